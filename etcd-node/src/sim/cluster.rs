//! The simulated cluster: nodes, storage, network and the witness register.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, mpsc};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use witness_core::{Fault, MemoryStore, RetryPolicy, Seen, Witness, WitnessState};

use super::invariants::{Checker, Violation};
use super::trace::Trace;
use crate::errors::EtcdError;
use crate::raft::{
    Body, ChangeKind, ConfChange, Config, Entry, EntryData, KnownWitness, MemStorage, Membership,
    Message, NodeId, Raft, Ready, Refused, Role, Snapshot, Storage, WitnessRequest,
    WitnessResponse, apply_rule,
};
use crate::server::driver::{Driver, World};
use crate::server::proposals::Proposals;
use crate::server::reads::Waiter;
use crate::server::wire::Envelope;

/// Network fault rates (per message) and delays, in ticks.
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    pub drop: f64,
    pub duplicate: f64,
    /// Delivery delay range [min, max] in ticks (reordering comes from different delays).
    pub min_delay: u64,
    pub max_delay: u64,
    /// Per Ready that persists something (any node): the node crashes inside it, either after
    /// sending its early messages and before persisting, or after persisting and before sending
    /// the rest, running its witness steps and applying.
    pub crash_in_ready: f64,
    /// Per delivery (messages, witness steps and witness replies): held for 10 to 60 ticks
    /// instead of the usual delay (a stalled connection, a slow storage request).
    pub hold: f64,
    /// Clock drift: each node's clock runs at a rate drawn from [1 - drift, 1 + drift] of the
    /// simulation's (0: every clock ticks in lockstep).
    pub drift: f64,
    /// Per witness step: its load returns one of the register's last states instead of the
    /// current one (a mount's attribute or directory cache). A step that would write then
    /// loses its compare-and-swap and runs again on the current state; one that answers without
    /// writing answers from the stale state.
    pub stale_loads: f64,
    /// Per witness step that writes: the write takes effect but its reply is lost, and the
    /// client loads again to learn the outcome (the rules answer the same from the state
    /// written; a read-term confirmation writes it back once more). Drawn from a random
    /// sequence of its own.
    pub lost_replies: f64,
}

impl Faults {
    /// A perfect network: one tick per message.
    pub fn none() -> Self {
        Faults {
            drop: 0.0,
            duplicate: 0.0,
            min_delay: 1,
            max_delay: 1,
            crash_in_ready: 0.0,
            hold: 0.0,
            drift: 0.0,
            stale_loads: 0.0,
            lost_replies: 0.0,
        }
    }
}

/// What happened during a run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub ticks: u64,
    pub messages: u64,
    pub witness_steps: u64,
    pub witness_writes: u64,
    pub committed: u64,
    pub crashes: u64,
    /// Crashes between sending early messages and persisting.
    pub crashes_before_persist: u64,
    /// Crashes after persisting and before sending, stepping the witness and applying.
    pub crashes_after_persist: u64,
    /// Deliveries held 10 to 60 ticks.
    pub held: u64,
    /// Witness steps answered from a stale load.
    pub stale_answers: u64,
    /// Witness writes whose reply was lost (the client loaded again to learn the outcome).
    pub lost_replies: u64,
    pub snapshots_installed: u64,
    pub reads_served: u64,
    /// Reads answered with an error (the node stepped down, say).
    pub reads_refused: u64,
    pub conf_changes: u64,
    pub transfers: u64,
    /// Witness storage wiped and initialised again (a new generation).
    pub witness_wipes: u64,
    /// Witness steps refused because the witness lost its state.
    pub witness_refusals: u64,
    /// Removed nodes stopped by the server's rule ([`Removal`]).
    pub removed_stopped: u64,
    /// Client writes answered as not applied ("no leader", "leader changed", ...).
    pub writes_refused: u64,
}

#[derive(Debug)]
enum Event {
    Message(Message),
    /// A witness step reaches the storage.
    WitnessStep {
        node: NodeId,
        request: WitnessRequest,
    },
    /// Its outcome reaches the node.
    WitnessReply {
        node: NodeId,
        response: WitnessResponse,
    },
    /// A node that crashed inside a Ready is started again (a supervisor restarting it).
    Restart(NodeId),
    /// A member-to-member envelope other than a Raft message (the reads' ReadIndex questions
    /// and answers).
    Peer {
        from: NodeId,
        to: NodeId,
        envelope: Envelope,
    },
}

/// A client read waiting on a node: its number, answered through the cluster's channel.
#[derive(Debug)]
struct SimRead {
    node: NodeId,
    number: u64,
    answers: mpsc::Sender<Answer>,
}

/// (node, read number, index or refusal)
type Answer = (NodeId, u64, Result<u64, EtcdError>);

impl Waiter for SimRead {
    type Answer = u64;
    fn answer(self, index: Result<u64, EtcdError>) {
        let _ = self.answers.send((self.node, self.number, index));
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// A client write waiting on a node, answered with the index it was applied at.
#[derive(Debug)]
struct SimWrite {
    node: NodeId,
    data: Vec<u8>,
    answers: mpsc::Sender<WriteAnswer>,
}

/// (node, the write's data, applied index or refusal)
type WriteAnswer = (NodeId, Vec<u8>, Result<u64, EtcdError>);

impl Waiter for SimWrite {
    type Answer = u64;
    fn answer(self, index: Result<u64, EtcdError>) {
        let _ = self.answers.send((self.node, self.data, index));
    }
    fn is_closed(&self) -> bool {
        false
    }
}

#[derive(Debug)]
struct Node {
    /// The running member (None: down or stopped), driven by the server's own code
    /// ([`Driver`]: writes, reads, the `Ready` order, the removed member's stop), whose memory
    /// a crash loses as a process's is.
    member: Option<Driver<SimWrite, SimRead>>,
    storage: MemStorage,
    config: Config,
    /// Clock rate relative to the simulation's, and the fraction of a tick accumulated.
    clock: Option<(f64, f64)>,
    /// Where the next incarnation's read rounds count from (drawn when it crashed).
    first_ctx: u64,
    /// Stopped by the removal rule: never started again (an operator must not start a removed
    /// member's data directory).
    stopped: bool,
}

/// The witness's cluster id in simulations.
pub const CLUSTER_ID: u64 = 0xc1;

/// A simulated cluster.
#[derive(Debug)]
pub struct Cluster {
    rng: StdRng,
    nodes: BTreeMap<NodeId, Node>,
    /// One register per witness member ever added (a new witness is a new register, as an
    /// operator initialises fresh storage for it).
    witnesses: BTreeMap<NodeId, WitnessState>,
    /// Per witness register: its last states before the current one (what a stale load sees).
    witness_history: BTreeMap<NodeId, Vec<WitnessState>>,
    /// Highest commit index any node ever reached: a read started later must see it.
    max_commit: u64,
    reads: u64,
    /// Where the nodes' reads are answered.
    answers: (mpsc::Sender<Answer>, mpsc::Receiver<Answer>),
    /// Where the nodes' client writes are answered.
    writes: (mpsc::Sender<WriteAnswer>, mpsc::Receiver<WriteAnswer>),
    /// Runs witness steps through witness-core's client (with no backoff: nothing sleeps).
    runtime: tokio::runtime::Runtime,
    /// Draws the witness store's lost replies (apart from `rng`: see [`Faults::lost_replies`]).
    store_rng: StdRng,
    now: u64,
    /// (deliver at, sequence, event): delivered in order of time, then sequence.
    queue: BTreeMap<(u64, u64), Event>,
    seq: u64,
    /// Pairs (a, b) with a < b that cannot talk; `(n, WITNESS_LINK)` cuts n from the witness.
    cut: BTreeSet<(NodeId, NodeId)>,
    pub faults: Faults,
    pub stats: Stats,
    /// A deliberate witness-side bug (tests of the simulator only).
    #[cfg(feature = "mutations")]
    pub witness_mutation: Option<crate::raft::Mutation>,
    checker: Checker,
    /// The config every node starts from (its id and seed set per node).
    template: Config,
    /// What happened, line by line, once [`Cluster::record_trace`] asked for it.
    pub trace: Option<Trace>,
}

/// A witness register as `etcdutl witness init` makes it, with a generation from the run's seed.
fn fresh_witness(rng: &mut StdRng) -> WitnessState {
    WitnessState {
        generation: rng.random_range(1..=u64::MAX),
        ..WitnessState::new(0, "witness", "witness:sim")
    }
}

/// The live nodes' Raft cores.
fn live(nodes: &BTreeMap<NodeId, Node>) -> Vec<&Raft> {
    let members = nodes.values().filter_map(|n| n.member.as_ref());
    members.map(|m| &m.raft).collect()
}

/// Used in `cut` for a node's link to the witness storage.
const WITNESS_LINK: NodeId = u64::MAX;

fn link(a: NodeId, b: NodeId) -> (NodeId, NodeId) {
    (a.min(b), a.max(b))
}

impl Cluster {
    /// `regular` nodes with ids 1..=regular, plus a witness with id regular+1 if `witness`.
    /// Panics on a configuration [`Membership::new`] refuses.
    pub fn new(regular: u64, witness: bool, seed: u64) -> Cluster {
        Self::with_config(regular, witness, seed, |_| {})
    }

    /// As [`Cluster::new`], adjusting each node's config.
    pub fn with_config(
        regular: u64,
        witness: bool,
        seed: u64,
        tune: impl Fn(&mut Config),
    ) -> Cluster {
        let mut template = Config::new(1);
        template.cluster_id = CLUSTER_ID;
        tune(&mut template);
        let membership = Membership::new(1..=regular, witness.then_some(regular + 1))
            .expect("a valid simulated configuration");
        let mut rng = StdRng::seed_from_u64(seed);
        let register = membership
            .voters
            .witness
            .map(|w| (w, fresh_witness(&mut rng)));
        let known = register.as_ref().map(|(w, state)| KnownWitness {
            id: *w,
            seen: Seen::of(state),
        });
        let mut c = Cluster {
            rng,
            nodes: BTreeMap::new(),
            witnesses: BTreeMap::new(),
            witness_history: BTreeMap::new(),
            max_commit: 0,
            reads: 0,
            answers: mpsc::channel(),
            writes: mpsc::channel(),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a tokio runtime for the witness client"),
            store_rng: StdRng::seed_from_u64(seed ^ 0x5707e),
            checker: Checker::new(
                &MemStorage::bootstrap(membership.clone(), known)
                    .snapshot()
                    .meta,
            ),
            now: 0,
            queue: BTreeMap::new(),
            seq: 0,
            cut: BTreeSet::new(),
            faults: Faults::none(),
            stats: Stats::default(),
            #[cfg(feature = "mutations")]
            witness_mutation: None,
            template,
            trace: None,
        };
        c.witnesses.extend(register);
        // Every member read the witness before its first start: it is bound to its generation.
        for &id in &membership.voters.regular {
            c.add_node(id, MemStorage::bootstrap(membership.clone(), known));
        }
        c
    }

    fn add_node(&mut self, id: NodeId, storage: MemStorage) {
        let mut config = self.template.clone();
        config.id = id;
        config.seed = self.rng.random();
        let raft = Raft::new(config.clone(), &storage).expect("valid simulated config");
        self.nodes.insert(
            id,
            Node {
                member: Some(Driver::new(raft, self.rng.random())),
                storage,
                config,
                clock: None,
                first_ctx: 0,
                stopped: false,
            },
        );
    }

    /// Records a [`Trace`] from now on.
    pub fn record_trace(&mut self) {
        self.trace = Some(Trace::default());
    }

    /// The simulated time, in ticks.
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Every node the simulation runs (members, joiners and removed nodes).
    pub fn node_ids(&self) -> Vec<NodeId> {
        self.nodes.keys().copied().collect()
    }
    /// The configuration the leader (else the first live node) has in effect.
    pub fn membership(&self) -> Membership {
        self.leader()
            .and_then(|l| self.raft(l))
            .or_else(|| live(&self.nodes).into_iter().next())
            .map_or_else(Membership::empty, |r| r.membership().clone())
    }
    pub fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
    pub fn raft(&self, id: NodeId) -> Option<&Raft> {
        self.nodes.get(&id)?.member.as_ref().map(|m| &m.raft)
    }
    /// Entries applied (known committed) so far, by index.
    pub fn committed(&self) -> &BTreeMap<u64, Entry> {
        self.checker.committed()
    }

    /// A summary of every node and witness register, for failure reports.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (id, n) in &self.nodes {
            match n.member.as_ref().map(|m| &m.raft) {
                Some(r) => out.push_str(&format!(
                    "  node {id}: {:?} term {} leader {} commit {} applied {} log ({}, {}] last {:?} view {:?} membership {:?}\n",
                    r.role(),
                    r.term(),
                    r.leader(),
                    r.commit(),
                    r.applied(),
                    r.log().snapshot_index(),
                    r.log().last_index(),
                    r.log().last_position(),
                    r.leader_view(),
                    r.membership()
                )),
                None if n.stopped => out.push_str(&format!(
                    "  node {id}: stopped (it applied its own removal)\n"
                )),
                None => out.push_str(&format!("  node {id}: down\n")),
            }
        }
        for (id, w) in &self.witnesses {
            out.push_str(&format!(
                "  witness {id}: term {} voted {} position {:?} R {:?} R_out {:?}\n",
                w.term,
                w.voted_for,
                w.last_log_position(),
                w.replication_set,
                w.replication_set_outgoing
            ));
        }
        out
    }

    /// The node that is leader in the highest term, if any.
    pub fn leader(&self) -> Option<NodeId> {
        live(&self.nodes)
            .into_iter()
            .filter(|r| r.role() == Role::Leader)
            .max_by_key(|r| r.term())
            .map(|r| r.id())
    }

    // ---- faults ----

    pub fn crash(&mut self, id: NodeId) {
        let first_ctx = self.rng.random();
        let node = self.nodes.get_mut(&id).expect("node");
        node.first_ctx = first_ctx;
        if node.member.take().is_some() {
            self.checker
                .restarted(id, self.nodes[&id].storage.snapshot().meta.index);
            self.stats.crashes += 1;
        }
    }

    /// The others learn at once that node `id` is down, as when its process dies and its
    /// connections close (`Raft::report_unreachable`); a machine that loses power just goes
    /// silent, which [`Cluster::crash`] alone models.
    pub fn report_down(&mut self, id: NodeId) {
        for other in self.live_ids() {
            if let Some(raft) = self.raft_mut(other) {
                raft.report_unreachable(id);
            }
        }
    }

    /// A crash inside a Ready; half the time a supervisor starts the node again within 20
    /// ticks (before its peers' timers run out, so it rejoins what it may have forgotten).
    fn crash_in_ready(&mut self, id: NodeId) {
        self.crash(id);
        if self.rng.random_bool(0.5) {
            self.seq += 1;
            let at = self.now + self.rng.random_range(1..=20);
            self.queue.insert((at, self.seq), Event::Restart(id));
        }
    }

    pub fn restart(&mut self, id: NodeId) {
        let node = self.nodes.get_mut(&id).expect("node");
        if node.member.is_none() && !node.stopped {
            let raft = Raft::new(node.config.clone(), &node.storage).expect("restart");
            node.member = Some(Driver::new(raft, node.first_ctx));
        }
    }

    /// Cuts the link between two regular nodes.
    pub fn partition(&mut self, a: NodeId, b: NodeId) {
        self.cut.insert(link(a, b));
    }

    /// The witness's storage is wiped and initialised again, as an operator might after losing
    /// it: a register with a new generation, term 0 and no log position.
    pub fn wipe_witness(&mut self, id: NodeId) {
        if self.witnesses.contains_key(&id) {
            let fresh = fresh_witness(&mut self.rng);
            self.witnesses.insert(id, fresh);
            self.witness_history.remove(&id);
            self.stats.witness_wipes += 1;
        }
    }

    /// The witness's storage is put back to `state` (an older copy restored).
    pub fn revert_witness(&mut self, id: NodeId, state: WitnessState) {
        self.witnesses.insert(id, state);
        self.witness_history.remove(&id);
    }

    /// The witness register `id` holds now.
    pub fn witness_state(&self, id: NodeId) -> Option<&WitnessState> {
        self.witnesses.get(&id)
    }

    /// Cuts a node off from the witness storage.
    pub fn cut_witness(&mut self, id: NodeId) {
        self.cut.insert(link(id, WITNESS_LINK));
    }

    /// Node `id` reaches the witness again (other cuts stay).
    pub fn restore_witness(&mut self, id: NodeId) {
        self.cut.remove(&link(id, WITNESS_LINK));
    }

    pub fn heal(&mut self) {
        self.cut.clear();
    }

    fn connected(&self, a: NodeId, b: NodeId) -> bool {
        !self.cut.contains(&link(a, b))
    }

    /// Runs `request` on the current leader and processes its Ready.
    fn on_leader<T>(
        &mut self,
        request: impl FnOnce(&mut Raft) -> Result<T, Refused>,
    ) -> Result<T, Refused> {
        let leader = self.leader().ok_or(Refused::NotLeader { leader: 0 })?;
        self.on_node(leader, request)
    }

    /// Runs `request` on live node `id` and processes its Ready.
    fn on_node<T>(
        &mut self,
        id: NodeId,
        request: impl FnOnce(&mut Raft) -> Result<T, Refused>,
    ) -> Result<T, Refused> {
        let out = request(self.raft_mut(id).expect("a live node"))?;
        self.process(id);
        Ok(out)
    }

    /// Proposes on the current leader; returns the index if it took it.
    pub fn propose(&mut self, data: Vec<u8>) -> Option<u64> {
        self.on_leader(|r| r.propose(data)).ok()
    }

    /// Proposes a configuration change on the leader. Nodes it adds are started (with empty
    /// storage, as etcd's `--initial-cluster-state existing`), a witness it adds gets a fresh
    /// register, whose generation the change carries (as the server reads it from the storage
    /// before it proposes).
    pub fn propose_conf_change(&mut self, mut cc: ConfChange) -> Result<u64, Refused> {
        for change in &cc.changes {
            if change.kind == ChangeKind::AddWitness && !self.witnesses.contains_key(&change.node) {
                let fresh = fresh_witness(&mut self.rng);
                self.witnesses.insert(change.node, fresh);
            }
            if let Some(w) = self.witnesses.get(&change.node) {
                cc.witness_generation = w.generation;
            }
        }
        let index = self.on_leader(|r| r.propose_conf_change(cc.clone()))?;
        self.stats.conf_changes += 1;
        for change in &cc.changes {
            match change.kind {
                ChangeKind::AddVoter | ChangeKind::AddLearner
                    if !self.nodes.contains_key(&change.node) =>
                {
                    self.add_node(change.node, MemStorage::joining());
                }
                _ => {}
            }
        }
        Ok(index)
    }

    /// Asks the leader to hand leadership to `to`.
    pub fn transfer_leader(&mut self, to: NodeId) -> Result<(), Refused> {
        self.on_leader(|r| r.transfer_leader(to))?;
        self.stats.transfers += 1;
        Ok(())
    }

    /// Starts a linearizable read on any live node, through the server's read handling
    /// (`server::reads`: batched rounds, forwarded by followers); refused only when no node
    /// believes it leads. Once answered, its index is checked against every commit index
    /// reached before it started.
    pub fn read(&mut self) -> Result<(), Refused> {
        let live = self.live_ids();
        if self.leader().is_none() {
            return Err(Refused::NotLeader { leader: 0 });
        }
        let id = live[self.rng.random_range(0..live.len())];
        self.read_on(id);
        Ok(())
    }

    /// Starts a linearizable read on live node `id` (as [`Cluster::read`]).
    pub fn read_on(&mut self, id: NodeId) {
        self.reads += 1;
        self.checker.read_started(self.reads, self.max_commit);
        let read = SimRead {
            node: id,
            number: self.reads,
            answers: self.answers.0.clone(),
        };
        let member = self.nodes.get_mut(&id).and_then(|n| n.member.as_mut());
        member.expect("a live node").read(read);
        self.process(id);
    }

    /// Whether live node `id` believes it leads (a deposed leader may, until it hears a
    /// higher term).
    pub fn believes_it_leads(&self, id: NodeId) -> bool {
        live(&self.nodes)
            .into_iter()
            .any(|r| r.id() == id && r.role() == Role::Leader)
    }

    /// A client write of unique 8-byte `data` (its id) on any live node, through the server's
    /// proposal handling (`server::proposals`: appended, held, or forwarded by a follower).
    /// Checked: it commits once, and an answer names the index it was applied at.
    pub fn submit(&mut self, data: [u8; 8]) {
        let live = self.live_ids();
        let Some(&id) = live.get(self.rng.random_range(0..live.len().max(1))) else {
            return;
        };
        self.checker.write_submitted(data.to_vec());
        let write = SimWrite {
            node: id,
            data: data.to_vec(),
            answers: self.writes.0.clone(),
        };
        self.with_member(id, |member, world| {
            member.submit(world, u64::from_le_bytes(data), data.to_vec(), write);
        });
        self.collect_answers();
        self.process(id);
    }

    /// Runs `act` on live node `id`'s member, with the simulated world around it; None if the
    /// node is down.
    fn with_member<T>(
        &mut self,
        id: NodeId,
        act: impl FnOnce(&mut Driver<SimWrite, SimRead>, &mut SimHost) -> T,
    ) -> Option<T> {
        let mut member = self.nodes.get_mut(&id)?.member.take()?;
        let out = act(&mut member, &mut SimHost { c: self, id });
        self.nodes.get_mut(&id).expect("node").member = Some(member);
        Some(out)
    }

    /// The live nodes' ids.
    fn live_ids(&self) -> Vec<NodeId> {
        let live = self.nodes.iter().filter(|(_, n)| n.member.is_some());
        live.map(|(&id, _)| id).collect()
    }

    fn raft_mut(&mut self, id: NodeId) -> Option<&mut Raft> {
        self.nodes
            .get_mut(&id)?
            .member
            .as_mut()
            .map(|m| &mut m.raft)
    }

    /// Checks the reads and writes answered since the last call.
    fn collect_answers(&mut self) {
        while let Ok((node, number, answer)) = self.answers.1.try_recv() {
            match answer {
                Ok(index) => {
                    self.stats.reads_served += 1;
                    self.checker.read_answered(node, number, index);
                }
                Err(_) => self.stats.reads_refused += 1,
            }
        }
        while let Ok((node, data, answer)) = self.writes.1.try_recv() {
            match answer {
                Ok(index) => self.checker.write_answered(node, &data, index),
                Err(e) if e == EtcdError::TIMEOUT => {}
                Err(e) => {
                    self.stats.writes_refused += 1;
                    self.checker.write_refused(node, &data, &e.message);
                }
            }
        }
    }

    /// Node `id` snapshots its state machine and compacts its log.
    pub fn compact(&mut self, id: NodeId) {
        self.compact_keeping(id, true);
    }

    /// Node `id` compacts its log behind its durable state machine and keeps no snapshot to
    /// send, as the server's `--snapshot-count` does (`Raft::compact_in_place`): a follower that
    /// needs one then gets a new one. (Its storage keeps the state machine, which the
    /// server's key space file is.)
    pub fn compact_in_place(&mut self, id: NodeId) {
        self.compact_keeping(id, false);
    }

    fn compact_keeping(&mut self, id: NodeId, sendable: bool) {
        let Some(node) = self.nodes.get_mut(&id) else {
            return;
        };
        if let Some(member) = node.member.as_mut() {
            let raft = &mut member.raft;
            let data: bytes::Bytes = raft.applied().to_le_bytes().to_vec().into();
            if sendable {
                node.storage.compact(raft.compact(data));
            } else if let Some(meta) = raft.snapshot_meta()
                && raft.compact_in_place(meta.clone())
            {
                node.storage.compact(Snapshot { meta, data });
            }
        }
    }

    /// Forces `id` to campaign now.
    pub fn campaign(&mut self, id: NodeId) {
        if let Some(r) = self.raft_mut(id) {
            r.campaign();
            self.process(id);
        }
    }

    // ---- time ----

    fn schedule(&mut self, event: Event, from: NodeId, to: NodeId) {
        if !self.connected(from, to) {
            return;
        }
        // The server's peer links never deliver an envelope twice (no resend on a new
        // connection), and a forwarded proposal must not be: only Raft messages and witness
        // requests and replies (which the core tolerates twice) are duplicated.
        let duplicable = !matches!(event, Event::Peer { .. });
        let copies = if duplicable && self.rng.random_bool(self.faults.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            if self.rng.random_bool(self.faults.drop) {
                continue;
            }
            let held = self.faults.hold > 0.0 && self.rng.random_bool(self.faults.hold);
            let delay = if held {
                self.stats.held += 1;
                self.rng.random_range(10..=60)
            } else {
                self.rng
                    .random_range(self.faults.min_delay..=self.faults.max_delay)
            };
            self.seq += 1;
            let e = match &event {
                Event::Message(m) => Event::Message(m.clone()),
                Event::WitnessStep { node, request } => Event::WitnessStep {
                    node: *node,
                    request: request.clone(),
                },
                Event::WitnessReply { node, response } => Event::WitnessReply {
                    node: *node,
                    response: response.clone(),
                },
                Event::Restart(node) => Event::Restart(*node),
                Event::Peer { from, to, envelope } => Event::Peer {
                    from: *from,
                    to: *to,
                    envelope: envelope.clone(),
                },
            };
            self.queue.insert((self.now + delay, self.seq), e);
        }
    }

    /// Ends a turn of node `id`'s loop, as the server's does ([`Driver::turn`]): its Readys
    /// are carried out until it has none, unless it crashes inside one; a removed member may
    /// stop.
    fn process(&mut self, id: NodeId) {
        let Some(outcome) = self.with_member(id, |member, world| member.turn(world)) else {
            return;
        };
        self.collect_answers();
        match outcome {
            Ok(stopped) => {
                if self.raft(id).is_some_and(Raft::snapshot_wanted) {
                    self.compact(id); // (the server takes it in the background, as soon)
                }
                if stopped {
                    self.crash(id);
                    self.nodes.get_mut(&id).expect("node").stopped = true;
                    self.stats.removed_stopped += 1;
                }
            }
            // (no snapshot: the node crashed between ready() and advance(), and a compaction
            // there is refused; it takes one after its restart if it still needs one)
            Err(Crashed) => self.crash_in_ready(id),
        }
    }

    /// Executes a witness step with witness-core's own client (load, rule, compare-and-swap,
    /// retried), against the register held in a [`MemoryStore`] with its last states as older
    /// versions: a stale load is one of them, a lost reply a write whose answer the client
    /// never gets.
    fn witness_step(&mut self, node: NodeId, request: WitnessRequest) {
        self.stats.witness_steps += 1;
        let id = request.witness_id();
        let Some(register) = self.witnesses.get(&id) else {
            // No such witness storage (a request of a configuration without a witness).
            let response = WitnessResponse::Failed { request };
            self.schedule(Event::WitnessReply { node, response }, WITNESS_LINK, node);
            return;
        };
        let mut versions = self.witness_history.get(&id).cloned().unwrap_or_default();
        versions.push(register.clone());
        let older = versions.len() - 1;
        let store = Arc::new(MemoryStore::with_states(&versions));
        let stale = older > 0
            && self.faults.stale_loads > 0.0
            && self.rng.random_bool(self.faults.stale_loads);
        if stale {
            store.inject(Fault::StaleLoad(older - self.rng.random_range(0..older)));
        }
        let lost_reply =
            self.faults.lost_replies > 0.0 && self.store_rng.random_bool(self.faults.lost_replies);
        if lost_reply {
            store.inject(Fault::LostReply);
        }
        let policy = RetryPolicy {
            initial_backoff: std::time::Duration::ZERO,
            max_backoff: std::time::Duration::ZERO,
            ..RetryPolicy::default()
        };
        let witness = Witness::with_policy(store.clone(), policy);
        let this = &*self;
        let stepped = self
            .runtime
            .block_on(witness.step("sim", |state, location| {
                let mut out = apply_rule(&this.witness_view(state, &request), &request, location)?;
                out.write = out.write.map(|next| this.witness_written(state, next));
                Ok(out)
            }));
        let written: Vec<WitnessState> = store.states().split_off(versions.len());
        let response = match stepped {
            Ok(s) => {
                if stale && s.attempts == 1 && !s.wrote {
                    self.stats.stale_answers += 1;
                }
                s.reply
            }
            Err(e) => {
                if e.is_lost_state() {
                    self.stats.witness_refusals += 1;
                }
                WitnessResponse::Failed {
                    request: request.clone(),
                }
            }
        };
        if let Some(t) = self.trace.as_mut() {
            t.witness(self.now, node, &request, &response, !written.is_empty());
        }
        if lost_reply && !written.is_empty() {
            self.stats.lost_replies += 1;
        }
        for next in written {
            let old = &self.witnesses[&id];
            self.stats.witness_writes += 1;
            self.checker.witness_write(id, old, &next, node, &request);
            let history = self.witness_history.entry(id).or_default();
            history.push(old.clone());
            if history.len() > 8 {
                history.remove(0);
            }
            self.witnesses.insert(id, next);
        }
        self.schedule(Event::WitnessReply { node, response }, WITNESS_LINK, node);
    }

    /// The state the witness rule sees: the register, or a doctored view under a mutation.
    fn witness_view(&self, register: &WitnessState, request: &WitnessRequest) -> WitnessState {
        #[cfg(feature = "mutations")]
        {
            use crate::raft::Mutation;
            let mut view = register.clone();
            match (self.witness_mutation, request) {
                (Some(Mutation::WitnessVoteWithoutLogRule), WitnessRequest::Vote { .. }) => {
                    (view.last_log_term, view.last_log_subterm) = (0, 0);
                }
                (Some(Mutation::WitnessIgnoresTerm), WitnessRequest::Vote { request: r, .. }) => {
                    (view.term, view.voted_for) = (r.term, crate::raft::NONE);
                }
                (Some(Mutation::WitnessIgnoresTerm), WitnessRequest::Append(r)) => {
                    view.term = r.term
                }
                _ => {}
            }
            view
        }
        #[cfg(not(feature = "mutations"))]
        {
            let _ = request;
            register.clone()
        }
    }

    /// What a step writes: the rule's state, with what a doctored view hid put back.
    fn witness_written(&self, old: &WitnessState, next: WitnessState) -> WitnessState {
        #[cfg(feature = "mutations")]
        {
            use crate::raft::Mutation;
            match self.witness_mutation {
                Some(Mutation::WitnessVoteWithoutLogRule) if next.last_log_position() == (0, 0) => {
                    WitnessState {
                        last_log_term: old.last_log_term,
                        last_log_subterm: old.last_log_subterm,
                        ..next
                    }
                }
                Some(Mutation::WitnessIgnoresTerm) => WitnessState {
                    term: old.term.max(next.term),
                    voted_for: old.voted_for,
                    ..next
                },
                _ => next,
            }
        }
        #[cfg(not(feature = "mutations"))]
        {
            let _ = old;
            next
        }
    }

    /// One tick: every live node ticks, due events are delivered, invariants are checked.
    pub fn tick(&mut self) -> Result<(), Violation> {
        self.now += 1;
        self.stats.ticks += 1;
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for &id in &ids {
            for _ in 0..self.node_ticks(id) {
                if let Some(member) = self.nodes.get_mut(&id).and_then(|n| n.member.as_mut()) {
                    member.tick();
                    self.process(id);
                }
            }
        }
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            match entry.remove() {
                Event::Message(m) => {
                    let (from, to) = (m.from, m.to);
                    let snapshot = match &m.body {
                        Body::Snapshot { snapshot } => Some(snapshot.meta.index),
                        _ => None,
                    };
                    let mut delivered = false;
                    if let Some(r) = self.nodes.get_mut(&to).and_then(|n| n.member.as_mut()) {
                        if let Some(t) = self.trace.as_mut() {
                            t.delivered(self.now, &m);
                        }
                        r.raft.step(m);
                        delivered = true;
                        self.process(to);
                    }
                    // The server's transport reports each snapshot it sent, once the receiver
                    // has it (or could not get it: the receiver is down). A dropped one is
                    // never reported, as when a connection hangs.
                    if let Some(index) = snapshot
                        && let Some(r) = self.raft_mut(from)
                    {
                        r.report_snapshot(to, index, delivered);
                        self.process(from);
                    }
                }
                Event::WitnessStep { node, request } => self.witness_step(node, request),
                Event::Restart(node) => self.restart(node),
                Event::Peer { from, to, envelope } => self.deliver(from, to, envelope),
                Event::WitnessReply { node, response } => {
                    if let Some(r) = self.raft_mut(node) {
                        r.step_witness(response);
                        self.process(node);
                    }
                }
            }
        }
        let live = live(&self.nodes);
        let stored: Vec<_> = self.nodes.iter().map(|(&id, n)| (id, &n.storage)).collect();
        self.checker.check(self.now, &live, &stored)
    }

    /// Delivers a member-to-member envelope to a live node.
    fn deliver(&mut self, from: NodeId, to: NodeId, envelope: Envelope) {
        if self
            .with_member(to, |member, world| member.receive(world, from, envelope))
            .is_some()
        {
            self.collect_answers();
            self.process(to);
        }
    }

    /// How many times node `id`'s clock ticks during this simulation tick (1 without drift).
    fn node_ticks(&mut self, id: NodeId) -> u32 {
        let drift = self.faults.drift;
        if drift <= 0.0 {
            return 1;
        }
        let rate = match self.nodes[&id].clock {
            Some((rate, _)) => rate,
            None => self.rng.random_range(1.0 - drift..=1.0 + drift),
        };
        let node = self.nodes.get_mut(&id).expect("node");
        let elapsed = node.clock.map_or(0.0, |(_, f)| f) + rate;
        node.clock = Some((rate, elapsed.fract()));
        elapsed.trunc() as u32
    }

    /// A leader's Ready about to be persisted: every entry its commit index now covers is
    /// durable on a quorum already (on the storage of a majority of the voters, the witness
    /// counting when its register's log position covers the entry), whatever the leader counts.
    fn check_commit_durable(&mut self, raft: &Raft, ready: &Ready) {
        let Some(hs) = ready.hard_state else { return };
        let known = raft.witness_known();
        let holds = |v: NodeId, e: &Entry| match self.witnesses.get(&v) {
            Some(register) => {
                let position = register.last_log_position();
                // A wiped or reverted register holds nothing, but members refuse it (its
                // generation or history differs from what they saw): not a durability question.
                position >= (e.term, e.subterm)
                    || known.is_some_and(|k| {
                        k.id == v
                            && (k.seen.generation != register.generation
                                || position < (k.seen.log_term, k.seen.log_subterm))
                    })
            }
            None => self.nodes.get(&v).is_some_and(|n| n.storage.holds(e)),
        };
        self.checker
            .commit_durable(raft, hs.commit, |m, e| m.majority(|v| holds(v, e)));
    }

    /// Ticks until `done` holds or `max` ticks pass; true if it held.
    pub fn run_until(
        &mut self,
        max: u64,
        mut done: impl FnMut(&Cluster) -> bool,
    ) -> Result<bool, Violation> {
        for _ in 0..max {
            if done(self) {
                return Ok(true);
            }
            self.tick()?;
        }
        Ok(done(self))
    }
}

/// A simulated crash inside a `Ready`.
struct Crashed;

/// The simulator's side of one node's `Ready`: its storage, the network, and the checks.
struct SimHost<'a> {
    c: &'a mut Cluster,
    id: NodeId,
}

impl World for SimHost<'_> {
    type Error = Crashed;
    type Write = SimWrite;

    fn send_raft(&mut self, raft: &Raft, messages: &[Message]) {
        let (c, id) = (&mut *self.c, self.id);
        c.checker
            .promises(id, &c.nodes[&id].storage, raft.log(), messages);
        for m in messages {
            c.stats.messages += 1;
            c.schedule(Event::Message(m.clone()), id, m.to);
        }
    }

    /// Persists, unless the node crashes before; it may also crash right after, with nothing
    /// sent, no witness step run and nothing applied.
    fn persist(&mut self, raft: &Raft, ready: &Ready) -> Result<(), Crashed> {
        let (c, id) = (&mut *self.c, self.id);
        c.check_commit_durable(raft, ready);
        let persists =
            ready.hard_state.is_some() || !ready.entries.is_empty() || ready.snapshot.is_some();
        // (no draw when the fault is off: the random sequence stays as it was)
        let crash =
            persists && c.faults.crash_in_ready > 0.0 && c.rng.random_bool(c.faults.crash_in_ready);
        let after_persist = crash && c.rng.random_bool(0.5);
        if crash && !after_persist {
            // Dies with its early messages on the wire and its own fsync not done.
            c.stats.crashes_before_persist += 1;
            return Err(Crashed);
        }
        if let Some(t) = c.trace.as_mut() {
            t.persisted(c.now, id, ready);
        }
        let storage = &mut c.nodes.get_mut(&id).expect("node").storage;
        if let Some(snapshot) = &ready.snapshot {
            storage.install(snapshot.clone());
        }
        storage.append(&ready.entries);
        if let Some(hs) = ready.hard_state {
            storage.set_hard_state(hs);
        }
        if after_persist {
            c.stats.crashes_after_persist += 1;
            return Err(Crashed);
        }
        Ok(())
    }

    fn step_witness(&mut self, _: &Raft, request: WitnessRequest) {
        let node = self.id;
        if let WitnessRequest::Append(r) = &request {
            let nodes = &self.c.nodes;
            self.c
                .checker
                .witness_append_asked(node, r, request.witness_id(), |id| {
                    nodes.get(&id).map(|n| &n.storage)
                });
        }
        self.c
            .schedule(Event::WitnessStep { node, request }, node, WITNESS_LINK);
    }

    fn install(&mut self, _: &Raft, snapshot: &Snapshot) -> Result<(), Crashed> {
        self.c.stats.snapshots_installed += 1;
        self.c.checker.installed(self.id, &snapshot.meta);
        Ok(())
    }

    fn apply(
        &mut self,
        _: &Raft,
        committed: &[Entry],
        writes: &mut Proposals<SimWrite>,
    ) -> Result<(), Crashed> {
        if let Some(t) = self.c.trace.as_mut() {
            t.applied(self.c.now, self.id, committed);
        }
        for e in committed {
            self.c.stats.committed += 1;
            self.c.checker.applied(self.id, e);
            if let EntryData::Normal(data) = &e.data
                && let Ok(id) = <[u8; 8]>::try_from(data.as_slice())
                && let Some(w) = writes.applied(u64::from_le_bytes(id))
            {
                w.answer(Ok(e.index));
            }
        }
        Ok(())
    }

    fn send(&mut self, to: NodeId, envelope: Envelope) {
        let from = self.id;
        self.c
            .schedule(Event::Peer { from, to, envelope }, from, to);
    }

    /// The simulator drives no leases and no membership changes through clients.
    fn receive(&mut self, _: &mut Raft, _: NodeId, _: Envelope) {}

    /// Records the node's role, checks the answers given so far and the catch-up rule.
    fn after_ready(&mut self, raft: &Raft) {
        let c = &mut *self.c;
        if let Some(t) = c.trace.as_mut() {
            t.role(c.now, raft);
        }
        c.collect_answers();
        c.max_commit = c.max_commit.max(raft.commit());
        if raft.role() == Role::Leader
            && let Some((subterm, rset)) = raft.leader_view()
        {
            // (this node's member is out of the cluster while its turn runs)
            let mut live = live(&c.nodes);
            live.push(raft);
            c.checker.check_catch_up(raft, subterm, rset, &live);
        }
    }
}
