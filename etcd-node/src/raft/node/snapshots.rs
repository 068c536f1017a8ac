//! Snapshots and log compaction: what the host saves, what a lagging follower is sent, and
//! when the log's prefix leaves memory.

use super::*;

impl Raft {
    /// Forgets the data of the latest snapshot (keeping its metadata): the host, which persisted
    /// it, supplies the data itself when it sends a snapshot message (whose data is then
    /// empty), so that a key space is not kept in memory beside the host's own copy.
    pub fn release_snapshot_data(&mut self) {
        if !self.snapshot.data.is_empty() && self.pending_snapshot.is_none() {
            self.snapshot.data = bytes::Bytes::new();
        }
    }

    /// Takes a snapshot of the state machine (`data`, as of the applied index) and drops the
    /// log up to it. Returns the snapshot for the host to persist.
    pub fn compact(&mut self, data: bytes::Bytes) -> Snapshot {
        if let Some(meta) = self.snapshot_meta() {
            self.compact_with(Snapshot { meta, data });
        }
        self.snapshot.clone()
    }

    /// What a snapshot of the state machine as of the applied index is (None: the latest
    /// snapshot is there already, and can be sent). A host that takes the snapshot in the
    /// background records this, with the state machine's view, at once, and hands both to
    /// [`Raft::compact_with`] (or the metadata alone to [`Raft::compact_in_place`]) when the
    /// snapshot is saved.
    pub fn snapshot_meta(&self) -> Option<SnapshotMeta> {
        let index = self.applied;
        if !self.replaces_snapshot(index, true) {
            return None;
        }
        // (the log is never trimmed past the applied index, so its position is known)
        let (term, subterm) = self
            .log
            .position(index)
            .expect("applied entries are in the log or at its start");
        Some(SnapshotMeta {
            index,
            term,
            subterm,
            membership: self.membership.clone(),
        })
    }

    /// A follower needs entries this leader no longer holds in memory and its latest snapshot
    /// is older than them: the host should take a snapshot now rather than at the next
    /// `--snapshot-count`. Until it is saved the follower waits.
    pub fn snapshot_wanted(&self) -> bool {
        self.snapshot_wanted
    }

    /// The latest snapshot is a copy kept to be sent ([`Raft::compact_with`]) and no one needs
    /// it any more: every regular member holds entries after it, and this member applied past
    /// it. A host whose copy is large (a dump of its key space) replaces it with a snapshot in
    /// place ([`Raft::compact_in_place`]) rather than keep it until the next scheduled one.
    pub fn snapshot_outlived(&self) -> bool {
        let index = self.snapshot.meta.index;
        self.snapshot_sendable && self.applied > index && self.held_by_all() > index
    }

    /// Keeps `snapshot` (of this member's state machine, with meta from
    /// [`Raft::snapshot_meta`], possibly some turns ago) as the one a lagging follower is sent,
    /// and drops the log up to it if it still holds those entries. Returns false, changing
    /// nothing, when the latest snapshot is as new (a leader's snapshot was installed
    /// meanwhile).
    pub fn compact_with(&mut self, snapshot: Snapshot) -> bool {
        if !self.compact_log(&snapshot.meta, true) {
            return false;
        }
        self.snapshot = snapshot;
        self.snapshot_sendable = true;
        // (one taken before the log was trimmed past it, by --snapshot-count, does not do)
        self.snapshot_wanted &= self.snapshot.meta.index < self.log.snapshot_index();
        true
    }

    /// As [`Raft::compact_with`], for a host whose state machine is durable as of `meta` (from
    /// [`Raft::snapshot_meta`]) and that keeps no copy of it to send: the log is dropped up to
    /// it, and a follower that needs a snapshot from now on gets a new one
    /// ([`Raft::snapshot_wanted`]). Returns false, changing nothing, when the latest snapshot
    /// is as new.
    pub fn compact_in_place(&mut self, meta: SnapshotMeta) -> bool {
        if !self.compact_log(&meta, false) {
            return false;
        }
        self.snapshot = Snapshot {
            meta,
            data: bytes::Bytes::new(),
        };
        self.snapshot_sendable = false;
        true
    }

    /// Whether a snapshot at `index` (that can be sent, if `sendable`) replaces the latest
    /// one: it is newer, or as new and can be sent when the latest cannot.
    pub(super) fn replaces_snapshot(&self, index: u64, sendable: bool) -> bool {
        let latest = self.snapshot.meta.index;
        index > latest || (index == latest && sendable && !self.snapshot_sendable)
    }

    /// Drops the log up to the snapshot `m` if it still holds those entries; false if `m`
    /// does not replace the latest snapshot.
    pub(super) fn compact_log(&mut self, m: &SnapshotMeta, sendable: bool) -> bool {
        assert!(
            !self.awaiting_advance,
            "compact between ready() and advance()"
        );
        if !self.replaces_snapshot(m.index, sendable) {
            return false;
        }
        assert!(m.index <= self.applied, "a snapshot of entries not applied");
        if m.index >= self.log.snapshot_index() {
            assert_eq!(
                self.log.position(m.index),
                Some((m.term, m.subterm)),
                "a snapshot of entries this log does not hold"
            );
            self.log.compact_to(m.index);
        }
        true
    }

    /// Drops from memory the entries no one will ask this member for: applied here, and held
    /// by every regular member (a leader knows from its followers' match indexes, a follower
    /// from its leader's heartbeats: a member restarted, or one that was a follower, may lead
    /// next, and a member that was down then catches up from its log). They stay in the
    /// host's storage until the next snapshot, for a restart. A follower that later needs one
    /// (a new member, one whose progress was reset) gets a snapshot instead, a new one if the
    /// latest is older ([`Raft::snapshot_wanted`]). Without this the log held every entry
    /// since the last snapshot: up to `--snapshot-count` (100,000) entries, 40 MB with
    /// 256-byte values. Dropped once they are at least half the log, so each entry is moved
    /// O(1) times.
    pub(super) fn trim_log(&mut self) {
        let upto = self.applied.min(self.held_by_all());
        let start = self.log.snapshot_index();
        let held = self.log.last_index() - start;
        if upto > start && (upto - start) * 2 >= held {
            self.log.compact_to(upto);
        }
    }

    /// The host's transport finished sending a snapshot to `to`: `delivered` when the follower
    /// received it whole. Delivered, the leader waits for the follower's answer (the follower
    /// may take a while to install a large snapshot) and sends it again only if a heartbeat
    /// answer comes an election timeout after the delivery with no answer to the snapshot. Not
    /// delivered, the leader probes the follower again once it answers a heartbeat (so an
    /// unreachable follower is not sent snapshot after snapshot).
    pub fn report_snapshot(&mut self, to: NodeId, index: u64, delivered: bool) {
        let now = self.ticks;
        let Some(pr) = self.lead.as_mut().and_then(|l| l.progress.get_mut(&to)) else {
            return;
        };
        match pr.snapshot {
            Some((sent, _)) if sent == index => {
                if delivered {
                    pr.snapshot = Some((index, now));
                } else {
                    pr.probe_from(pr.next);
                    pr.paused = true;
                }
            }
            _ => {} // answered already, or another snapshot is outstanding now
        }
    }
}
