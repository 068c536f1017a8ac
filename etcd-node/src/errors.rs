//! etcd's client-visible errors, in one table: each with the gRPC code and the exact message
//! etcd sends, as etcd keeps them in `api/v3rpc/rpctypes/error.go` and the map in
//! `server/etcdserver/api/v3rpc/util.go`. Clients match on these strings (etcdctl, client-go's
//! `rpctypes.ErrCompacted`, Patroni), so each is written once, here.
//!
//! The layers below the API (`mvcc`, the Raft loop) name an error of this table, or make one of
//! their own with [`EtcdError::new`] for a refusal etcd does not have (the witness's, mostly);
//! they know no gRPC type. Only the API layer turns an [`EtcdError`] into a gRPC status
//! (`server::api::status`). Invariants (tested below): every message starts with
//! `etcdserver: `, no message is in the table twice, and no module but this one spells one out.

use std::borrow::Cow;

/// The gRPC status codes etcd's errors carry, without a gRPC type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    OutOfRange,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

/// An error an etcd client sees: etcd's gRPC code and message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct EtcdError {
    pub code: Code,
    pub message: Cow<'static, str>,
}

impl EtcdError {
    /// A refusal of etcd-node's own (etcd has no such error): its message starts with
    /// `etcdserver: ` as etcd's do.
    pub fn new(code: Code, message: impl Into<Cow<'static, str>>) -> Self {
        EtcdError {
            code,
            message: message.into(),
        }
    }

    /// [`EtcdError::new`] with `InvalidArgument`.
    pub fn invalid(message: impl Into<Cow<'static, str>>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }
}

/// Declares the table: one associated constant per error, and `TABLE` (every entry, with its
/// name) for the checks below.
macro_rules! etcd_errors {
    ($($(#[$doc:meta])* $name:ident = $code:ident, $message:literal;)*) => {
        impl EtcdError {
            $(
                $(#[$doc])*
                pub const $name: EtcdError = EtcdError {
                    code: Code::$code,
                    message: Cow::Borrowed($message),
                };
            )*
        }

        /// Every error of the table, by name.
        pub const TABLE: &[(&str, EtcdError)] = &[$((stringify!($name), EtcdError::$name)),*];
    };
}

etcd_errors! {
    // Requests (etcd checks them before proposing).
    EMPTY_KEY = InvalidArgument, "etcdserver: key is not provided";
    KEY_NOT_FOUND = InvalidArgument, "etcdserver: key not found";
    VALUE_PROVIDED = InvalidArgument, "etcdserver: value is provided";
    LEASE_PROVIDED = InvalidArgument, "etcdserver: lease is provided";
    TOO_MANY_OPS = InvalidArgument, "etcdserver: too many operations in txn request";
    DUPLICATE_KEY = InvalidArgument, "etcdserver: duplicate key given in txn request";
    INVALID_SORT_OPTION = InvalidArgument, "etcdserver: invalid sort option";
    REQUEST_TOO_LARGE = InvalidArgument, "etcdserver: request is too large";
    /// A request with no operation in it (etcd-node's: etcd's gRPC layer cannot send one).
    EMPTY_REQUEST = InvalidArgument, "etcdserver: empty request";

    // The key space.
    COMPACTED = OutOfRange, "etcdserver: mvcc: required revision has been compacted";
    FUTURE_REV = OutOfRange, "etcdserver: mvcc: required revision is a future revision";
    /// A write while NOSPACE is raised (or one that would pass the quota).
    NO_SPACE = ResourceExhausted, "etcdserver: mvcc: database space exceeded";
    /// A write while CORRUPT is raised.
    CORRUPT = DataLoss, "etcdserver: corrupt cluster";
    /// A watch created with a negative ID (sent as a cancel reason).
    NEGATIVE_WATCH_ID = InvalidArgument, "etcdserver: mvcc: watch ID must not be negative";

    // Leases.
    LEASE_NOT_FOUND = NotFound, "etcdserver: requested lease not found";
    LEASE_EXIST = FailedPrecondition, "etcdserver: lease already exists";
    LEASE_TTL_TOO_LARGE = OutOfRange, "etcdserver: too large lease TTL";

    // Membership.
    MEMBER_EXIST = FailedPrecondition, "etcdserver: member ID already exist";
    PEER_URL_EXIST = FailedPrecondition, "etcdserver: Peer URLs already exists";
    MEMBER_NOT_FOUND = NotFound, "etcdserver: member not found";
    MEMBER_NOT_LEARNER = FailedPrecondition, "etcdserver: can only promote a learner member";
    TOO_MANY_LEARNERS = FailedPrecondition, "etcdserver: too many learner members in cluster";

    // Auth.
    ROOT_USER_NOT_EXIST = FailedPrecondition, "etcdserver: root user does not exist";
    ROOT_ROLE_NOT_EXIST = FailedPrecondition, "etcdserver: root user does not have root role";
    USER_EMPTY = InvalidArgument, "etcdserver: user name is empty";
    USER_ALREADY_EXIST = FailedPrecondition, "etcdserver: user name already exists";
    USER_NOT_FOUND = FailedPrecondition, "etcdserver: user name not found";
    ROLE_EMPTY = InvalidArgument, "etcdserver: role name is empty";
    ROLE_ALREADY_EXIST = FailedPrecondition, "etcdserver: role name already exists";
    ROLE_NOT_FOUND = FailedPrecondition, "etcdserver: role name not found";
    ROLE_NOT_GRANTED = FailedPrecondition, "etcdserver: role is not granted to the user";
    PERMISSION_NOT_GIVEN = InvalidArgument, "etcdserver: permission is not given";
    PERMISSION_NOT_GRANTED = FailedPrecondition, "etcdserver: permission is not granted to the role";
    INVALID_AUTH_MGMT = FailedPrecondition, "etcdserver: invalid auth management";
    AUTH_NOT_ENABLED = FailedPrecondition, "etcdserver: authentication is not enabled";
    AUTH_FAILED = InvalidArgument, "etcdserver: authentication failed, invalid user ID or password";
    INVALID_AUTH_TOKEN = Unauthenticated, "etcdserver: invalid auth token";
    PERMISSION_DENIED = PermissionDenied, "etcdserver: permission denied";

    // The member and its leader.
    NO_LEADER = Unavailable, "etcdserver: no leader";
    NOT_LEADER = FailedPrecondition, "etcdserver: not leader";
    LEADER_CHANGED = Unavailable, "etcdserver: leader changed";
    /// A write whose outcome this member cannot tell (it may or may not have been applied).
    TIMEOUT = Unavailable, "etcdserver: request timed out";
    STOPPED = Unavailable, "etcdserver: server stopped";
    NOT_SUPPORTED_FOR_LEARNER = Unavailable, "etcdserver: rpc not supported for learner";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_message_is_etcds_form_and_in_the_table_once() {
        let mut seen = std::collections::BTreeSet::new();
        for (name, e) in TABLE {
            assert!(
                e.message.starts_with("etcdserver: "),
                "{name}: {}",
                e.message
            );
            assert!(
                seen.insert(&e.message),
                "{name}: {} is in the table twice",
                e.message
            );
        }
    }

    /// No source file but this one writes out a message of the table: a copy would drift. (Unit
    /// tests, in the `tests.rs` files, spell out the wire strings they pin.)
    #[test]
    fn no_other_module_spells_out_a_message_of_the_table() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut copies = Vec::new();
        for file in crate::layers::rust_files(&src) {
            if file.ends_with("errors.rs") || file.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&file).unwrap();
            for (name, e) in TABLE {
                if text.contains(&format!("\"{}\"", e.message)) {
                    copies.push(format!("{}: {name}", file.display()));
                }
            }
        }
        assert!(
            copies.is_empty(),
            "use the table's constant instead: {copies:#?}"
        );
    }
}
