//! The invariants of `shared/design/extended-raft.md`, checked during simulation.
//!
//! Checked: election safety (one leader per term); leader completeness (a new leader holds every
//! entry known committed); log matching (same index and term -> same prefix); state machine
//! safety (every node applies the same entry at an index); terms never decrease at the witness;
//! the witness's (last_log_term, last_log_subterm) only grows; at most one witness vote per term;
//! a witness append carries R with the witness in it and an entry of the leader's own term;
//! |R| = number of regular voters and the leader is in R; a regular voter enters R only holding
//! the leader's log up to the new subterm (the catch-up rule, paper §4.4); each subterm starts
//! with an empty entry.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use witness_core::WitnessState;

use crate::raft::{Entry, EntryData, Membership, NodeId, Raft, Role, WitnessRequest};

/// An invariant that did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub tick: u64,
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at tick {}: {}", self.tick, self.what)
    }
}

/// Everything the checks remember across ticks.
#[derive(Debug)]
pub struct Checker {
    membership: Membership,
    leaders: BTreeMap<u64, NodeId>,
    committed: BTreeMap<u64, Entry>,
    witness_votes: BTreeMap<u64, NodeId>,
    /// The last (subterm, R) seen of each (term, leader).
    rsets: BTreeMap<(u64, NodeId), (u64, BTreeSet<NodeId>)>,
    pending: Option<String>,
    ticks_checked: u64,
}

impl Checker {
    pub fn new(membership: &Membership, witness: &WitnessState) -> Self {
        let mut witness_votes = BTreeMap::new();
        if witness.voted_for != 0 {
            witness_votes.insert(witness.term, witness.voted_for);
        }
        Checker {
            membership: membership.clone(),
            leaders: BTreeMap::new(),
            committed: BTreeMap::new(),
            witness_votes,
            rsets: BTreeMap::new(),
            pending: None,
            ticks_checked: 0,
        }
    }

    pub fn committed(&self) -> &BTreeMap<u64, Entry> {
        &self.committed
    }

    fn fail(&mut self, what: String) {
        self.pending.get_or_insert(what);
    }

    /// A node applied `e`: state machine safety and the empty entry at each subterm start.
    pub fn applied(&mut self, node: NodeId, e: &Entry) {
        match self.committed.get(&e.index) {
            Some(known) if known != e => {
                let what = format!(
                    "state machine safety: node {node} applied {e:?} at {}, others applied {known:?}",
                    e.index
                );
                self.fail(what);
            }
            Some(_) => {}
            None => {
                if let Some(prev) = self.committed.get(&(e.index - 1))
                    && (prev.term, prev.subterm) != (e.term, e.subterm)
                    && e.data != EntryData::Empty
                {
                    let what = format!(
                        "subterm start: entry {} opens (term {}, subterm {}) but is not empty",
                        e.index, e.term, e.subterm
                    );
                    self.fail(what);
                }
                self.committed.insert(e.index, e.clone());
            }
        }
    }

    /// The witness register changes from `old` to `new` by `node`'s `request`.
    pub fn witness_write(
        &mut self,
        old: &WitnessState,
        new: &WitnessState,
        node: NodeId,
        request: &WitnessRequest,
    ) {
        if new.term < old.term {
            self.fail(format!(
                "witness term went down {} -> {}",
                old.term, new.term
            ));
        }
        if new.last_log_position() < old.last_log_position() {
            self.fail(format!(
                "witness log position went down {:?} -> {:?}",
                old.last_log_position(),
                new.last_log_position()
            ));
        }
        if new.voted_for != 0 {
            let first = *self.witness_votes.entry(new.term).or_insert(new.voted_for);
            if first != new.voted_for {
                self.fail(format!(
                    "witness voted twice in term {}: {first} and {}",
                    new.term, new.voted_for
                ));
            }
        }
        if let WitnessRequest::Append(r) = request {
            let w = self.membership.witness.unwrap_or(0);
            if !r.replication_set.contains(&w)
                || !r.replication_set.contains(&node)
                || r.entry_term != r.term
            {
                self.fail(format!("witness append by {node} outside the rules: {r:?}"));
            }
        }
    }

    /// Per-tick checks over the live nodes.
    pub fn check(&mut self, tick: u64, live: &[&Raft]) -> Result<(), Violation> {
        self.ticks_checked += 1;
        for r in live.iter().filter(|r| r.role() == Role::Leader) {
            let first_seen = !self.leaders.contains_key(&r.term());
            let leader = *self.leaders.entry(r.term()).or_insert(r.id());
            if leader != r.id() {
                self.fail(format!(
                    "election safety: {} and {} both lead term {}",
                    leader,
                    r.id(),
                    r.term()
                ));
            }
            if let Some((subterm, rset)) = r.leader_view() {
                self.check_catch_up(r, subterm, rset, live);
                let voters: BTreeSet<NodeId> = self
                    .membership
                    .regular
                    .iter()
                    .copied()
                    .chain(self.membership.witness)
                    .collect();
                if rset.len() != self.membership.regular.len()
                    || !rset.contains(&r.id())
                    || !rset.is_subset(&voters)
                {
                    self.fail(format!(
                        "replication set shape: leader {} has R = {rset:?}",
                        r.id()
                    ));
                }
            }
            if first_seen {
                let log = r.log();
                let missing = self
                    .committed
                    .values()
                    .find(|e| log.get(e.index as usize - 1) != Some(e))
                    .map(|e| e.index);
                if let Some(i) = missing {
                    self.fail(format!(
                        "leader completeness: leader {} of term {} lacks committed entry {i}",
                        r.id(),
                        r.term()
                    ));
                }
            }
        }
        if self.ticks_checked.is_multiple_of(64) {
            self.check_log_matching(live);
        }
        match self.pending.take() {
            Some(what) => Err(Violation { tick, what }),
            None => Ok(()),
        }
    }

    /// A regular voter that joined R in this subterm holds the leader's log before the subterm.
    fn check_catch_up(
        &mut self,
        leader: &Raft,
        subterm: u64,
        rset: &BTreeSet<NodeId>,
        live: &[&Raft],
    ) {
        let key = (leader.term(), leader.id());
        let previous = self.rsets.insert(key, (subterm, rset.clone()));
        let Some((old_subterm, old)) = previous else {
            return;
        };
        if old_subterm == subterm {
            return;
        }
        let log = leader.log();
        let Some(start) = log
            .iter()
            .position(|e| (e.term, e.subterm) == (leader.term(), subterm))
        else {
            return;
        };
        let joined: Vec<NodeId> = rset
            .difference(&old)
            .copied()
            .filter(|v| self.membership.regular.contains(v))
            .collect();
        for v in joined {
            let Some(node) = live.iter().find(|n| n.id() == v) else {
                continue;
            };
            let held = node.log();
            if held.len() < start || held[..start] != log[..start] {
                let what = format!(
                    "catch-up rule: node {v} entered R in (term {}, subterm {subterm}) holding {} entries, the leader had {start} before the subterm",
                    leader.term(),
                    held.len()
                );
                self.fail(what);
            }
        }
    }

    fn check_log_matching(&mut self, live: &[&Raft]) {
        for (i, a) in live.iter().enumerate() {
            for b in &live[i + 1..] {
                let (la, lb) = (a.log(), b.log());
                let common = la.len().min(lb.len());
                if let Some(k) = (0..common).rev().find(|&k| la[k].term == lb[k].term)
                    && la[..=k] != lb[..=k]
                {
                    let what = format!(
                        "log matching: nodes {} and {} agree on the term at {} but not on the entries before",
                        a.id(),
                        b.id(),
                        k + 1
                    );
                    self.fail(what);
                }
            }
        }
    }
}
