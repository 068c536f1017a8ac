//! What a leader tracks about each regular follower (flow control and liveness).
//!
//! Invariants: `matched < next`; in the probe state at most one Append is outstanding
//! (`paused`); in the replicate state at most `max_inflight`, whose last indexes are `inflight`;
//! while a snapshot is outstanding (`snapshot`), nothing else is sent.

use std::collections::VecDeque;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// Highest index known to be replicated (persisted) on the follower.
    pub matched: u64,
    /// Next index to send.
    pub next: u64,
    /// Replicate (optimistic pipelining) rather than probe (one message until answered).
    pub replicate: bool,
    /// Probe state: an Append is outstanding.
    pub paused: bool,
    /// Replicate state: last index of each outstanding Append.
    pub inflight: VecDeque<u64>,
    /// Tick of the last message heard from the follower.
    pub last_heard: u64,
    /// A snapshot is on its way: (its index, tick sent).
    pub snapshot: Option<(u64, u64)>,
    /// The highest ReadIndex round the follower confirmed.
    pub read_ack: u64,
}

impl Progress {
    pub fn new(next: u64, now: u64) -> Self {
        Progress {
            matched: 0,
            next,
            replicate: false,
            paused: false,
            inflight: VecDeque::new(),
            last_heard: now,
            snapshot: None,
            read_ack: 0,
        }
    }

    /// Back to probing from `next` (after a rejection or a lost message).
    pub fn probe_from(&mut self, next: u64) {
        self.next = next.max(self.matched + 1);
        self.replicate = false;
        self.paused = false;
        self.inflight.clear();
        self.snapshot = None;
    }

    /// A successful response up to `index`. Returns true if `matched` advanced.
    pub fn acknowledge(&mut self, index: u64) -> bool {
        self.paused = false;
        self.snapshot = None;
        self.inflight.retain(|&i| i > index);
        self.next = self.next.max(index + 1);
        if index > self.matched {
            self.matched = index;
            self.replicate = true;
            true
        } else {
            false
        }
    }

    /// May an Append be sent now?
    pub fn can_send(&self, max_inflight: usize) -> bool {
        if self.snapshot.is_some() {
            false
        } else if self.replicate {
            self.inflight.len() < max_inflight
        } else {
            !self.paused
        }
    }

    /// Records an Append whose last entry is `last`.
    pub fn sent(&mut self, last: u64) {
        if self.replicate {
            self.inflight.push_back(last);
            self.next = last + 1;
        } else {
            self.paused = true;
        }
    }
}
