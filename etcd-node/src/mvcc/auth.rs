//! The auth state (etcd's users, roles and key permissions) as the key space stores it, and the
//! auth changes that go through Raft, applied with etcd's rules and messages.
//!
//! One table, `auth`: `enabled` -> [1] while auth is on; `revision` -> u64 (LE) bumped by every
//! change; `secret` -> the key tokens are signed with (chosen by the member that proposed
//! `AuthEnable`); `user/<name>` -> [`StoredUser`]; `role/<name>` -> [`StoredRole`]. Passwords
//! are stored only as bcrypt hashes, computed by the proposing member (as etcd 3.5 does), so
//! no entry carries a password in clear.

use super::sealed::Writable;
use etcd_client::proto::{
    PbAuthRoleAddRequest, PbAuthRoleDeleteRequest, PbAuthRoleGrantPermissionRequest,
    PbAuthRoleRevokePermissionRequest, PbAuthUserAddRequest, PbAuthUserChangePasswordRequest,
    PbAuthUserDeleteRequest, PbAuthUserGrantRoleRequest, PbAuthUserRevokeRoleRequest,
};
use prost::Message;

use crate::errors::EtcdError;

/// The role that may do everything (etcd's `root`).
pub const ROOT: &str = "root";

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct StoredUser {
    #[prost(string, tag = "1")]
    pub name: String,
    /// bcrypt hash; empty for a user without a password (it cannot authenticate).
    #[prost(string, tag = "2")]
    pub password_hash: String,
    /// Sorted.
    #[prost(string, repeated, tag = "3")]
    pub roles: Vec<String>,
}

/// A permission on `[key, range_end)` (etcd's spelling: empty end is one key, "\0" every key
/// from `key`): 0 READ, 1 WRITE, 2 READWRITE.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct Perm {
    #[prost(int32, tag = "1")]
    pub perm_type: i32,
    #[prost(bytes = "vec", tag = "2")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    pub range_end: Vec<u8>,
}

#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct StoredRole {
    #[prost(string, tag = "1")]
    pub name: String,
    /// Sorted by (key, range_end).
    #[prost(message, repeated, tag = "2")]
    pub perms: Vec<Perm>,
}

/// An auth change, as proposed (field numbers are part of the log format).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthChange {
    #[prost(oneof = "AuthOp", tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11")]
    pub op: Option<AuthOp>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum AuthOp {
    /// Turn auth on, with the token-signing secret the proposer chose.
    #[prost(bytes, tag = "1")]
    Enable(Vec<u8>),
    #[prost(bool, tag = "2")]
    Disable(bool),
    /// `password` cleared, `hashed_password` set by the proposer.
    #[prost(message, tag = "3")]
    UserAdd(PbAuthUserAddRequest),
    #[prost(message, tag = "4")]
    UserDelete(PbAuthUserDeleteRequest),
    /// `password` cleared, `hashed_password` set by the proposer.
    #[prost(message, tag = "5")]
    UserChangePassword(PbAuthUserChangePasswordRequest),
    #[prost(message, tag = "6")]
    UserGrantRole(PbAuthUserGrantRoleRequest),
    #[prost(message, tag = "7")]
    UserRevokeRole(PbAuthUserRevokeRoleRequest),
    #[prost(message, tag = "8")]
    RoleAdd(PbAuthRoleAddRequest),
    #[prost(message, tag = "9")]
    RoleDelete(PbAuthRoleDeleteRequest),
    #[prost(message, tag = "10")]
    RoleGrantPermission(PbAuthRoleGrantPermissionRequest),
    #[prost(message, tag = "11")]
    RoleRevokePermission(PbAuthRoleRevokePermissionRequest),
}

pub fn user_key(name: &str) -> String {
    format!("user/{name}")
}
pub fn role_key(name: &str) -> String {
    format!("role/{name}")
}

/// Decodes a stored user or role.
pub fn decode<T: Message + Default>(bytes: &[u8]) -> Result<T, redb::StorageError> {
    T::decode(bytes).map_err(|e| redb::StorageError::Corrupted(format!("auth record: {e}")))
}

type AuthTable<'t> = Writable<'t, &'static [u8]>;

fn get<T: Message + Default>(t: &AuthTable<'_>, key: &str) -> Result<Option<T>, redb::Error> {
    Ok(match t.get(key.as_bytes())? {
        Some(v) => Some(decode(&v)?),
        None => None,
    })
}

fn put<T: Message>(t: &mut AuthTable<'_>, key: &str, value: &T) -> Result<(), redb::Error> {
    t.insert(key.as_bytes(), &value.encode_to_vec())?;
    Ok(())
}

/// Applies one auth change; a refused change changes nothing.
pub(super) fn apply(
    t: &mut AuthTable<'_>,
    op: &AuthOp,
) -> Result<Result<(), EtcdError>, redb::Error> {
    let enabled = t.get("enabled".as_bytes())?.is_some();
    let refused = match op {
        AuthOp::Enable(secret) => match get::<StoredUser>(t, &user_key(ROOT))? {
            None => Some(EtcdError::ROOT_USER_NOT_EXIST),
            Some(u) if !u.roles.iter().any(|r| r == ROOT) => Some(EtcdError::ROOT_ROLE_NOT_EXIST),
            Some(_) => {
                if !enabled {
                    t.insert("secret".as_bytes(), secret.as_slice())?;
                    t.insert("enabled".as_bytes(), [1u8].as_slice())?;
                }
                None
            }
        },
        AuthOp::Disable(_) => {
            t.remove("enabled".as_bytes())?;
            None
        }
        AuthOp::UserAdd(r) => {
            let key = user_key(&r.name);
            if r.name.is_empty() {
                Some(EtcdError::USER_EMPTY)
            } else if t.get(key.as_bytes())?.is_some() {
                Some(EtcdError::USER_ALREADY_EXIST)
            } else {
                let user = StoredUser {
                    name: r.name.clone(),
                    password_hash: r.hashed_password.clone(),
                    roles: Vec::new(),
                };
                put(t, &key, &user)?;
                None
            }
        }
        AuthOp::UserDelete(r) => {
            let key = user_key(&r.name);
            if enabled && r.name == ROOT {
                Some(EtcdError::INVALID_AUTH_MGMT)
            } else if t.remove(key.as_bytes())?.is_none() {
                Some(EtcdError::USER_NOT_FOUND)
            } else {
                None
            }
        }
        AuthOp::UserChangePassword(r) => {
            let key = user_key(&r.name);
            match get::<StoredUser>(t, &key)? {
                None => Some(EtcdError::USER_NOT_FOUND),
                Some(mut u) => {
                    u.password_hash = r.hashed_password.clone();
                    put(t, &key, &u)?;
                    None
                }
            }
        }
        AuthOp::UserGrantRole(r) => {
            let key = user_key(&r.user);
            match get::<StoredUser>(t, &key)? {
                None => Some(EtcdError::USER_NOT_FOUND),
                Some(_) if r.role != ROOT && t.get(role_key(&r.role).as_bytes())?.is_none() => {
                    Some(EtcdError::ROLE_NOT_FOUND)
                }
                Some(mut u) => {
                    if let Err(at) = u.roles.binary_search(&r.role) {
                        u.roles.insert(at, r.role.clone());
                        put(t, &key, &u)?;
                    }
                    None
                }
            }
        }
        AuthOp::UserRevokeRole(r) => {
            let key = user_key(&r.name);
            match get::<StoredUser>(t, &key)? {
                _ if enabled && r.name == ROOT && r.role == ROOT => {
                    Some(EtcdError::INVALID_AUTH_MGMT)
                }
                None => Some(EtcdError::USER_NOT_FOUND),
                Some(mut u) => match u.roles.binary_search(&r.role) {
                    Err(_) => Some(EtcdError::ROLE_NOT_GRANTED),
                    Ok(at) => {
                        u.roles.remove(at);
                        put(t, &key, &u)?;
                        None
                    }
                },
            }
        }
        AuthOp::RoleAdd(r) => {
            let key = role_key(&r.name);
            if r.name.is_empty() {
                Some(EtcdError::ROLE_EMPTY)
            } else if t.get(key.as_bytes())?.is_some() {
                Some(EtcdError::ROLE_ALREADY_EXIST)
            } else {
                let role = StoredRole {
                    name: r.name.clone(),
                    perms: Vec::new(),
                };
                put(t, &key, &role)?;
                None
            }
        }
        AuthOp::RoleDelete(r) => {
            if enabled && r.role == ROOT {
                Some(EtcdError::INVALID_AUTH_MGMT)
            } else if t.remove(role_key(&r.role).as_bytes())?.is_none() {
                Some(EtcdError::ROLE_NOT_FOUND)
            } else {
                // Taken from every user that had it.
                let mut changed = Vec::new();
                for row in t.range("user/".as_bytes().."user0".as_bytes())? {
                    let (k, v) = row?;
                    let mut u: StoredUser = decode(&v)?;
                    if let Ok(at) = u.roles.binary_search(&r.role) {
                        u.roles.remove(at);
                        changed.push((String::from_utf8_lossy(k.value()).into_owned(), u));
                    }
                }
                for (k, u) in changed {
                    put(t, &k, &u)?;
                }
                None
            }
        }
        AuthOp::RoleGrantPermission(r) => {
            let key = role_key(&r.name);
            match (get::<StoredRole>(t, &key)?, &r.perm) {
                (None, _) => Some(EtcdError::ROLE_NOT_FOUND),
                (Some(_), None) => Some(EtcdError::PERMISSION_NOT_GIVEN),
                // As etcd: a permission names a key, and a range must not be empty (the end
                // "\0" means "every key from `key`").
                (Some(_), Some(p))
                    if p.key.is_empty()
                        || (!p.range_end.is_empty()
                            && p.range_end <= p.key
                            && p.range_end != [0]) =>
                {
                    Some(EtcdError::INVALID_AUTH_MGMT)
                }
                (Some(mut role), Some(p)) => {
                    let perm = Perm {
                        perm_type: p.perm_type,
                        key: p.key.clone(),
                        range_end: p.range_end.clone(),
                    };
                    let same = |q: &Perm| (&q.key, &q.range_end).cmp(&(&perm.key, &perm.range_end));
                    match role.perms.binary_search_by(same) {
                        Ok(at) => role.perms[at] = perm,
                        Err(at) => role.perms.insert(at, perm),
                    }
                    put(t, &key, &role)?;
                    None
                }
            }
        }
        AuthOp::RoleRevokePermission(r) => {
            let key = role_key(&r.role);
            match get::<StoredRole>(t, &key)? {
                None => Some(EtcdError::ROLE_NOT_FOUND),
                Some(mut role) => {
                    let before = role.perms.len();
                    role.perms
                        .retain(|q| !(q.key == r.key && q.range_end == r.range_end));
                    if role.perms.len() == before {
                        Some(EtcdError::PERMISSION_NOT_GRANTED)
                    } else {
                        put(t, &key, &role)?;
                        None
                    }
                }
            }
        }
    };
    if let Some(e) = refused {
        return Ok(Err(e));
    }
    let revision = t
        .get("revision".as_bytes())?
        .and_then(|v| v.as_slice().try_into().ok().map(u64::from_le_bytes))
        .unwrap_or(0);
    t.insert(
        "revision".as_bytes(),
        (revision + 1).to_le_bytes().as_slice(),
    )?;
    Ok(Ok(()))
}

/// Is `[start, end)` (etcd's spelling) covered by the permissions among `perms` that allow
/// `write` (or reading)? Ranges may be covered by several permissions together.
pub fn permitted(perms: &[Perm], write: bool, start: &[u8], end: &[u8]) -> bool {
    let allows = |p: &Perm| p.perm_type == 2 || p.perm_type == i32::from(write);
    // Every permission as [from, to), `None` for "no end".
    let mut spans: Vec<(Vec<u8>, Option<Vec<u8>>)> = perms
        .iter()
        .filter(|p| allows(p))
        .map(|p| {
            let to = match p.range_end.as_slice() {
                [] => Some([p.key.as_slice(), &[0]].concat()),
                [0] => None,
                e => Some(e.to_vec()),
            };
            (p.key.clone(), to)
        })
        .collect();
    spans.sort();
    let want_end: Option<Vec<u8>> = match end {
        [] => Some([start, &[0]].concat()),
        [0] => None,
        e => Some(e.to_vec()),
    };
    // Sweep from `start`, extending what is covered.
    let mut covered = start.to_vec();
    for (from, to) in spans {
        if from.as_slice() > covered.as_slice() {
            break;
        }
        match to {
            None => return true,
            Some(to) if to > covered => covered = to,
            Some(_) => {}
        }
        if want_end.as_ref().is_some_and(|w| covered >= *w) {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(t: i32, k: &str, e: &str) -> Perm {
        Perm {
            perm_type: t,
            key: k.into(),
            range_end: e.into(),
        }
    }

    #[test]
    fn ranges_are_covered_by_one_or_several_permissions_of_the_right_kind() {
        let perms = [
            perm(0, "a", "c"),
            perm(2, "c", "e"),
            perm(1, "x", ""),
            perm(2, "z", "\0"),
        ];
        assert!(permitted(&perms, false, b"a", b""));
        assert!(
            permitted(&perms, false, b"b", b"d"),
            "two permissions together"
        );
        assert!(
            !permitted(&perms, true, b"b", b"d"),
            "READ does not allow writing"
        );
        assert!(permitted(&perms, true, b"c", b"e"));
        assert!(!permitted(&perms, false, b"a", b"f"), "a gap at e..f");
        assert!(permitted(&perms, true, b"x", b""));
        assert!(!permitted(&perms, false, b"x", b""), "WRITE only");
        assert!(
            !permitted(&perms, true, b"x", b"y"),
            "one key is not a range"
        );
        assert!(permitted(&perms, true, b"zz", b"\0"), "open end");
        assert!(!permitted(&perms, false, b"a", b"\0"));
        assert!(!permitted(&[], false, b"a", b""));
    }
}
