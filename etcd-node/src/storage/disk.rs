//! `DiskStorage`: the Raft log, hard state and snapshots of one member on disk
//! (`<data-dir>/member/snap`, and the WAL in `<data-dir>/member/wal` or `--wal-dir`),
//! implementing [`raft::Storage`].
//!
//! Invariants: [`DiskStorage::persist`] returns only after everything in the `Ready` it was
//! given is durable (one WAL fsync for entries and hard state; a received snapshot first
//! written to its own file); the entries kept follow the snapshot contiguously; opening refuses
//! (with the reason) a log that does not reach the persisted commit index.
//!
//! [`raft::Storage`]: crate::raft::Storage

use std::path::Path;

use super::StorageError;
use super::snap::SnapDir;
use super::wal::{SEGMENT_BYTES, Wal};
use crate::raft::{
    Entry, HardState, KnownWitness, MemStorage, Membership, Ready, Snapshot, SnapshotMeta, Storage,
};

/// Snapshot files kept after a compaction: only the newest. Each is a dump of the whole key
/// space (not, as etcd's `.snap` files, a few kilobytes of metadata), and an older one could
/// not be used anyway: the WAL is released up to the newest, so starting from an older one
/// finds entries missing and refuses (`StorageError::Inconsistent`).
const KEEP_SNAPSHOTS: usize = 1;

#[derive(Debug)]
pub struct DiskStorage {
    wal: Wal,
    snaps: SnapDir,
    /// What is durable, in memory: the hard state, the snapshot's metadata, and the entries
    /// until [`DiskStorage::release_entries`].
    mem: MemStorage,
    /// Whether `mem` keeps the entries (until the Raft core, which keeps its own copy, is built
    /// from them: two copies of up to `--snapshot-count` entries were tens of megabytes).
    entries_kept: bool,
    /// The member directory's lock, held while open: a second process on it stops before it
    /// clears this member's received snapshots (the WAL's own lock does not cover a second
    /// process given another `--wal-dir`).
    _member_lock: Option<nix::fcntl::Flock<std::fs::File>>,
}

/// The key space a new member starts from ([`DiskStorage::bootstrap`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootKeySpace {
    /// A new cluster's: empty (the starting snapshot holds an empty dump).
    Empty,
    /// The key-space file's, durable at the starting index already (a restore): the starting
    /// snapshot is in place, so the restored key space is not written a second time.
    InPlace,
}

/// What opening found besides the state.
#[derive(Debug, Default)]
pub struct OpenReport {
    /// Bytes of a torn WAL tail that were discarded (an unacknowledged batch).
    pub torn_bytes: u64,
    /// Bytes of the WAL a failed fsync left unsynced, discarded (unacknowledged batches).
    pub unsynced_bytes: u64,
    /// Snapshot files that failed their checks and were skipped.
    pub rejected_snapshots: Vec<String>,
}

impl DiskStorage {
    /// Opens (creating) the storage: snapshots under `member_dir`, the WAL in `wal_dir`.
    pub fn open(
        member_dir: &Path,
        wal_dir: &Path,
    ) -> Result<(DiskStorage, OpenReport), StorageError> {
        Self::open_with(member_dir, wal_dir, SEGMENT_BYTES)
    }

    /// As [`DiskStorage::open`] with a WAL segment size (tests use small ones).
    pub fn open_with(
        member_dir: &Path,
        wal_dir: &Path,
        segment_bytes: u64,
    ) -> Result<(DiskStorage, OpenReport), StorageError> {
        std::fs::create_dir_all(member_dir).map_err(|source| StorageError::Io {
            path: member_dir.to_path_buf(),
            source,
        })?;
        let member_lock = super::lock_member_dir(member_dir)?;
        let snap_dir = member_dir.join("snap");
        let snaps = SnapDir::open(&snap_dir).map_err(|source| StorageError::Io {
            path: snap_dir,
            source,
        })?;
        snaps.clear_received().map_err(|source| StorageError::Io {
            path: snaps.dir().to_path_buf(),
            source,
        })?;
        let loaded = snaps.load()?;
        let (wal, rec) = Wal::open(wal_dir, segment_bytes)?;
        let snapshot = loaded
            .snapshot
            .unwrap_or_else(|| MemStorage::joining().snapshot());
        let entries: Vec<Entry> = rec
            .entries
            .into_iter()
            .filter(|e| e.index > snapshot.meta.index)
            .collect();
        if let Some(first) = entries.first()
            && first.index != snapshot.meta.index + 1
        {
            return Err(StorageError::Inconsistent {
                dir: member_dir.to_path_buf(),
                what: format!(
                    "the WAL starts at entry {} but the newest snapshot ends at {}: entries are missing",
                    first.index, snapshot.meta.index
                ),
            });
        }
        let last = entries.last().map_or(snapshot.meta.index, |e| e.index);
        if rec.hard_state.commit > last {
            return Err(StorageError::Inconsistent {
                dir: member_dir.to_path_buf(),
                what: format!(
                    "the hard state says entry {} is committed but the log ends at {last}: the WAL lost acknowledged entries",
                    rec.hard_state.commit
                ),
            });
        }
        let report = OpenReport {
            torn_bytes: rec.torn_bytes,
            unsynced_bytes: rec.unsynced_bytes,
            rejected_snapshots: loaded
                .rejected
                .iter()
                .map(|(p, w)| format!("{}: {w}", p.display()))
                .collect(),
        };
        Ok((
            DiskStorage {
                wal,
                snaps,
                mem: MemStorage::from_parts(rec.hard_state, snapshot, entries),
                entries_kept: true,
                _member_lock: member_lock,
            },
            report,
        ))
    }

    /// True if nothing was ever persisted here (a new member).
    pub fn is_empty(&self) -> bool {
        self.mem.snapshot().meta.index == 0
            && self.mem.entries().is_empty()
            && self.mem.hard_state() == HardState::default()
    }

    /// Makes a new member of a new cluster: the committed starting position every member shares
    /// (see [`crate::raft::MemStorage::bootstrap`]), holding the key space `key_space` says,
    /// knowing `witness` of its witness.
    pub fn bootstrap(
        &mut self,
        membership: Membership,
        witness: Option<KnownWitness>,
        key_space: BootKeySpace,
    ) -> Result<(), StorageError> {
        let boot = MemStorage::bootstrap(membership, witness);
        let snapshot = boot.snapshot();
        match key_space {
            BootKeySpace::Empty => save_streamed(&self.snaps, &snapshot.meta, |_| Ok(()))?,
            BootKeySpace::InPlace => save_in_place(&self.snaps, &snapshot.meta)?,
        }
        self.wal
            .mark_snapshot(snapshot.meta.index, snapshot.meta.term)?;
        self.wal.save(Some(boot.hard_state()), &[])?;
        self.mem = boot;
        Ok(())
    }

    /// Makes `snapshot` durable: its file, then its marker in the WAL. A snapshot without data
    /// was received into a file of its own ([`SnapDir::receive`]): that file becomes its file.
    fn write_snapshot(&mut self, snapshot: &Snapshot) -> Result<(), StorageError> {
        let received = snapshot.data.is_empty()
            && saved(
                &self.snaps,
                &snapshot.meta,
                self.snaps.publish_received(&snapshot.meta),
            )?;
        if !received {
            save(&self.snaps, snapshot)?;
        }
        self.wal
            .mark_snapshot(snapshot.meta.index, snapshot.meta.term)?;
        // (the older snapshot files describe a state the log no longer leads to)
        self.purge_snapshots()
    }

    fn purge_snapshots(&self) -> Result<(), StorageError> {
        self.snaps
            .purge(KEEP_SNAPSHOTS)
            .map_err(|source| StorageError::Io {
                path: self.snaps.dir().to_path_buf(),
                source,
            })
    }

    /// Takes `meta` as this member's snapshot, in place: the key space is durable at its
    /// index already (`--force-new-cluster`'s, which replaces the log by it).
    pub fn install_in_place(&mut self, meta: &SnapshotMeta) -> Result<(), StorageError> {
        save_in_place(&self.snaps, meta)?;
        self.wal.mark_snapshot(meta.index, meta.term)?;
        self.mem.install(Snapshot {
            meta: meta.clone(),
            data: bytes::Bytes::new(),
        });
        self.purge_snapshots()
    }

    /// Where the snapshot files are.
    pub fn snap_dir(&self) -> &Path {
        self.snaps.dir()
    }

    /// Forgets the entries in memory, and keeps none from now on: the Raft core built from this
    /// storage keeps its own log, and the WAL has them. ([`Storage::entries`] is then empty.)
    pub fn release_entries(&mut self) {
        self.entries_kept = false;
        self.mem = MemStorage::from_parts(self.mem.hard_state(), self.mem.snapshot(), Vec::new());
    }

    /// Forgets the data of the latest snapshot in memory (its file keeps it; see
    /// [`super::snap::DataReader`]).
    pub fn release_snapshot_data(&mut self) {
        self.mem.release_snapshot_data();
    }

    /// Makes everything `ready` asks to persist durable: a received snapshot, then entries and
    /// hard state in one WAL batch (one fsync; none when only the commit index moved, see
    /// [`super::wal`]). Says whether the WAL fsynced.
    pub fn persist(&mut self, ready: &Ready) -> Result<bool, StorageError> {
        if let Some(snapshot) = &ready.snapshot {
            self.write_snapshot(snapshot)?;
            self.mem.install(snapshot.clone());
        }
        let synced = self.wal.save(ready.hard_state, &ready.entries)?;
        if self.entries_kept {
            self.mem.append(&ready.entries);
        }
        if let Some(hs) = ready.hard_state {
            self.mem.set_hard_state(hs);
        }
        Ok(synced)
    }

    /// Keeps `snapshot` (of this member's own state machine, from `Raft::compact`), drops the
    /// WAL segments and snapshot files it makes unnecessary.
    pub fn compact(&mut self, snapshot: &Snapshot) -> Result<(), StorageError> {
        if snapshot.meta.index <= self.mem.snapshot().meta.index {
            return Ok(());
        }
        save(&self.snaps, snapshot)?;
        self.adopt(snapshot)
    }

    /// The snapshot files, for a snapshot saved away from the loop ([`save_streamed`], then
    /// [`DiskStorage::adopt`]).
    pub fn snap_files(&self) -> SnapDir {
        self.snaps.clone()
    }

    /// As [`DiskStorage::compact`], for a snapshot whose file [`save_streamed`] wrote already
    /// (its data may be empty: the file holds it).
    pub fn adopt(&mut self, snapshot: &Snapshot) -> Result<(), StorageError> {
        if snapshot.meta.index <= self.mem.snapshot().meta.index {
            return Ok(());
        }
        self.wal
            .mark_snapshot(snapshot.meta.index, snapshot.meta.term)?;
        if self.entries_kept {
            self.mem.compact(snapshot.clone());
        } else {
            self.mem = MemStorage::from_parts(self.mem.hard_state(), snapshot.clone(), Vec::new());
        }
        self.wal.release_to(snapshot.meta.index)?;
        self.purge_snapshots()
    }
}

/// Writes `snapshot`'s file durably in `snaps`.
fn save(snaps: &SnapDir, snapshot: &Snapshot) -> Result<(), StorageError> {
    saved(snaps, &snapshot.meta, snaps.save(snapshot)).map(drop)
}

/// Writes the file of snapshot `meta` durably in `snaps` (from any thread), its data written
/// by `data` as it goes.
pub fn save_streamed(
    snaps: &SnapDir,
    meta: &SnapshotMeta,
    data: impl FnOnce(&mut dyn std::io::Write) -> std::io::Result<()>,
) -> Result<(), StorageError> {
    saved(snaps, meta, snaps.save_streamed(meta, data)).map(drop)
}

/// Writes the file of the snapshot in place `meta` durably in `snaps` (from any thread): the
/// key space is durable at `meta.index` already.
pub fn save_in_place(snaps: &SnapDir, meta: &SnapshotMeta) -> Result<(), StorageError> {
    saved(snaps, meta, snaps.save_in_place(meta)).map(drop)
}

/// The outcome of saving snapshot `meta`'s file, as a storage error naming it.
fn saved<T>(
    snaps: &SnapDir,
    meta: &SnapshotMeta,
    outcome: std::io::Result<T>,
) -> Result<T, StorageError> {
    outcome.map_err(|source| StorageError::SaveSnapshot {
        index: meta.index,
        dir: snaps.dir().to_path_buf(),
        source,
    })
}

impl Storage for DiskStorage {
    fn hard_state(&self) -> HardState {
        self.mem.hard_state()
    }
    fn snapshot(&self) -> Snapshot {
        self.mem.snapshot()
    }
    fn entries(&self) -> Vec<Entry> {
        self.mem.entries()
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use crate::raft::{Config, EntryData, Raft, SnapshotMeta};

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            term,
            subterm: 0,
            index,
            data: EntryData::Normal(index.to_le_bytes().to_vec()),
        }
    }

    fn batch(entries: Vec<Entry>, commit: u64) -> Ready {
        Ready {
            hard_state: Some(HardState {
                term: 2,
                vote: 1,
                commit,
                witness: None,
            }),
            entries,
            ..Ready::default()
        }
    }

    /// A second process on a member's directory stops before it changes anything there, even
    /// when given a WAL directory of its own (which passes the WAL's lock).
    #[test]
    fn a_member_directory_is_opened_by_one_process_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let (_first, _) = DiskStorage::open(dir.path(), &dir.path().join("wal")).unwrap();
        // (what a start clears: a snapshot being received)
        let unfinished = dir.path().join("snap/being-received.tmp");
        std::fs::write(&unfinished, b"part").unwrap();
        let err = DiskStorage::open(dir.path(), &dir.path().join("other-wal")).unwrap_err();
        assert!(matches!(err, StorageError::Locked(_)), "{err}");
        assert!(
            err.to_string()
                .contains("a member is already running on this data directory"),
            "{err}"
        );
        assert!(
            unfinished.exists(),
            "the second open cleared the snapshot directory"
        );
        assert!(!dir.path().join("other-wal").exists());
    }

    #[test]
    fn a_bootstrapped_member_restarts_into_raft_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let membership = Membership::new([1, 2], Some(3)).unwrap();
        {
            let (mut s, _) = DiskStorage::open(dir.path(), &dir.path().join("wal")).unwrap();
            assert!(s.is_empty());
            s.bootstrap(membership.clone(), None, BootKeySpace::Empty)
                .unwrap();
            s.persist(&batch(vec![entry(2, 2), entry(3, 2)], 2))
                .unwrap();
            s.persist(&batch(vec![entry(3, 3)], 2)).unwrap();
        }
        let (s, _) = DiskStorage::open(dir.path(), &dir.path().join("wal")).unwrap();
        assert!(!s.is_empty());
        assert_eq!(s.snapshot().meta.membership, membership);
        assert_eq!(s.entries(), vec![entry(2, 2), entry(3, 3)]);
        let raft = Raft::new(Config::new(1), &s).unwrap();
        assert_eq!(raft.commit(), 2);
        assert_eq!(raft.log().last_index(), 3);
    }

    #[test]
    fn compaction_drops_covered_segments_and_restart_sees_snapshot_plus_tail() {
        compaction_and_restart(false);
    }

    /// The same, the entries released from memory first (as a running member does): what is
    /// persisted and compacted is the same on disk.
    #[test]
    fn a_storage_that_keeps_no_entries_in_memory_persists_and_compacts_the_same() {
        compaction_and_restart(true);
    }

    fn compaction_and_restart(release: bool) {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = DiskStorage::open_with(dir.path(), &dir.path().join("wal"), 2048).unwrap();
        s.bootstrap(
            Membership::new([1], None).unwrap(),
            None,
            BootKeySpace::Empty,
        )
        .unwrap();
        if release {
            s.release_entries();
        }
        for i in 2..=200 {
            s.persist(&batch(vec![entry(i, 2)], i - 1)).unwrap();
        }
        let segments = std::fs::read_dir(dir.path().join("wal")).unwrap().count();
        let snap = Snapshot {
            meta: SnapshotMeta {
                index: 150,
                term: 2,
                subterm: 0,
                membership: Membership::new([1], None).unwrap(),
            },
            data: bytes::Bytes::from_static(b"state"),
        };
        s.compact(&snap).unwrap();
        let after = std::fs::read_dir(dir.path().join("wal")).unwrap().count();
        assert!(after < segments, "{after} < {segments}");
        drop(s);
        let (s, _) = DiskStorage::open_with(dir.path(), &dir.path().join("wal"), 2048).unwrap();
        // (the data stays in its file)
        assert_eq!(s.snapshot().meta, snap.meta);
        let mut data = Vec::new();
        std::io::Read::read_to_end(
            &mut crate::storage::snap::DataReader::open(s.snap_dir(), &snap.meta).unwrap(),
            &mut data,
        )
        .unwrap();
        assert_eq!(data, b"state");
        assert_eq!(s.entries().first().map(|e| e.index), Some(151));
        assert_eq!(s.entries().len(), 50);
        assert_eq!(s.hard_state().commit, 199);
    }

    /// Child side of the crash test: persists batches, printing each acknowledgement, until the
    /// armed failpoint aborts the process.
    #[test]
    fn crash_child() {
        let Ok(dir) = std::env::var("DISK_CRASH_DIR") else {
            return; // only meaningful as the crash test's child process
        };
        crate::failpoint::setup().unwrap();
        let (mut s, _) =
            DiskStorage::open_with(Path::new(&dir), &Path::new(&dir).join("wal"), 4096).unwrap();
        if s.is_empty() {
            s.bootstrap(
                Membership::new([1], None).unwrap(),
                None,
                BootKeySpace::Empty,
            )
            .unwrap();
        }
        let start = s.entries().last().map_or(2, |e| e.index + 1);
        for i in start..start + 1000 {
            s.persist(&batch(vec![entry(i, 2)], i - 1)).unwrap();
            println!("acked {i}");
        }
    }

    #[test]
    fn every_acknowledged_batch_survives_a_crash_at_each_durable_step() {
        let exe = std::env::current_exe().unwrap();
        for failpoint in [
            "wal-before-fsync:37",
            "wal-after-fsync:50",
            "wal-segment-before-rename:3",
            "wal-before-fsync:120",
        ] {
            let dir = tempfile::tempdir().unwrap();
            let mut acked = 1;
            for round in 0..2 {
                let out = Command::new(&exe)
                    .args([
                        "--exact",
                        "storage::disk::tests::crash_child",
                        "--nocapture",
                    ])
                    .env("DISK_CRASH_DIR", dir.path())
                    .env("ETCD_NODE_FAILPOINT", failpoint)
                    .output()
                    .unwrap();
                assert!(!out.status.success(), "{failpoint}: the child must crash");
                let stdout = String::from_utf8_lossy(&out.stdout);
                if let Some(last) = stdout
                    .lines()
                    .filter_map(|l| l.strip_prefix("acked "))
                    .filter_map(|n| n.parse::<u64>().ok())
                    .next_back()
                {
                    acked = last;
                }
                let (s, _) = DiskStorage::open_with(dir.path(), &dir.path().join("wal"), 4096)
                    .unwrap_or_else(|e| panic!("{failpoint}: reopen failed: {e}"));
                let last = s.entries().last().map_or(1, |e| e.index);
                assert!(
                    last >= acked,
                    "{failpoint}: acknowledged entry {acked} lost (log ends at {last})"
                );
                assert!(
                    last <= acked + 1,
                    "{failpoint}: more than one unacknowledged batch"
                );
                println!(
                    "{failpoint} round {round}: acknowledged up to {acked}, log ends at {last}"
                );
                for (k, e) in s.entries().iter().enumerate() {
                    assert_eq!(*e, entry(k as u64 + 2, 2), "{failpoint}: entry {}", k + 2);
                }
                let left: Vec<_> = std::fs::read_dir(dir.path().join("wal"))
                    .unwrap()
                    .filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .filter(|n| n.ends_with(".tmp"))
                    .collect();
                assert!(
                    left.is_empty(),
                    "{failpoint}: left after the restart: {left:?}"
                );
            }
        }
    }
}
