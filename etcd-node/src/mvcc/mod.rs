//! The MVCC key space, on redb: every change of a key is kept under (key, revision) until a
//! compaction removes what no reader may ask for any more.
//!
//! Tables (`docs/formats.md`):
//! - `history`: (key, main revision) -> the key's `KeyValue` at that revision (key and value
//!   fields empty; a tombstone has version 0) after the number of its value's row in `values`
//!   ([`record`]); a key's newest row is its state (a key is live unless that row is a
//!   tombstone), and reads at the newest revision take it;
//! - `values`: value number -> value bytes, appended ([`record`]);
//! - `current`: an empty table of another type than format 1's `current` (key -> record), so
//!   that a binary from before format 2 refuses the file instead of finding no keys in it;
//! - `meta`: `format` ([`FORMAT`]; an older binary's files are upgraded when opened, a newer
//!   one's refused), `revision` (newest main revision), `compact` (compacted revision), `applied` (the
//!   last Raft index applied, committed in the same transaction as its changes, so replaying
//!   the log after a crash never applies an entry twice), `member_id` and `cluster_id` (this
//!   member's identity, fixed when it bootstraps or joins), `values` (the last value number);
//! - `values_aside`: only while a file of format 1 or 2 is being upgraded (its values moved);
//! - `members`: member id -> etcd's `Member` (name, peer URLs, learner flag): the cluster's
//!   members as the applied configuration changes left them, seeded at bootstrap from
//!   `--initial-cluster`;
//! - `removed`: member id -> nothing: every member an applied change removed (ids are never
//!   reused), so that their messages are refused;
//! - `leases`: lease id -> its granted TTL in seconds (when it expires is the leader's business,
//!   in memory: a revoke goes through Raft);
//! - `lease_keys`: (lease id, key) -> nothing: the live keys attached to each lease;
//! - `alarms`: (member id, alarm type) -> nothing: the raised alarms (NOSPACE, CORRUPT), as
//!   etcd keeps them, applied through Raft so every member refuses the same writes;
//! - `auth`: users, roles, permissions and whether auth is on ([`auth`]);
//! - `cluster`: `version` and `features` (comma-separated), the cluster's parameters as the
//!   leader last recorded them (`crate::version`).
//!
//! Applying is deterministic: every node computes the same revisions, results and errors from
//! the same entries. Requests are checked ([`check`]) before they are proposed; what can only
//! be known against the data (a missing key for `ignore_value`, a compacted revision) is decided
//! here and is the same on every node.

mod apply;
pub mod auth;
mod defrag;
mod dump;
pub mod etcd;
pub mod events;
mod range;
mod record;
pub mod request;
mod sealed;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use etcd_client::proto::{PbAlarmMember, PbEvent, PbKeyValue, PbMember};
use prost::Message;
use redb::{
    Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction,
};

use crate::errors::EtcdError;
use crate::version::ClusterParams;
pub use apply::Applied;
pub use dump::{DumpError, Hashing, rewrite, summarize};
use dump::{Part, Parts, PbDump, PbDumpAuthRow, PbDumpEntry, PbDumpLease, write_part};
pub use range::RangeOutput;
pub use request::{
    ClusterParamsSet, MemberAttrsSet, MemberChange, Op, Proposal, Response, check, needs_space,
};
use sealed::{meta_get, meta_set};

const HISTORY: TableDefinition<(&[u8], u64), &[u8]> = TableDefinition::new("history");
/// Formats 2 and 3: key -> the revision of its newest `history` row (dropped when opened: the
/// newest row says the same).
const LIVE: TableDefinition<&[u8], u64> = TableDefinition::new("live");
/// Format 1's table of live records (dropped when opened: `history` holds the same).
const FORMAT1_CURRENT: TableDefinition<&[u8], &[u8]> = TableDefinition::new("current");
/// Format 2 onwards: the same name with other types, which format-1 binaries fail to open.
const DOWNGRADE_GUARD: TableDefinition<u64, ()> = TableDefinition::new("current");
/// While a file is being upgraded to format 3: `after` -> the last (key, revision) whose value
/// was moved ([`values_aside`]).
const VALUES_ASIDE: TableDefinition<&str, (&[u8], u64)> = TableDefinition::new("values_aside");
/// History rows per transaction of the upgrade to format 3.
const ASIDE_CHUNK: usize = if cfg!(test) { 5_000 } else { 50_000 };
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
// The small tables: sealed rows ([`sealed`]), a payload and its checksum.
const MEMBERS: sealed::Def<u64> = TableDefinition::new("members");
const REMOVED: sealed::Def<u64> = TableDefinition::new("removed");
const LEASES: sealed::Def<i64> = TableDefinition::new("leases");
const LEASE_KEYS: sealed::Def<(i64, &[u8])> = TableDefinition::new("lease_keys");
const ALARMS: sealed::Def<(u64, i32)> = TableDefinition::new("alarms");
// (text keys as bytes: a damaged key is then found by its checksum, where redb's `&str` would
// panic decoding it)
const AUTH: sealed::Def<&[u8]> = TableDefinition::new("auth");
const CLUSTER: sealed::Def<&[u8]> = TableDefinition::new("cluster");

/// The key space's page cache unless configured (`--backend-cache-bytes`; redb's own default
/// is 1 GiB, which made a member's memory grow with its data). 16 MiB: 64 MiB made puts and
/// ranges no faster after 200,000 writes over 100,000 keys, and cost 48 MB more per member
/// (docs/benchmarks.md); pages past it are read through the kernel's page cache.
pub const DEFAULT_CACHE_BYTES: usize = 16 << 20;

/// The key-space file's format. 1: a `current` table held a copy of every live key's record;
/// 2: `live` holds only the revision of the record in `history` (a record is stored once);
/// 3: values in a table of their own, appended ([`record`]); 4: no `live` table (a key's
/// newest `history` row says the same); 5: the small tables' rows and `meta`'s carry checksums
/// ([`sealed`]); 6: values may be stored compressed ([`record`]).
pub const FORMAT: u64 = 6;

/// What a committed entry asks of the store.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Nothing (an empty entry, a configuration change without member data, undecodable data).
    Noop,
    Kv(Proposal),
    Member(MemberChange),
}

/// A storage failure: the node cannot go on safely (the caller stops it).
#[derive(Debug, thiserror::Error)]
#[error("key-value store {path}: {message}")]
pub struct StoreError {
    pub path: String,
    pub message: String,
    /// The file is damaged (a checksum failed, or redb found its structure broken): the data
    /// read is wrong, not merely unreachable. The corruption check raises CORRUPT on it.
    pub damaged: bool,
}

/// `e`, met on the file at `path`, as a [`StoreError`].
fn store_error<E: std::fmt::Display + 'static>(path: &str, e: E) -> StoreError {
    StoreError {
        path: path.to_string(),
        message: e.to_string(),
        damaged: is_damage(&e),
    }
}

/// `e`, met opening the key-space file at `path`, as a [`StoreError`]. redb refuses a file that
/// is not one of its databases (no magic number at its start: a creation a crash interrupted,
/// in a build that did not yet create the file aside, or other bytes) as invalid data, not as
/// `Corrupted`: that too says the file is damaged.
fn open_error(path: &str, e: redb::DatabaseError) -> StoreError {
    let not_a_database = matches!(
        &e,
        redb::DatabaseError::Storage(redb::StorageError::Io(io))
            if io.kind() == std::io::ErrorKind::InvalidData
    );
    let mut error = store_error(path, e);
    error.damaged |= not_a_database;
    error
}

/// Whether a failure says the file is damaged. The callers pass redb's errors of every kind,
/// io errors and messages alike: only redb's say it, as `Corrupted` (which the row checksums of
/// record.rs also use), directly or as the storage error under a table, transaction or commit.
fn is_damage(e: &dyn std::any::Any) -> bool {
    use redb::{CommitError, StorageError, TableError, TransactionError};
    let storage = e
        .downcast_ref::<StorageError>()
        .or_else(|| match e.downcast_ref::<TableError>() {
            Some(TableError::Storage(s)) => Some(s),
            _ => None,
        })
        .or_else(|| match e.downcast_ref::<TransactionError>() {
            Some(TransactionError::Storage(s)) => Some(s),
            _ => None,
        })
        .or_else(|| match e.downcast_ref::<CommitError>() {
            Some(CommitError::Storage(s)) => Some(s),
            _ => None,
        });
    matches!(storage, Some(StorageError::Corrupted(_)))
        || matches!(e.downcast_ref(), Some(redb::Error::Corrupted(_)))
}

/// What applying a batch of entries did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// One per entry (see [`Applied`]).
    pub results: Vec<Applied>,
    /// What the batch changed, in order: the events watchers are sent, without the previous
    /// records (a watcher that wants them has [`Mvcc::fill_prev`] read them).
    pub events: Vec<PbEvent>,
    /// The store's revision after the batch.
    pub revision: u64,
}

/// A lease as stored: its granted TTL in seconds and its keys.
pub type LeaseRecord = (i64, Vec<Vec<u8>>);

/// The MVCC store of one member.
#[derive(Debug)]
pub struct Mvcc {
    /// Shared by every reader and writer; held exclusively only to compact the file
    /// (Defragment), which redb allows only with no transaction open.
    db: RwLock<Database>,
    path: String,
    /// The page cache's size (`--backend-cache-bytes`), for the file a defragment writes.
    cache_bytes: usize,
    /// Whether auth is on, as applied (every request asks: kept here, not read from redb).
    auth_on: AtomicBool,
    /// The encoded size of what was applied since the last durable commit: redb may hold those
    /// pages in memory, not in the file yet, so [`Mvcc::db_size`] adds it.
    unsynced_bytes: AtomicU64,
    /// The file's space on disk as the last commit left it (the applier's commits, a restore,
    /// a defragment and the open read it again; the few rows of `set_identity` and
    /// `seed_members` leave it): what [`Mvcc::db_size_at_commit`] counts.
    file_bytes: AtomicU64,
    /// The `removed` table, as applied (the peer service asks at every message).
    removed: RwLock<BTreeSet<u64>>,
    /// The `cluster` table, as applied (None: not decided yet).
    params: RwLock<Option<ClusterParams>>,
    /// Batches applied and not committed yet, in the applier's open transaction: see
    /// [`Mvcc::apply`]. Any other use of the database commits it first ([`Mvcc::db`]).
    pending: Mutex<Option<Pending>>,
    /// Whether `pending` holds a transaction (readers skip the lock when not). Set after the
    /// transaction is stored, cleared after it is committed.
    has_pending: AtomicBool,
    /// A commit of applied entries failed: what it held may be lost from the key space (not
    /// from the WAL), so nothing more is applied or served.
    failed: AtomicBool,
    /// Commits of applied entries without an fsync since the last durable one of them: redb
    /// reuses the pages each frees only after the next durable commit, so their number bounds
    /// how far the file grows past what it holds ([`Mvcc::unsynced_commits`]). A durable
    /// commit outside the applier's (a compaction, Defragment) does not reset it: the next
    /// durable commit only comes sooner.
    unsynced_commits: AtomicU64,
    /// Told how long each commit of applied entries took (the server's metrics).
    on_commit: OnceLock<CommitObserver>,
}

/// What [`Mvcc::observe_commits`] was given.
struct CommitObserver(Box<dyn Fn(Duration) + Send + Sync>);

impl std::fmt::Debug for CommitObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CommitObserver")
    }
}

/// The applier's transaction, left open between batches.
struct Pending {
    tx: WriteTransaction,
    /// When its first batch was applied.
    since: Instant,
    /// Entries it holds.
    entries: usize,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("since", &self.since)
            .field("entries", &self.entries)
            .finish_non_exhaustive()
    }
}

/// How long applied batches may wait in the applier's open transaction before it is committed,
/// and how many entries it may hold. Each commit of the key space costs about as much as
/// applying a few puts (redb writes its changed pages and its allocator state); a reader that
/// comes meanwhile commits it first, so no read misses what was applied before it started.
const DEFER_COMMIT: Duration = Duration::from_millis(5);
const DEFER_ENTRIES: usize = 512;

impl Drop for Mvcc {
    /// What the applier left open is committed (without an fsync, as it would have been): a
    /// store opened again in this process finds it.
    fn drop(&mut self) {
        if let Err(e) = self.settle() {
            tracing::error!(error = %e, "committing the last applied entries at close failed; they are applied again from the WAL at start");
        }
    }
}

/// `path` with `suffix` added to its name: a file written beside the key space's file before it
/// is renamed over it.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Removes the file `aside`, written beside the key space's file and left by a crash before it
/// was renamed into place (so it holds nothing the key space needs); `what` names it in the log.
fn remove_aside(aside: &Path, what: &str) -> std::io::Result<()> {
    match std::fs::remove_file(aside) {
        Ok(()) => {
            tracing::info!(file = %aside.display(), "removed {what}");
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates an empty key-space file at `path` when there is none. redb sizes a new file, then
/// writes its header and, after an fsync, the magic number that marks it a database: a process
/// that dies in between (a crash, or a SIGTERM in a new member's first moments) leaves a file
/// every later open refuses ("Not a redb database: magic number mismatch"), and the member
/// could not start again. So the file is made beside `path` (`<path>.creating`, replaced if a
/// crash left one) and renamed into place, durably, once redb has finished it: `path` is
/// either absent or a whole database.
fn create_if_absent(path: &Path) -> Result<(), redb::Error> {
    let aside = beside(path, ".creating");
    remove_aside(
        &aside,
        "a key-space file whose creation a crash interrupted",
    )?;
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        other => return other.map(|_| ()).map_err(redb::Error::from),
    }
    drop(redb::Builder::new().create(&aside)?);
    crate::crash!("kv-create-before-rename");
    crate::storage::rename_durably(&aside, path)?;
    Ok(())
}

/// Where the store stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Position {
    /// The newest revision (1 in an empty store, as in etcd).
    pub revision: u64,
    pub compacted: u64,
    /// The last Raft index applied.
    pub applied: u64,
}

impl Mvcc {
    /// Opens (creating) the store at `path`, with the default cache.
    pub fn open(path: &Path) -> Result<Mvcc, StoreError> {
        Self::open_with_cache(path, DEFAULT_CACHE_BYTES)
    }

    /// Opens (creating) the store at `path`, caching at most `cache_bytes` of its pages in
    /// memory (reads beyond come from the file, through the kernel's page cache).
    pub fn open_with_cache(path: &Path, cache_bytes: usize) -> Result<Mvcc, StoreError> {
        let name = path.display().to_string();
        defrag::remove_leftover(path).map_err(|e| store_error(&name, e))?;
        create_if_absent(path).map_err(|e| store_error(&name, e))?;
        let db = redb::Builder::new()
            .set_cache_size(cache_bytes)
            .create(path)
            .map_err(|e| open_error(&name, e))?;
        let mvcc = Mvcc {
            db: RwLock::new(db),
            path: name.clone(),
            cache_bytes,
            auth_on: AtomicBool::new(false),
            unsynced_bytes: AtomicU64::new(0),
            file_bytes: AtomicU64::new(0),
            removed: RwLock::default(),
            params: RwLock::default(),
            pending: Mutex::new(None),
            has_pending: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            unsynced_commits: AtomicU64::new(0),
            on_commit: OnceLock::new(),
        };
        let tx = mvcc
            .db()?
            .begin_write()
            .map_err(|e| store_error(&name, e))?;
        let format = stored_format(&tx, &name)?;
        upgrade(&tx, &name, format).map_err(|e| store_error(&name, e))?;
        {
            tx.open_table(HISTORY).map_err(|e| store_error(&name, e))?;
            tx.open_table(record::VALUES)
                .map_err(|e| store_error(&name, e))?;
            tx.open_table(MEMBERS).map_err(|e| store_error(&name, e))?;
            tx.open_table(REMOVED).map_err(|e| store_error(&name, e))?;
            tx.open_table(CLUSTER).map_err(|e| store_error(&name, e))?;
            tx.open_table(LEASES).map_err(|e| store_error(&name, e))?;
            tx.open_table(AUTH).map_err(|e| store_error(&name, e))?;
            tx.open_table(LEASE_KEYS)
                .map_err(|e| store_error(&name, e))?;
            tx.open_table(ALARMS).map_err(|e| store_error(&name, e))?;
            let mut meta = tx.open_table(META).map_err(|e| store_error(&name, e))?;
            if meta_get(&meta, "revision").map_err(|e| store_error(&name, e))? == 0 {
                meta_set(&mut meta, "revision", 1).map_err(|e| store_error(&name, e))?;
            }
        }
        tx.commit().map_err(|e| store_error(&name, e))?;
        values_aside(&*mvcc.db()?, &name).map_err(|e| store_error(&name, e))?;
        mvcc.committed();
        mvcc.refresh_auth_on()?;
        mvcc.refresh_removed()?;
        mvcc.refresh_params()?;
        Ok(mvcc)
    }

    /// (bytes of pages allocated, bytes of keys and values stored) in the file, which grows in
    /// steps ahead of what it holds. Takes the write lock for a moment: not for hot paths.
    pub fn space(&self) -> Result<(u64, u64), StoreError> {
        let (db, _settled) = self.for_writing()?;
        let tx = db.begin_write().map_err(|e| self.fail(e))?;
        let stats = tx.stats().map_err(|e| self.fail(e))?;
        let allocated = stats.allocated_pages() * stats.page_size() as u64;
        let stored = stats.stored_bytes();
        tx.abort().map_err(|e| self.fail(e))?;
        Ok((allocated, stored))
    }

    /// Is auth on (as applied)?
    pub fn auth_enabled(&self) -> bool {
        self.auth_on.load(Ordering::Acquire)
    }

    fn refresh_auth_on(&self) -> Result<(), StoreError> {
        // (every row read, and so checked: a flipped bit in the `enabled` row's key must not
        // turn auth off unseen)
        let on = self.auth_rows("")?.iter().any(|(key, _)| key == "enabled");
        self.auth_on.store(on, Ordering::Release);
        Ok(())
    }

    /// The database, shared (Defragment takes it alone), as it is: what the applier holds is not
    /// committed by taking it.
    fn shared(&self) -> RwLockReadGuard<'_, Database> {
        self.db.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// The database, for the length of one operation (its transactions end before the guard
    /// does, so Defragment never finds one open), with everything applied committed: a read
    /// sees every write answered before it started.
    fn db(&self) -> Result<RwLockReadGuard<'_, Database>, StoreError> {
        let db = self.shared();
        self.settle()?;
        self.intact()?;
        Ok(db)
    }

    /// An error once a commit of applied entries failed: the key space lacks writes that were
    /// answered, and must serve nothing more (the member stops; at its next start the WAL
    /// applies them again).
    fn intact(&self) -> Result<(), StoreError> {
        if self.failed.load(Ordering::Acquire) {
            return Err(self.fail(
                "a commit of entries applied earlier failed, so they are not in the key space; restart the member to apply them again from its WAL",
            ));
        }
        Ok(())
    }

    /// Has `observe` told how long each commit of applied entries takes, whoever makes it (the
    /// applier, or a reader that needs what it holds); the first observer given stays.
    pub fn observe_commits(&self, observe: impl Fn(Duration) + Send + Sync + 'static) {
        let _ = self.on_commit.set(CommitObserver(Box::new(observe)));
    }

    /// Commits the applier's pending transaction, if there is one.
    fn settle(&self) -> Result<(), StoreError> {
        if !self.has_pending.load(Ordering::Acquire) {
            return Ok(());
        }
        self.settled().map(drop)
    }

    /// The applier's slot, its transaction committed, locked: a write transaction begun while
    /// it is held does not wait for one the applier would open meanwhile.
    fn settled(&self) -> Result<MutexGuard<'_, Option<Pending>>, StoreError> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = pending.take() {
            self.commit_with(p.tx, false)?;
        }
        Ok(pending)
    }

    /// The database and the applier's slot, settled and locked, for a write transaction other
    /// than the applier's (which would otherwise wait for the applier's next commit).
    fn for_writing(
        &self,
    ) -> Result<
        (
            RwLockReadGuard<'_, Database>,
            MutexGuard<'_, Option<Pending>>,
        ),
        StoreError,
    > {
        let db = self.shared();
        let settled = self.settled()?;
        self.intact()?;
        Ok((db, settled))
    }

    /// Commits `tx`, the applier's (with an fsync if `durable`); on failure nothing more is
    /// applied (what it held is not in the key space, and later entries build on it).
    fn commit_with(&self, mut tx: WriteTransaction, durable: bool) -> Result<(), StoreError> {
        let durability = if durable {
            Durability::Immediate
        } else {
            Durability::None
        };
        let started = Instant::now();
        let committed = tx
            .set_durability(durability)
            .map_err(|e| self.fail(e))
            .and_then(|()| tx.commit().map_err(|e| self.fail(e)));
        self.committed();
        if let Some(CommitObserver(observe)) = self.on_commit.get() {
            observe(started.elapsed());
        }
        self.failed.fetch_or(committed.is_err(), Ordering::AcqRel);
        self.has_pending.store(false, Ordering::Release);
        if durable {
            self.unsynced_commits.store(0, Ordering::Release);
        } else {
            self.unsynced_commits.fetch_add(1, Ordering::AcqRel);
        }
        committed
    }

    /// Commits of applied entries without an fsync since the key space was last made durable
    /// (by the applier, or by a reader that needed what it held).
    pub fn unsynced_commits(&self) -> u64 {
        self.unsynced_commits.load(Ordering::Acquire)
    }

    /// Compacts the database file (etcd's Defragment): waits for the operations under way,
    /// holds off new ones until done; the file shrinks to what the key space uses. The rows
    /// are copied into a new file that replaces this one ([`defrag`]), or compacted in place by
    /// redb when the disk has no room for the copy, the copy fails, or the file holds a table
    /// this release does not copy.
    pub fn defragment(&self) -> Result<(), StoreError> {
        let mut db = self.db.write().unwrap_or_else(PoisonError::into_inner);
        self.settle()?;
        let path = Path::new(&self.path);
        let copy = if !defrag::room_for_copy(path) {
            tracing::info!(file = %self.path, "no room on the disk for a copy of the key space: compacting it in place");
            None
        } else {
            // (None: a table this release does not copy, which redb's compaction keeps)
            defrag::copied(&db, path, self.cache_bytes).unwrap_or_else(|e| {
                tracing::warn!(error = %e, "could not copy the key space into a new file: compacting it in place");
                None
            })
        };
        match copy {
            Some(copy) => {
                // (the old file is gone: the copy is the key space from now on, whatever comes)
                *db = copy;
                if let Err(e) = defrag::sync_renamed(path) {
                    // Unsynced, the rename could be undone by a power cut, bringing back the
                    // old file without what is applied from now on: nothing more is applied.
                    self.failed.store(true, Ordering::Release);
                    let e = format!("making the defragmented file's rename durable: {e}");
                    tracing::error!(file = %self.path, error = %e, "the key space applies nothing more");
                    return Err(self.fail(e));
                }
            }
            None => while db.compact().map_err(|e| self.fail(e))? {},
        }
        // (compaction commits durably: everything applied is in the file)
        self.unsynced_bytes.store(0, Ordering::Release);
        self.committed();
        Ok(())
    }

    fn fail<E: std::fmt::Display + 'static>(&self, e: E) -> StoreError {
        store_error(&self.path, e)
    }

    /// Revision, compacted revision and applied index.
    pub fn position(&self) -> Result<Position, StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        let meta = tx.open_table(META).map_err(|e| self.fail(e))?;
        let get = |k| meta_get(&meta, k).map_err(|e| self.fail(e));
        Ok(Position {
            revision: get("revision")?,
            compacted: get("compact")?,
            applied: get("applied")?,
        })
    }

    /// The disk space the database file takes, in bytes (its size in etcd's terms: the quota,
    /// Status and `etcd_mvcc_db_total_size_in_bytes` use it).
    pub fn db_size(&self) -> u64 {
        // redb grows its file in steps that double (270 MB, 540 MB, 1.08 GB, 2.16 GB, ...) and
        // leaves the step's unused end a hole: its length would trip a 2 GiB quota with half of
        // it used. What the disk holds is what grows with the data (etcd: "physically
        // allocated"), plus what was applied since the last durable commit, which redb may keep
        // in memory until then (counted twice if some reached the file: the size errs high).
        self.committed() + self.unsynced_bytes.load(Ordering::Acquire)
    }

    /// [`Mvcc::db_size`] as of the last commit, read from memory: a write's quota check asks
    /// this, as etcd's asks the backend size its last commit recorded. (Asking the file
    /// system was a `statx` per write; the applier commits every few milliseconds under
    /// writes, and every commit reads the file's size again.)
    pub fn db_size_at_commit(&self) -> u64 {
        self.file_bytes.load(Ordering::Acquire) + self.unsynced_bytes.load(Ordering::Acquire)
    }

    /// Reads the file's space on disk (after a commit), records it for
    /// [`Mvcc::db_size_at_commit`] and returns it.
    fn committed(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let on_disk = std::fs::metadata(&self.path).map_or(0, |m| m.len().min(m.blocks() * 512));
        self.file_bytes.store(on_disk, Ordering::Release);
        on_disk
    }

    /// The auth rows whose key starts with `prefix` ([`auth`] lists them), in key order.
    pub fn auth_rows(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        read_auth(&tx, prefix).map_err(|e| self.fail(e))
    }

    /// One auth row.
    pub fn auth_row(&self, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        let table = sealed::read(&tx, AUTH).map_err(|e| self.fail(e))?;
        table.get(key.as_bytes()).map_err(|e| self.fail(e))
    }

    /// The raised alarms, by member.
    pub fn alarms(&self) -> Result<Vec<PbAlarmMember>, StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        read_alarms(&tx).map_err(|e| self.fail(e))
    }

    /// This member's id and its cluster's id, once stored (0 before).
    pub fn identity(&self) -> Result<(u64, u64), StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        let meta = tx.open_table(META).map_err(|e| self.fail(e))?;
        let get = |k| meta_get(&meta, k).map_err(|e| self.fail(e));
        Ok((get("member_id")?, get("cluster_id")?))
    }

    /// Stores this member's id and its cluster's id, durably.
    pub fn set_identity(&self, member_id: u64, cluster_id: u64) -> Result<(), StoreError> {
        let (db, _settled) = self.for_writing()?;
        let mut tx = db.begin_write().map_err(|e| self.fail(e))?;
        tx.set_durability(Durability::Immediate)
            .map_err(|e| self.fail(e))?;
        {
            let mut meta = tx.open_table(META).map_err(|e| self.fail(e))?;
            meta_set(&mut meta, "member_id", member_id).map_err(|e| self.fail(e))?;
            meta_set(&mut meta, "cluster_id", cluster_id).map_err(|e| self.fail(e))?;
        }
        tx.commit().map_err(|e| self.fail(e))
    }

    /// The members, by id.
    pub fn members(&self) -> Result<Vec<PbMember>, StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        self.read_members(&tx)
    }

    /// Did an applied change remove member `id` from the cluster?
    pub fn was_removed(&self, id: u64) -> bool {
        self.removed
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&id)
    }

    /// The cluster's version and features as the leader last recorded them (None: not yet).
    pub fn cluster_params(&self) -> Option<ClusterParams> {
        self.params
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Is cluster feature `name` on (recorded on by the leader)?
    pub fn cluster_feature(&self, name: &str) -> bool {
        self.params
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|p| p.features.contains(name))
    }

    fn refresh_params(&self) -> Result<(), StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        let set = read_params(&tx).map_err(|e| self.fail(e))?;
        *self.params.write().unwrap_or_else(PoisonError::into_inner) = set.map(|p| ClusterParams {
            version: p.version,
            features: p.features.into_iter().collect(),
        });
        Ok(())
    }

    fn refresh_removed(&self) -> Result<(), StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        let ids = read_removed(&tx).map_err(|e| self.fail(e))?;
        *self.removed.write().unwrap_or_else(PoisonError::into_inner) = ids.into_iter().collect();
        Ok(())
    }

    /// The members as `tx` sees them.
    fn read_members(&self, tx: &redb::ReadTransaction) -> Result<Vec<PbMember>, StoreError> {
        let table = sealed::read(tx, MEMBERS).map_err(|e| self.fail(e))?;
        let mut out = Vec::new();
        for row in table.iter().map_err(|e| self.fail(e))? {
            let (_, v) = row.map_err(|e| self.fail(e))?;
            out.push(PbMember::decode(v.as_slice()).map_err(|e| {
                self.fail(redb::StorageError::Corrupted(format!("member record: {e}")))
            })?);
        }
        Ok(out)
    }

    /// Stores `members` durably unless members are stored already (bootstrap, and stores from
    /// before the table existed).
    pub fn seed_members(&self, members: &[PbMember]) -> Result<(), StoreError> {
        let (db, _settled) = self.for_writing()?;
        let mut tx = db.begin_write().map_err(|e| self.fail(e))?;
        tx.set_durability(Durability::Immediate)
            .map_err(|e| self.fail(e))?;
        {
            let mut table = sealed::write(&tx, MEMBERS).map_err(|e| self.fail(e))?;
            if table.is_empty().map_err(|e| self.fail(e))? {
                for m in members {
                    table
                        .insert(m.id, m.encode_to_vec().as_slice())
                        .map_err(|e| self.fail(e))?;
                }
            }
        }
        tx.commit().map_err(|e| self.fail(e))
    }

    /// Applies committed entries; `durable` commits everything applied with an fsync (required
    /// before the Raft log behind `applied` is compacted). Entries at or below the stored
    /// applied index were applied before a restart and are skipped (`None`), as are commands
    /// that answer nothing (`Noop`, `Member`).
    ///
    /// Otherwise the batch joins the applier's open transaction, which is committed (without an
    /// fsync) once it is [`DEFER_COMMIT`] old or holds [`DEFER_ENTRIES`] entries, or as soon as
    /// anything else uses the database ([`Mvcc::db`]): a reader never misses a write answered
    /// before it started, and a busy applier commits once per several batches instead of once
    /// per batch. What is applied and not committed is lost in a crash, as a commit without an
    /// fsync is: the WAL's entries are applied again at start.
    pub fn apply(&self, entries: &[(u64, Command)], durable: bool) -> Result<Outcome, StoreError> {
        self.intact()?;
        let db = self.shared();
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let (tx, since, held) = match pending.take() {
            Some(p) => (p.tx, p.since, p.entries),
            None => {
                let tx = db.begin_write().map_err(|e| self.fail(e))?;
                (tx, Instant::now(), 0)
            }
        };
        let outcome = self.apply_in(&tx, entries).inspect_err(|_| {
            // (the transaction is dropped with the batches it held: nothing more is applied)
            self.failed.fetch_or(held > 0, Ordering::AcqRel);
        })?;
        crate::crash!("apply-before-commit");
        let held = held + entries.len();
        if durable || held >= DEFER_ENTRIES || since.elapsed() >= DEFER_COMMIT {
            // (visible first: readers do not wait for the fsync, which makes what is committed
            // durable)
            self.commit_with(tx, false)?;
            if durable {
                let tx = db.begin_write().map_err(|e| self.fail(e))?;
                self.commit_with(tx, true)?;
            }
        } else {
            *pending = Some(Pending {
                tx,
                since,
                entries: held,
            });
            self.has_pending.store(true, Ordering::Release);
        }
        crate::crash!("apply-after-commit");
        drop(pending);
        if durable {
            self.unsynced_bytes.store(0, Ordering::Release);
        } else {
            let applied: usize = entries
                .iter()
                .map(|(_, c)| match c {
                    Command::Kv(p) => p.encoded_len(),
                    _ => 0,
                })
                .sum();
            self.unsynced_bytes
                .fetch_add(applied as u64, Ordering::AcqRel);
        }
        // (the guard goes first: reading it again while Defragment waits would deadlock)
        drop(db);
        let has_op = |wanted: fn(&Op) -> bool| {
            entries
                .iter()
                .any(|(_, c)| matches!(c, Command::Kv(Proposal { op: Some(op), .. }) if wanted(op)))
        };
        if has_op(|op| matches!(op, Op::Auth(_))) {
            self.refresh_auth_on()?;
        }
        if entries
            .iter()
            .any(|(_, c)| matches!(c, Command::Member(m) if m.remove))
        {
            self.refresh_removed()?;
        }
        if has_op(|op| matches!(op, Op::ClusterParams(_))) {
            self.refresh_params()?;
        }
        Ok(outcome)
    }

    /// Applies `entries` in `tx` (see [`Mvcc::apply`]).
    fn apply_in(
        &self,
        tx: &WriteTransaction,
        entries: &[(u64, Command)],
    ) -> Result<Outcome, StoreError> {
        let mut w = apply::Writer::open(tx).map_err(|e| self.fail(e))?;
        let mut out = Vec::with_capacity(entries.len());
        for (index, command) in entries {
            if *index <= w.applied {
                out.push(None);
                continue;
            }
            let r = match command {
                Command::Noop => None,
                Command::Kv(p) => Some(w.apply(&p.op).map_err(|e| self.fail(e))?),
                Command::Member(c) => {
                    if let Some(m) = &c.member {
                        // (opened here, not per batch: membership changes are rare)
                        let mut members = sealed::write(tx, MEMBERS).map_err(|e| self.fail(e))?;
                        if c.remove {
                            members.remove(m.id).map_err(|e| self.fail(e))?;
                            let mut removed =
                                sealed::write(tx, REMOVED).map_err(|e| self.fail(e))?;
                            removed.insert(m.id, &[]).map_err(|e| self.fail(e))?;
                        } else {
                            members
                                .insert(m.id, m.encode_to_vec().as_slice())
                                .map_err(|e| self.fail(e))?;
                        }
                    }
                    None
                }
            };
            w.applied = *index;
            out.push(r);
        }
        let (events, revision) = (std::mem::take(&mut w.events), w.revision);
        w.finish().map_err(|e| self.fail(e))?;
        Ok(Outcome {
            results: out,
            events,
            revision,
        })
    }

    /// The events on the keys of `[start, end)` from revision `from` to the newest, and the
    /// newest revision; `Err(compacted)` when `from` is below the compacted revision (those
    /// events are gone).
    pub fn events(
        &self,
        start: &[u8],
        end: &[u8],
        from: u64,
    ) -> Result<Result<(Vec<PbEvent>, u64), u64>, StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        let read = || -> Result<Result<(Vec<PbEvent>, u64), u64>, redb::Error> {
            let meta = tx.open_table(META)?;
            let (revision, compacted) = (
                meta_get(&meta, "revision")?.max(1),
                meta_get(&meta, "compact")?,
            );
            if from < compacted {
                return Ok(Err(compacted));
            }
            let tables = (&tx.open_table(HISTORY)?, &tx.open_table(record::VALUES)?);
            Ok(Ok((
                events::replay(tables, start, end, from, revision)?,
                revision,
            )))
        };
        read().map_err(|e| self.fail(e))
    }

    /// Makes everything applied so far durable (before the Raft log behind it is compacted, and
    /// every `--backend-batch-limit` entries or `--backend-batch-interval`).
    pub fn sync(&self) -> Result<(), StoreError> {
        crate::storage_error!("kv-sync-enospc", crate::failpoint::ENOSPC, |e| self.fail(e));
        crate::storage_error!("kv-sync-eio", crate::failpoint::EIO, |e| self.fail(e));
        self.apply(&[], true).map(|_| ())
    }

    /// Gives each of `events` (applied changes) that has none its key's record just before it
    /// (`prev_kv`), as etcd reads it for a watcher that asked for it when it sends the event:
    /// none for a put that created the key, none when that revision was compacted since.
    pub fn fill_prev(&self, events: &mut [PbEvent]) -> Result<(), StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        let read = |events: &mut [PbEvent]| -> Result<(), redb::Error> {
            let compacted = meta_get(&tx.open_table(META)?, "compact")?;
            let (history, values) = (tx.open_table(HISTORY)?, tx.open_table(record::VALUES)?);
            for e in events.iter_mut().filter(|e| e.prev_kv.is_none()) {
                let Some(kv) = &e.kv else { continue };
                let created = e.r#type == events::PUT && kv.create_revision == kv.mod_revision;
                let Some(before) = (kv.mod_revision as u64).checked_sub(1) else {
                    continue;
                };
                if created || before < compacted {
                    continue;
                }
                if let Some(stored) = range::row_at(&history, &kv.key, before)? {
                    e.prev_kv = Some(record::decode(&values, &kv.key, &stored)?);
                }
            }
            Ok(())
        };
        read(events).map_err(|e| self.fail(e))
    }

    /// Serves a Range at the newest revision or an older one.
    pub fn range(
        &self,
        req: &etcd_client::proto::PbRangeRequest,
    ) -> Result<Result<RangeOutput, EtcdError>, StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        let read = || -> Result<Result<RangeOutput, EtcdError>, redb::Error> {
            let meta = tx.open_table(META)?;
            range::range(
                (&tx.open_table(HISTORY)?, &tx.open_table(record::VALUES)?),
                meta_get(&meta, "revision")?.max(1),
                meta_get(&meta, "compact")?,
                req,
            )
        };
        read().map_err(|e| self.fail(e))
    }

    /// Every lease: (id, granted TTL in seconds).
    pub fn leases(&self) -> Result<Vec<(i64, i64)>, StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        self.read_leases(&tx)
    }

    fn read_leases(&self, tx: &redb::ReadTransaction) -> Result<Vec<(i64, i64)>, StoreError> {
        let table = sealed::read(tx, LEASES).map_err(|e| self.fail(e))?;
        let rows = table.iter().map_err(|e| self.fail(e))?;
        rows.map(|row| {
            let (k, v) = row.map_err(|e| self.fail(e))?;
            let id = k.value();
            Ok((id, sealed::ttl(id, &v).map_err(|e| self.fail(e))?))
        })
        .collect()
    }

    /// The granted TTL of lease `id` and its keys; None when there is no such lease.
    pub fn lease(&self, id: i64) -> Result<Option<LeaseRecord>, StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        let read = || -> Result<Option<LeaseRecord>, redb::Error> {
            let Some(ttl) = sealed::read(&tx, LEASES)?.get(id)? else {
                return Ok(None);
            };
            let ttl = sealed::ttl(id, &ttl)?;
            Ok(Some((
                ttl,
                lease_keys_of(&sealed::read(&tx, LEASE_KEYS)?, id)?,
            )))
        };
        read().map_err(|e| self.fail(e))
    }

    /// HashKV: a CRC-32C of every history row (key, revision, record) at or below `revision`
    /// (0: the newest), in key order; with the compacted revision and the revision hashed.
    /// Members that applied the same log (compactions included) answer the same hash.
    pub fn hash_kv(&self, revision: u64) -> Result<Result<(u32, u64, u64), EtcdError>, StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        let read = || -> Result<Result<(u32, u64, u64), EtcdError>, redb::Error> {
            let meta = tx.open_table(META)?;
            let (newest, compacted) = (
                meta_get(&meta, "revision")?.max(1),
                meta_get(&meta, "compact")?,
            );
            let at = if revision == 0 { newest } else { revision };
            if at > newest {
                return Ok(Err(EtcdError::FUTURE_REV));
            }
            if at < compacted {
                return Ok(Err(EtcdError::COMPACTED));
            }
            let mut crc = 0u32;
            let values = tx.open_table(record::VALUES)?;
            for row in tx.open_table(HISTORY)?.iter()? {
                let (k, v) = row?;
                let (key, rev) = k.value();
                if rev <= at {
                    crc = crc32c::crc32c_append(crc, key);
                    crc = crc32c::crc32c_append(crc, &rev.to_le_bytes());
                    let logical = record::logical(&values, key, v.value())?;
                    crc = crc32c::crc32c_append(crc, &logical);
                }
            }
            Ok(Ok((crc, compacted, at)))
        };
        read().map_err(|e| self.fail(e))
    }

    /// The whole key space as bytes (the data of a Raft snapshot).
    pub fn dump(&self) -> Result<Vec<u8>, StoreError> {
        Ok(self.dump_with_revision()?.0)
    }

    /// The CRC-32C of [`Mvcc::dump`], computed as the dump is written: memory does not grow
    /// with the key space (`Maintenance.Hash`).
    pub fn dump_crc(&self) -> Result<u32, StoreError> {
        struct Crc(u32);
        impl std::io::Write for Crc {
            fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
                self.0 = crc32c::crc32c_append(self.0, bytes);
                Ok(bytes.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut crc = Crc(0);
        self.dump_to(&mut crc, || {})?;
        Ok(crc.0)
    }

    /// As [`Mvcc::dump`], with the revision the dump is at.
    pub fn dump_with_revision(&self) -> Result<(Vec<u8>, u64), StoreError> {
        let mut out = Vec::new();
        let revision = self.dump_to(&mut out, || {})?;
        Ok((out, revision))
    }

    /// Writes the dump to `out` as it reads the key space, a record at a time (memory does not
    /// grow with the key space), calling `opened` as soon as the dump's view is fixed (its read
    /// transaction is open): a caller on another thread lets the applier go on from then, and
    /// the dump stays that of the key space at that moment. Returns the dump's revision.
    pub fn dump_to(
        &self,
        out: &mut dyn std::io::Write,
        opened: impl FnOnce(),
    ) -> Result<u64, StoreError> {
        self.with_view(|view| {
            opened();
            view.dump_to(out)
        })
    }

    /// Runs `f` with one consistent view of the key space (a read transaction), to dump it as
    /// many times as `f` needs (to learn the dump's length before streaming it, say). Defragment
    /// waits until it ends.
    pub fn with_view<T>(
        &self,
        f: impl FnOnce(&View<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let db = self.db()?;
        let tx = db.begin_read().map_err(|e| self.fail(e))?;
        f(&View { mvcc: self, tx })
    }
}

/// One consistent view of the key space ([`Mvcc::with_view`]).
pub struct View<'a> {
    mvcc: &'a Mvcc,
    tx: redb::ReadTransaction,
}

impl std::fmt::Debug for View<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("View")
            .field("path", &self.mvcc.path)
            .finish()
    }
}

impl View<'_> {
    /// Writes the dump of this view to `out`, a record at a time; returns its revision.
    ///
    /// The encoding is `PbDump`'s, its small fields first, then the history, one entry at a
    /// time (a protobuf decoder takes fields in any order).
    pub fn dump_to(&self, out: &mut dyn std::io::Write) -> Result<u64, StoreError> {
        let (m, tx) = (self.mvcc, &self.tx);
        let history = tx.open_table(HISTORY).map_err(|e| m.fail(e))?;
        let values = tx.open_table(record::VALUES).map_err(|e| m.fail(e))?;
        let meta = tx.open_table(META).map_err(|e| m.fail(e))?;
        let get = |k| meta_get(&meta, k).map_err(|e| m.fail(e));
        let head = PbDump {
            revision: get("revision")?,
            compacted: get("compact")?,
            history: Vec::new(),
            members: m.read_members(tx)?,
            leases: m
                .read_leases(tx)?
                .into_iter()
                .map(|(id, ttl)| PbDumpLease { id, ttl })
                .collect(),
            alarms: read_alarms(tx).map_err(|e| m.fail(e))?,
            removed: read_removed(tx).map_err(|e| m.fail(e))?,
            cluster_params: read_params(tx).map_err(|e| m.fail(e))?,
            auth: read_auth(tx, "")
                .map_err(|e| m.fail(e))?
                .into_iter()
                .map(|(key, value)| PbDumpAuthRow { key, value })
                .collect(),
        };
        let failed = |e: std::io::Error| m.fail(format!("writing the dump: {e}"));
        out.write_all(&head.encode_to_vec()).map_err(failed)?;
        for row in history.iter().map_err(|e| m.fail(e))? {
            let (k, v) = row.map_err(|e| m.fail(e))?;
            let (key, revision) = k.value();
            let entry = PbDumpEntry {
                key: key.to_vec(),
                revision,
                record: record::logical(&values, key, v.value()).map_err(|e| m.fail(e))?,
                sub: record::sub_revision(v.value()),
            };
            write_part(out, &Part::History(entry)).map_err(failed)?;
        }
        Ok(head.revision)
    }
}

/// How a restore commits what it writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commits {
    /// In one transaction: the key space is either as it was or the dump's (a member's own
    /// key space, replaced by its leader's snapshot).
    One,
    /// In transactions of [`defrag::ROWS_PER_COMMIT`] history rows, only the last durable and
    /// only it marking the key space restored: for a file nothing reads until the restore
    /// returns (`etcdutl snapshot restore` builds the data directory aside and renames it into
    /// place when complete). 1,000,000 keys: 4.95 s against 5.76 s in one transaction (medians).
    Chunked,
}

/// What a restore has read so far, carried from one of its transactions to the next.
#[derive(Default)]
struct Restoring {
    revision: u64,
    compacted: u64,
    /// Whether the dump's members replaced ours (a snapshot from before the members table
    /// carries none: ours are kept).
    members_replaced: bool,
    /// The last `values` row written.
    last_value: u64,
}

impl Mvcc {
    /// Replaces the key space with the dump `input` holds, taken at Raft index `applied`,
    /// durably, committing as `commits` says. The dump is read a part at a time: memory does
    /// not grow with it.
    pub fn restore(
        &self,
        input: impl std::io::Read,
        applied: u64,
        commits: Commits,
    ) -> Result<(), StoreError> {
        let mut parts = Parts::new(input);
        let (db, _settled) = self.for_writing()?;
        let rows_per_commit = match commits {
            Commits::One => usize::MAX,
            Commits::Chunked => defrag::ROWS_PER_COMMIT,
        };
        let tx = db.begin_write().map_err(|e| self.fail(e))?;
        tx.delete_table(HISTORY).map_err(|e| self.fail(e))?;
        tx.delete_table(record::VALUES).map_err(|e| self.fail(e))?;
        tx.delete_table(AUTH).map_err(|e| self.fail(e))?;
        tx.delete_table(LEASES).map_err(|e| self.fail(e))?;
        tx.delete_table(LEASE_KEYS).map_err(|e| self.fail(e))?;
        tx.delete_table(ALARMS).map_err(|e| self.fail(e))?;
        tx.delete_table(CLUSTER).map_err(|e| self.fail(e))?;
        let mut read = Restoring::default();
        let mut chunk = defrag::Chunks {
            db: &db,
            tx,
            rows: 0,
        };
        while !self.restore_parts(&chunk.tx, &mut parts, &mut read, rows_per_commit)? {
            chunk = chunk.next().map_err(|e| self.fail(e))?;
        }
        let mut tx = chunk.tx;
        tx.set_durability(Durability::Immediate)
            .map_err(|e| self.fail(e))?;
        {
            // The keys attached to leases: those of the live keys.
            let history = tx.open_table(HISTORY).map_err(|e| self.fail(e))?;
            let mut lease_keys = sealed::write(&tx, LEASE_KEYS).map_err(|e| self.fail(e))?;
            range::scan(&history, &[0], &[0], None, |key, stored| {
                let (kv, _) = record::decode_meta(key, stored)?;
                if kv.lease != 0 {
                    lease_keys.insert((kv.lease, key), &[])?;
                }
                Ok(true)
            })
            .map_err(|e| self.fail(e))?;
            let mut meta = tx.open_table(META).map_err(|e| self.fail(e))?;
            let mut set = |name, value| meta_set(&mut meta, name, value).map_err(|e| self.fail(e));
            set("revision", read.revision.max(1))?;
            set("compact", read.compacted)?;
            set("applied", applied)?;
            set("values", read.last_value)?;
        }
        tx.commit().map_err(|e| self.fail(e))?;
        self.committed();
        drop(db); // (see `apply`)
        self.refresh_auth_on()?;
        self.refresh_removed()?;
        self.refresh_params()
    }

    /// Writes the parts of the dump `parts` into `tx` until `rows` history rows are written
    /// (false) or the dump ends (true).
    fn restore_parts(
        &self,
        tx: &WriteTransaction,
        parts: &mut Parts<impl std::io::Read>,
        read: &mut Restoring,
        rows: usize,
    ) -> Result<bool, StoreError> {
        let mut cluster = sealed::write(tx, CLUSTER).map_err(|e| self.fail(e))?;
        let mut members = sealed::write(tx, MEMBERS).map_err(|e| self.fail(e))?;
        let mut removed = sealed::write(tx, REMOVED).map_err(|e| self.fail(e))?;
        let mut history = record::Rows {
            history: tx.open_table(HISTORY).map_err(|e| self.fail(e))?,
            values: tx.open_table(record::VALUES).map_err(|e| self.fail(e))?,
            last: read.last_value,
        };
        let mut leases = sealed::write(tx, LEASES).map_err(|e| self.fail(e))?;
        let mut auth = sealed::write(tx, AUTH).map_err(|e| self.fail(e))?;
        let mut alarms = sealed::write(tx, ALARMS).map_err(|e| self.fail(e))?;
        let (mut written, mut ended) = (0, false);
        while written < rows {
            let Some(part) = parts.next_part().map_err(|e| self.fail(e))? else {
                ended = true;
                break;
            };
            match part {
                Part::Revision(r) => read.revision = r,
                Part::Compacted(c) => read.compacted = c,
                Part::Member(m) => {
                    if !read.members_replaced {
                        members.clear().map_err(|e| self.fail(e))?;
                        read.members_replaced = true;
                    }
                    members
                        .insert(m.id, m.encode_to_vec().as_slice())
                        .map_err(|e| self.fail(e))?;
                }
                Part::Lease(l) => {
                    leases
                        .insert(l.id, &l.ttl.to_le_bytes())
                        .map_err(|e| self.fail(e))?;
                }
                // (added to what this member knows: a dump from before the table has none)
                Part::Removed(id) => {
                    removed.insert(id, &[]).map_err(|e| self.fail(e))?;
                }
                Part::ClusterParams(p) => {
                    cluster
                        .insert("version".as_bytes(), p.version.as_bytes())
                        .map_err(|e| self.fail(e))?;
                    cluster
                        .insert("features".as_bytes(), p.features.join(",").as_bytes())
                        .map_err(|e| self.fail(e))?;
                }
                Part::Auth(row) => {
                    auth.insert(row.key.as_bytes(), &row.value)
                        .map_err(|e| self.fail(e))?;
                }
                Part::Alarm(a) => {
                    alarms
                        .insert((a.member_id, a.alarm), &[])
                        .map_err(|e| self.fail(e))?;
                }
                Part::History(e) => {
                    let kv = decode_kv(&e.key, &e.record).map_err(|e| self.fail(e))?;
                    history
                        .put(&e.key, (e.revision, e.sub), &kv)
                        .map_err(|e| self.fail(e))?;
                    written += 1;
                }
            }
        }
        read.last_value = history.last;
        Ok(ended)
    }
}

/// What a dump holds (`etcdutl snapshot status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DumpSummary {
    pub revision: u64,
    pub compacted: u64,
    /// Live keys at `revision`.
    pub keys: u64,
    /// Rows of history (every kept version of every key, tombstones included).
    pub versions: u64,
    pub leases: u64,
}

/// The format of the file at `path` (0: new), refused when newer than [`FORMAT`].
fn stored_format(tx: &redb::WriteTransaction, path: &str) -> Result<u64, StoreError> {
    let format = tx
        .open_table(META)
        .map_err(redb::Error::from)
        .and_then(|meta| sealed::stored_format(&meta))
        .map_err(|e| store_error(path, e))?;
    if format > FORMAT {
        return Err(store_error(
            path,
            format!(
                "the file has format {format}, written by a newer etcd-node; this one reads \
                 formats up to {FORMAT}. Run the version that wrote it (a data directory cannot \
                 be downgraded: restore a snapshot into a new one instead)"
            ),
        ));
    }
    Ok(format)
}

/// Brings the file at `path`, of format `format` (not newer than [`FORMAT`]), to [`FORMAT`]
/// inside `tx`.
fn upgrade(tx: &redb::WriteTransaction, path: &str, format: u64) -> Result<(), redb::Error> {
    use redb::TableHandle;
    if format == FORMAT {
        return Ok(());
    }
    if format == 5 {
        // Format 6 reads every format-5 row as it is: only the number changes, so that a
        // release of format 5 refuses the file once a value may be compressed.
        sealed::meta_set(&mut tx.open_table(META)?, "format", FORMAT)?;
        tracing::info!(path, "key-space file upgraded from format 5 to {FORMAT}");
        return Ok(());
    }
    // (from format 2 on, a table of that name is the downgrade guard)
    let format1 = format < 2
        && tx
            .list_tables()?
            .any(|t| t.name() == FORMAT1_CURRENT.name());
    if format1 {
        tx.delete_table(FORMAT1_CURRENT)?;
    }
    tx.delete_table(LIVE)?;
    let from = if format1 { 1 } else { format };
    if from > 0 {
        tracing::info!(
            path,
            "key-space file upgraded from format {from} to {FORMAT}"
        );
    }
    if format < 3 {
        // The move of the values (format 3) follows in transactions of its own
        // (`values_aside`); from here on the file says the new format, so an older binary
        // refuses it even half moved.
        tx.open_table(VALUES_ASIDE)?;
    }
    tx.open_table(DOWNGRADE_GUARD)?;
    tx.open_table(META)?.insert("format", FORMAT)?;
    // (from format 5: the small tables and `meta`, this row included, sealed)
    sealed::seal_all(tx)
}

/// Format 2 to 3: every history row's value moved to `values` ([`record`]), in key order,
/// [`ASIDE_CHUNK`] rows per durable transaction (memory does not grow with the key space),
/// each recording the last row it moved in `values_aside`; a start that stops midway resumes
/// after it. The table's presence means the move is under way; the last transaction drops it.
fn values_aside(db: &Database, path: &str) -> Result<(), redb::Error> {
    use redb::TableHandle;
    use std::ops::Bound;
    let under_way = db
        .begin_read()?
        .list_tables()?
        .any(|t| t.name() == VALUES_ASIDE.name());
    if !under_way {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let mut moved = 0u64;
    loop {
        let mut tx = db.begin_write()?;
        tx.set_durability(Durability::Immediate)?;
        let done = {
            let mut meta = tx.open_table(META)?;
            let mut aside = tx.open_table(VALUES_ASIDE)?;
            let after = aside.get("after")?.map(|g| {
                let (key, rev) = g.value();
                (key.to_vec(), rev)
            });
            let mut rows = record::Rows {
                history: tx.open_table(HISTORY)?,
                values: tx.open_table(record::VALUES)?,
                last: meta_get(&meta, "values")?,
            };
            let start = match &after {
                None => Bound::Unbounded,
                Some((key, rev)) => Bound::Excluded((key.as_slice(), *rev)),
            };
            let chunk = rows
                .history
                .range::<(&[u8], u64)>((start, Bound::Unbounded))?
                .take(ASIDE_CHUNK)
                .map(|row| {
                    let (k, v) = row?;
                    let (key, rev) = k.value();
                    Ok((key.to_vec(), rev, v.value().to_vec()))
                })
                .collect::<Result<Vec<_>, redb::Error>>()?;
            for (key, rev, old) in &chunk {
                let kv = decode_kv(key, old)?;
                // (removed first: `put` would read the old row as format 3)
                rows.history.remove((key.as_slice(), *rev))?;
                rows.put(key, (*rev, record::sub_revision(old)), &kv)?;
            }
            moved += chunk.len() as u64;
            meta_set(&mut meta, "values", rows.last)?;
            match chunk.last() {
                Some((key, rev, _)) if chunk.len() == ASIDE_CHUNK => {
                    aside.insert("after", (key.as_slice(), *rev))?;
                    false
                }
                _ => true,
            }
        };
        if done {
            tx.delete_table(VALUES_ASIDE)?;
        }
        tx.commit()?;
        if done {
            break;
        }
        tracing::info!(
            path,
            rows = moved,
            "upgrading the key-space file to format {FORMAT}"
        );
    }
    if moved > 0 {
        tracing::info!(
            path,
            rows = moved,
            seconds = started.elapsed().as_secs_f64(),
            "key-space file upgraded to format {FORMAT}: values moved to a table of their own"
        );
    }
    Ok(())
}

/// A logical record (formats 1 and 2 stored it; HashKV and dumps use it) back into a
/// `KeyValue`: the key is not in the record.
fn decode_kv(key: &[u8], record: &[u8]) -> Result<PbKeyValue, redb::StorageError> {
    let mut kv = PbKeyValue::decode(record)
        .map_err(|e| redb::StorageError::Corrupted(format!("record of key {key:?}: {e}")))?;
    kv.key = key.to_vec();
    Ok(kv)
}

/// The auth rows whose key starts with `prefix`, in key order.
fn read_auth(
    tx: &redb::ReadTransaction,
    prefix: &str,
) -> Result<Vec<(String, Vec<u8>)>, redb::Error> {
    let mut out = Vec::new();
    for row in sealed::read(tx, AUTH)?.range(prefix.as_bytes()..)? {
        let (k, v) = row?;
        if !k.value().starts_with(prefix.as_bytes()) {
            break;
        }
        // (checked: the bytes are the text that was written)
        out.push((String::from_utf8_lossy(k.value()).into_owned(), v));
    }
    Ok(out)
}

/// The `cluster` table (None: never recorded).
fn read_params(tx: &redb::ReadTransaction) -> Result<Option<ClusterParamsSet>, redb::Error> {
    // (every row read, so that a row whose name changed is found damaged, not missing)
    let (mut version, mut features) = (None, String::new());
    for row in sealed::read(tx, CLUSTER)?.iter()? {
        let (name, value) = row?;
        let value = String::from_utf8_lossy(&value).into_owned();
        match name.value() {
            b"version" => version = Some(value),
            b"features" => features = value,
            _ => {}
        }
    }
    let Some(version) = version else {
        return Ok(None);
    };
    Ok(Some(ClusterParamsSet {
        version,
        features: features
            .split(',')
            .filter(|f| !f.is_empty())
            .map(str::to_string)
            .collect(),
    }))
}

/// Records member `a.member_id`'s name and client URLs (nothing when it is no longer a member).
fn set_member_attrs(tx: &redb::WriteTransaction, a: &MemberAttrsSet) -> Result<(), redb::Error> {
    let mut members = sealed::write(tx, MEMBERS)?;
    let Some(stored) = members.get(a.member_id)? else {
        return Ok(());
    };
    let mut member = PbMember::decode(stored.as_slice())
        .map_err(|e| redb::Error::Corrupted(format!("member record {:x}: {e}", a.member_id)))?;
    member.name.clone_from(&a.name);
    member.client_ur_ls.clone_from(&a.client_urls);
    members.insert(a.member_id, &member.encode_to_vec())?;
    Ok(())
}

/// The ids of the removed members.
fn read_removed(tx: &redb::ReadTransaction) -> Result<Vec<u64>, redb::Error> {
    let mut out = Vec::new();
    for row in sealed::read(tx, REMOVED)?.iter()? {
        out.push(row?.0.value());
    }
    Ok(out)
}

/// The raised alarms, by member.
fn read_alarms(tx: &redb::ReadTransaction) -> Result<Vec<PbAlarmMember>, redb::Error> {
    let mut out = Vec::new();
    for row in sealed::read(tx, ALARMS)?.iter()? {
        let (member_id, alarm) = row?.0.value();
        out.push(PbAlarmMember { member_id, alarm });
    }
    Ok(out)
}

/// The keys attached to lease `id`, in key order.
fn lease_keys_of<T: ReadableTable<(i64, &'static [u8]), &'static [u8]>>(
    table: &sealed::Sealed<(i64, &'static [u8]), T>,
    id: i64,
) -> Result<Vec<Vec<u8>>, redb::Error> {
    let mut keys = Vec::new();
    for row in table.range::<(i64, &[u8])>((id, &[][..])..)? {
        let (k, _) = row?;
        let (lease, key) = k.value();
        if lease != id {
            break;
        }
        keys.push(key.to_vec());
    }
    Ok(keys)
}

#[cfg(test)]
mod tests;
