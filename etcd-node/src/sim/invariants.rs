//! The invariants of `shared/design/extended-raft.md`, checked during simulation.
//!
//! Checked: election safety (one leader per term); leader completeness (a new leader holds every
//! entry known committed after its snapshot, in memory or, for entries it trimmed from memory,
//! in its storage, and its snapshot agrees with them); log matching (same index and term ->
//! same entries down to the later snapshot, over the live nodes' logs in memory and every
//! node's storage, down nodes' too); state machine
//! safety (every node applies the same entry at an index, each once and in order, and a
//! snapshot installs exactly the committed prefix); per witness: its term never decreases, its
//! (last_log_term, last_log_subterm) only grows, at most one vote per term; a witness append
//! carries R with the witness and the leader in it and an entry of the leader's own term;
//! |R| = number of regular voters, R within the voters, the leader in R; a regular voter enters
//! R only holding the leader's log up to the new subterm (the catch-up rule, paper §4.4) unless
//! a configuration change reset R; each subterm starts with an empty entry; a linearizable read
//! is served at an index no lower than any commit index reached before it started.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use witness_core::WitnessState;
use witness_core::rules::AppendRequest;

use crate::raft::{
    Body, Entry, EntryData, MemStorage, Membership, Message, NodeId, Raft, RaftLog, Role,
    SnapshotMeta, Storage, WitnessRequest,
};

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

/// A log as the checks read it: the entries after index `after`, and whose log it is (a
/// member's in memory, which it trims once every member holds them, or what its storage
/// persisted, everything since its last snapshot).
struct LogView<'a> {
    whose: String,
    after: u64,
    entries: &'a [Entry],
}

impl<'a> LogView<'a> {
    fn in_memory(r: &'a Raft) -> Self {
        let log = r.log();
        LogView {
            whose: format!("node {}'s log", r.id()),
            after: log.snapshot_index(),
            entries: log.entries(),
        }
    }

    fn persisted(node: NodeId, storage: &'a MemStorage) -> Self {
        let (after, entries) = storage.persisted();
        LogView {
            whose: format!("node {node}'s storage"),
            after,
            entries,
        }
    }

    fn entry(&self, index: u64) -> Option<&'a Entry> {
        let k = index.checked_sub(self.after + 1)?;
        self.entries.get(usize::try_from(k).ok()?)
    }

    fn last_index(&self) -> u64 {
        self.after + self.entries.len() as u64
    }
}

/// What the catch-up check remembers of a leader: its last subterm, R and configuration.
type LeaderView = (u64, BTreeSet<NodeId>, Membership);

/// Everything the checks remember across ticks.
#[derive(Debug, Default)]
pub struct Checker {
    leaders: BTreeMap<u64, NodeId>,
    committed: BTreeMap<u64, Entry>,
    /// Last index each node applied (its state machine's position).
    applied: BTreeMap<NodeId, u64>,
    /// (witness, term) -> the vote it cast.
    witness_votes: BTreeMap<(NodeId, u64), NodeId>,
    views: BTreeMap<(u64, NodeId), LeaderView>,
    /// The position every member of the cluster started from: (index, term, subterm).
    bootstrap: (u64, u64, u64),
    /// Read number -> the highest commit index reached before the read started.
    reads: BTreeMap<u64, u64>,
    /// Client writes submitted through the server's proposal handling -> the index they were
    /// first committed at.
    writes: BTreeMap<Vec<u8>, Option<u64>>,
    /// Client writes answered with an error that says they were not applied, and by whom.
    refused: BTreeMap<Vec<u8>, (NodeId, String)>,
    pending: Option<String>,
    ticks_checked: u64,
    /// Per node: the highest commit index its Readys carried (checked for durability up to it
    /// when it led), and the configuration it had at its last Ready.
    commits: BTreeMap<NodeId, (u64, Membership)>,
}

impl Checker {
    /// Checks for a cluster whose members all start from the snapshot `bootstrap`.
    pub fn new(bootstrap: &SnapshotMeta) -> Self {
        Checker {
            bootstrap: (bootstrap.index, bootstrap.term, bootstrap.subterm),
            applied: BTreeMap::new(),
            ..Self::default()
        }
    }

    pub fn committed(&self) -> &BTreeMap<u64, Entry> {
        &self.committed
    }

    fn fail(&mut self, what: String) {
        self.pending.get_or_insert(what);
    }

    /// A node applied `e`: state machine safety, order, and the empty entry at each subterm start.
    pub fn applied(&mut self, node: NodeId, e: &Entry) {
        let last = self
            .applied
            .insert(node, e.index)
            .unwrap_or(self.bootstrap.0);
        if e.index != last + 1 {
            let what = format!(
                "apply order: node {node} applied entry {} after {last}",
                e.index
            );
            self.fail(what);
        }
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
                self.write_committed(e);
            }
        }
    }

    /// A client write was submitted (its data is unique).
    pub fn write_submitted(&mut self, data: Vec<u8>) {
        self.writes.insert(data, None);
    }

    /// Node `node` answered a client write with error `message`, which tells the client it was
    /// not applied: it must never commit.
    pub fn write_refused(&mut self, node: NodeId, data: &[u8], message: &str) {
        if let Some(Some(at)) = self.writes.get(data) {
            let what = format!(
                "refused write committed: node {node} answered {data:?} with {message:?}, but it committed at {at}"
            );
            self.fail(what);
        }
        self.refused
            .insert(data.to_vec(), (node, message.to_string()));
    }

    /// A newly committed entry: a client write must commit once (a proposal forwarded or
    /// retried twice would apply twice), and not after it was answered as not applied.
    fn write_committed(&mut self, e: &Entry) {
        let EntryData::Normal(data) = &e.data else {
            return;
        };
        if let Some((node, message)) = self.refused.get(data) {
            let what = format!(
                "refused write committed: node {node} answered {data:?} with {message:?}, but it committed at {}",
                e.index
            );
            self.fail(what);
        }
        match self.writes.get_mut(data) {
            Some(Some(first)) => {
                let what = format!(
                    "client write applied twice: {data:?} committed at {first} and at {}",
                    e.index
                );
                self.fail(what);
            }
            Some(at) => *at = Some(e.index),
            None => {}
        }
    }

    /// Node `node` answered a client write as applied at `index`.
    pub fn write_answered(&mut self, node: NodeId, data: &[u8], index: u64) {
        let holds = self
            .committed
            .get(&index)
            .is_some_and(|e| e.data == EntryData::Normal(data.to_vec()));
        if !holds {
            let what = format!(
                "client write: node {node} answered {data:?} as applied at {index}, which holds {:?}",
                self.committed.get(&index)
            );
            self.fail(what);
        }
    }

    /// A node's Ready carries commit index `commit`, before it is persisted. If it leads, every
    /// entry the index newly covers must be durable on a quorum already (`durable`), in the
    /// configuration in effect now or at its previous Ready (a change applied between its commit
    /// decision and this Ready does not move what was counted).
    pub fn commit_durable(
        &mut self,
        node: &Raft,
        commit: u64,
        durable: impl Fn(&Membership, &Entry) -> bool,
    ) {
        let (from, before) = self
            .commits
            .insert(node.id(), (commit, node.membership().clone()))
            .unwrap_or((0, node.membership().clone()));
        if node.role() != Role::Leader || commit <= from {
            self.commits.get_mut(&node.id()).expect("inserted").0 = from.max(commit);
            return;
        }
        let lacking = (from + 1..=commit)
            .filter_map(|i| node.log().entry(i))
            .find(|e| !durable(node.membership(), e) && !durable(&before, e));
        if let Some(e) = lacking {
            let what = format!(
                "durable commit: leader {} of term {} commits entry {} (term {}, subterm {}) before a quorum of {:?} persisted it",
                node.id(),
                node.term(),
                e.index,
                e.term,
                e.subterm,
                node.membership()
            );
            self.fail(what);
        }
    }

    /// Node `node` sends `messages` while its storage holds `storage`: every promise in them is
    /// durable already (a granted vote is persisted with its term; an acknowledged index is
    /// persisted with the entry `log` has there). A promise made before the fsync is forgotten
    /// by a crash that keeps the message on the wire.
    pub fn promises(
        &mut self,
        node: NodeId,
        storage: &MemStorage,
        log: &RaftLog,
        messages: &[Message],
    ) {
        for m in messages {
            let kept = match m.body {
                Body::VoteResp {
                    pre: false,
                    granted: true,
                } => {
                    let hs = storage.hard_state();
                    (hs.term, hs.vote) == (m.term, m.to)
                }
                Body::AppendResp {
                    index,
                    reject: false,
                } => log.entry(index).is_none_or(|e| storage.holds(e)),
                _ => true,
            };
            if !kept {
                self.fail(format!(
                    "promise before persistence: node {node} sends {:?} in term {} to {} before persisting it",
                    m.body, m.term, m.to
                ));
            }
        }
    }

    /// A node restarts: its state machine is rebuilt from its snapshot at `index`.
    pub fn restarted(&mut self, node: NodeId, index: u64) {
        self.applied.insert(node, index);
    }

    /// A node installed a snapshot from its leader: it must be of the committed prefix.
    pub fn installed(&mut self, node: NodeId, meta: &SnapshotMeta) {
        let position = (meta.index, meta.term, meta.subterm);
        match self.committed.get(&meta.index) {
            _ if position == self.bootstrap => {}
            Some(e) if (e.term, e.subterm) == (meta.term, meta.subterm) => {}
            other => {
                let what = format!(
                    "snapshot: node {node} installed a snapshot at {} (term {}, subterm {}), committed there: {other:?}",
                    meta.index, meta.term, meta.subterm
                );
                self.fail(what);
            }
        }
        self.applied.insert(node, meta.index);
    }

    /// A linearizable read starts after commit index `floor` was reached somewhere.
    pub fn read_started(&mut self, number: u64, floor: u64) {
        self.reads.insert(number, floor);
    }

    /// Node `node` answered read `number` with `index` (the state machine must reach it before
    /// serving the read).
    pub fn read_answered(&mut self, node: NodeId, number: u64, index: u64) {
        let floor = self.reads.remove(&number).unwrap_or(0);
        if index < floor {
            let what = format!(
                "linearizable read: node {node} answered read {number} at index {index} but {floor} was committed before it started"
            );
            self.fail(what);
        }
    }

    /// Witness `witness`'s register changes from `old` to `new` by `node`'s `request`.
    pub fn witness_write(
        &mut self,
        witness: NodeId,
        old: &WitnessState,
        new: &WitnessState,
        node: NodeId,
        request: &WitnessRequest,
    ) {
        if new.term < old.term {
            self.fail(format!(
                "witness {witness} term went down {} -> {}",
                old.term, new.term
            ));
        }
        if new.last_log_position() < old.last_log_position() {
            self.fail(format!(
                "witness {witness} log position went down {:?} -> {:?}",
                old.last_log_position(),
                new.last_log_position()
            ));
        }
        if new.voted_for != 0 {
            let first = *self
                .witness_votes
                .entry((witness, new.term))
                .or_insert(new.voted_for);
            if first != new.voted_for {
                self.fail(format!(
                    "witness {witness} voted twice in term {}: {first} and {}",
                    new.term, new.voted_for
                ));
            }
        }
        if let WitnessRequest::Vote { pre: true, .. } = request {
            self.fail(format!(
                "witness {witness} written by {node}'s pre-vote ({old:?} -> {new:?})"
            ));
        }
        if let WitnessRequest::Append(r) = request
            && (!r.replication_set.contains(&witness)
                || !r.replication_set.contains(&node)
                || r.entry_term != r.term)
        {
            self.fail(format!("witness append by {node} outside the rules: {r:?}"));
        }
    }

    /// Condition 3 of the witness write: when `leader` asks the witness to store an entry, a
    /// subquorum of R (a quorum of R less the witness's own vote, the leader included) has
    /// persisted it. `stored` gives each node's storage. A member whose persisted term passed
    /// the request's counts too: it may have replaced the entry since it acknowledged it, and
    /// the witness then refuses the stale leader by its term.
    pub fn witness_append_asked<'s>(
        &mut self,
        leader: NodeId,
        request: &AppendRequest,
        witness: NodeId,
        stored: impl Fn(NodeId) -> Option<&'s MemStorage>,
    ) {
        let holds = |id: NodeId| {
            stored(id).is_some_and(|s| {
                s.hard_state().term > request.term
                    || s.snapshot().meta.index >= request.index
                    || s.entries().iter().any(|e| {
                        e.index == request.index
                            && e.term == request.entry_term
                            && e.subterm == request.entry_subterm
                    })
            })
        };
        // (R has as many members as there are regular voters; with the witness the voters are one
        // more, and their quorum less the witness is half of R, rounded up)
        let need = request.replication_set.len().div_ceil(2);
        let have = request
            .replication_set
            .iter()
            .filter(|&&id| id != witness && holds(id))
            .count();
        if have < need {
            self.fail(format!(
                "leader {leader} asked witness {witness} to store index {} (term {}, subterm {}) \
                 persisted by {have} members of R {:?}, fewer than the {need} condition 3 needs",
                request.index, request.entry_term, request.entry_subterm, request.replication_set
            ));
        }
    }

    /// Per-tick checks over the live nodes, and every node's storage (`stored`, down nodes'
    /// too).
    pub fn check(
        &mut self,
        tick: u64,
        live: &[&Raft],
        stored: &[(NodeId, &MemStorage)],
    ) -> Result<(), Violation> {
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
            if let Some((_, rset)) = r.leader_view() {
                self.check_rset_shape(r, rset);
            }
            if first_seen {
                let storage = stored.iter().find(|(id, _)| *id == r.id());
                self.check_leader_completeness(r, storage.map(|(_, s)| *s));
            }
        }
        if self.ticks_checked.is_multiple_of(64) {
            let logs = live.iter().map(|r| LogView::in_memory(r));
            let persisted = stored.iter().map(|(id, s)| LogView::persisted(*id, s));
            self.check_log_matching(&logs.chain(persisted).collect::<Vec<_>>());
        }
        match self.pending.take() {
            Some(what) => Err(Violation { tick, what }),
            None => Ok(()),
        }
    }

    fn check_rset_shape(&mut self, r: &Raft, rset: &BTreeSet<NodeId>) {
        let voters = &r.membership().voters;
        let within = rset.iter().all(|&v| voters.contains(v));
        let leader_in = rset.contains(&r.id()) || !voters.regular.contains(&r.id());
        if rset.len() != voters.regular.len() || !within || !leader_in {
            self.fail(format!(
                "replication set shape: leader {} has R = {rset:?} with voters {voters:?}",
                r.id()
            ));
        }
    }

    /// A new leader holds every committed entry after its snapshot: in its log in memory, or,
    /// for those it trimmed from memory, in its storage.
    fn check_leader_completeness(&mut self, r: &Raft, storage: Option<&MemStorage>) {
        let log = r.log();
        let snap = log.snapshot_index();
        let stored = storage.map(|s| LogView::persisted(r.id(), s));
        let held = |e: &Entry| match &stored {
            Some(stored) if e.index <= snap => {
                e.index <= stored.after || stored.entry(e.index) == Some(e)
            }
            _ => e.index <= snap || log.entry(e.index) == Some(e),
        };
        let missing = self.committed.values().find(|e| !held(e)).map(|e| e.index);
        let snapshot_agrees = self
            .committed
            .get(&snap)
            .is_none_or(|e| log.term(snap) == Some(e.term));
        if missing.is_some() || !snapshot_agrees {
            self.fail(format!(
                "leader completeness: leader {} of term {} lacks committed entry {missing:?} (snapshot at {snap} agrees: {snapshot_agrees})",
                r.id(),
                r.term()
            ));
        }
    }

    /// A regular voter that joined R in this subterm holds the leader's log before the subterm,
    /// unless a configuration change reset R.
    ///
    /// Run after every Ready of a leader: R can change twice within one simulation tick (a
    /// drifting clock ticks twice), and a per-tick sample would skip a subterm
    /// (raft-sim --start 4925 --regular 4 --witness reported a false catch-up violation).
    pub fn check_catch_up(
        &mut self,
        leader: &Raft,
        subterm: u64,
        rset: &BTreeSet<NodeId>,
        live: &[&Raft],
    ) {
        let key = (leader.term(), leader.id());
        let view = (subterm, rset.clone(), leader.membership().clone());
        let Some((old_subterm, old, old_membership)) = self.views.insert(key, view) else {
            return;
        };
        if old_subterm == subterm || &old_membership != leader.membership() {
            return;
        }
        let log = leader.log();
        let Some(start) = log
            .entries()
            .iter()
            .find(|e| (e.term, e.subterm) == (leader.term(), subterm))
            .map(|e| e.index)
        else {
            return;
        };
        let joined: Vec<NodeId> = rset
            .difference(&old)
            .copied()
            .filter(|&v| leader.membership().is_regular_voter(v))
            .collect();
        for v in joined {
            // A node already in a later term may have had its log cut by a newer leader since
            // it acknowledged this one: its log now says nothing about what it held then.
            let Some(node) = live
                .iter()
                .find(|n| n.id() == v && n.term() <= leader.term())
            else {
                continue;
            };
            let held = node.log();
            let before = start - 1;
            let lacks = held.last_index() < before
                || (held.snapshot_index().max(log.snapshot_index()) + 1..=before)
                    .any(|i| held.entry(i) != log.entry(i));
            if lacks {
                let what = format!(
                    "catch-up rule: node {v} entered R in (term {}, subterm {subterm}) holding up to {}, the leader had {before} before the subterm",
                    leader.term(),
                    held.last_index()
                );
                self.fail(what);
            }
        }
    }

    /// Log matching over every pair of logs: the live nodes' in memory and every node's
    /// storage (a persisted log is one the node had, and down nodes' count too).
    fn check_log_matching(&mut self, logs: &[LogView]) {
        for (i, a) in logs.iter().enumerate() {
            for b in &logs[i + 1..] {
                let term = |l: &LogView, k| l.entry(k).map(|e| e.term);
                let lo = a.after.max(b.after) + 1;
                let hi = a.last_index().min(b.last_index());
                let Some(k) = (lo..=hi)
                    .rev()
                    .find(|&k| term(a, k).is_some() && term(a, k) == term(b, k))
                else {
                    continue;
                };
                if let Some(j) = (lo..=k).find(|&j| a.entry(j) != b.entry(j)) {
                    let what = format!(
                        "log matching: {} and {} agree on the term at {k} but not on entry {j}",
                        a.whose, b.whose,
                    );
                    self.fail(what);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::EntryData;
    use witness_core::Seen;
    use witness_core::rules::Caller;

    fn ask(index: u64, rset: Vec<NodeId>) -> AppendRequest {
        AppendRequest {
            caller: Caller {
                cluster_id: 1,
                witness_id: 9,
                seen: Seen::default(),
            },
            term: 2,
            leader: 1,
            entry_term: 2,
            entry_subterm: 1,
            index,
            replication_set: rset,
            replication_set_outgoing: Vec::new(),
        }
    }

    /// Condition 3 can fail: a witness append for an entry the leader has not persisted is
    /// reported; once it is persisted (or with three regular voters, once two hold it) it is not.
    #[test]
    fn a_witness_append_before_a_subquorum_persisted_is_reported() {
        let members = Membership::new([1, 2], Some(9)).unwrap();
        let mut leader = MemStorage::bootstrap(members.clone(), None);
        let follower = MemStorage::bootstrap(members.clone(), None);
        // (the first index past the bootstrap snapshot)
        let at = leader.snapshot().meta.index + 1;
        let entry = Entry {
            term: 2,
            subterm: 1,
            index: at,
            data: EntryData::Empty,
        };
        let stored = |l: &MemStorage, id: NodeId| match id {
            1 => Some(l.clone()),
            2 => Some(follower.clone()),
            _ => None,
        };
        let mut checker = Checker::new(&leader.snapshot().meta);
        let early = stored(&leader, 1);
        checker.witness_append_asked(1, &ask(at, vec![1, 9]), 9, |id| match id {
            1 => early.as_ref(),
            _ => None,
        });
        assert!(
            checker
                .pending
                .as_ref()
                .is_some_and(|p| p.contains("condition 3")),
            "{:?}",
            checker.pending
        );
        leader.append(std::slice::from_ref(&entry));
        let mut checker = Checker::new(&leader.snapshot().meta);
        let persisted = stored(&leader, 1);
        checker.witness_append_asked(1, &ask(at, vec![1, 9]), 9, |id| match id {
            1 => persisted.as_ref(),
            _ => None,
        });
        assert_eq!(checker.pending, None);
        // Three regular voters and the witness: R = {1, 2, 9}, two of them must hold it.
        let mut checker = Checker::new(&leader.snapshot().meta);
        let other = stored(&leader, 2);
        checker.witness_append_asked(1, &ask(at, vec![1, 2, 9]), 9, |id| match id {
            1 => persisted.as_ref(),
            2 => other.as_ref(),
            _ => None,
        });
        assert!(
            checker.pending.is_some(),
            "one of three regular voters is not enough"
        );
    }
}
