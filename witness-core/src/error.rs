//! The one error type of witness-core, shared by every backend.
//!
//! Expected outcomes are not errors: losing a compare-and-swap is [`crate::store::CasOutcome::Conflict`],
//! a rejected vote is a reply. An `Error` means the step could not be carried out; its message
//! says what failed, on what, and what to do.

use std::io;

use crate::codec::DecodeError;
use crate::state::Seen;
use crate::store::Version;
use crate::url::UrlProblem;

/// Everything that can go wrong in a witness step, a store or a URL.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A `witness:` URL could not be parsed.
    #[error("invalid witness URL {url:?}: {problem}")]
    InvalidUrl {
        /// The URL as given, with any SAS signature redacted.
        url: String,
        problem: UrlProblem,
    },
    /// The store holds no witness state yet.
    #[error(
        "no witness state at {location}: initialise it with `etcdutl witness init --name NAME --advertise-peer-url URL`"
    )]
    NotInitialised { location: String },
    /// The witness's storage holds nothing, but this member is bound to a witness there: the
    /// storage was wiped (or the share is not mounted).
    #[error(
        "no witness state at {location}, but this cluster is bound to the witness of generation {expected:#x} there: the storage was wiped, or the share is not mounted. If the share is mounted again, the witness comes back by itself; if its state is gone, its votes are lost and a new witness at that location would not be trusted. Safe recovery: start the other member so that both regular members run (they need no witness), then replace the witness at runtime (docs/operations.md, \"The witness's storage was lost\")"
    )]
    Lost { location: String, expected: u64 },
    /// `create` found a witness already there.
    #[error(
        "a witness is already initialised at {location} (member {name:?}), and it may be in use (`etcdutl witness status` shows the cluster bound to it): a cluster that uses it records its generation and would refuse a witness initialised here again, losing its tie-breaker. To give a running cluster a new witness, initialise a new location and replace the witness member (docs/operations.md, \"Moving or replacing the witness\"); pass --force only if no member of any cluster that used this witness will run again (its term and vote are discarded)"
    )]
    AlreadyInitialised { location: String, name: String },
    /// The stored record is damaged. Never fall back to an older one: restore or re-initialise.
    #[error(
        "witness state {version} at {location} is corrupt: {source}; the witness refuses to guess (an older state could grant a forbidden vote). A cluster that uses it cannot trust it again: with both regular members running, replace the witness at runtime with one initialised at a new location (docs/operations.md, \"The witness's storage was lost\")"
    )]
    Corrupt {
        location: String,
        version: Version,
        #[source]
        source: DecodeError,
    },
    /// The witness is bound to another cluster.
    #[error(
        "witness at {location} belongs to cluster {stored:#x}, not to this cluster {requested:#x}: a witness serves one cluster; point this cluster at its own witness (initialise a new location with `etcdutl witness init` for a new cluster)"
    )]
    WrongCluster {
        location: String,
        stored: u64,
        requested: u64,
    },
    /// The witness is bound to another member id of this cluster.
    #[error(
        "witness at {location} is member {stored:#x}, but this cluster calls its witness {requested:#x}: check the witness peer URL in --initial-cluster"
    )]
    WrongMember {
        location: String,
        stored: u64,
        requested: u64,
    },
    /// The witness's generation is not the one this member is bound to: its storage was wiped
    /// and initialised again (or the URL now names other storage). Its votes are lost.
    #[error(
        "the witness at {location} is not the witness this cluster is bound to (it has generation {found:#x}, this member is bound to {expected:#x}): its storage was wiped and initialised again, or now names other storage; a witness that forgot its votes could elect a member that lacks acknowledged writes, so this member will neither vote nor commit with it. Safe recovery: start the other member so that both regular members run (they need no witness), then replace the witness at runtime (docs/operations.md, \"The witness's storage was lost\"); never initialise the old location again"
    )]
    Replaced {
        location: String,
        expected: u64,
        found: u64,
    },
    /// The witness holds an older term or log position than this member saw it hold: its storage
    /// was restored from an old copy. Its votes are lost.
    #[error(
        "the witness at {location} went back in time: it holds term {} and log position ({}, {}), but this member saw it at term {} and log position ({}, {}); its storage was restored from an older copy, and a witness that forgot its votes could elect a member that lacks acknowledged writes, so this member will neither vote nor commit with it. Safe recovery: start the other member so that both regular members run (they need no witness), then replace the witness at runtime (docs/operations.md, \"The witness's storage was lost\")",
        found.term, found.log_term, found.log_subterm, seen.term, seen.log_term, seen.log_subterm
    )]
    Reverted {
        location: String,
        seen: Seen,
        found: Seen,
    },
    /// The storage refused access.
    #[error(
        "permission denied to {op} {location}: give etcd-node read and write access to the witness storage (a directory writable by its user, or a SAS with read and write permission that has not expired)"
    )]
    PermissionDenied { op: &'static str, location: String },
    /// The storage is full.
    #[error(
        "no space left to {op} {location}: free space on the witness storage (a witness needs a few KiB)"
    )]
    NoSpace { op: &'static str, location: String },
    /// The storage is mounted read-only.
    #[error(
        "cannot {op} {location}: the file system is read-only; mount the witness share read-write"
    )]
    ReadOnly { op: &'static str, location: String },
    /// The configured path exists but is not a directory.
    #[error(
        "{location} is not a directory: the witness path must name a directory on the shared mount"
    )]
    NotADirectory { location: String },
    /// The configured directory does not exist.
    #[error("{location} does not exist: mount the witness share there, or create the directory")]
    NoSuchDirectory { location: String },
    /// The storage lacks a feature the witness depends on (hard links, fsync, conditional writes).
    #[error("the witness storage at {location} cannot be used: {reason}")]
    Unsupported { location: String, reason: String },
    /// Any other I/O failure. Transient ones are retried by the client.
    #[error("failed to {op} {location}: {source}")]
    Io {
        op: &'static str,
        location: String,
        #[source]
        source: io::Error,
    },
    /// A remote store failed; `transient` failures (timeouts, 5xx) may have taken effect.
    #[error("witness storage {location} failed to {op}: {message}")]
    Remote {
        op: &'static str,
        location: String,
        message: String,
        transient: bool,
    },
    /// The client gave up after too many lost compare-and-swap races.
    #[error(
        "witness step on {location} lost {conflicts} compare-and-swap races in {attempts} attempts; too much contention, try again"
    )]
    TooManyConflicts {
        location: String,
        attempts: u32,
        conflicts: u32,
    },
}

impl Error {
    /// This error as a member that has seen its witness (`seen`) should report it: a witness
    /// that is not initialised is then one whose storage was lost, not one still to set up.
    pub fn for_member(self, seen: &Seen) -> Error {
        match self {
            Error::NotInitialised { location } if seen.generation != 0 => Error::Lost {
                location,
                expected: seen.generation,
            },
            other => other,
        }
    }

    /// True when the witness lost its state (wiped, re-initialised, restored from an old copy):
    /// it must be replaced, never trusted again.
    pub fn is_lost_state(&self) -> bool {
        matches!(
            self,
            Error::Replaced { .. } | Error::Reverted { .. } | Error::Lost { .. }
        )
    }

    /// True for failures that may clear up by themselves, and after which a write may or may not
    /// have taken effect: the caller must re-read to learn the outcome.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Remote { transient, .. } => *transient,
            Error::Io { source, .. } => matches!(
                source.kind(),
                io::ErrorKind::TimedOut
                    | io::ErrorKind::Interrupted
                    | io::ErrorKind::WouldBlock
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::StaleNetworkFileHandle
            ),
            _ => false,
        }
    }
}

/// witness-core's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
