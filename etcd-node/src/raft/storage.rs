//! What a node persists, and an in-memory implementation for tests and the simulator.
//!
//! Invariants: `append` replaces the persisted suffix from the first appended index on (a
//! follower's conflicting entries are overwritten, never merged); the hard state is replaced
//! whole.

use super::types::{Entry, EntryData, HardState, Membership, NONE};

/// Durable state a node restarts from.
pub trait Storage {
    fn hard_state(&self) -> HardState;
    fn membership(&self) -> Membership;
    /// Every persisted entry, in index order from 1.
    fn entries(&self) -> Vec<Entry>;
}

/// Storage in memory. "Persisted" means stored here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemStorage {
    hard_state: HardState,
    membership: Membership,
    entries: Vec<Entry>,
}

impl MemStorage {
    pub fn new(membership: Membership) -> Self {
        MemStorage {
            hard_state: HardState::default(),
            membership,
            entries: Vec::new(),
        }
    }

    /// A new member of a new cluster: like etcd's bootstrap, every member starts with the same
    /// committed configuration entry at (term 1, subterm 0, index 1). Without it a fresh witness
    /// (log position (0, 0), empty R) could never grant a vote, and a one-node-plus-witness
    /// cluster could never elect.
    pub fn bootstrap(membership: Membership) -> Self {
        MemStorage {
            hard_state: HardState {
                term: 1,
                vote: NONE,
                commit: 1,
            },
            membership,
            entries: vec![Entry {
                term: 1,
                subterm: 0,
                index: 1,
                data: EntryData::Empty,
            }],
        }
    }

    pub fn set_hard_state(&mut self, hs: HardState) {
        self.hard_state = hs;
    }

    /// Persists `entries`, dropping any persisted entries from the first one's index on.
    pub fn append(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first() else { return };
        assert!(
            first.index >= 1 && first.index <= self.entries.len() as u64 + 1,
            "append at {} leaves a gap after {}",
            first.index,
            self.entries.len()
        );
        self.entries.truncate(first.index as usize - 1);
        for (i, e) in entries.iter().enumerate() {
            assert_eq!(
                e.index,
                first.index + i as u64,
                "entries to persist are contiguous"
            );
        }
        self.entries.extend_from_slice(entries);
    }
}

impl Storage for MemStorage {
    fn hard_state(&self) -> HardState {
        self.hard_state
    }
    fn membership(&self) -> Membership {
        self.membership.clone()
    }
    fn entries(&self) -> Vec<Entry> {
        self.entries.clone()
    }
}
