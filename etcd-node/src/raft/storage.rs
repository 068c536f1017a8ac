//! What a node persists, and an in-memory implementation for tests and the simulator.
//!
//! A node's durable state is a snapshot (the state machine up to an index, with the
//! configuration and the (term, subterm) of that index), the log entries after it, and the hard
//! state. Invariants: entries follow the snapshot's index contiguously; `append` replaces the
//! persisted suffix from the first appended index on (a follower's conflicting entries are
//! overwritten, never merged); the hard state is replaced whole.

use super::membership::Membership;
use super::types::{Entry, HardState, KnownWitness, NONE, Snapshot, SnapshotMeta};

/// Durable state a node restarts from.
pub trait Storage {
    fn hard_state(&self) -> HardState;
    /// The latest snapshot (index 0 for a node that joins and has received nothing yet).
    fn snapshot(&self) -> Snapshot;
    /// Every persisted entry after the snapshot, in index order.
    fn entries(&self) -> Vec<Entry>;
}

/// Storage in memory. "Persisted" means stored here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemStorage {
    hard_state: HardState,
    snapshot: Snapshot,
    entries: Vec<Entry>,
}

impl MemStorage {
    /// A node that joins an existing cluster: it knows nothing until the leader reaches it.
    pub fn joining() -> Self {
        MemStorage {
            hard_state: HardState::default(),
            snapshot: Snapshot {
                meta: SnapshotMeta {
                    index: 0,
                    term: 0,
                    subterm: 0,
                    membership: Membership::empty(),
                },
                data: bytes::Bytes::new(),
            },
            entries: Vec::new(),
        }
    }

    /// A member of a new cluster: every member starts from the same committed snapshot at
    /// (term 1, subterm 0, index 1) holding the initial configuration, like etcd's bootstrap
    /// entries. A node that joins later receives it (or a later snapshot) from the leader. Without
    /// a term-1 position a fresh witness (log position (0, 0)) could not tell candidates apart.
    /// `witness`: what the member read of its witness before it started (its generation), so
    /// that it never trusts another one.
    pub fn bootstrap(membership: Membership, witness: Option<KnownWitness>) -> Self {
        MemStorage {
            hard_state: HardState {
                term: 1,
                vote: NONE,
                commit: 1,
                witness,
            },
            snapshot: Snapshot {
                meta: SnapshotMeta {
                    index: 1,
                    term: 1,
                    subterm: 0,
                    membership,
                },
                data: bytes::Bytes::new(),
            },
            entries: Vec::new(),
        }
    }

    /// Storage holding exactly these parts (a durable store's in-memory view after recovery);
    /// `entries` must follow `snapshot` contiguously.
    pub fn from_parts(hard_state: HardState, snapshot: Snapshot, entries: Vec<Entry>) -> Self {
        MemStorage {
            hard_state,
            snapshot,
            entries,
        }
    }

    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    fn last_index(&self) -> u64 {
        self.snapshot.meta.index + self.entries.len() as u64
    }

    /// Persists `entries`, dropping any persisted entries from the first one's index on.
    pub fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else { return };
        let offset = self.snapshot.meta.index;
        assert!(
            first.index > offset && first.index <= self.last_index() + 1,
            "append at {} outside ({offset}, {}]",
            first.index,
            self.last_index() + 1
        );
        self.entries.truncate((first.index - offset - 1) as usize);
        for (i, e) in entries.iter().enumerate() {
            assert_eq!(
                e.index,
                first.index + i as u64,
                "entries to persist are contiguous"
            );
        }
        self.entries.extend_from_slice(entries);
    }

    /// Whether `e` is persisted here (in the log, or covered by the snapshot).
    pub fn holds(&self, e: &Entry) -> bool {
        let snap = &self.snapshot.meta;
        if e.index <= snap.index {
            return e.index < snap.index || e.term == snap.term;
        }
        self.entries
            .get((e.index - snap.index - 1) as usize)
            .is_some_and(|mine| mine.term == e.term)
    }

    /// The snapshot's index and the entries persisted after it.
    pub fn persisted(&self) -> (u64, &[Entry]) {
        (self.snapshot.meta.index, &self.entries)
    }

    /// Installs a snapshot received from the leader: the log is replaced by it.
    pub fn install(&mut self, snapshot: Snapshot) {
        self.entries.clear();
        self.hard_state.commit = self.hard_state.commit.max(snapshot.meta.index);
        self.snapshot = snapshot;
    }

    /// Forgets the snapshot's data, keeping its metadata (the host keeps the data elsewhere).
    pub fn release_snapshot_data(&mut self) {
        self.snapshot.data = bytes::Bytes::new();
    }

    /// Keeps `snapshot` (of this node's own state machine) and drops the entries it covers.
    pub fn compact(&mut self, snapshot: Snapshot) {
        let (old, new) = (self.snapshot.meta.index, snapshot.meta.index);
        assert!(
            new >= old && new <= self.last_index(),
            "compaction to {new} outside [{old}, {}]",
            self.last_index()
        );
        self.entries.drain(..(new - old) as usize);
        self.snapshot = snapshot;
    }
}

impl Storage for MemStorage {
    fn hard_state(&self) -> HardState {
        self.hard_state
    }
    fn snapshot(&self) -> Snapshot {
        self.snapshot.clone()
    }
    fn entries(&self) -> Vec<Entry> {
        self.entries.clone()
    }
}
