//! `Raft`: one node of the extended Raft, as a pure state machine.
//!
//! Input: [`Raft::tick`], [`Raft::step`] (a message from a regular peer),
//! [`Raft::step_witness`] (the outcome of a witness step the host ran), [`Raft::propose`].
//! Output: [`Raft::ready`], processed by the host, then [`Raft::advance`].
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
//! - a candidate asks the witness only when the witness's vote would complete a quorum.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use witness_core::rules::{AppendReply, AppendRequest, Caller, VoteRequest};

use super::config::Config;
use super::mutation::Mutation;
use super::progress::Progress;
use super::replication_set::{self, Liveness};
use super::storage::Storage;
use super::types::{
    Body, Entry, EntryData, HardState, Membership, Message, NONE, NodeId, Ready, WitnessRequest,
    WitnessResponse,
};

/// A node's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Follower,
    PreCandidate,
    Candidate,
    Leader,
}

/// A proposal could not be taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    #[error("not the leader (leader: {leader})")]
    NotLeader { leader: NodeId },
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
    /// Tick at which the outstanding witness request was issued.
    witness_inflight: Option<u64>,
}

/// One node of the extended Raft.
#[derive(Debug)]
pub struct Raft {
    cfg: Config,
    membership: Membership,
    term: u64,
    vote: NodeId,
    commit: u64,
    log: Vec<Entry>,
    persisted: u64,
    applied: u64,
    persisted_hs: HardState,
    role: Role,
    leader: NodeId,
    ticks: u64,
    election_elapsed: u64,
    heartbeat_elapsed: u64,
    randomized_timeout: u64,
    rng: StdRng,
    votes: BTreeMap<NodeId, bool>,
    witness_asked: bool,
    lead: Option<Leading>,
    msgs: Vec<Message>,
    witness_out: Vec<WitnessRequest>,
    awaiting_advance: bool,
}

impl Raft {
    /// A node restarted from `storage` (a new node: empty storage).
    pub fn new(cfg: Config, storage: &impl Storage) -> Result<Raft, String> {
        cfg.validate()?;
        let membership = storage.membership();
        if !membership.regular.contains(&cfg.id) {
            return Err(format!(
                "node {} is not a regular voter of {membership:?}",
                cfg.id
            ));
        }
        let hs = storage.hard_state();
        let log = storage.entries();
        for (i, e) in log.iter().enumerate() {
            assert_eq!(
                e.index,
                i as u64 + 1,
                "persisted log has a gap or starts after 1"
            );
        }
        assert!(
            hs.commit <= log.len() as u64,
            "persisted commit {} is past the log end",
            hs.commit
        );
        let mut raft = Raft {
            rng: StdRng::seed_from_u64(cfg.seed),
            cfg,
            membership,
            term: hs.term,
            vote: hs.vote,
            commit: hs.commit,
            persisted: log.len() as u64,
            log,
            applied: 0,
            persisted_hs: hs,
            role: Role::Follower,
            leader: NONE,
            ticks: 0,
            election_elapsed: 0,
            heartbeat_elapsed: 0,
            randomized_timeout: 0,
            votes: BTreeMap::new(),
            witness_asked: false,
            lead: None,
            msgs: Vec::new(),
            witness_out: Vec::new(),
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
    pub fn log(&self) -> &[Entry] {
        &self.log
    }
    pub fn membership(&self) -> &Membership {
        &self.membership
    }
    /// The leader's current subterm and replication set.
    pub fn leader_view(&self) -> Option<(u64, &BTreeSet<NodeId>)> {
        self.lead.as_ref().map(|l| (l.subterm, &l.rset))
    }

    fn last_index(&self) -> u64 {
        self.log.len() as u64
    }
    fn term_at(&self, index: u64) -> u64 {
        if index == 0 {
            0
        } else {
            self.log[index as usize - 1].term
        }
    }
    fn last_term(&self) -> u64 {
        self.term_at(self.last_index())
    }
    fn last_subterm(&self) -> u64 {
        self.log.last().map_or(0, |e| e.subterm)
    }
    /// True if the deliberate bug `m` is switched on (never without the `mutations` feature).
    fn mutated(&self, m: Mutation) -> bool {
        #[cfg(feature = "mutations")]
        return self.cfg.mutation == Some(m);
        #[cfg(not(feature = "mutations"))]
        {
            let _ = m;
            false
        }
    }

    fn caller(&self) -> Caller {
        Caller {
            cluster_id: self.cfg.cluster_id,
            witness_id: self.membership.witness.unwrap_or(NONE),
        }
    }
    fn peers(&self) -> Vec<NodeId> {
        self.membership
            .regular
            .iter()
            .copied()
            .filter(|&p| p != self.cfg.id)
            .collect()
    }

    fn send(&mut self, to: NodeId, term: u64, body: Body) {
        debug_assert!(
            Some(to) != self.membership.witness,
            "the witness never receives messages"
        );
        self.msgs.push(Message {
            from: self.cfg.id,
            to,
            term,
            body,
        });
    }

    // ---- transitions ----

    fn reset_election_timer(&mut self) {
        self.election_elapsed = 0;
        self.heartbeat_elapsed = 0;
        let n = self.cfg.election_tick;
        self.randomized_timeout = self.rng.random_range(n..2 * n);
    }

    fn become_follower(&mut self, term: u64, leader: NodeId) {
        assert!(term >= self.term, "term must never decrease");
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
        let progress = self
            .peers()
            .into_iter()
            .map(|p| (p, Progress::new(next, now)))
            .collect();
        self.lead = Some(Leading {
            progress,
            subterm: 0,
            subterm_start: next,
            rset: self.membership.regular.clone(),
            witness_subterm: None,
            witness_match: 0,
            witness_inflight: None,
        });
        self.reset_election_timer();
        self.append_entry(EntryData::Empty);
    }

    /// Starts an election (or a pre-vote round). Also callable by tests and the host.
    pub fn campaign(&mut self) {
        if self.role == Role::Leader {
            return;
        }
        self.start_campaign(self.cfg.pre_vote);
    }

    fn start_campaign(&mut self, pre: bool) {
        if pre {
            self.role = Role::PreCandidate;
            self.leader = NONE;
        } else {
            self.term += 1;
            self.vote = self.cfg.id;
            self.role = Role::Candidate;
            self.leader = NONE;
        }
        self.reset_election_timer();
        self.votes.clear();
        self.witness_asked = false;
        self.votes.insert(self.cfg.id, true);
        let term = self.vote_term();
        let (last_index, last_term) = (self.last_index(), self.last_term());
        for p in self.peers() {
            self.send(
                p,
                term,
                Body::Vote {
                    pre,
                    last_index,
                    last_term,
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
        let q = self.membership.quorum();
        let granted_regular: Vec<NodeId> = self
            .votes
            .iter()
            .filter(|&(id, &g)| g && self.membership.regular.contains(id))
            .map(|(&id, _)| id)
            .collect();
        let witness_granted = self
            .membership
            .witness
            .is_some_and(|w| self.votes.get(&w) == Some(&true));
        let granted = granted_regular.len() + usize::from(witness_granted);
        let rejected = self.votes.values().filter(|&&g| !g).count();
        if granted >= q {
            if self.role == Role::PreCandidate {
                self.start_campaign(false);
            } else {
                self.become_leader();
            }
            return;
        }
        if rejected > self.membership.voters() - q {
            let term = self.term;
            self.become_follower(term, NONE);
            return;
        }
        if self.membership.witness.is_some()
            && !self.witness_asked
            && granted_regular.len() + 1 >= q
        {
            self.witness_asked = true;
            let request = VoteRequest {
                caller: self.caller(),
                term: self.vote_term(),
                candidate: self.cfg.id,
                last_log_term: self.last_term(),
                last_log_subterm: self.last_subterm(),
                granted: granted_regular,
                granted_outgoing: Vec::new(),
            };
            let pre = self.role == Role::PreCandidate;
            self.witness_out.push(WitnessRequest::Vote { pre, request });
        }
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
            self.broadcast_heartbeat();
        }
        self.expire_witness_request();
        self.adjust_replication_set();
        if self.election_elapsed >= self.cfg.election_tick {
            self.election_elapsed = 0;
            if self.cfg.check_quorum && !self.quorum_active() {
                let term = self.term;
                self.become_follower(term, NONE);
            }
        }
    }

    /// Proposes a command; returns its index.
    pub fn propose(&mut self, data: Vec<u8>) -> Result<u64, ProposeError> {
        assert!(
            !self.awaiting_advance,
            "propose between ready() and advance()"
        );
        if self.role != Role::Leader {
            return Err(ProposeError::NotLeader {
                leader: self.leader,
            });
        }
        Ok(self.append_entry(EntryData::Normal(data)))
    }

    /// Handles a message from a regular peer.
    pub fn step(&mut self, m: Message) {
        assert!(!self.awaiting_advance, "step between ready() and advance()");
        if !self.membership.regular.contains(&m.from) || m.to != self.cfg.id {
            return;
        }
        let is_vote_request = matches!(m.body, Body::Vote { .. });
        if m.term > self.term {
            let in_lease = self.cfg.check_quorum
                && self.leader != NONE
                && self.election_elapsed < self.cfg.election_tick;
            if is_vote_request && in_lease {
                return; // a leader we heard from recently is alive: ignore disruption
            }
            match m.body {
                Body::Vote { pre: true, .. } => {}
                Body::VoteResp {
                    pre: true,
                    granted: true,
                } => {}
                Body::Append { .. } | Body::Heartbeat { .. } => {
                    self.become_follower(m.term, m.from)
                }
                _ => self.become_follower(m.term, NONE),
            }
        } else if m.term < self.term {
            match m.body {
                Body::Append { .. } | Body::Heartbeat { .. } => {
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
        match m.body {
            Body::Vote {
                pre,
                last_index,
                last_term,
            } => self.handle_vote(m.from, m.term, pre, last_index, last_term),
            Body::VoteResp { pre, granted } => self.handle_vote_resp(m.from, m.term, pre, granted),
            Body::Append {
                prev_index,
                prev_term,
                entries,
                commit,
            } => {
                if self.role != Role::Follower || self.leader != m.from {
                    self.become_follower(m.term, m.from);
                }
                self.election_elapsed = 0;
                self.handle_append(m.from, prev_index, prev_term, entries, commit);
            }
            Body::Heartbeat { commit } => {
                if self.role != Role::Follower || self.leader != m.from {
                    self.become_follower(m.term, m.from);
                }
                self.election_elapsed = 0;
                self.commit_to(commit.min(self.last_index()));
                let term = self.term;
                self.send(m.from, term, Body::HeartbeatResp);
            }
            Body::AppendResp { index, reject } => self.handle_append_resp(m.from, index, reject),
            Body::HeartbeatResp => self.handle_heartbeat_resp(m.from),
        }
    }

    fn handle_vote(&mut self, from: NodeId, term: u64, pre: bool, last_index: u64, last_term: u64) {
        let can_vote = self.vote == from
            || (self.vote == NONE && self.leader == NONE)
            || (pre && term > self.term);
        let up_to_date = (last_term, last_index) >= (self.last_term(), self.last_index());
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

    fn handle_append(
        &mut self,
        from: NodeId,
        prev_index: u64,
        prev_term: u64,
        entries: Vec<Entry>,
        commit: u64,
    ) {
        let term = self.term;
        if prev_index < self.commit {
            // Already committed here: answer with what we have committed.
            let index = self.commit;
            self.send(
                from,
                term,
                Body::AppendResp {
                    index,
                    reject: false,
                },
            );
            return;
        }
        if prev_index > self.last_index() || self.term_at(prev_index) != prev_term {
            let index = self.last_index().min(prev_index.saturating_sub(1));
            self.send(
                from,
                term,
                Body::AppendResp {
                    index,
                    reject: true,
                },
            );
            return;
        }
        let last_new = prev_index + entries.len() as u64;
        for e in entries {
            if e.index <= self.last_index() {
                if self.term_at(e.index) == e.term {
                    continue;
                }
                assert!(
                    e.index > self.commit,
                    "leader asked to overwrite committed entry {}",
                    e.index
                );
                self.log.truncate(e.index as usize - 1);
                self.persisted = self.persisted.min(e.index - 1);
            }
            assert_eq!(e.index, self.last_index() + 1);
            self.log.push(e);
        }
        self.commit_to(commit.min(last_new));
        self.send(
            from,
            term,
            Body::AppendResp {
                index: last_new,
                reject: false,
            },
        );
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
        let lead = self.lead.as_ref().expect("only a leader appends");
        let entry = Entry {
            term: self.term,
            subterm: lead.subterm,
            index: self.last_index() + 1,
            data,
        };
        self.log.push(entry);
        for p in self.peers() {
            self.send_append(p);
        }
        self.maybe_commit();
        self.last_index()
    }

    fn send_append(&mut self, to: NodeId) {
        let (last, max_batch, max_inflight) = (
            self.last_index(),
            self.cfg.max_batch as u64,
            self.cfg.max_inflight,
        );
        let lead = self.lead.as_mut().expect("leader");
        let pr = lead.progress.get_mut(&to).expect("progress for every peer");
        if !pr.can_send(max_inflight) || (pr.replicate && pr.next > last) {
            return;
        }
        let prev_index = pr.next - 1;
        let hi = last.min(prev_index + max_batch);
        let entries: Vec<Entry> = self.log[prev_index as usize..hi as usize].to_vec();
        let sent_last = entries.last().map_or(prev_index, |e| e.index);
        pr.sent(sent_last);
        let prev_term = self.term_at(prev_index);
        let (term, commit) = (self.term, self.commit);
        self.send(
            to,
            term,
            Body::Append {
                prev_index,
                prev_term,
                entries,
                commit,
            },
        );
    }

    fn broadcast_heartbeat(&mut self) {
        let term = self.term;
        let commit = self.commit;
        let targets: Vec<(NodeId, u64)> = self
            .lead
            .as_ref()
            .expect("leader")
            .progress
            .iter()
            .map(|(&p, pr)| (p, pr.matched))
            .collect();
        for (p, matched) in targets {
            self.send(
                p,
                term,
                Body::Heartbeat {
                    commit: commit.min(matched),
                },
            );
        }
    }

    fn handle_append_resp(&mut self, from: NodeId, index: u64, reject: bool) {
        let now = self.ticks;
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let Some(pr) = lead.progress.get_mut(&from) else {
            return;
        };
        pr.last_heard = now;
        if reject {
            let next = (index + 1).min(pr.next.saturating_sub(1)).max(1);
            pr.probe_from(next);
        } else if pr.acknowledge(index) {
            self.maybe_commit();
        }
        self.send_append(from);
    }

    fn handle_heartbeat_resp(&mut self, from: NodeId) {
        let (now, last) = (self.ticks, self.last_index());
        let Some(lead) = self.lead.as_mut() else {
            return;
        };
        let Some(pr) = lead.progress.get_mut(&from) else {
            return;
        };
        pr.last_heard = now;
        if !pr.replicate {
            pr.paused = false;
            self.send_append(from);
        } else if pr.matched < last {
            // Appends may have been lost (a partition, a drop). Ask about the entry before
            // `next` with no entries: a follower that lacks it rejects, and we probe from its hint.
            let prev_index = pr.next - 1;
            let prev_term = self.term_at(prev_index);
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
        }
    }

    /// The index a subquorum of R (the leader included) has persisted: (quorum - 1)-th highest
    /// match among R's regular members; 0 if R's regular members are fewer.
    fn subquorum_index(&self) -> u64 {
        let lead = self.lead.as_ref().expect("leader");
        let need = self.membership.quorum() - 1;
        let mut matches: Vec<u64> = lead
            .rset
            .iter()
            .filter(|&&m| self.membership.regular.contains(&m))
            .map(|&m| {
                if m == self.cfg.id {
                    self.persisted
                } else {
                    lead.progress[&m].matched
                }
            })
            .collect();
        matches.sort_unstable_by(|a, b| b.cmp(a));
        if need == 0 || matches.len() < need {
            0
        } else {
            matches[need - 1]
        }
    }

    /// The highest index the witness counts as having acknowledged (with the shortcut).
    fn witness_credit(&self) -> u64 {
        let lead = self.lead.as_ref().expect("leader");
        let Some(w) = self.membership.witness else {
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
        let Some(lead) = self.lead.as_ref() else {
            return;
        };
        let mut matches: Vec<u64> = lead.progress.values().map(|p| p.matched).collect();
        matches.push(self.persisted);
        if self.membership.witness.is_some() {
            matches.push(self.witness_credit());
        }
        matches.sort_unstable_by(|a, b| b.cmp(a));
        let candidate = matches[self.membership.quorum() - 1];
        if candidate > self.commit && self.term_at(candidate) == self.term {
            self.commit_to(candidate);
        }
        self.maybe_ask_witness();
    }

    /// AppendToWitness when conditions 1-4 hold (design note "Log replication to the witness").
    fn maybe_ask_witness(&mut self) {
        let Some(w) = self.membership.witness else {
            return;
        };
        let Some(lead) = self.lead.as_ref() else {
            return;
        };
        if !lead.rset.contains(&w)
            || lead.witness_subterm == Some(lead.subterm)
            || lead.witness_inflight.is_some()
        {
            return;
        }
        let index = self.subquorum_index();
        if index < lead.subterm_start {
            return; // nothing of the current subterm is persisted by a subquorum of R yet
        }
        let entry = &self.log[index as usize - 1];
        assert_eq!(
            (entry.term, entry.subterm),
            (self.term, lead.subterm),
            "condition 1"
        );
        let request = AppendRequest {
            caller: self.caller(),
            term: self.term,
            leader: self.cfg.id,
            entry_term: entry.term,
            entry_subterm: entry.subterm,
            index,
            replication_set: lead.rset.iter().copied().collect(),
            replication_set_outgoing: Vec::new(),
        };
        let now = self.ticks;
        self.lead.as_mut().expect("leader").witness_inflight = Some(now);
        self.witness_out.push(WitnessRequest::Append(request));
    }

    fn expire_witness_request(&mut self) {
        let (now, limit) = (self.ticks, self.cfg.election_tick);
        let lead = self.lead.as_mut().expect("leader");
        if lead.witness_inflight.is_some_and(|t| now - t > limit) {
            lead.witness_inflight = None;
            self.maybe_ask_witness();
        }
    }

    fn adjust_replication_set(&mut self) {
        let (now, window, last) = (self.ticks, self.cfg.liveness_ticks(), self.last_index());
        let skip_catch_up = self.mutated(Mutation::ReenterBeforeCatchUp);
        let lead = self.lead.as_ref().expect("leader");
        let next = replication_set::adjust(
            &lead.rset,
            &self.membership.regular,
            self.membership.witness,
            self.cfg.id,
            |v| {
                let pr = &lead.progress[&v];
                Liveness {
                    reachable: now - pr.last_heard <= window,
                    caught_up: pr.matched == last || skip_catch_up,
                }
            },
        );
        if next == lead.rset {
            return;
        }
        let lead = self.lead.as_mut().expect("leader");
        lead.rset = next;
        lead.subterm += 1;
        lead.subterm_start = self.log.len() as u64 + 1;
        self.append_entry(EntryData::Empty);
    }

    /// Check-quorum: a quorum heard from within an election timeout, counting the witness when
    /// it is pinned in this subterm (it recorded this leader's R and acknowledged).
    fn quorum_active(&self) -> bool {
        let lead = self.lead.as_ref().expect("leader");
        let window = self.cfg.election_tick;
        let peers = lead
            .progress
            .values()
            .filter(|p| self.ticks - p.last_heard <= window)
            .count();
        let witness = self
            .membership
            .witness
            .is_some_and(|w| lead.rset.contains(&w) && lead.witness_subterm == Some(lead.subterm));
        1 + peers + usize::from(witness) >= self.membership.quorum()
    }

    /// Handles the outcome of a witness step the host ran for this node.
    pub fn step_witness(&mut self, response: WitnessResponse) {
        assert!(
            !self.awaiting_advance,
            "step_witness between ready() and advance()"
        );
        match response {
            WitnessResponse::Append { request, reply } => {
                if let AppendReply::StaleTerm { term } = reply
                    && term > self.term
                {
                    self.become_follower(term, NONE);
                    return;
                }
                if self.role != Role::Leader || request.term != self.term {
                    return;
                }
                let lead = self.lead.as_mut().expect("leader");
                lead.witness_inflight = None;
                if let AppendReply::Ack { index, .. } = reply {
                    lead.witness_match = lead.witness_match.max(index);
                    lead.witness_subterm = lead.witness_subterm.max(Some(request.entry_subterm));
                }
                self.maybe_commit();
            }
            WitnessResponse::Vote {
                pre,
                request,
                reply,
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
                if self.role != expected || request.term != self.vote_term() {
                    return;
                }
                let w = self.membership.witness.expect("a witness answered");
                self.votes.entry(w).or_insert(reply.granted);
                self.poll();
            }
            WitnessResponse::Failed { request } => {
                if let (WitnessRequest::Append(_), Some(lead)) = (&request, self.lead.as_mut()) {
                    lead.witness_inflight = None;
                }
            }
        }
    }

    // ---- output ----

    pub fn has_ready(&self) -> bool {
        !self.msgs.is_empty()
            || !self.witness_out.is_empty()
            || self.persisted < self.last_index()
            || self.applied < self.commit
            || self.hard_state() != self.persisted_hs
    }

    fn hard_state(&self) -> HardState {
        HardState {
            term: self.term,
            vote: self.vote,
            commit: self.commit,
        }
    }

    /// What the host must do now (see [`Ready`]). Call [`Raft::advance`] when done.
    pub fn ready(&mut self) -> Ready {
        assert!(!self.awaiting_advance, "ready() twice without advance()");
        self.awaiting_advance = true;
        let hs = self.hard_state();
        Ready {
            hard_state: (hs != self.persisted_hs).then_some(hs),
            entries: self.log[self.persisted as usize..].to_vec(),
            messages: std::mem::take(&mut self.msgs),
            witness_requests: std::mem::take(&mut self.witness_out),
            committed: self.log[self.applied as usize..self.commit as usize].to_vec(),
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
        if let Some(last) = ready.committed.last() {
            self.applied = last.index;
        }
        if self.role == Role::Leader && !ready.entries.is_empty() {
            // The leader's own entries are now persisted: they count.
            self.maybe_commit();
        }
    }
}
