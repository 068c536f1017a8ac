//! Moving a key space in from etcd's snapshot files and out to them: etcd 3.4/3.5's bbolt
//! buckets (docs/formats.md, "etcd's snapshot files") to and from a dump.
//!
//! etcd's buckets and what they become:
//! - `key`: revision (main u64 BE, `_`, sub u64 BE, and `t` for a tombstone) -> `KeyValue`.
//!   etcd orders rows by revision, a dump by (key, revision): the rows pass through a
//!   scratch redb file to be sorted, so memory does not grow with the key space. Sub
//!   revisions are dropped in (a key changes at most once per main revision); going out, the
//!   keys of one main revision get sub revisions 0, 1, ... in key order;
//! - `meta`: `finishedCompactRev` and `scheduledCompactRev` (revision bytes) give the
//!   compacted revision; the current revision is the newest row's, or the compacted one if
//!   later (etcd's own rule when it opens the file);
//! - `lease`: id (i64 BE) -> `Lease` {ID, TTL, RemainingTTL}: each lease with its granted TTL
//!   (the remaining time is not kept, as etcd's own restore gives every lease its whole TTL);
//! - `auth` (`authEnabled` [1] or [0], `authRevision` u64 BE), `authUsers` (name -> `User`
//!   with its bcrypt hash), `authRoles` (name -> `Role`): the `auth` table's rows. etcd keeps
//!   no token-signing secret on disk; an enabled import gets one derived from the file's
//!   SHA-256 (every member restored from the file derives the same), which the restore then
//!   mixes with the new members' ids;
//! - `members`, `members_removed`, `alarm`, `cluster`: not carried (a restore names its
//!   members; alarms and the cluster version are the running cluster's).

use std::io::{Read, Seek, Write};
use std::path::Path;

use etcd_client::proto::PbKeyValue;
use prost::Message;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use sha2::{Digest, Sha256};

use super::auth::{Perm, StoredRole, StoredUser, role_key, user_key};
use super::dump::{
    DumpError, Part, Parts, PbDumpAuthRow, PbDumpEntry, PbDumpLease, is_tombstone, write_part,
};
use crate::storage::bbolt::{self, BboltError};

/// etcd's `leasepb.Lease`.
#[derive(Clone, PartialEq, prost::Message)]
struct EtcdLease {
    #[prost(int64, tag = "1")]
    id: i64,
    #[prost(int64, tag = "2")]
    ttl: i64,
    #[prost(int64, tag = "3")]
    remaining_ttl: i64,
}

/// etcd's `authpb.User`.
#[derive(Clone, PartialEq, prost::Message)]
struct EtcdUser {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    password: Vec<u8>,
    #[prost(string, repeated, tag = "3")]
    roles: Vec<String>,
    #[prost(message, optional, tag = "4")]
    options: Option<EtcdUserOptions>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct EtcdUserOptions {
    #[prost(bool, tag = "1")]
    no_password: bool,
}

/// etcd's `authpb.Role` (its `Permission` is the same message as [`Perm`]).
#[derive(Clone, PartialEq, prost::Message)]
struct EtcdRole {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(message, repeated, tag = "2")]
    key_permission: Vec<Perm>,
}

const REV_BYTES: usize = 17;

/// etcd's revision bytes: main, `_`, sub (big-endian), and `t` for a tombstone.
fn rev_bytes(main: u64, sub: u64, tombstone: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(REV_BYTES + 1);
    b.extend(main.to_be_bytes());
    b.push(b'_');
    b.extend(sub.to_be_bytes());
    if tombstone {
        b.push(b't');
    }
    b
}

/// (main revision, tombstone) of etcd's revision bytes.
fn parse_rev(b: &[u8]) -> Option<(u64, bool)> {
    let main = u64::from_be_bytes(b.get(..8)?.try_into().ok()?);
    match (b.len(), b.get(8), b.get(REV_BYTES)) {
        (REV_BYTES, Some(b'_'), None) => Some((main, false)),
        (18, Some(b'_'), Some(b't')) => Some((main, true)),
        _ => None,
    }
}

/// Scratch tables, in a redb file of the caller's directory, removed when done.
const BY_KEY: TableDefinition<(&[u8], u64), &[u8]> = TableDefinition::new("by_key");
const BY_REVISION: TableDefinition<(u64, &[u8]), &[u8]> = TableDefinition::new("by_revision");
/// (keyed by the id as u64: the order of etcd's big-endian keys)
const LEASES: TableDefinition<u64, i64> = TableDefinition::new("leases");
const AUTH: TableDefinition<&str, &[u8]> = TableDefinition::new("auth");

/// Bytes of rows held in memory, and written per scratch transaction: values can be large
/// (up to the request limit), so batches are counted in bytes, not rows.
const BATCH_BYTES: usize = 16 << 20;

/// Why an etcd file cannot be converted, either way.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    /// It cannot be read as a bbolt file.
    #[error(transparent)]
    Bbolt(#[from] BboltError),
    /// It is a bbolt file, but a bucket or a row is not what etcd writes.
    #[error("{0}")]
    NotEtcd(String),
    /// The etcd-node snapshot's key space does not decode.
    #[error(transparent)]
    Dump(#[from] DumpError),
    /// A row of the etcd-node snapshot does not decode.
    #[error("{what} in the snapshot: {source}")]
    Row {
        what: String,
        source: prost::DecodeError,
    },
    /// The scratch file in the work directory failed.
    #[error("the scratch file: {0}")]
    Scratch(String),
    #[error("writing the {what}: {source}")]
    Write {
        what: &'static str,
        source: std::io::Error,
    },
}

fn not_etcd(what: impl Into<String>) -> ConvertError {
    ConvertError::NotEtcd(what.into())
}

/// A scratch redb file, deleted on drop.
struct Scratch {
    db: Option<Database>,
    path: std::path::PathBuf,
}

impl Scratch {
    fn create(dir: &Path) -> Result<Scratch, ConvertError> {
        let path = dir.join(format!("etcd-convert-{}.redb", std::process::id()));
        let db = redb::Builder::new()
            .set_cache_size(64 << 20)
            .create(&path)
            .map_err(|e| ConvertError::Scratch(format!("creating {}: {e}", path.display())))?;
        Ok(Scratch { db: Some(db), path })
    }

    fn db(&self) -> &Database {
        self.db.as_ref().expect("open until dropped")
    }

    /// Runs `fill` with a write transaction at a time: `fill` returns whether it has more.
    fn write(
        &self,
        mut fill: impl FnMut(&redb::WriteTransaction) -> Result<bool, ConvertError>,
    ) -> Result<(), ConvertError> {
        loop {
            let mut tx = self.db().begin_write().map_err(scratch)?;
            tx.set_durability(Durability::None).map_err(scratch)?;
            let more = fill(&tx)?;
            tx.commit().map_err(scratch)?;
            if !more {
                return Ok(());
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        drop(self.db.take());
        let _ = std::fs::remove_file(&self.path);
    }
}

fn scratch(e: impl std::fmt::Display) -> ConvertError {
    ConvertError::Scratch(e.to_string())
}

/// What an etcd file held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EtcdFileSummary {
    pub revision: u64,
    pub compacted: u64,
    /// Rows of the `key` bucket.
    pub rows: u64,
    pub leases: u64,
    pub users: u64,
    pub roles: u64,
    pub auth_enabled: bool,
}

/// Writes to `out` the dump of the etcd (bbolt) file `file`, whose first `len` bytes are the
/// database and whose SHA-256 is `sha` (of those bytes); `work` is a directory for a scratch
/// file.
pub fn import(
    file: std::fs::File,
    len: u64,
    sha: &[u8],
    work: &Path,
    out: &mut dyn Write,
) -> Result<EtcdFileSummary, ConvertError> {
    let db = bbolt::Reader::open(file, len)?;
    let mut s = EtcdFileSummary::default();
    let bucket = |name: &str| {
        db.bucket(name.as_bytes())
            .map_err(|e| BboltError::Damaged(format!("bucket {name}: {e}")))
    };
    let Some(keys) = bucket("key")? else {
        return Err(not_etcd(
            "it has no `key` bucket: it is a bbolt file, but not an etcd key space",
        ));
    };
    // The small parts first: compaction, leases, auth.
    if let Some(meta) = bucket("meta")? {
        db.for_each::<ConvertError>(&meta, &mut |k, v| {
            if k == b"finishedCompactRev" || k == b"scheduledCompactRev" {
                let (main, _) = parse_rev(v).ok_or_else(|| {
                    not_etcd(format!(
                        "meta {}: not a revision",
                        String::from_utf8_lossy(k)
                    ))
                })?;
                s.compacted = s.compacted.max(main);
            }
            Ok(())
        })?;
    }
    let emit = |out: &mut dyn Write, part: &Part| {
        write_part(out, part).map_err(|source| ConvertError::Write {
            what: "converted key space",
            source,
        })
    };
    if let Some(leases) = bucket("lease")? {
        db.for_each::<ConvertError>(&leases, &mut |_, v| {
            let l = EtcdLease::decode(v)
                .map_err(|e| not_etcd(format!("a lease does not decode: {e}")))?;
            s.leases += 1;
            emit(
                out,
                &Part::Lease(PbDumpLease {
                    id: l.id,
                    ttl: l.ttl,
                }),
            )
        })?;
    }
    let auth_row = |out: &mut dyn Write, key: String, value: Vec<u8>| {
        emit(out, &Part::Auth(PbDumpAuthRow { key, value }))
    };
    if let Some(auth) = bucket("auth")? {
        db.for_each::<ConvertError>(&auth, &mut |k, v| {
            match k {
                b"authEnabled" if v == [1] => {
                    s.auth_enabled = true;
                    auth_row(out, "enabled".into(), vec![1])?;
                    let secret = Sha256::new()
                        .chain_update(b"imported from etcd\0")
                        .chain_update(sha)
                        .finalize();
                    auth_row(out, "secret".into(), secret.to_vec())?;
                }
                b"authRevision" => {
                    let rev = u64::from_be_bytes(
                        v.try_into()
                            .map_err(|_| not_etcd("auth authRevision: not 8 bytes"))?,
                    );
                    auth_row(out, "revision".into(), rev.to_le_bytes().to_vec())?;
                }
                _ => {}
            }
            Ok(())
        })?;
    }
    let utf8 = |what: &str, b: Vec<u8>| {
        String::from_utf8(b).map_err(|_| not_etcd(format!("{what}: a name that is not UTF-8")))
    };
    if let Some(users) = bucket("authUsers")? {
        db.for_each::<ConvertError>(&users, &mut |_, v| {
            let u = EtcdUser::decode(v)
                .map_err(|e| not_etcd(format!("a user does not decode: {e}")))?;
            let name = utf8("a user", u.name)?;
            let no_password = u.options.is_some_and(|o| o.no_password);
            let mut roles = u.roles;
            roles.sort();
            let user = StoredUser {
                name: name.clone(),
                password_hash: if no_password {
                    String::new()
                } else {
                    utf8("a password hash", u.password)?
                },
                roles,
            };
            s.users += 1;
            auth_row(out, user_key(&name), user.encode_to_vec())
        })?;
    }
    if let Some(roles) = bucket("authRoles")? {
        db.for_each::<ConvertError>(&roles, &mut |_, v| {
            let r = EtcdRole::decode(v)
                .map_err(|e| not_etcd(format!("a role does not decode: {e}")))?;
            let name = utf8("a role", r.name)?;
            let mut perms = r.key_permission;
            perms.sort_by(|a, b| (&a.key, &a.range_end).cmp(&(&b.key, &b.range_end)));
            s.roles += 1;
            let role = StoredRole {
                name: name.clone(),
                perms,
            };
            auth_row(out, role_key(&name), role.encode_to_vec())
        })?;
    }
    // The history, sorted by (key, revision) through the scratch file.
    let sorter = Scratch::create(work)?;
    let (mut rows, mut pending) = (Vec::new(), 0);
    let flush = |rows: &mut Vec<(Vec<u8>, u64, Vec<u8>)>| {
        sorter.write(|tx| {
            let mut t = tx.open_table(BY_KEY).map_err(scratch)?;
            for (key, main, record) in rows.drain(..) {
                t.insert((key.as_slice(), main), record.as_slice())
                    .map_err(scratch)?;
            }
            Ok(false)
        })
    };
    let mut newest = 0;
    db.for_each::<ConvertError>(&keys, &mut |k, v| {
        let (main, tombstone) = parse_rev(k)
            .ok_or_else(|| not_etcd(format!("key bucket: {k:?} is not an etcd revision")))?;
        let mut kv = PbKeyValue::decode(v).map_err(|e| {
            not_etcd(format!(
                "key bucket: the row at revision {main} does not decode: {e}"
            ))
        })?;
        let key = std::mem::take(&mut kv.key);
        if key.is_empty() {
            return Err(not_etcd(format!(
                "key bucket: the row at revision {main} has no key"
            )));
        }
        let record = if tombstone {
            PbKeyValue {
                mod_revision: main as i64,
                ..Default::default()
            }
        } else if kv.version <= 0 || kv.mod_revision != main as i64 {
            return Err(not_etcd(format!(
                "key bucket: the row at revision {main} says version {} and revision {}",
                kv.version, kv.mod_revision
            )));
        } else {
            kv // (its key taken: the record)
        };
        newest = newest.max(main);
        s.rows += 1;
        let record = record.encode_to_vec();
        pending += key.len() + record.len();
        rows.push((key, main, record));
        if pending >= BATCH_BYTES {
            flush(&mut rows)?;
            pending = 0;
        }
        Ok(())
    })?;
    flush(&mut rows)?;
    let tx = sorter.db().begin_read().map_err(scratch)?;
    if let Some(t) = open(&tx, BY_KEY)? {
        for row in t.iter().map_err(scratch)? {
            let (k, v) = row.map_err(scratch)?;
            let (key, revision) = k.value();
            let entry = PbDumpEntry {
                key: key.to_vec(),
                revision,
                record: v.value().to_vec(),
                // (etcd's sub-revisions are not carried over: rows of one revision replay in
                // key order)
                sub: None,
            };
            emit(out, &Part::History(entry))?;
        }
    }
    s.revision = newest.max(s.compacted).max(1);
    emit(out, &Part::Revision(s.revision))?;
    emit(out, &Part::Compacted(s.compacted))?;
    Ok(s)
}

/// Writes the dump `dump` holds to `out` as an etcd (bbolt) database, without the SHA-256
/// that a snapshot file ends with (the caller appends it); `work` is a directory for a
/// scratch file. Returns what it wrote.
pub fn export<W: Write + Seek>(
    dump: impl Read,
    out: W,
    work: &Path,
) -> Result<(EtcdFileSummary, W), ConvertError> {
    let sorter = Scratch::create(work)?;
    let mut s = EtcdFileSummary::default();
    let mut parts = Parts::new(dump);
    // (returns once the dump is read: `write` goes on while the closure says true)
    sorter.write(|tx| {
        let mut by_rev = tx.open_table(BY_REVISION).map_err(scratch)?;
        let mut leases = tx.open_table(LEASES).map_err(scratch)?;
        let mut auth = tx.open_table(AUTH).map_err(scratch)?;
        let mut written = 0;
        while written < BATCH_BYTES {
            let Some(part) = parts.next_part()? else {
                return Ok(false);
            };
            match part {
                Part::Revision(r) => s.revision = r,
                Part::Compacted(c) => s.compacted = c,
                Part::History(e) => {
                    s.rows += 1;
                    written += e.key.len() + e.record.len();
                    by_rev
                        .insert((e.revision, e.key.as_slice()), e.record.as_slice())
                        .map_err(scratch)?;
                }
                Part::Lease(l) => {
                    s.leases += 1;
                    leases.insert(l.id as u64, l.ttl).map_err(scratch)?;
                }
                Part::Auth(row) => {
                    auth.insert(row.key.as_str(), row.value.as_slice())
                        .map_err(scratch)?;
                }
                Part::Member(_) | Part::Alarm(_) | Part::Removed(_) | Part::ClusterParams(_) => {}
            }
        }
        Ok(true)
    })?;
    let io = |source| ConvertError::Write {
        what: "etcd file",
        source,
    };
    let tx = sorter.db().begin_read().map_err(scratch)?;
    let mut w = bbolt::Writer::new(out).map_err(io)?;
    // Buckets in name order, empty ones too: etcd opens them all.
    w.bucket(b"alarm").finish().map_err(io)?;
    let auth_rows = read_all(&tx, AUTH)?;
    let auth_get = |k: &str| auth_rows.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    {
        let mut b = w.bucket(b"auth");
        s.auth_enabled = auth_get("enabled").is_some();
        b.put(b"authEnabled", &[u8::from(s.auth_enabled)])
            .map_err(io)?;
        let revision = auth_get("revision")
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map_or(0, u64::from_le_bytes);
        b.put(b"authRevision", &revision.to_be_bytes())
            .map_err(io)?;
        b.finish().map_err(io)?;
    }
    let bad = |what: &str, source| ConvertError::Row {
        what: what.to_string(),
        source,
    };
    {
        let mut b = w.bucket(b"authRoles");
        for (key, value) in auth_rows.iter().filter(|(k, _)| k.starts_with("role/")) {
            let r = StoredRole::decode(value.as_slice()).map_err(|e| bad(key, e))?;
            let role = EtcdRole {
                name: r.name.clone().into_bytes(),
                key_permission: r.perms,
            };
            s.roles += 1;
            b.put(r.name.as_bytes(), &role.encode_to_vec())
                .map_err(io)?;
        }
        b.finish().map_err(io)?;
    }
    {
        let mut b = w.bucket(b"authUsers");
        for (key, value) in auth_rows.iter().filter(|(k, _)| k.starts_with("user/")) {
            let u = StoredUser::decode(value.as_slice()).map_err(|e| bad(key, e))?;
            let user = EtcdUser {
                name: u.name.clone().into_bytes(),
                options: u
                    .password_hash
                    .is_empty()
                    .then_some(EtcdUserOptions { no_password: true }),
                password: u.password_hash.into_bytes(),
                roles: u.roles,
            };
            s.users += 1;
            b.put(u.name.as_bytes(), &user.encode_to_vec())
                .map_err(io)?;
        }
        b.finish().map_err(io)?;
    }
    w.bucket(b"cluster").finish().map_err(io)?;
    let mut newest = 0;
    {
        let mut b = w.bucket(b"key");
        if let Some(t) = open(&tx, BY_REVISION)? {
            let mut sub = (0, 0);
            for row in t.iter().map_err(scratch)? {
                let (k, v) = row.map_err(scratch)?;
                let (main, key) = k.value();
                sub = if sub.0 == main {
                    (main, sub.1 + 1)
                } else {
                    (main, 0)
                };
                let tombstone = is_tombstone(v.value())?;
                let kv = if tombstone {
                    PbKeyValue {
                        key: key.to_vec(),
                        ..Default::default()
                    }
                } else {
                    let mut kv = PbKeyValue::decode(v.value())
                        .map_err(|e| bad(&format!("the row of {key:?} at {main}"), e))?;
                    kv.key = key.to_vec();
                    kv
                };
                newest = main;
                b.put(&rev_bytes(main, sub.1, tombstone), &kv.encode_to_vec())
                    .map_err(io)?;
            }
        }
        b.finish().map_err(io)?;
    }
    {
        let mut b = w.bucket(b"lease");
        if let Some(t) = open(&tx, LEASES)? {
            for row in t.iter().map_err(scratch)? {
                let (id, ttl) = row.map_err(scratch)?;
                let lease = EtcdLease {
                    id: id.value() as i64,
                    ttl: ttl.value(),
                    remaining_ttl: 0,
                };
                b.put(&id.value().to_be_bytes(), &lease.encode_to_vec())
                    .map_err(io)?;
            }
        }
        b.finish().map_err(io)?;
    }
    w.bucket(b"members").finish().map_err(io)?;
    w.bucket(b"members_removed").finish().map_err(io)?;
    // etcd's revision on opening is the newest row's or the compacted one: a revision past
    // both (none of our writes leaves one, but a bumped restore may) is kept by compacting
    // there, so it never goes back.
    if s.revision > newest.max(s.compacted) && s.revision > 1 {
        s.compacted = s.revision;
    }
    {
        let mut b = w.bucket(b"meta");
        if s.compacted > 0 {
            let rev = rev_bytes(s.compacted, 0, false);
            b.put(b"finishedCompactRev", &rev).map_err(io)?;
            b.put(b"scheduledCompactRev", &rev).map_err(io)?;
        }
        b.finish().map_err(io)?;
    }
    let out = w.finish().map_err(io)?;
    Ok((s, out))
}

fn open<K: redb::Key + 'static, V: redb::Value + 'static>(
    tx: &redb::ReadTransaction,
    table: TableDefinition<K, V>,
) -> Result<Option<redb::ReadOnlyTable<K, V>>, ConvertError> {
    match tx.open_table(table) {
        Ok(t) => Ok(Some(t)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(scratch(e)),
    }
}

/// The auth rows (a few per user and role: held in memory).
fn read_all(
    tx: &redb::ReadTransaction,
    table: TableDefinition<&str, &[u8]>,
) -> Result<Vec<(String, Vec<u8>)>, ConvertError> {
    let mut rows = Vec::new();
    if let Some(t) = open(tx, table)? {
        for row in t.iter().map_err(scratch)? {
            let (k, v) = row.map_err(scratch)?;
            rows.push((k.value().to_string(), v.value().to_vec()));
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::super::dump::PbDump;
    use super::*;

    fn kv(create: i64, rev: i64, version: i64, value: &str, lease: i64) -> Vec<u8> {
        PbKeyValue {
            create_revision: create,
            mod_revision: rev,
            version,
            value: value.into(),
            lease,
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn row(key: &str, revision: u64, record: Vec<u8>) -> PbDumpEntry {
        PbDumpEntry {
            key: key.into(),
            revision,
            record,
            sub: None,
        }
    }

    fn tombstone(rev: i64) -> Vec<u8> {
        PbKeyValue {
            mod_revision: rev,
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn auth(key: &str, value: Vec<u8>) -> PbDumpAuthRow {
        PbDumpAuthRow {
            key: key.into(),
            value,
        }
    }

    /// A dump with what etcd files carry: history with a multi-key revision (a txn) and
    /// tombstones, leases, users and roles, compaction.
    fn sample() -> PbDump {
        let alice = StoredUser {
            name: "alice".into(),
            password_hash: "$2a$10$abcdefghijklmnopqrstuv".into(),
            roles: vec!["reader".into(), "root".into()],
        };
        let nopass = StoredUser {
            name: "svc".into(),
            password_hash: String::new(),
            roles: vec![],
        };
        let reader = StoredRole {
            name: "reader".into(),
            perms: vec![
                Perm {
                    perm_type: 0,
                    key: b"a".to_vec(),
                    range_end: b"b".to_vec(),
                },
                Perm {
                    perm_type: 2,
                    key: b"z".to_vec(),
                    range_end: Vec::new(),
                },
            ],
        };
        PbDump {
            revision: 7,
            compacted: 3,
            history: vec![
                row("a", 2, kv(2, 2, 1, "1", 0)),
                row("a", 5, kv(2, 5, 2, "2", 0)),
                row("b", 4, kv(4, 4, 1, "x", 9)),
                row("b", 6, tombstone(6)),
                row("c", 5, kv(5, 5, 1, "t", 0)),
                row("d", 7, kv(7, 7, 1, &"v".repeat(10_000), 0)),
            ],
            leases: vec![
                PbDumpLease { id: 9, ttl: 60 },
                PbDumpLease { id: -3, ttl: 5 },
            ],
            auth: vec![
                auth("enabled", vec![1]),
                auth("revision", 12u64.to_le_bytes().to_vec()),
                auth("role/reader", reader.encode_to_vec()),
                auth("secret", vec![1, 2, 3]),
                auth("user/alice", alice.encode_to_vec()),
                auth("user/svc", nopass.encode_to_vec()),
            ],
            ..Default::default()
        }
    }

    fn through_etcd(dump: &PbDump) -> (PbDump, EtcdFileSummary, EtcdFileSummary) {
        let work = tempfile::tempdir().unwrap();
        let path = work.path().join("etcd.db");
        let file = std::fs::File::create_new(&path).unwrap();
        let bytes = dump.encode_to_vec();
        let (out_summary, file) = export(bytes.as_slice(), file, work.path()).unwrap();
        file.sync_all().unwrap();
        let len = file.metadata().unwrap().len();
        let mut back = Vec::new();
        let in_summary = import(
            std::fs::File::open(&path).unwrap(),
            len,
            b"sha",
            work.path(),
            &mut back,
        )
        .unwrap();
        let names: Vec<_> = std::fs::read_dir(work.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "scratch files removed: {names:?}");
        (
            PbDump::decode(back.as_slice()).unwrap(),
            out_summary,
            in_summary,
        )
    }

    #[test]
    fn a_dump_comes_back_from_an_etcd_file_as_it_went() {
        let dump = sample();
        let (back, out, imported) = through_etcd(&dump);
        assert_eq!(back.history, dump.history);
        assert_eq!((back.revision, back.compacted), (7, 3));
        let mut leases = dump.leases.clone();
        leases.sort_by_key(|l| l.id.to_be_bytes());
        assert_eq!(back.leases, leases, "in etcd's key order");
        // Every auth row but the secret, which etcd does not keep: a new one is derived.
        let without_secret = |rows: &[PbDumpAuthRow]| -> Vec<PbDumpAuthRow> {
            let mut rows: Vec<_> = rows.iter().filter(|r| r.key != "secret").cloned().collect();
            rows.sort_by(|a, b| a.key.cmp(&b.key));
            rows
        };
        assert_eq!(without_secret(&back.auth), without_secret(&dump.auth));
        let secret = back.auth.iter().find(|r| r.key == "secret").unwrap();
        assert_eq!(secret.value.len(), 32);
        assert_ne!(secret.value, vec![1, 2, 3]);
        let expected = EtcdFileSummary {
            revision: 7,
            compacted: 3,
            rows: 6,
            leases: 2,
            users: 2,
            roles: 1,
            auth_enabled: true,
        };
        assert_eq!((out, imported), (expected, expected));
    }

    #[test]
    fn an_empty_key_space_and_a_revision_past_the_last_row() {
        let (back, _, _) = through_etcd(&PbDump {
            revision: 1,
            ..Default::default()
        });
        assert_eq!(
            (back.revision, back.compacted, back.history.len()),
            (1, 0, 0)
        );
        assert!(
            back.auth
                .iter()
                .all(|r| r.key != "enabled" && r.key != "secret")
        );
        // A bumped restore's revision is past every row: kept by compacting there.
        let mut bumped = sample();
        bumped.revision = 1_000_007;
        let (back, out, _) = through_etcd(&bumped);
        assert_eq!((back.revision, back.compacted), (1_000_007, 1_000_007));
        assert_eq!(out.compacted, 1_000_007);
    }

    /// An etcd 3.5 file's extra meta keys (its Raft state and storage version) are ignored; a
    /// compaction in progress counts as done (etcd finishes it when it opens the file).
    #[test]
    fn an_etcd_35_file_with_its_extra_meta_keys() {
        let work = tempfile::tempdir().unwrap();
        let path = work.path().join("etcd35.db");
        let mut w = bbolt::Writer::new(std::fs::File::create_new(&path).unwrap()).unwrap();
        let mut b = w.bucket(b"key");
        let live = PbKeyValue {
            key: b"k".to_vec(),
            create_revision: 4,
            mod_revision: 4,
            version: 1,
            value: b"v".to_vec(),
            lease: 0,
        };
        b.put(&rev_bytes(4, 0, false), &live.encode_to_vec())
            .unwrap();
        b.finish().unwrap();
        let mut b = w.bucket(b"meta");
        for (k, v) in [
            (&b"confState"[..], &b"{\"voters\":[1]}"[..]),
            (b"consistent_index", &9u64.to_be_bytes()),
            (b"finishedCompactRev", &rev_bytes(2, 0, false)),
            (b"scheduledCompactRev", &rev_bytes(3, 0, false)),
            (b"storageVersion", b"3.5.0"),
            (b"term", &2u64.to_be_bytes()),
        ] {
            b.put(k, v).unwrap();
        }
        b.finish().unwrap();
        let file = w.finish().unwrap();
        let len = file.metadata().unwrap().len();
        let mut out = Vec::new();
        let s = import(file, len, b"sha", work.path(), &mut out).unwrap();
        assert_eq!((s.revision, s.compacted, s.rows), (4, 3, 1));
        let d = PbDump::decode(out.as_slice()).unwrap();
        assert_eq!(d.history.len(), 1);
        // A bbolt file without a key bucket is not an etcd key space.
        let other = work.path().join("other.db");
        let w = bbolt::Writer::new(std::fs::File::create_new(&other).unwrap()).unwrap();
        let file = w.finish().unwrap();
        let len = file.metadata().unwrap().len();
        let err = import(file, len, b"", work.path(), &mut Vec::new()).unwrap_err();
        assert!(
            matches!(err, ConvertError::NotEtcd(_)) && err.to_string().contains("no `key` bucket"),
            "{err}"
        );
    }

    #[test]
    fn revision_bytes_are_etcds() {
        let b = rev_bytes(0x0102, 3, false);
        assert_eq!(b, [0, 0, 0, 0, 0, 0, 1, 2, b'_', 0, 0, 0, 0, 0, 0, 0, 3]);
        assert_eq!(parse_rev(&b), Some((0x0102, false)));
        assert_eq!(parse_rev(&rev_bytes(9, 0, true)), Some((9, true)));
        for bad in [&b[..16], b"0123456789abcdefgh", &[0u8; 19][..]] {
            assert_eq!(parse_rev(bad), None, "{bad:?}");
        }
    }
}
