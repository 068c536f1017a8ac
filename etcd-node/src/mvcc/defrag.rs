//! Defragmenting by copy: every row of the key space written into a new file beside it
//! (`kv.redb.defrag`), in key order, in transactions of [`ROWS_PER_COMMIT`] rows of which only
//! the last is made durable, then renamed over the old file. This is
//! etcd's way (bbolt's defragment copies every bucket into a new file), and it writes each page
//! once, where redb's own compaction moves pages toward the file's start one durable commit at
//! a time (docs/benchmarks.md, "Growth, memory and disk").
//!
//! Invariants: the old file is untouched until the rename, so a failure or a crash before it
//! leaves the key space as it was (the copy left by a crash is removed when the key space
//! opens: [`remove_leftover`]); the copy holds exactly the rows of one read transaction, taken
//! with every other use of the database held off; a table this release does not know how to
//! copy is never dropped: the copy is abandoned and redb's compaction runs instead. So does a
//! file system without room for the copy (etcd's defragment fails there), and a copy that
//! fails: the defragment that frees space must not need more of it.

use std::path::{Path, PathBuf};

use redb::{
    Database, Durability, Key, ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition,
    TableHandle, Value, WriteTransaction,
};

use super::{
    ALARMS, AUTH, CLUSTER, DOWNGRADE_GUARD, HISTORY, LEASE_KEYS, LEASES, MEMBERS, META, REMOVED,
    record,
};

/// The file a defragment writes before it replaces the key space's file `path`.
fn copy_path(path: &Path) -> PathBuf {
    super::beside(path, ".defrag")
}

/// Removes the copy a crash in the middle of a defragment left beside the key space's file
/// `path`.
pub(super) fn remove_leftover(path: &Path) -> std::io::Result<()> {
    super::remove_aside(&copy_path(path), "the copy an unfinished defragment left")
}

/// Whether the file system holding the key space's file `path` has room for a copy of it
/// (the blocks it takes; true when that cannot be told: a copy that fails is given up).
pub(super) fn room_for_copy(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    fail::fail_point!("defrag-no-room", |_| false);
    let (Ok(file), Some(dir)) = (std::fs::metadata(path), crate::storage::parent_dir(path)) else {
        return true;
    };
    nix::sys::statvfs::statvfs(dir).map_or(true, |fs| {
        let free = fs.blocks_available().saturating_mul(fs.fragment_size());
        free > file.blocks() * 512
    })
}

/// Copies the database `db`, whose file is `path`, into a new file and renames that over
/// `path`: the new database, open with a page cache of `cache_bytes`, which the caller must use
/// from then on (the old file is gone) and whose rename the caller makes durable ([`sync_renamed`]).
/// None, with nothing changed, when the file holds a table this release does not copy (the
/// caller compacts in place instead); an error, with nothing changed either, when the copy or
/// its rename fails. The caller holds every other use of `db` off.
pub(super) fn copied(
    db: &Database,
    path: &Path,
    cache_bytes: usize,
) -> Result<Option<Database>, String> {
    let target = copy_path(path);
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", target.display());
    remove_leftover(path).map_err(|e| at(&e))?;
    let from = db.begin_read().map_err(|e| e.to_string())?;
    let copy = redb::Builder::new()
        .set_cache_size(cache_bytes)
        .create(&target)
        .map_err(|e| at(&e))?;
    let written = copy_into(&from, &copy);
    if !matches!(written, Ok(true)) {
        drop(copy);
        let _ = std::fs::remove_file(&target);
        return written.map(|_| None).map_err(|e| at(&e));
    }
    crate::crash!("defrag-before-rename");
    if let Err(e) = std::fs::rename(&target, path) {
        drop(copy);
        let _ = std::fs::remove_file(&target);
        return Err(at(&e));
    }
    Ok(Some(copy))
}

/// Makes the rename of a copy over the key space's file `path` durable (an fsync of its
/// directory).
pub(super) fn sync_renamed(path: &Path) -> std::io::Result<()> {
    crate::storage_error!("defrag-sync-eio", crate::failpoint::EIO, |e| e);
    crate::storage::sync_dir(crate::storage::parent_dir(path).unwrap_or(Path::new("/")))
}

/// Rows per transaction of the copy. One transaction for the whole copy took a quarter longer
/// per row than transactions of 20,000 (redb 4.5, 1,000,000 rows in key order with a 16 MiB page
/// cache: 3.8 against 2.8 µs a row), and the chunks cost nothing in safety: the copy is not the
/// key space until it is renamed over it, after the last, durable, commit. (Unit tests take 7,
/// so that their small key spaces cross commits within tables and between them.)
pub(super) const ROWS_PER_COMMIT: usize = if cfg!(test) { 7 } else { 20_000 };

/// Whether a defragment copies the table `name`: every table this release writes does.
fn copied_table(name: &str) -> bool {
    [
        HISTORY.name(),
        record::VALUES.name(),
        META.name(),
        DOWNGRADE_GUARD.name(),
        MEMBERS.name(),
        REMOVED.name(),
        LEASES.name(),
        LEASE_KEYS.name(),
        ALARMS.name(),
        AUTH.name(),
        CLUSTER.name(),
    ]
    .contains(&name)
}

/// Copies every table `from` holds into `to`, [`ROWS_PER_COMMIT`] rows per transaction, the
/// last one durable: false (nothing copied) if one of them is a table this release does not
/// copy.
fn copy_into(from: &ReadTransaction, to: &Database) -> Result<bool, redb::Error> {
    if from.list_multimap_tables()?.next().is_some() {
        return Ok(false);
    }
    let tables: Vec<String> = from.list_tables()?.map(|t| t.name().to_string()).collect();
    if !tables.iter().all(|name| copied_table(name)) {
        return Ok(false);
    }
    let mut into = Chunks {
        db: to,
        tx: to.begin_write()?,
        rows: 0,
    };
    for name in &tables {
        if name == HISTORY.name() {
            into = copy_table(from, into, HISTORY)?;
        } else if name == record::VALUES.name() {
            into = copy_table(from, into, record::VALUES)?;
        } else if name == META.name() {
            into = copy_table(from, into, META)?;
        } else if name == DOWNGRADE_GUARD.name() {
            into = copy_table(from, into, DOWNGRADE_GUARD)?;
        } else if name == LEASES.name() {
            into = copy_table(from, into, LEASES)?;
        } else if name == LEASE_KEYS.name() {
            into = copy_table(from, into, LEASE_KEYS)?;
        } else if name == ALARMS.name() {
            into = copy_table(from, into, ALARMS)?;
        } else if let Some(sealed) = [MEMBERS, REMOVED].iter().find(|t| t.name() == name) {
            into = copy_table(from, into, *sealed)?;
        } else if let Some(sealed) = [AUTH, CLUSTER].iter().find(|t| t.name() == name) {
            into = copy_table(from, into, *sealed)?;
        }
    }
    let mut last = into.tx;
    last.set_durability(Durability::Immediate)?;
    last.commit()?;
    Ok(true)
}

/// A copy's (or a restore's) open transaction, committed (not durably) every
/// [`ROWS_PER_COMMIT`] rows.
pub(super) struct Chunks<'a> {
    pub db: &'a Database,
    pub tx: WriteTransaction,
    /// Rows in `tx`.
    pub rows: usize,
}

impl Chunks<'_> {
    /// Commits the transaction, then begins the next (redb has one writer at a time: beginning
    /// it first would wait for ever).
    pub fn next(self) -> Result<Self, redb::Error> {
        let Chunks { db, mut tx, .. } = self;
        tx.set_durability(Durability::None)?;
        tx.commit()?;
        Ok(Chunks {
            db,
            tx: db.begin_write()?,
            rows: 0,
        })
    }
}

/// Copies the table `def` of `from` into the copy, row by row in key order.
fn copy_table<'a, K: Key + 'static, V: Value + 'static>(
    from: &ReadTransaction,
    mut into: Chunks<'a>,
    def: TableDefinition<K, V>,
) -> Result<Chunks<'a>, redb::Error> {
    let source = from.open_table(def)?;
    let mut rows = source.iter()?;
    loop {
        let mut full = false;
        {
            let mut target = into.tx.open_table(def)?;
            for row in rows.by_ref() {
                let (key, value) = row?;
                target.insert(key.value(), value.value())?;
                into.rows += 1;
                if into.rows >= ROWS_PER_COMMIT {
                    full = true;
                    break;
                }
            }
        }
        if !full {
            return Ok(into);
        }
        into = into.next()?;
    }
}
