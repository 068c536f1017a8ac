//! A node's log in memory: the position where it starts (the last snapshot's, or a later one
//! once entries every member holds and this one applied were dropped, see [`Raft::advance`]),
//! then the entries after it.
//!
//! [`Raft::advance`]: super::Raft::advance
//!
//! Invariants: `entries[k].index == snap_index + 1 + k`; the (term, subterm) of the snapshot's
//! index stays known after compaction, so the log's last position and the term of the entry
//! before the first one are always answerable.

use super::types::{Entry, SnapshotMeta};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaftLog {
    snap_index: u64,
    snap_term: u64,
    snap_subterm: u64,
    entries: Vec<Entry>,
}

impl RaftLog {
    /// A log after `snapshot`, holding `entries` (which must follow it contiguously).
    pub fn new(snapshot: &SnapshotMeta, entries: Vec<Entry>) -> Self {
        for (k, e) in entries.iter().enumerate() {
            assert_eq!(
                e.index,
                snapshot.index + 1 + k as u64,
                "persisted log has a gap or does not follow the snapshot"
            );
        }
        RaftLog {
            snap_index: snapshot.index,
            snap_term: snapshot.term,
            snap_subterm: snapshot.subterm,
            entries,
        }
    }

    /// Index of the last entry dropped: the snapshot's, or later (the log's start).
    pub fn snapshot_index(&self) -> u64 {
        self.snap_index
    }

    pub fn last_index(&self) -> u64 {
        self.snap_index + self.entries.len() as u64
    }

    /// The term at `index`, if known (compacted entries' terms are not, except the snapshot's).
    pub fn term(&self, index: u64) -> Option<u64> {
        self.position(index).map(|(term, _)| term)
    }

    /// (term, subterm) at `index`: the snapshot's position, or an entry's.
    pub fn position(&self, index: u64) -> Option<(u64, u64)> {
        if index == self.snap_index {
            Some((self.snap_term, self.snap_subterm))
        } else {
            self.entry(index).map(|e| (e.term, e.subterm))
        }
    }

    pub fn entry(&self, index: u64) -> Option<&Entry> {
        let k = index.checked_sub(self.snap_index + 1)?;
        self.entries.get(usize::try_from(k).ok()?)
    }

    /// (term, subterm) of the last entry.
    pub fn last_position(&self) -> (u64, u64) {
        self.entries
            .last()
            .map_or((self.snap_term, self.snap_subterm), |e| (e.term, e.subterm))
    }

    /// The entries after the snapshot.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Entries with indexes in `[lo, hi]`; both must be after the snapshot (or `lo > hi`).
    pub fn slice(&self, lo: u64, hi: u64) -> &[Entry] {
        if lo > hi {
            return &[];
        }
        assert!(
            lo > self.snap_index && hi <= self.last_index(),
            "entries [{lo}, {hi}] not in the log ({}, {}]",
            self.snap_index,
            self.last_index()
        );
        let base = self.snap_index + 1;
        &self.entries[(lo - base) as usize..=(hi - base) as usize]
    }

    pub fn push(&mut self, e: Entry) {
        assert_eq!(e.index, self.last_index() + 1, "log entries are contiguous");
        self.entries.push(e);
    }

    /// Drops the entries from `index` on (index after the snapshot).
    pub fn truncate_from(&mut self, index: u64) {
        assert!(index > self.snap_index, "cannot truncate the snapshot");
        self.entries
            .truncate((index - self.snap_index - 1) as usize);
    }

    /// Forgets the entries up to `index` (which must be in the log).
    pub fn compact_to(&mut self, index: u64) {
        if index <= self.snap_index {
            return;
        }
        let e = self.entry(index).expect("compaction inside the log");
        (self.snap_term, self.snap_subterm) = (e.term, e.subterm);
        self.entries.drain(..(index - self.snap_index) as usize);
        self.snap_index = index;
        // (a log that grew while a member was down gives its room back once it caught up)
        if self.entries.capacity() > 4 * self.entries.len().max(1024) {
            self.entries.shrink_to_fit();
        }
    }

    /// Replaces the whole log by a snapshot's position.
    pub fn restore(&mut self, snapshot: &SnapshotMeta) {
        *self = RaftLog::new(snapshot, Vec::new());
    }
}
