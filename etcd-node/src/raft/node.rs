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

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use witness_core::Seen;
use witness_core::rules::{AppendReply, AppendRequest, Caller, VoteRequest};

use super::config::Config;
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
    pub fn new(cfg: Config, storage: &impl Storage) -> Result<Raft, String> {
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

    // ---- observers ----

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

    /// Who asks the witness: this cluster, its witness member, and what this node saw of that
    /// witness (the witness rules refuse a witness that lost its state).
    fn caller(&self) -> Caller {
        let witness_id = self.membership.witness().unwrap_or(NONE);
        let seen = match self.witness_known {
            Some(k) if k.id == witness_id && !self.mutated(Mutation::ForgetWitnessIdentity) => {
                k.seen
            }
            _ => Seen::NOTHING,
        };
        Caller {
            cluster_id: self.cfg.cluster_id,
            witness_id,
            seen,
        }
    }

    /// How this node asks its witness (None: the configuration has none).
    pub fn witness_caller(&self) -> Option<Caller> {
        self.membership.witness().map(|_| self.caller())
    }

    /// What this node knows of its witness.
    pub fn witness_known(&self) -> Option<KnownWitness> {
        self.witness_known
    }

    /// Learns what a witness step, or the leader, saw of witness `known.id`: only of the witness
    /// of this node's configuration (a late answer of a removed witness, or a leader whose
    /// configuration is ahead, teaches nothing until this node applies the same change).
    fn learn_witness(&mut self, known: KnownWitness) {
        if known.seen == Seen::NOTHING || Some(known.id) != self.membership.witness() {
            return;
        }
        self.witness_known = Some(KnownWitness::learn(self.witness_known, known));
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

    // ---- transitions ----

    fn reset_election_timer(&mut self) {
        self.election_elapsed = 0;
        self.heartbeat_elapsed = 0;
        let n = self.cfg.election_tick;
        self.randomized_timeout = self.rng.random_range(n..n + self.election_spread());
    }

    /// How far election timeouts are spread above `election_tick`. Raft spreads them over a
    /// whole timeout so that candidates rarely split the vote. With at most two regular voters
    /// and a witness, each candidate needs the witness's vote (or the other voter's), and the
    /// witness grants at most one per term, atomically: a split needs the witness unreachable
    /// and both voters campaigning within one message delay. A fifth of the timeout is enough
    /// spread then, and the survivor of a leader crash campaigns that much sooner on average.
    fn election_spread(&self) -> u64 {
        let n = self.cfg.election_tick;
        let v = &self.membership.voters;
        if !self.membership.is_joint() && v.witness.is_some() && v.regular.len() <= 2 {
            (n / 5).max(2).min(n)
        } else {
            n
        }
    }

    fn become_follower(&mut self, term: u64, leader: NodeId) {
        assert!(term >= self.term, "term must never decrease");
        if term > self.term || self.leader != leader {
            self.leader_commit = 0;
        }
        if term > self.term {
            self.term = term;
            self.vote = NONE;
        }
        self.role = Role::Follower;
        self.leader = leader;
        self.lead = None;
        self.reset_election_timer();
    }

    fn become_leader(&mut self) {
        assert_eq!(self.role, Role::Candidate);
        self.role = Role::Leader;
        self.leader = self.cfg.id;
        let next = self.last_index() + 1;
        let now = self.ticks;
        let silent_since = now.saturating_sub(self.cfg.liveness_ticks() + 1);
        let progress = self
            .membership
            .replicas()
            .into_iter()
            .filter(|&p| p != self.cfg.id)
            .map(|p| {
                let mut pr = Progress::new(next, now);
                if !self.votes.contains_key(&p) {
                    // Silent through the election: its liveness counts from when this node
                    // last heard from it. One long silent (down, cut off) may be replaced by
                    // the first adjustment of R at once (a leader elected with the witness's
                    // vote while the other member is down commits a tick later, not a
                    // liveness window later); one heard from lately (it handed leadership
                    // over, or its vote is merely slower than the witness's over a WAN) keeps
                    // its place, so the cluster does not depend on the witness for nothing.
                    pr.last_heard = self.heard.get(&p).map_or(silent_since, |&t| t.min(now));
                }
                (p, pr)
            })
            .collect();
        self.lead = Some(Leading {
            progress,
            subterm: 0,
            subterm_start: next,
            rset: self.membership.voters.regular.clone(),
            witness_subterm: None,
            witness_match: 0,
            witness_inflight: None,
            transfer: None,
            reads_waiting: Vec::new(),
            reads: VecDeque::new(),
            read_round: 0,
            witness_read_ack: 0,
            witness_read_inflight: None,
            reentry: None,
            reentry_backoff: 0,
            reentry_failures: 0,
            last_at_ticks: VecDeque::from([next]),
        });
        self.reset_election_timer();
        // No configuration change until this first entry is applied (a configuration change
        // proposed before the leader commits in its term could overlap an unknown earlier one).
        self.pending_conf_index = self.append_entry(EntryData::Empty);
        // A member silent through the election leaves R now, not at the next tick.
        self.adjust_replication_set();
        if !self.voter() {
            // A retiring node won (its log held what the others lacked): it leads only to
            // replicate that and hand over.
            self.hand_over();
        }
    }

    /// Starts an election (or a pre-vote round). Also callable by tests and the host.
    pub fn campaign(&mut self) {
        if self.role == Role::Leader || !self.promotable() || self.unapplied_conf_change() {
            return;
        }
        self.start_campaign(self.cfg.pre_vote, false);
    }

    /// Whether a committed configuration change is not applied yet. A node does not campaign
    /// then (etcd's guard): it would count votes in a configuration already replaced.
    fn unapplied_conf_change(&self) -> bool {
        self.commit > self.applied
            && self
                .log
                .slice(self.applied + 1, self.commit)
                .iter()
                .any(|e| matches!(e.data, EntryData::ConfChange(_)))
    }

    fn start_campaign(&mut self, pre: bool, transfer: bool) {
        if pre {
            self.role = Role::PreCandidate;
            self.leader = NONE;
        } else {
            self.term += 1;
            self.vote = self.cfg.id;
            self.role = Role::Candidate;
            self.leader = NONE;
        }
        self.lead = None;
        self.reset_election_timer();
        self.votes.clear();
        self.witness_asked = false;
        self.votes.insert(self.cfg.id, true);
        let term = self.vote_term();
        let last_index = self.last_index();
        let (last_term, _) = self.log.last_position();
        let voters: BTreeSet<NodeId> = self
            .membership
            .halves()
            .flat_map(|h| h.regular.iter().copied())
            .filter(|&v| v != self.cfg.id)
            .collect();
        for p in voters {
            self.send(
                p,
                term,
                Body::Vote {
                    pre,
                    last_index,
                    last_term,
                    transfer,
                },
            );
        }
        self.poll();
    }

    /// The term a (pre-)candidate campaigns in.
    fn vote_term(&self) -> u64 {
        if self.role == Role::PreCandidate {
            self.term + 1
        } else {
            self.term
        }
    }

    /// Counts votes; wins, loses, or asks the witness when its vote would complete a quorum.
    fn poll(&mut self) {
        let granted = |v: NodeId| self.votes.get(&v) == Some(&true);
        if self.membership.majority(granted) {
            if self.role == Role::PreCandidate {
                self.start_campaign(false, false);
            } else {
                self.become_leader();
            }
            return;
        }
        if !self
            .membership
            .majority(|v| self.votes.get(&v) != Some(&false))
        {
            let term = self.term;
            self.become_follower(term, NONE);
            return;
        }
        let Some(w) = self.membership.witness() else {
            return;
        };
        if self.witness_asked || !self.membership.majority(|v| v == w || granted(v)) {
            return;
        }
        self.witness_asked = true;
        let granted_in = |set: &BTreeSet<NodeId>| -> Vec<NodeId> {
            set.iter().copied().filter(|&v| granted(v)).collect()
        };
        let (last_log_term, last_log_subterm) = self.log.last_position();
        let request = VoteRequest {
            caller: self.caller(),
            term: self.vote_term(),
            candidate: self.cfg.id,
            last_log_term,
            last_log_subterm,
            granted: granted_in(&self.membership.voters.regular),
            granted_outgoing: self
                .membership
                .outgoing
                .as_ref()
                .map_or_else(Vec::new, |o| granted_in(&o.regular)),
        };
        let pre = self.role == Role::PreCandidate;
        self.witness_out.push(WitnessRequest::Vote { pre, request });
    }

    // ---- input ----

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

    /// Proposes a configuration change; returns its index. It takes effect when applied. A
    /// change of more than one voter passes through a joint configuration, which the leader
    /// leaves by itself once the change is applied.
    pub fn propose_conf_change(&mut self, cc: ConfChange) -> Result<u64, Refused> {
        assert!(
            !self.awaiting_advance,
            "propose between ready() and advance()"
        );
        self.check_leader()?;
        if self.pending_conf_index > self.applied {
            return Err(Refused::ConfChangePending {
                index: self.pending_conf_index,
            });
        }
        let next = self
            .membership
            .apply(&cc)
            .map_err(Refused::InvalidConfChange)?;
        if cc.changes.is_empty() {
            return Err(Refused::InvalidConfChange(
                "the leader leaves a joint configuration by itself".into(),
            ));
        }
        if !next.voters.regular.contains(&self.cfg.id) {
            return Err(Refused::InvalidConfChange(format!(
                "it removes the leader ({:x}); transfer leadership to another member first",
                self.cfg.id
            )));
        }
        let index = self.append_entry(EntryData::ConfChange(cc));
        self.pending_conf_index = index;
        Ok(index)
    }

    /// etcd's strict reconfiguration check, for a leader about to propose `cc`: would the
    /// configuration after it have a quorum among this leader, the regular voters it heard from
    /// lately and the current witness when the host says it is usable (its storage opens and
    /// answers)? Refuses a change that leaves the cluster unable to commit, e.g. removing the
    /// witness while the other member is down, or removing the other member while the witness
    /// cannot be reached. A witness being added does not count.
    pub fn check_reconfig_quorum(
        &self,
        cc: &ConfChange,
        witness_usable: bool,
    ) -> Result<(), Refused> {
        self.check_leader()?;
        let next = self
            .membership
            .apply(cc)
            .map_err(Refused::InvalidConfChange)?;
        // etcd's readiness rule: a learner is promoted only once it holds at least 90% of the
        // leader's log, so the new voter does not hold the quorum back while it catches up.
        let leader_match = self.match_of(self.cfg.id);
        for c in &cc.changes {
            let promoted =
                c.kind == ChangeKind::AddVoter && self.membership.learners.contains(&c.node);
            if promoted
                && u128::from(self.match_of(c.node)) * 100
                    < u128::from(leader_match) * u128::from(LEARNER_READY_PERCENT)
            {
                return Err(Refused::InvalidConfChange(
                    "can only promote a learner member which is in sync with leader".into(),
                ));
            }
        }
        let w = next
            .witness()
            .filter(|&w| witness_usable && self.membership.witness() == Some(w));
        let unreachable: Vec<String> = next
            .voters
            .regular
            .iter()
            .filter(|&&v| v != self.cfg.id && !self.reachable(v))
            .map(|v| format!("member {v:x} is not reachable"))
            .chain(
                next.witness()
                    .filter(|&v| Some(v) != w)
                    .map(|v| format!("the witness {v:x} cannot be used from this member")),
            )
            .collect();
        if next
            .voters
            .majority(|v| Some(v) == w || v == self.cfg.id || self.reachable(v))
        {
            return Ok(());
        }
        Err(Refused::InvalidConfChange(format!(
            "the configuration after this change would have no quorum: {}; start the member \
             (or wait until it is connected) or repair the witness, and try again",
            unreachable.join(", ")
        )))
    }

    /// Hands leadership to regular voter `to` (never the witness): once `to` holds the whole
    /// log it is told to campaign at once. Proposals are refused meanwhile; the transfer is
    /// abandoned after an election timeout.
    pub fn transfer_leader(&mut self, to: NodeId) -> Result<(), Refused> {
        assert!(
            !self.awaiting_advance,
            "transfer between ready() and advance()"
        );
        self.check_leader()?;
        if Some(to) == self.membership.witness() {
            return Err(Refused::TransferToWitness { id: to });
        }
        if to == self.cfg.id {
            return Ok(());
        }
        if !self.membership.voters.regular.contains(&to) {
            return Err(Refused::NotAVoter { id: to });
        }
        self.start_transfer(to);
        Ok(())
    }

    /// Tells regular voter `to` to campaign once it holds the whole log.
    fn start_transfer(&mut self, to: NodeId) {
        let (now, last) = (self.ticks, self.last_index());
        let lead = self.leading();
        lead.transfer = Some((to, now));
        if lead.progress[&to].matched == last {
            let term = self.term;
            self.send(to, term, Body::TimeoutNow);
        } else {
            self.send_append(to);
        }
    }

    /// Asks for a linearizable read: a [`ReadState`] with `ctx` appears in a later `Ready` once
    /// it is safe to read at its index. Only the leader answers (a host forwards reads to it).
    pub fn read_index(&mut self, ctx: Vec<u8>) -> Result<(), Refused> {
        assert!(!self.awaiting_advance, "read between ready() and advance()");
        if self.lead.is_none() {
            return Err(Refused::NotLeader {
                leader: self.leader,
            });
        }
        if self.term_at(self.commit) != Some(self.term) {
            // The commit index is only known current once an entry of this term commits.
            self.leading().reads_waiting.push(ctx);
            return Ok(());
        }
        self.start_reads(vec![ctx]);
        Ok(())
    }

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
    fn replaces_snapshot(&self, index: u64, sendable: bool) -> bool {
        let latest = self.snapshot.meta.index;
        index > latest || (index == latest && sendable && !self.snapshot_sendable)
    }

    /// Drops the log up to the snapshot `m` if it still holds those entries; false if `m`
    /// does not replace the latest snapshot.
    fn compact_log(&mut self, m: &SnapshotMeta, sendable: bool) -> bool {
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
    fn trim_log(&mut self) {
        let upto = self.applied.min(self.held_by_all());
        let start = self.log.snapshot_index();
        let held = self.log.last_index() - start;
        if upto > start && (upto - start) * 2 >= held {
            self.log.compact_to(upto);
        }
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

    fn handle_vote(&mut self, from: NodeId, term: u64, pre: bool, last_index: u64, last_term: u64) {
        let can_vote = self.vote == from
            || (self.vote == NONE && self.leader == NONE)
            || (pre && term > self.term);
        let (my_last_term, _) = self.log.last_position();
        let up_to_date = (last_term, last_index) >= (my_last_term, self.last_index());
        let granted = can_vote && up_to_date;
        if granted && !pre {
            self.vote = from;
            self.election_elapsed = 0;
        }
        // A granted pre-vote answers in the term asked about; anything else in ours.
        let reply_term = if granted && pre { term } else { self.term };
        self.send(from, reply_term, Body::VoteResp { pre, granted });
    }

    fn handle_vote_resp(&mut self, from: NodeId, term: u64, pre: bool, granted: bool) {
        let expected = if pre {
            Role::PreCandidate
        } else {
            Role::Candidate
        };
        if self.role != expected || term != self.vote_term() {
            return;
        }
        self.votes.entry(from).or_insert(granted);
        self.poll();
    }

    fn reply_append(&mut self, to: NodeId, index: u64, reject: bool) {
        let term = self.term;
        self.send(to, term, Body::AppendResp { index, reject });
    }

    fn handle_append(
        &mut self,
        from: NodeId,
        prev_index: u64,
        prev_term: u64,
        entries: Vec<Entry>,
        commit: u64,
    ) {
        if prev_index < self.commit {
            // Already committed here: answer with what we have committed.
            self.reply_append(from, self.commit, false);
            return;
        }
        if self.term_at(prev_index) != Some(prev_term) {
            let hint = self.last_index().min(prev_index.saturating_sub(1));
            self.reply_append(from, hint, true);
            return;
        }
        let last_new = prev_index + entries.len() as u64;
        for e in entries {
            if e.index <= self.last_index() {
                if self.term_at(e.index) == Some(e.term) {
                    continue;
                }
                assert!(
                    e.index > self.commit,
                    "leader asked to overwrite committed entry {}",
                    e.index
                );
                self.log.truncate_from(e.index);
                self.persisted = self.persisted.min(e.index - 1);
            }
            self.log.push(e);
        }
        self.commit_to(commit.min(last_new));
        self.reply_append(from, last_new, false);
    }

    fn handle_snapshot(&mut self, from: NodeId, snapshot: Snapshot) {
        let index = snapshot.meta.index;
        if index <= self.commit {
            self.reply_append(from, self.commit, false);
            return;
        }
        if self.term_at(index) == Some(snapshot.meta.term) {
            // We hold the snapshot's last entry, hence everything before it.
            self.commit_to(index);
            self.reply_append(from, index, false);
            return;
        }
        self.log.restore(&snapshot.meta);
        self.membership = snapshot.meta.membership.clone();
        // The Ready that carries the snapshot persists and applies it before anything else.
        (self.commit, self.persisted, self.applied) = (index, index, index);
        self.snapshot = snapshot.clone();
        self.snapshot_sendable = false;
        self.snapshot_wanted = false;
        self.pending_snapshot = Some(snapshot);
        self.reply_append(from, index, false);
    }

    fn commit_to(&mut self, index: u64) {
        if index > self.commit {
            assert!(
                index <= self.last_index(),
                "commit {index} past the log end"
            );
            self.commit = index;
        }
    }

    // ---- leader ----

    fn append_entry(&mut self, data: EntryData) -> u64 {
        let subterm = self.lead.as_ref().expect("only a leader appends").subterm;
        let entry = Entry {
            term: self.term,
            subterm,
            index: self.last_index() + 1,
            data,
        };
        self.log.push(entry);
        let peers: Vec<NodeId> = self.leading().progress.keys().copied().collect();
        for p in peers {
            self.send_append(p);
        }
        self.maybe_commit();
        self.last_index()
    }

    fn send_append(&mut self, to: NodeId) {
        let (last, max_batch, max_inflight, now) = (
            self.last_index(),
            self.cfg.max_batch as u64,
            self.cfg.max_inflight,
            self.ticks,
        );
        let lead = self.lead.as_mut().expect("leader");
        let Some(pr) = lead.progress.get_mut(&to) else {
            return;
        };
        if !pr.can_send(max_inflight) || (pr.replicate && pr.next > last) {
            return;
        }
        let prev_index = pr.next - 1;
        let body = match self.log.term(prev_index) {
            Some(prev_term) => {
                let hi = last.min(prev_index + max_batch);
                let entries = self.log.slice(prev_index + 1, hi).to_vec();
                pr.sent(hi.max(prev_index));
                Body::Append {
                    prev_index,
                    prev_term,
                    entries,
                    commit: self.commit,
                }
            }
            None if !self.snapshot_sendable
                || self.snapshot.meta.index < self.log.snapshot_index() =>
            {
                // Dropped from memory after the latest snapshot (trim_log), or the host keeps
                // no data of it (compact_in_place, a restart): a new one is needed. The follower
                // waits for it (this is asked again on its heartbeats).
                self.snapshot_wanted = true;
                return;
            }
            None => {
                // The entries the follower needs are compacted: send the snapshot instead.
                pr.snapshot = Some((self.snapshot.meta.index, now));
                Body::Snapshot {
                    snapshot: self.snapshot.clone(),
                }
            }
        };
        let term = self.term;
        self.send(to, term, body);
    }

    /// The highest index every regular member holds: on a leader, the lowest of its own
    /// persisted index and its followers' match indexes; on a follower, what its leader said.
    fn held_by_all(&self) -> u64 {
        match &self.lead {
            Some(lead) => lead
                .progress
                .values()
                .map(|pr| pr.matched)
                .fold(self.persisted, u64::min),
            None => self.heard_held,
        }
    }

    /// Sends each follower a heartbeat with the commit index it can apply and read round
    /// `read`. With `newer_than`, only to the followers that hold entries committed after it:
    /// a new commit is told at once (otherwise followers learn it with the next append or
    /// heartbeat, up to a heartbeat later: a follower that forwarded a client's proposal would
    /// answer that much later).
    fn broadcast_heartbeat(&mut self, read: u64, newer_than: Option<u64>) {
        let (term, commit, held) = (self.term, self.commit, self.held_by_all());
        let targets: Vec<(NodeId, u64)> = self
            .leading()
            .progress
            .iter()
            .map(|(&p, pr)| (p, commit.min(pr.matched)))
            .filter(|&(_, c)| newer_than.is_none_or(|before| c > before))
            .collect();
        for (p, commit) in targets {
            self.send(p, term, Body::Heartbeat { commit, read, held });
        }
    }

    fn handle_append_resp(&mut self, from: NodeId, index: u64, reject: bool) {
        let (now, last) = (self.ticks, self.last_index());
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let Some(pr) = lead.progress.get_mut(&from) else {
            return;
        };
        pr.last_heard = now;
        if pr.snapshot.is_some_and(|(sent, _)| reject || index < sent) {
            // An answer to an Append sent before the snapshot (nothing else is sent while it
            // is outstanding; the snapshot's own answer covers its index): stale. Probing
            // again would send the snapshot again, once per such answer, while the first one
            // is still on its way.
            return;
        }
        if reject {
            let next = (index + 1).min(pr.next.saturating_sub(1)).max(1);
            pr.probe_from(next);
        } else if pr.acknowledge(index) {
            let caught_up = pr.matched == last;
            let reentering = caught_up && lead.reentry.is_some_and(|(v, _)| v == from);
            if caught_up && lead.transfer.is_some_and(|(to, _)| to == from) {
                let term = self.term;
                self.send(from, term, Body::TimeoutNow);
            }
            if reentering {
                // The hold did its job: the voter re-enters R now, not at the next tick.
                self.adjust_replication_set();
            }
            self.maybe_commit();
        }
        self.send_append(from);
    }

    fn handle_heartbeat_resp(&mut self, from: NodeId, read: u64) {
        let (now, last, retry) = (self.ticks, self.last_index(), self.cfg.election_tick);
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let Some(pr) = lead.progress.get_mut(&from) else {
            return;
        };
        pr.last_heard = now;
        pr.read_ack = pr.read_ack.max(read);
        if let Some((_, sent)) = pr.snapshot {
            if now - sent > retry {
                // The snapshot was lost: send it again.
                pr.probe_from(pr.next);
                self.send_append(from);
            }
        } else if !pr.replicate {
            pr.paused = false;
            self.send_append(from);
        } else if pr.matched < last {
            // Appends may have been lost (a partition, a drop). Ask about the entry before
            // `next` with no entries: a follower that lacks it rejects, and we probe from its hint.
            let prev_index = pr.next - 1;
            if let Some(prev_term) = self.log.term(prev_index) {
                let (term, commit) = (self.term, self.commit);
                self.send(
                    from,
                    term,
                    Body::Append {
                        prev_index,
                        prev_term,
                        entries: Vec::new(),
                        commit,
                    },
                );
            } else {
                pr.probe_from(pr.next);
                self.send_append(from);
            }
        }
        self.serve_reads();
    }

    /// The index a subquorum of R (the leader included) has persisted: (quorum - 1)-th highest
    /// match among R's regular members; 0 if R's regular members are fewer. Outside a joint
    /// configuration only (the witness is never in R during one).
    fn subquorum_index(&self) -> u64 {
        let lead = self.lead.as_ref().expect("leader");
        let need = self.membership.voters.quorum() - 1;
        let mut matches: Vec<u64> = lead
            .rset
            .iter()
            .filter(|&&m| self.membership.voters.regular.contains(&m))
            .map(|&m| self.match_of(m))
            .collect();
        matches.sort_unstable_by(|a, b| b.cmp(a));
        if need == 0 || matches.len() < need {
            0
        } else {
            matches[need - 1]
        }
    }

    /// A regular member's persisted index as the leader knows it.
    fn match_of(&self, id: NodeId) -> u64 {
        if id == self.cfg.id {
            if self.mutated(Mutation::CommitBeforePersist) {
                return self.last_index();
            }
            return self.persisted;
        }
        let lead = self.lead.as_ref().expect("leader");
        lead.progress.get(&id).map_or(0, |p| p.matched)
    }

    /// The highest index the witness counts as having acknowledged (with the shortcut).
    fn witness_credit(&self) -> u64 {
        let lead = self.lead.as_ref().expect("leader");
        let Some(w) = self.membership.witness() else {
            return 0;
        };
        let mut credit = lead.witness_match;
        let pinned = lead.witness_subterm == Some(lead.subterm)
            || self.mutated(Mutation::CreditWitnessWithoutWrite);
        if pinned && lead.rset.contains(&w) {
            let sq = self.subquorum_index();
            if sq >= lead.subterm_start {
                credit = credit.max(sq);
            }
        }
        credit
    }

    fn maybe_commit(&mut self) {
        if self.lead.is_none() {
            return;
        }
        let witness = self.membership.witness();
        let credit = self.witness_credit();
        let candidate = self.membership.committed(|v| {
            if Some(v) == witness {
                credit
            } else {
                self.match_of(v)
            }
        });
        if candidate > self.commit && self.term_at(candidate) == Some(self.term) {
            let before = self.commit;
            self.commit_to(candidate);
            self.broadcast_heartbeat(0, Some(before));
            let waiting = std::mem::take(&mut self.leading().reads_waiting);
            self.start_reads(waiting);
        }
        self.maybe_ask_witness();
    }

    /// AppendToWitness when conditions 1-4 hold (design note "Log replication to the witness").
    fn maybe_ask_witness(&mut self) {
        let Some(w) = self.membership.voters.witness else {
            return;
        };
        let Some(lead) = self.lead.as_ref() else {
            return;
        };
        if self.membership.is_joint()
            || !lead.rset.contains(&w)
            || lead.witness_subterm == Some(lead.subterm)
            || lead.witness_inflight.is_some()
        {
            return;
        }
        let index = self.subquorum_index();
        if index < lead.subterm_start {
            return; // nothing of the current subterm is persisted by a subquorum of R yet
        }
        // Condition 1: every entry from the subterm's start on is of (term, subterm); the entry
        // itself may already be compacted.
        if let Some(entry) = self.log.entry(index) {
            assert_eq!(
                (entry.term, entry.subterm),
                (self.term, lead.subterm),
                "condition 1"
            );
        }
        let request = AppendRequest {
            caller: self.caller(),
            term: self.term,
            leader: self.cfg.id,
            entry_term: self.term,
            entry_subterm: lead.subterm,
            index,
            replication_set: lead.rset.iter().copied().collect(),
            replication_set_outgoing: Vec::new(),
        };
        let now = self.ticks;
        self.leading().witness_inflight = Some(now);
        self.witness_out.push(WitnessRequest::Append(request));
    }

    fn expire_witness_requests(&mut self) {
        let (now, limit) = (self.ticks, self.cfg.election_tick);
        let lead = self.leading();
        if lead.witness_inflight.is_some_and(|t| now - t > limit) {
            lead.witness_inflight = None;
            self.maybe_ask_witness();
        }
        let lead = self.leading();
        if lead.witness_read_inflight.is_some_and(|t| now - t > limit) {
            lead.witness_read_inflight = None;
        }
    }

    fn adjust_replication_set(&mut self) {
        let transferring = self.lead.as_ref().is_some_and(|l| l.transfer.is_some());
        if transferring
            || self.membership.is_joint()
            || !self.membership.voters.regular.contains(&self.cfg.id)
        {
            // During a transfer, a new subterm's entry would leave the target behind the log.
            return;
        }
        let last = self.last_index();
        let skip_catch_up = self.mutated(Mutation::ReenterBeforeCatchUp);
        let next = self.adjusted_rset(|pr| pr.matched == last || skip_catch_up);
        if next != self.leading().rset {
            let lead = self.leading();
            if lead.reentry.take().is_some() {
                lead.reentry_failures = 0;
            }
            self.new_subterm(next);
        }
    }

    /// R after adjustment, with `caught_up` deciding whether a reachable voter may enter it.
    fn adjusted_rset(&self, caught_up: impl Fn(&Progress) -> bool) -> BTreeSet<NodeId> {
        let (now, window) = (self.ticks, self.cfg.liveness_ticks());
        let lead = self.lead.as_ref().expect("leader");
        replication_set::adjust(
            &lead.rset,
            &self.membership.voters.regular,
            self.membership.voters.witness,
            self.cfg.id,
            |v| {
                let pr = &lead.progress[&v];
                Liveness {
                    reachable: now - pr.last_heard <= window,
                    caught_up: caught_up(pr),
                }
            },
        )
    }

    /// A voter that keeps up under a steady stream of proposals may never hold the very last
    /// index, so it would never re-enter R and the cluster would keep depending on the witness.
    /// When a reachable voter outside R holds everything the leader had
    /// [`REENTRY_LOOKBACK_TICKS`] ago, the leader asks the host to hold new proposals (at most
    /// [`REENTRY_HOLD_TICKS`]) so that the voter catches up and re-enters R; a hold that does
    /// not succeed backs off, an election timeout the first time, twice that the next, up to 16
    /// times. Called once per tick, after the adjustment.
    fn hold_for_reentry(&mut self) {
        let (now, last, election) = (self.ticks, self.last_index(), self.cfg.election_tick);
        let lead = self.leading();
        let mark = lead.last_at_ticks[0];
        if lead.last_at_ticks.len() == REENTRY_LOOKBACK_TICKS {
            lead.last_at_ticks.pop_front();
        }
        lead.last_at_ticks.push_back(last);
        match lead.reentry {
            Some((_, since)) if now - since >= REENTRY_HOLD_TICKS => {
                lead.reentry = None;
                lead.reentry_backoff = now + (election << lead.reentry_failures.min(4));
                lead.reentry_failures += 1;
            }
            Some(_) => {}
            None if now < lead.reentry_backoff || lead.transfer.is_some() => {}
            None => {
                if self.membership.is_joint() {
                    return;
                }
                let rset = self.leading().rset.clone();
                let entering = self
                    .adjusted_rset(|pr| pr.matched >= mark)
                    .into_iter()
                    .find(|v| !rset.contains(v) && self.membership.voters.regular.contains(v));
                if let Some(v) = entering {
                    self.leading().reentry = Some((v, now));
                }
            }
        }
    }

    /// Should the host hold new proposals for now? True for at most [`REENTRY_HOLD_TICKS`] while
    /// a voter that keeps up catches up to re-enter the replication set. Proposing anyway is
    /// safe; it only keeps that voter out of R longer.
    pub fn proposals_held(&self) -> bool {
        self.lead.as_ref().is_some_and(|l| l.reentry.is_some())
    }

    /// Starts a subterm with replication set `rset`, opened by an empty entry.
    fn new_subterm(&mut self, rset: BTreeSet<NodeId>) {
        let start = self.last_index() + 1;
        let lead = self.leading();
        lead.rset = rset;
        lead.subterm += 1;
        lead.subterm_start = start;
        self.append_entry(EntryData::Empty);
    }

    /// Is a follower recently heard from (within the liveness window)?
    fn reachable(&self, id: NodeId) -> bool {
        let lead = self.lead.as_ref().expect("leader");
        lead.progress
            .get(&id)
            .is_some_and(|p| self.ticks - p.last_heard <= self.cfg.liveness_ticks())
    }

    /// Would the regular voters we hear from make a quorum without the witness?
    fn regular_quorum_reachable(&self) -> bool {
        let w = self.membership.witness();
        self.membership
            .majority(|v| Some(v) != w && (v == self.cfg.id || self.reachable(v)))
    }

    /// Is the witness pinned in this subterm: in R, and it acknowledged (so it recorded our R)?
    fn witness_pinned(&self) -> bool {
        let lead = self.lead.as_ref().expect("leader");
        self.membership
            .voters
            .witness
            .is_some_and(|w| lead.rset.contains(&w) && lead.witness_subterm == Some(lead.subterm))
    }

    /// Check-quorum: a quorum heard from within an election timeout, counting the witness when
    /// it is pinned in this subterm (it recorded this leader's R and acknowledged).
    fn quorum_active(&self) -> bool {
        let lead = self.lead.as_ref().expect("leader");
        let window = self.cfg.election_tick;
        let witness = self.membership.witness();
        let pinned = self.witness_pinned();
        self.membership.majority(|v| {
            v == self.cfg.id
                || (Some(v) == witness && pinned)
                || lead
                    .progress
                    .get(&v)
                    .is_some_and(|p| self.ticks - p.last_heard <= window)
        })
    }

    // ---- reads ----

    /// Starts ReadIndex for `ctxs` at the current commit index (which is of this term).
    fn start_reads(&mut self, ctxs: Vec<Vec<u8>>) {
        if ctxs.is_empty() {
            return;
        }
        let index = self.commit;
        let alone = self.membership.majority(|v| v == self.cfg.id);
        // Two regular voters and the witness pinned to us: no one else can win an election
        // while this subterm lasts, so our commit index is current without a round trip.
        let pinned_pair = !self.membership.is_joint()
            && self.voter()
            && self.membership.voters.regular.len() == 2
            && self.witness_pinned();
        if alone || pinned_pair || self.mutated(Mutation::ReadWithoutConfirmation) {
            self.read_states
                .extend(ctxs.into_iter().map(|ctx| ReadState { index, ctx }));
            return;
        }
        let lead = self.leading();
        lead.read_round += 1;
        let round = lead.read_round;
        lead.reads.extend(
            ctxs.into_iter()
                .map(|ctx| PendingRead { round, index, ctx }),
        );
        self.broadcast_heartbeat(round, None);
        if !self.regular_quorum_reachable() {
            self.maybe_read_witness();
        }
    }

    /// Reads the witness's term for the latest read round (one read in flight at most).
    fn maybe_read_witness(&mut self) {
        if self.membership.witness().is_none() {
            return;
        }
        let (caller, term, now) = (self.caller(), self.term, self.ticks);
        let lead = self.leading();
        if lead.reads.is_empty() || lead.witness_read_inflight.is_some() {
            return;
        }
        lead.witness_read_inflight = Some(now);
        let round = lead.read_round;
        self.witness_out.push(WitnessRequest::ReadTerm {
            caller,
            term,
            round,
        });
    }

    /// Answers the pending reads whose round a quorum confirmed.
    fn serve_reads(&mut self) {
        let Some(lead) = self.lead.as_ref() else {
            return;
        };
        let witness = self.membership.witness();
        let confirmed = |round: u64| {
            self.membership.majority(|v| {
                v == self.cfg.id
                    || (Some(v) == witness && lead.witness_read_ack >= round)
                    || lead.progress.get(&v).is_some_and(|p| p.read_ack >= round)
            })
        };
        let served = lead.reads.iter().take_while(|r| confirmed(r.round)).count();
        let lead = self.leading();
        let done: Vec<PendingRead> = lead.reads.drain(..served).collect();
        self.read_states.extend(done.into_iter().map(|r| ReadState {
            index: r.index,
            ctx: r.ctx,
        }));
    }

    // ---- the witness's answers ----

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

    /// Handles the outcome of a witness step the host ran for this node.
    pub fn step_witness(&mut self, response: WitnessResponse) {
        assert!(
            !self.awaiting_advance,
            "step_witness between ready() and advance()"
        );
        let witness = response.witness_id();
        match &response {
            WitnessResponse::Append { seen, .. }
            | WitnessResponse::Vote { seen, .. }
            | WitnessResponse::ReadTerm { seen, .. } => self.learn_witness(KnownWitness {
                id: witness,
                seen: *seen,
            }),
            WitnessResponse::Failed { .. } => {}
        }
        match response {
            WitnessResponse::Append { request, reply, .. } => {
                if let AppendReply::StaleTerm { term } = reply
                    && term > self.term
                {
                    self.become_follower(term, NONE);
                    return;
                }
                if self.role != Role::Leader
                    || request.term != self.term
                    || request.caller.witness_id != self.membership.witness().unwrap_or(NONE)
                {
                    return;
                }
                let stale_ack_credited = self.mutated(Mutation::CreditStaleSubtermAck);
                let lead = self.leading();
                lead.witness_inflight = None;
                if let AppendReply::Ack { index, .. } = reply {
                    lead.witness_match = lead.witness_match.max(index);
                    lead.witness_subterm = lead.witness_subterm.max(Some(request.entry_subterm));
                    if stale_ack_credited {
                        lead.witness_subterm = Some(lead.subterm);
                    }
                }
                self.maybe_commit();
            }
            WitnessResponse::Vote {
                pre,
                request,
                reply,
                ..
            } => {
                if !reply.granted && reply.term > self.term && !(pre && reply.term < request.term) {
                    self.become_follower(reply.term, NONE);
                    return;
                }
                let expected = if pre {
                    Role::PreCandidate
                } else {
                    Role::Candidate
                };
                let w = request.caller.witness_id;
                if self.role != expected
                    || request.term != self.vote_term()
                    || Some(w) != self.membership.witness()
                {
                    return;
                }
                self.votes.entry(w).or_insert(reply.granted);
                self.poll();
            }
            WitnessResponse::ReadTerm {
                witness,
                term,
                round,
                witness_term,
                ..
            } => {
                if witness_term > self.term {
                    self.become_follower(witness_term, NONE);
                    return;
                }
                if self.role != Role::Leader
                    || term != self.term
                    || Some(witness) != self.membership.witness()
                {
                    return;
                }
                let lead = self.leading();
                lead.witness_read_inflight = None;
                if witness_term == term {
                    lead.witness_read_ack = lead.witness_read_ack.max(round);
                }
                self.serve_reads();
            }
            WitnessResponse::Failed { request } => {
                if Some(request.witness_id()) != self.membership.witness() {
                    return; // a failure of a witness no longer in the configuration
                }
                if let Some(lead) = self.lead.as_mut() {
                    match request {
                        WitnessRequest::Append(_) => lead.witness_inflight = None,
                        WitnessRequest::ReadTerm { .. } => lead.witness_read_inflight = None,
                        WitnessRequest::Vote { .. } => {}
                    }
                }
            }
        }
    }

    // ---- configuration ----

    /// A committed configuration change is applied: it takes effect now.
    fn apply_conf_change(&mut self, cc: &ConfChange) {
        // A change that no longer applies (it was checked against the configuration it was
        // proposed in) is skipped identically on every node.
        let Ok(next) = self.membership.apply(cc) else {
            return;
        };
        let witness_changed = next.witness() != self.membership.witness();
        let was_voter = self.voter();
        self.membership = next;
        if let Some(w) = self.membership.witness()
            && witness_changed
            && cc.witness_generation != 0
        {
            // The new witness's generation, read by the proposer from its fresh storage: every
            // member is bound to it before the witness can be used.
            self.witness_known = Some(KnownWitness {
                id: w,
                seen: Seen {
                    generation: cc.witness_generation,
                    ..Seen::NOTHING
                },
            });
        }
        if witness_changed && let Some(lead) = self.lead.as_mut() {
            // Nothing a previous witness acknowledged or confirmed counts for a new one.
            lead.witness_match = 0;
            lead.witness_subterm = None;
            lead.witness_inflight = None;
            lead.witness_read_ack = 0;
            lead.witness_read_inflight = None;
        }
        if self.role != Role::Leader {
            self.removed |= was_voter && !self.voter();
            if !self.promotable() && self.role != Role::Follower {
                let term = self.term;
                self.become_follower(term, NONE);
            }
            return;
        }
        let (next_index, now) = (self.last_index() + 1, self.ticks);
        let replicas: BTreeSet<NodeId> = self
            .membership
            .replicas()
            .into_iter()
            .filter(|&p| p != self.cfg.id)
            .collect();
        let voters = self.membership.voters.regular.clone();
        let lead = self.leading();
        lead.progress.retain(|p, _| replicas.contains(p));
        for p in replicas {
            lead.progress
                .entry(p)
                .or_insert_with(|| Progress::new(next_index, now));
        }
        if lead.transfer.is_some_and(|(to, _)| !voters.contains(&to)) {
            lead.transfer = None;
        }
        // "A configuration change resets R to the regular voters and increments the subterm."
        self.new_subterm(voters);
        if !self.voter() {
            self.removed |= was_voter;
            self.hand_over();
        }
    }

    /// This leader applied its own removal (an earlier leader proposed it). Stepping down at
    /// once could strand the others: they may not know the change is committed, so their old
    /// configuration still needs this node's vote. It keeps leading as a non-voter instead,
    /// refusing proposals, replicating and heartbeating the commit index, and hands leadership
    /// to the most up-to-date regular voter, again whenever a handover times out.
    fn hand_over(&mut self) {
        let lead = self.lead.as_ref().expect("leader");
        let target = self
            .membership
            .voters
            .regular
            .iter()
            .copied()
            .max_by_key(|&v| (lead.progress.get(&v).map_or(0, |p| p.matched), Reverse(v)));
        match target {
            Some(to) => self.start_transfer(to),
            None => {
                let term = self.term;
                self.become_follower(term, NONE);
            }
        }
    }

    /// A leader in a joint configuration leaves it once the change that entered it is applied.
    fn maybe_leave_joint(&mut self) {
        if self.role == Role::Leader
            && self.lead.as_ref().is_some_and(|l| l.transfer.is_none())
            && self.membership.is_joint()
            && self.pending_conf_index <= self.applied
        {
            self.pending_conf_index =
                self.append_entry(EntryData::ConfChange(ConfChange::default()));
        }
    }

    // ---- output ----

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
        {
            let (early, late) = messages
                .into_iter()
                .partition(|m| matches!(m.body, Body::Append { .. } | Body::Heartbeat { .. }));
            messages = late;
            early
        } else {
            Vec::new()
        };
        Ready {
            snapshot: self.pending_snapshot.take(),
            hard_state: (hs != self.persisted_hs).then_some(hs),
            entries: self
                .log
                .slice(self.persisted + 1, self.last_index())
                .to_vec(),
            early_messages,
            messages,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::{Change, MemStorage, Voters};

    /// docs/raft.md, "Bugs the simulator must catch": with four or more regular voters only the
    /// outgoing half's granting voters keep the witness from electing a candidate that misses a
    /// committed entry, and the simulator's joint changes cannot show it. The request must
    /// carry them.
    #[test]
    fn joint_witness_vote_lists_both_halves() {
        let half = |regular: [NodeId; 2]| Voters {
            regular: regular.into_iter().collect(),
            witness: Some(4),
        };
        let joint = Membership {
            voters: half([1, 2]),
            outgoing: Some(half([1, 3])),
            learners: BTreeSet::new(),
        };
        let mut cfg = Config::new(1);
        cfg.pre_vote = false;
        let mut raft = Raft::new(cfg, &MemStorage::bootstrap(joint, None)).expect("a valid node");
        raft.campaign();
        let ready = raft.ready();
        let vote = ready.witness_requests.iter().find_map(|r| match r {
            WitnessRequest::Vote { request, .. } => Some(request),
            _ => None,
        });
        let vote = vote.expect("the witness's vote completes both halves at once");
        assert_eq!(vote.granted, vec![1]);
        assert_eq!(vote.granted_outgoing, vec![1]);
    }

    /// `member promote` of a learner that holds less than 90% of the leader's log is refused
    /// with etcd's message; once it caught up, it is accepted.
    #[test]
    fn a_learner_is_promoted_only_once_in_sync() {
        let members = Membership {
            voters: Voters {
                regular: [1].into_iter().collect(),
                witness: None,
            },
            outgoing: None,
            learners: [2].into_iter().collect(),
        };
        let mut cfg = Config::new(1);
        cfg.pre_vote = false;
        let mut raft = Raft::new(cfg, &MemStorage::bootstrap(members, None)).unwrap();
        raft.campaign();
        turn(&mut raft);
        assert_eq!(raft.role(), Role::Leader);
        for i in 0..20 {
            raft.propose(vec![i]).unwrap();
            turn(&mut raft);
        }
        let last = raft.log().last_index();
        let promote = ConfChange {
            changes: vec![Change {
                kind: ChangeKind::AddVoter,
                node: 2,
            }],
            witness_generation: 0,
            context: Vec::new(),
        };
        let behind = last * LEARNER_READY_PERCENT / 100 - 1;
        raft.step(from_2(
            raft.term(),
            Body::AppendResp {
                index: behind,
                reject: false,
            },
        ));
        turn(&mut raft);
        match raft.check_reconfig_quorum(&promote, false) {
            Err(Refused::InvalidConfChange(why)) => assert_eq!(
                why,
                "can only promote a learner member which is in sync with leader"
            ),
            other => panic!("a learner at {behind} of {last} was promotable: {other:?}"),
        }
        raft.step(from_2(
            raft.term(),
            Body::AppendResp {
                index: last,
                reject: false,
            },
        ));
        turn(&mut raft);
        raft.check_reconfig_quorum(&promote, false)
            .expect("a learner holding the whole log is promoted");
    }

    /// Node 1 of three regular voters, without pre-vote.
    fn one_of_three() -> Raft {
        let mut cfg = Config::new(1);
        cfg.pre_vote = false;
        let members = Membership::new([1, 2, 3], None).unwrap();
        Raft::new(cfg, &MemStorage::bootstrap(members, None)).unwrap()
    }

    /// Node 1 campaigns and leads with node 3's vote.
    fn elect_with_3(raft: &mut Raft) {
        raft.campaign();
        turn(raft);
        let granted = Body::VoteResp {
            pre: false,
            granted: true,
        };
        raft.step(from(3, raft.term(), granted));
        assert_eq!(raft.role(), Role::Leader);
        turn(raft);
    }

    /// Carries out a Ready as a host whose disk and sends never fail; returns what it sent.
    fn turn(raft: &mut Raft) -> Vec<Message> {
        let ready = raft.ready();
        let mut sent = ready.early_messages.clone();
        sent.extend(ready.messages.iter().cloned());
        raft.advance(&ready);
        sent
    }

    fn from_2(term: u64, body: Body) -> Message {
        from(2, term, body)
    }

    fn from(from: NodeId, term: u64, body: Body) -> Message {
        Message {
            from,
            to: 1,
            term,
            body,
            witness: None,
        }
    }

    fn snapshots_to_2(sent: &[Message]) -> usize {
        sent.iter()
            .filter(|m| m.to == 2 && matches!(m.body, Body::Snapshot { .. }))
            .count()
    }

    /// A new leader elected with the witness's vote before the other member's (a leadership
    /// transfer over a WAN slower than the witness's storage) keeps that member in R when it
    /// heard from it lately: it does not make the cluster depend on the witness for nothing (a
    /// loss of its own site would then leave the other member unable to lead). One it did not
    /// hear from (down) is replaced as it takes office, as before.
    #[test]
    fn a_new_leader_keeps_a_member_it_heard_from_lately() {
        for heard in [true, false] {
            let mut cfg = Config::new(1);
            cfg.pre_vote = false;
            let members = Membership::new([1, 2], Some(3)).unwrap();
            let mut raft = Raft::new(cfg, &MemStorage::bootstrap(members, None)).unwrap();
            // (a liveness window into its life, short of its election timeout)
            for _ in 0..=raft.cfg.liveness_ticks() {
                raft.tick();
            }
            assert_eq!(raft.role(), Role::Follower);
            if heard {
                raft.step(from_2(raft.term(), Body::HeartbeatResp { read: 0 }));
            }
            raft.campaign();
            let ready = raft.ready();
            let request = ready
                .witness_requests
                .iter()
                .find_map(|r| match r {
                    WitnessRequest::Vote { request, .. } => Some(request.clone()),
                    _ => None,
                })
                .expect("the witness is asked for its vote");
            raft.advance(&ready);
            let reply = witness_core::VoteReply {
                term: raft.term(),
                granted: true,
                refusal: None,
            };
            raft.step_witness(WitnessResponse::Vote {
                pre: false,
                request,
                reply,
                seen: Seen::default(),
            });
            assert_eq!(raft.role(), Role::Leader, "elected with the witness's vote");
            turn(&mut raft);
            let rset = &raft.lead.as_ref().expect("leading").rset;
            assert_eq!(
                rset.contains(&2),
                heard,
                "heard lately: {heard}, R: {rset:?}"
            );
            assert_eq!(rset.contains(&3), !heard, "R: {rset:?}");
        }
    }

    /// A follower that was paused answers, when it resumes, every Append it missed with a
    /// rejection. Each used to make the leader probe again and send its snapshot again: a
    /// leader of an 800 MB key space queued one copy per answer and was OOM-killed. One
    /// snapshot is outstanding at a time; the transport's report decides when to send another.
    /// A snapshot taken in the background: its position is fixed when it starts, more entries
    /// apply meanwhile, and the log is compacted to that position (not to the applied index)
    /// when it is saved; a second one for the same position changes nothing.
    #[test]
    fn a_snapshot_saved_later_compacts_to_where_it_was_taken() {
        // Node 2 hears nothing: the leader keeps its log in memory for it.
        let mut raft = one_of_three();
        elect_with_3(&mut raft);
        let term = raft.term();
        let propose = |raft: &mut Raft| {
            raft.propose(b"x".to_vec()).unwrap();
            turn(raft);
            let index = raft.log().last_index();
            raft.step(from(
                3,
                term,
                Body::AppendResp {
                    index,
                    reject: false,
                },
            ));
            turn(raft);
            turn(raft);
            assert_eq!(raft.applied(), index);
        };
        propose(&mut raft);
        let meta = raft
            .snapshot_meta()
            .expect("entries applied past the snapshot");
        assert_eq!(meta.index, raft.applied());
        propose(&mut raft);
        propose(&mut raft);
        let applied = raft.applied();
        assert!(applied > meta.index);
        let snapshot = Snapshot {
            meta: meta.clone(),
            data: bytes::Bytes::new(),
        };
        assert!(raft.compact_with(snapshot.clone()));
        assert_eq!(raft.log().snapshot_index(), meta.index);
        assert_eq!(raft.log().last_index(), applied, "later entries kept");
        assert!(!raft.compact_with(snapshot), "already compacted that far");
    }

    /// The leader proposes an entry, both followers acknowledge it, and it is applied.
    fn propose_acked(raft: &mut Raft) {
        let term = raft.term();
        raft.propose(b"x".to_vec()).unwrap();
        turn(raft);
        let index = raft.log().last_index();
        for f in [2, 3] {
            raft.step(from(
                f,
                term,
                Body::AppendResp {
                    index,
                    reject: false,
                },
            ));
        }
        turn(raft);
        turn(raft);
    }

    /// The leader goes through a new term (it knows nothing of its followers until they
    /// answer), and node 2 answers that it needs everything.
    fn node_2_needs_everything(raft: &mut Raft) {
        let heartbeat = Body::Heartbeat {
            commit: 0,
            read: 0,
            held: 0,
        };
        raft.step(from_2(raft.term() + 1, heartbeat));
        turn(raft);
        elect_with_3(raft);
        let reject = Body::AppendResp {
            index: 0,
            reject: true,
        };
        raft.step(from_2(raft.term(), reject));
    }

    /// A snapshot started before the log was trimmed past it (`--snapshot-count`) and saved
    /// after: it becomes the latest, the log is not touched, and a follower that waits for a
    /// newer one still does.
    #[test]
    fn a_snapshot_older_than_the_log_start_does_not_end_the_wait() {
        let mut raft = one_of_three();
        elect_with_3(&mut raft);
        propose_acked(&mut raft);
        let early = raft.snapshot_meta().expect("entries applied");
        for _ in 0..5 {
            propose_acked(&mut raft);
        }
        let start = raft.log().snapshot_index();
        assert!(start > early.index, "trimmed past the early snapshot");
        // A new term, and node 2 needs everything: a snapshot is wanted.
        node_2_needs_everything(&mut raft);
        turn(&mut raft);
        assert!(raft.snapshot_wanted());
        let saved = Snapshot {
            meta: early.clone(),
            data: bytes::Bytes::new(),
        };
        assert!(
            raft.compact_with(saved),
            "newer than the bootstrap snapshot"
        );
        assert_eq!(raft.snapshot.meta.index, early.index);
        assert_eq!(raft.log().snapshot_index(), start, "the log is not touched");
        assert!(raft.snapshot_wanted(), "it does not do for node 2");
        raft.compact(bytes::Bytes::from_static(b"state"));
        assert!(!raft.snapshot_wanted());
    }

    /// A snapshot in place (`--snapshot-count`'s: the host keeps no data of it) compacts the
    /// log but is never sent: a follower that needs one waits for a new one with data, which
    /// may be at the same index when nothing was applied since. Once every member holds
    /// entries after that copy, it is outlived, and a snapshot in place may replace it.
    #[test]
    fn a_snapshot_in_place_is_never_sent_a_new_one_is_taken_instead() {
        let mut raft = one_of_three();
        elect_with_3(&mut raft);
        for _ in 0..3 {
            propose_acked(&mut raft);
        }
        let meta = raft.snapshot_meta().expect("entries applied");
        assert!(raft.compact_in_place(meta.clone()));
        assert_eq!(raft.log().snapshot_index(), meta.index);
        assert!(!raft.compact_in_place(meta.clone()), "already there");
        node_2_needs_everything(&mut raft);
        assert_eq!(snapshots_to_2(&turn(&mut raft)), 0, "it has no data");
        assert!(raft.snapshot_wanted());
        raft.step(from_2(raft.term(), Body::HeartbeatResp { read: 0 }));
        assert_eq!(snapshots_to_2(&turn(&mut raft)), 0, "still waiting for one");

        let again = raft
            .snapshot_meta()
            .expect("the one in place can be replaced");
        assert_eq!(again.index, meta.index, "nothing applied since");
        let taken = raft.compact(bytes::Bytes::from_static(b"state"));
        assert_eq!(taken.meta, again);
        assert!(!raft.snapshot_wanted());
        assert_eq!(raft.snapshot_meta(), None, "this one can be sent");
        raft.step(from_2(raft.term(), Body::HeartbeatResp { read: 0 }));
        let sent = turn(&mut raft);
        assert!(sent.iter().any(|m| matches!(&m.body,
            Body::Snapshot { snapshot } if m.to == 2 && snapshot.data == taken.data)));

        // Node 2 installs it; once it (and node 3) hold a later entry, the copy is not needed.
        let installed = Body::AppendResp {
            index: taken.meta.index,
            reject: false,
        };
        raft.step(from_2(raft.term(), installed));
        turn(&mut raft);
        assert!(!raft.snapshot_outlived(), "nothing after it yet");
        propose_acked(&mut raft);
        assert!(raft.snapshot_outlived(), "every member holds a later entry");
        let in_place = raft.snapshot_meta().expect("entries applied since");
        assert!(raft.compact_in_place(in_place));
        assert!(!raft.snapshot_outlived(), "a snapshot in place is no copy");
    }

    /// A leader keeps in memory only the entries some follower may still ask for, and a
    /// follower that asks for dropped ones (here: after a new term reset what the leader knows
    /// of it) waits for a snapshot taken for it, newer than the dropped entries.
    #[test]
    fn entries_every_follower_holds_leave_memory_and_a_late_one_gets_a_new_snapshot() {
        let mut raft = one_of_three();
        elect_with_3(&mut raft);
        let term = raft.term();
        for i in 0..10 {
            raft.propose(vec![i]).unwrap();
        }
        turn(&mut raft);
        let last = raft.log().last_index();
        let ack = Body::AppendResp {
            index: last,
            reject: false,
        };
        raft.step(from(3, term, ack.clone()));
        turn(&mut raft);
        turn(&mut raft);
        assert_eq!(raft.applied(), last);
        assert_eq!(
            raft.log().snapshot_index(),
            1,
            "kept for node 2, which has none"
        );
        raft.step(from_2(term, ack));
        turn(&mut raft);
        assert_eq!(
            raft.log().snapshot_index(),
            last,
            "every follower holds them"
        );
        assert_eq!(raft.snapshot.meta.index, 1, "no snapshot was taken");
        assert!(!raft.snapshot_wanted());

        // A new term: the leader knows nothing of its followers until they answer.
        raft.step(from_2(
            term + 1,
            Body::Heartbeat {
                commit: 0,
                read: 0,
                held: 0,
            },
        ));
        assert_eq!(raft.role(), Role::Follower);
        turn(&mut raft);
        elect_with_3(&mut raft);
        let term = raft.term();
        let reject = Body::AppendResp {
            index: 0,
            reject: true,
        };
        raft.step(from_2(term, reject));
        assert_eq!(
            snapshots_to_2(&turn(&mut raft)),
            0,
            "the old snapshot would not do"
        );
        assert!(raft.snapshot_wanted());
        raft.step(from_2(term, Body::HeartbeatResp { read: 0 }));
        assert_eq!(snapshots_to_2(&turn(&mut raft)), 0, "still waiting for one");

        let taken = raft.compact(bytes::Bytes::from_static(b"state")).meta.index;
        assert!(taken >= last && !raft.snapshot_wanted());
        raft.step(from_2(term, Body::HeartbeatResp { read: 0 }));
        let sent = turn(&mut raft);
        assert_eq!(snapshots_to_2(&sent), 1);
        assert!(sent.iter().any(|m| matches!(&m.body,
            Body::Snapshot { snapshot } if m.to == 2 && snapshot.meta.index == taken)));
    }

    /// A follower drops applied entries only once its leader says every member holds them: a
    /// member restarted as a follower may lead next, and one that was down then catches up from
    /// its log (scenario 05 sent it a snapshot when followers dropped what they applied).
    #[test]
    fn a_follower_drops_entries_only_once_its_leader_says_every_member_holds_them() {
        let members = Membership::new([1, 2, 3], None).unwrap();
        let mut raft = Raft::new(Config::new(1), &MemStorage::bootstrap(members, None)).unwrap();
        let term = 2;
        let entries: Vec<Entry> = (2..=11)
            .map(|index| Entry {
                term,
                subterm: 0,
                index,
                data: EntryData::Normal(vec![index as u8]),
            })
            .collect();
        let append = Body::Append {
            prev_index: 1,
            prev_term: 1,
            entries,
            commit: 11,
        };
        raft.step(from_2(term, append));
        turn(&mut raft);
        turn(&mut raft);
        assert_eq!(raft.applied(), 11);
        assert_eq!(raft.log().snapshot_index(), 1, "node 3 may lack them");
        let heartbeat = Body::Heartbeat {
            commit: 11,
            read: 0,
            held: 8,
        };
        raft.step(from_2(term, heartbeat));
        turn(&mut raft);
        assert_eq!(raft.log().snapshot_index(), 8);
        assert_eq!(raft.log().last_index(), 11);
    }

    #[test]
    fn a_leader_sends_one_snapshot_until_the_transport_reports() {
        let mut cfg = Config::new(1);
        cfg.pre_vote = false;
        let members = Membership::new([1, 2, 3], None).unwrap();
        let mut raft = Raft::new(cfg, &MemStorage::bootstrap(members, None)).unwrap();
        raft.campaign();
        turn(&mut raft);
        let term = raft.term();
        let granted = Body::VoteResp {
            pre: false,
            granted: true,
        };
        // Node 3 votes and acknowledges; node 2 is paused and hears nothing.
        raft.step(from(3, term, granted));
        assert_eq!(raft.role(), Role::Leader);
        for _ in 0..3 {
            raft.propose(b"x".to_vec()).unwrap();
        }
        turn(&mut raft);
        let last = raft.log().last_index();
        let ack = Body::AppendResp {
            index: last,
            reject: false,
        };
        raft.step(from(3, term, ack));
        turn(&mut raft);
        assert_eq!(raft.applied(), last);
        let index = raft.compact(bytes::Bytes::from_static(b"state")).meta.index;

        // Node 2 resumes and rejects what it missed; the leader has only the snapshot for it.
        let reject = Body::AppendResp {
            index: 0,
            reject: true,
        };
        raft.step(from_2(term, reject.clone()));
        assert_eq!(snapshots_to_2(&turn(&mut raft)), 1);
        for _ in 0..5 {
            raft.step(from_2(term, reject.clone()));
        }
        assert_eq!(snapshots_to_2(&turn(&mut raft)), 0, "stale rejections");

        // Not delivered: nothing more until the follower is heard from, then once.
        raft.report_snapshot(2, index, false);
        raft.propose(b"y".to_vec()).unwrap();
        assert_eq!(snapshots_to_2(&turn(&mut raft)), 0, "unreachable follower");
        raft.step(from_2(term, Body::HeartbeatResp { read: 0 }));
        assert_eq!(snapshots_to_2(&turn(&mut raft)), 1);

        // Delivered: the follower may take its time installing it.
        raft.report_snapshot(2, index, true);
        for _ in 0..raft.election_tick() {
            raft.tick();
            raft.step(from_2(term, Body::HeartbeatResp { read: 0 }));
            assert_eq!(snapshots_to_2(&turn(&mut raft)), 0, "installing");
        }
        // ... but an election timeout after the delivery, with no answer, it was lost.
        raft.tick();
        raft.tick();
        raft.step(from_2(term, Body::HeartbeatResp { read: 0 }));
        assert_eq!(snapshots_to_2(&turn(&mut raft)), 1, "lost after delivery");

        // The follower's answer ends it: appends follow.
        let installed = Body::AppendResp {
            index,
            reject: false,
        };
        raft.step(from_2(term, installed));
        let sent = turn(&mut raft);
        assert_eq!(snapshots_to_2(&sent), 0);
        assert!(
            sent.iter()
                .any(|m| m.to == 2 && matches!(m.body, Body::Append { .. }))
        );
    }
}
