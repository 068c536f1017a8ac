//! `Raft`: one node of the extended Raft, as a pure state machine.
//!
//! Input: [`Raft::tick`], [`Raft::step`] (a message from a regular peer),
//! [`Raft::step_witness`] (the outcome of a witness step the host ran), [`Raft::propose`],
//! [`Raft::propose_conf_change`], [`Raft::read_index`], [`Raft::transfer_leader`],
//! [`Raft::compact`]. Output: [`Raft::ready`], processed by the host, then [`Raft::advance`].
//!
//! Invariants (checked by `assert!` where a violation means corruption, and by the simulator):
//! - one vote per term; the term never decreases; the commit index never decreases and never
//!   passes a truncation;
//! - a leader only appends; a follower truncates only uncommitted entries;
//! - the leader counts itself only for persisted entries;
//! - the witness is asked to store an entry only if it is of the current (term, subterm), the
//!   witness is in R, a subquorum of R (leader included) persisted it, and the witness has not
//!   acknowledged anything in this subterm; otherwise, in the same subterm, it is credited without
//!   I/O (the "shortcut");
//! - every subterm starts with an empty entry; |R| = regular voters and the leader is in R;
//!   applying a configuration change resets R to the regular voters in a new subterm;
//! - a candidate asks the witness only when the witness's vote would complete a quorum;
//! - a configuration change takes effect when applied, and a leader has at most one unapplied
//!   change in its log (its own first entry counts as one);
//! - a read is answered only after a quorum confirmed this leader after the read arrived (the
//!   witness through a fresh read of its term), or at once when the witness is pinned to a
//!   two-node leader.
//!
//! This file holds the node's state, its inputs and outputs; the rules live beside it, one
//! concern per file: `election.rs` (timers, campaigns, the vote rule), `replication.rs`
//! (appends, heartbeats, the commit rule), `witness.rs` (when the witness is asked, the
//! replication set R and its subterms, the witness's answers), `reads.rs` (ReadIndex),
//! `snapshots.rs` (snapshots and compaction), `conf_change.rs` (membership changes), and
//! `tests.rs`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use witness_core::Seen;
use witness_core::rules::{AppendReply, AppendRequest, Caller, VoteRequest};

use super::config::Config;
use super::errors::ConfigError;
use super::log::RaftLog;
use super::membership::{ChangeKind, ConfChange, Membership};
use super::mutation::Mutation;
use super::progress::Progress;
use super::replication_set::{self, Liveness};
use super::storage::Storage;
use super::types::{
    Body, Entry, EntryData, HardState, KnownWitness, Message, NONE, NodeId, ReadState, Ready,
    Snapshot, SnapshotMeta, WitnessRequest, WitnessResponse,
};

mod coalesce;
mod conf_change;
mod election;
mod reads;
mod replication;
mod snapshots;
#[cfg(test)]
mod tests;
mod witness;

/// The share of the leader's log a learner must hold to be promoted, in percent (etcd's
/// `readyPercent`, 0.9).
const LEARNER_READY_PERCENT: u64 = 90;

/// A node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Follower,
    PreCandidate,
    Candidate,
    Leader,
}

/// Why a request (proposal, configuration change, read, transfer) was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("not the leader (leader: {leader:x})")]
    NotLeader { leader: NodeId },
    #[error("leadership is being transferred to {to:x}; retry shortly")]
    Transferring { to: NodeId },
    #[error("a configuration change (index {index}) is not applied yet; retry once it is")]
    ConfChangePending { index: u64 },
    #[error("invalid configuration change: {0}")]
    InvalidConfChange(String),
    #[error("member {id:x} is the witness, which never leads; pick a regular voter")]
    TransferToWitness { id: NodeId },
    #[error("member {id:x} is not a regular voter; only a regular voter can lead")]
    NotAVoter { id: NodeId },
}

/// A linearizable read waiting for its quorum.
#[derive(Debug, Clone)]
struct PendingRead {
    round: u64,
    index: u64,
    ctx: Vec<u8>,
}

/// The leader's volatile state.
#[derive(Debug, Clone)]
struct Leading {
    progress: BTreeMap<NodeId, Progress>,
    subterm: u64,
    /// Index of the empty entry that opened the current subterm.
    subterm_start: u64,
    rset: BTreeSet<NodeId>,
    /// The subterm in which the witness last acknowledged (none yet: not 0).
    witness_subterm: Option<u64>,
    /// Highest index the witness acknowledged with a write.
    witness_match: u64,
    /// Tick at which the outstanding witness append was issued.
    witness_inflight: Option<u64>,
    /// Leader transfer in progress: (target, tick started).
    transfer: Option<(NodeId, u64)>,
    /// Reads that arrived before this term's first commit.
    reads_waiting: Vec<Vec<u8>>,
    reads: VecDeque<PendingRead>,
    read_round: u64,
    /// Highest read round the witness confirmed (its term equalled ours in a read after it).
    witness_read_ack: u64,
    /// Tick at which the outstanding witness term read was issued.
    witness_read_inflight: Option<u64>,
    /// A regular voter about to re-enter R, and the tick the hold began: the host holds new
    /// proposals so that the voter's match index can reach the last index (see
    /// [`Raft::proposals_held`]).
    reentry: Option<(NodeId, u64)>,
    /// No new hold before this tick (a hold that did not succeed backs off).
    reentry_backoff: u64,
    /// Holds in a row that did not succeed (each doubles the back-off).
    reentry_failures: u32,
    /// The last index at each of the last [`REENTRY_LOOKBACK_TICKS`] ticks, oldest first: a
    /// voter whose match index reached the oldest keeps up.
    last_at_ticks: VecDeque<u64>,
}

/// Ticks a hold for a re-entering voter may last (it usually ends after one round trip).
const REENTRY_HOLD_TICKS: u64 = 2;
/// How recent the leader's last index must be in a voter's log for a hold to be worth it.
const REENTRY_LOOKBACK_TICKS: usize = 4;

/// One node of the extended Raft.
#[derive(Debug)]
pub struct Raft {
    cfg: Config,
    membership: Membership,
    term: u64,
    vote: NodeId,
    commit: u64,
    /// What this node knows of its witness (persisted in the hard state).
    witness_known: Option<KnownWitness>,
    log: RaftLog,
    /// The latest snapshot (own, or received): what a lagging follower is sent, if
    /// `snapshot_sendable`.
    snapshot: Snapshot,
    /// Whether the host keeps `snapshot`'s data to send: true once it saved one with its data
    /// ([`Raft::compact_with`]); false after a restart, after [`Raft::compact_in_place`] (the
    /// host's state machine is the data, and moves on) and after a snapshot received from a
    /// leader (the host restores its state machine from it and need not keep it). A follower
    /// that needs a snapshot while it is false gets a new one ([`Raft::snapshot_wanted`]).
    snapshot_sendable: bool,
    /// A received snapshot the host has not persisted yet.
    pending_snapshot: Option<Snapshot>,
    /// A follower needs entries this leader dropped from memory after the latest snapshot
    /// (see [`Raft::advance`]): the host should take a new one.
    snapshot_wanted: bool,
    /// The highest index a leader said every regular member holds (heartbeats' `held`).
    heard_held: u64,
    persisted: u64,
    applied: u64,
    persisted_hs: HardState,
    role: Role,
    leader: NodeId,
    /// The highest commit index `leader` (another node) announced to this one in this term.
    leader_commit: u64,
    ticks: u64,
    election_elapsed: u64,
    heartbeat_elapsed: u64,
    randomized_timeout: u64,
    rng: StdRng,
    votes: BTreeMap<NodeId, bool>,
    /// When this node last received anything from each peer (the tick; any term, any role):
    /// a new leader does not count as silent a voter it heard from lately.
    heard: BTreeMap<NodeId, u64>,
    witness_asked: bool,
    lead: Option<Leading>,
    /// Index of the last configuration change a leader appended (or its first entry).
    pending_conf_index: u64,
    /// This node applied its own removal. The others may not know the removal is committed
    /// (their configuration still needs this node, and a leader that has not applied it keeps
    /// replicating to it), so its log may hold entries no one else has: refusing their
    /// candidates forever, unable to campaign, it would strand them. While its log holds entries
    /// not known committed it is *retiring*: it may still campaign (counting votes in its new
    /// configuration, where it has none), lead, and hand over.
    removed: bool,
    msgs: Vec<Message>,
    witness_out: Vec<WitnessRequest>,
    read_states: Vec<ReadState>,
    awaiting_advance: bool,
}

impl Raft {
    /// A node restarted from `storage` (a new member: bootstrap or joining storage).
    pub fn new(cfg: Config, storage: &impl Storage) -> Result<Raft, ConfigError> {
        cfg.validate()?;
        let hs = storage.hard_state();
        let snapshot = storage.snapshot();
        let log = RaftLog::new(&snapshot.meta, storage.entries());
        let commit = hs.commit.max(snapshot.meta.index);
        assert!(
            commit <= log.last_index(),
            "persisted commit {commit} is past the log end {}",
            log.last_index()
        );
        let mut raft = Raft {
            rng: StdRng::seed_from_u64(cfg.seed),
            cfg,
            membership: snapshot.meta.membership.clone(),
            term: hs.term,
            vote: hs.vote,
            commit,
            witness_known: hs.witness,
            persisted: log.last_index(),
            applied: snapshot.meta.index,
            log,
            snapshot,
            snapshot_sendable: false,
            pending_snapshot: None,
            snapshot_wanted: false,
            heard_held: 0,
            persisted_hs: hs,
            role: Role::Follower,
            leader: NONE,
            ticks: 0,
            election_elapsed: 0,
            heartbeat_elapsed: 0,
            randomized_timeout: 0,
            votes: BTreeMap::new(),
            heard: BTreeMap::new(),
            witness_asked: false,
            lead: None,
            pending_conf_index: 0,
            removed: false,
            leader_commit: 0,
            msgs: Vec::new(),
            witness_out: Vec::new(),
            read_states: Vec::new(),
            awaiting_advance: false,
        };
        raft.reset_election_timer();
        Ok(raft)
    }

    pub fn id(&self) -> NodeId {
        self.cfg.id
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn leader(&self) -> NodeId {
        self.leader
    }

    pub fn term(&self) -> u64 {
        self.term
    }

    pub fn commit(&self) -> u64 {
        self.commit
    }

    pub fn applied(&self) -> u64 {
        self.applied
    }

    pub fn log(&self) -> &RaftLog {
        &self.log
    }

    /// The configuration in effect (as of the applied index).
    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// The leader's current subterm and replication set.
    pub fn leader_view(&self) -> Option<(u64, &BTreeSet<NodeId>)> {
        self.lead.as_ref().map(|l| (l.subterm, &l.rset))
    }

    fn last_index(&self) -> u64 {
        self.log.last_index()
    }

    fn term_at(&self, index: u64) -> Option<u64> {
        self.log.term(index)
    }

    /// True if the deliberate bug `m` is switched on (never without the `mutations` feature).
    pub fn mutated(&self, m: Mutation) -> bool {
        #[cfg(feature = "mutations")]
        return self.cfg.mutation == Some(m);
        #[cfg(not(feature = "mutations"))]
        {
            let _ = m;
            false
        }
    }

    /// Is this node a regular voter of its configuration?
    fn voter(&self) -> bool {
        self.membership.is_regular_voter(self.cfg.id)
    }

    /// May this node campaign? A voter may, and a removed node that is still retiring.
    fn promotable(&self) -> bool {
        self.voter() || self.retiring()
    }

    /// Whether this node applied its own removal and its log holds entries not known committed
    /// (which may exist nowhere else). A removed member's host stops only once it is not.
    pub fn retiring(&self) -> bool {
        self.removed && !self.voter() && self.last_index() > self.commit
    }

    /// The highest commit index the current leader, another node, announced to this one in
    /// this term (0: none yet). A removed member that sees it cover its removal knows a leader
    /// that will apply the removal without it.
    pub fn leader_commit(&self) -> u64 {
        self.leader_commit
    }

    /// Ticks without hearing from a leader before a follower campaigns (before the spread).
    pub fn election_tick(&self) -> u64 {
        self.cfg.election_tick
    }

    fn leading(&mut self) -> &mut Leading {
        self.lead.as_mut().expect("leader")
    }

    fn send(&mut self, to: NodeId, term: u64, body: Body) {
        debug_assert!(
            Some(to) != self.membership.witness(),
            "the witness never receives messages"
        );
        // A leader tells its followers what it knows of the witness.
        let witness = (self.role == Role::Leader)
            .then_some(self.witness_known)
            .flatten();
        self.msgs.push(Message {
            from: self.cfg.id,
            to,
            term,
            body,
            witness,
        });
    }

    /// Advances logical time by one tick.
    pub fn tick(&mut self) {
        assert!(!self.awaiting_advance, "tick between ready() and advance()");
        self.ticks += 1;
        self.election_elapsed += 1;
        if self.role != Role::Leader {
            if self.election_elapsed >= self.randomized_timeout {
                self.campaign();
            }
            return;
        }
        self.heartbeat_elapsed += 1;
        if self.heartbeat_elapsed >= self.cfg.heartbeat_tick {
            self.heartbeat_elapsed = 0;
            let lead = self.leading();
            let round = if lead.reads.is_empty() {
                0
            } else {
                lead.read_round
            };
            self.broadcast_heartbeat(round, None);
            if !self.regular_quorum_reachable() {
                self.maybe_read_witness();
            }
        }
        self.expire_witness_requests();
        let (now, limit) = (self.ticks, self.cfg.election_tick);
        let lead = self.leading();
        if lead.transfer.is_some_and(|(_, t)| now - t >= limit) {
            lead.transfer = None; // the target did not take over in time: back to normal
            if !self.voter() {
                self.hand_over(); // unless this leader was removed: try again
            }
        }
        self.adjust_replication_set();
        self.hold_for_reentry();
        if self.election_elapsed >= self.cfg.election_tick {
            self.election_elapsed = 0;
            if self.cfg.check_quorum && !self.quorum_active() {
                let term = self.term;
                self.become_follower(term, NONE);
            }
        }
    }

    /// Refuses when this node is not the leader or is handing leadership over.
    fn check_leader(&self) -> Result<(), Refused> {
        match &self.lead {
            None => Err(Refused::NotLeader {
                leader: self.leader,
            }),
            Some(Leading {
                transfer: Some((to, _)),
                ..
            }) => Err(Refused::Transferring { to: *to }),
            Some(_) => Ok(()),
        }
    }

    /// Proposes a command; returns its index.
    pub fn propose(&mut self, data: Vec<u8>) -> Result<u64, Refused> {
        assert!(
            !self.awaiting_advance,
            "propose between ready() and advance()"
        );
        self.check_leader()?;
        Ok(self.append_entry(EntryData::Normal(data)))
    }

    /// Handles a message from a regular peer.
    pub fn step(&mut self, m: Message) {
        assert!(!self.awaiting_advance, "step between ready() and advance()");
        if m.to != self.cfg.id {
            return;
        }
        self.heard.insert(m.from, self.ticks);
        let disruptive_vote = matches!(
            m.body,
            Body::Vote {
                transfer: false,
                ..
            }
        );
        if m.term > self.term {
            let in_lease = self.cfg.check_quorum
                && self.leader != NONE
                && self.election_elapsed < self.cfg.election_tick;
            if disruptive_vote && in_lease {
                return; // a leader we heard from recently is alive: ignore disruption
            }
            match m.body {
                Body::Vote { pre: true, .. } => {}
                Body::VoteResp {
                    pre: true,
                    granted: true,
                } => {}
                Body::Append { .. } | Body::Heartbeat { .. } | Body::Snapshot { .. } => {
                    self.become_follower(m.term, m.from)
                }
                _ => self.become_follower(m.term, NONE),
            }
        } else if m.term < self.term {
            match m.body {
                Body::Append { .. } | Body::Heartbeat { .. } | Body::Snapshot { .. } => {
                    // Tell a stale leader about the newer term.
                    let (to, term, index) = (m.from, self.term, self.last_index());
                    self.send(
                        to,
                        term,
                        Body::AppendResp {
                            index,
                            reject: true,
                        },
                    );
                }
                Body::Vote { pre: true, .. } => {
                    let (to, term) = (m.from, self.term);
                    self.send(
                        to,
                        term,
                        Body::VoteResp {
                            pre: true,
                            granted: false,
                        },
                    );
                }
                _ => {}
            }
            return;
        }
        // (learned after the message is handled: a snapshot may bring the configuration that
        // names the witness)
        let from_leader = matches!(
            m.body,
            Body::Append { .. } | Body::Heartbeat { .. } | Body::Snapshot { .. }
        );
        let learn = m.witness.filter(|_| from_leader);
        self.handle(m);
        if let Some(k) = learn {
            self.learn_witness(k);
        }
    }

    /// Handles a message of this node's term.
    fn handle(&mut self, m: Message) {
        match m.body {
            Body::Vote {
                pre,
                last_index,
                last_term,
                ..
            } => self.handle_vote(m.from, m.term, pre, last_index, last_term),
            Body::VoteResp { pre, granted } => self.handle_vote_resp(m.from, m.term, pre, granted),
            Body::Append {
                prev_index,
                prev_term,
                entries,
                commit,
            } => {
                self.follow(m.from, m.term);
                self.leader_commit = self.leader_commit.max(commit);
                self.handle_append(m.from, prev_index, prev_term, entries, commit);
            }
            Body::Snapshot { snapshot } => {
                self.follow(m.from, m.term);
                self.handle_snapshot(m.from, snapshot);
            }
            Body::Heartbeat { commit, read, held } => {
                self.follow(m.from, m.term);
                self.heard_held = self.heard_held.max(held);
                self.leader_commit = self.leader_commit.max(commit);
                self.commit_to(commit.min(self.last_index()));
                let term = self.term;
                self.send(m.from, term, Body::HeartbeatResp { read });
            }
            Body::TimeoutNow => {
                if self.role != Role::Leader && self.promotable() && !self.unapplied_conf_change() {
                    self.start_campaign(false, true);
                }
            }
            Body::AppendResp { index, reject } => self.handle_append_resp(m.from, index, reject),
            Body::HeartbeatResp { read } => self.handle_heartbeat_resp(m.from, read),
        }
    }

    /// `leader` (of our term) spoke: follow it.
    fn follow(&mut self, leader: NodeId, term: u64) {
        if self.role != Role::Follower || self.leader != leader {
            self.become_follower(term, leader);
        }
        self.election_elapsed = 0;
    }

    pub fn has_ready(&self) -> bool {
        !self.msgs.is_empty()
            || !self.witness_out.is_empty()
            || !self.read_states.is_empty()
            || self.pending_snapshot.is_some()
            || self.persisted < self.last_index()
            || self.applied < self.commit
            || self.hard_state() != self.persisted_hs
    }

    fn hard_state(&self) -> HardState {
        HardState {
            term: self.term,
            vote: self.vote,
            commit: self.commit,
            witness: self.witness_known,
        }
    }

    /// Whether this node's commit index newly covers a configuration change that its persisted
    /// commit index does not. Until that is persisted, no message may carry it: a member that
    /// applied its own removal on that word stops, and if this leader then crashed before its
    /// fsync it would restart not knowing the change committed, with a configuration that still
    /// needs the stopped member's vote (`raft-sim --start 1320 --seeds 1 --regular 1` did).
    fn commits_unpersisted_conf_change(&self) -> bool {
        let from = self.persisted_hs.commit.max(self.log.snapshot_index()) + 1;
        self.log
            .slice(from, self.commit)
            .iter()
            .any(|e| matches!(e.data, EntryData::ConfChange(_)))
    }

    /// What the host must do now (see [`Ready`]). Call [`Raft::advance`] when done.
    pub fn ready(&mut self) -> Ready {
        assert!(!self.awaiting_advance, "ready() twice without advance()");
        self.awaiting_advance = true;
        let hs = self.hard_state();
        let mut messages = std::mem::take(&mut self.msgs);
        // A leader's appends and heartbeats carry its log and its commit index (which counts
        // only persisted entries of its own), never a promise about its disk; but they carry its
        // term, so only once term and vote are durable.
        let early_messages = if self.mutated(Mutation::SendBeforePersist) {
            std::mem::take(&mut messages)
        } else if self.mutated(Mutation::VoteBeforePersist) && self.role != Role::Leader {
            let (early, late) = messages
                .into_iter()
                .partition(|m| matches!(m.body, Body::VoteResp { .. }));
            messages = late;
            early
        } else if self.role == Role::Leader
            && (hs.term, hs.vote) == (self.persisted_hs.term, self.persisted_hs.vote)
            && !self.commits_unpersisted_conf_change()
        {
            let (early, late) = messages
                .into_iter()
                .partition(|m| matches!(m.body, Body::Append { .. } | Body::Heartbeat { .. }));
            messages = late;
            early
        } else {
            Vec::new()
        };
        let max_batch = self.cfg.max_batch;
        Ready {
            snapshot: self.pending_snapshot.take(),
            hard_state: (hs != self.persisted_hs).then_some(hs),
            entries: self
                .log
                .slice(self.persisted + 1, self.last_index())
                .to_vec(),
            early_messages: coalesce::coalesce(early_messages, max_batch),
            messages: coalesce::coalesce(messages, max_batch),
            witness_requests: std::mem::take(&mut self.witness_out),
            committed: self.log.slice(self.applied + 1, self.commit).to_vec(),
            read_states: std::mem::take(&mut self.read_states),
        }
    }

    /// The host persisted, sent and applied `ready`.
    pub fn advance(&mut self, ready: &Ready) {
        assert!(self.awaiting_advance, "advance() without ready()");
        self.awaiting_advance = false;
        if let Some(hs) = ready.hard_state {
            self.persisted_hs = hs;
        }
        if let Some(last) = ready.entries.last() {
            self.persisted = last.index;
        }
        if self.role == Role::Leader && !ready.entries.is_empty() {
            // The leader's own entries are now persisted: they count.
            self.maybe_commit();
        }
        for e in &ready.committed {
            self.applied = e.index;
            if let EntryData::ConfChange(cc) = &e.data {
                self.apply_conf_change(cc);
            }
        }
        self.maybe_leave_joint();
        self.trim_log();
    }
}
