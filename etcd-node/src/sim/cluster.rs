//! The simulated cluster: nodes, storage, network and the witness register.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use witness_core::WitnessState;

use super::invariants::{Checker, Violation};
use crate::raft::{
    Config, Entry, MemStorage, Membership, Message, NodeId, Raft, Role, WitnessRequest,
    WitnessResponse, apply_rule,
};

/// Network fault rates (per message) and delays, in ticks.
#[derive(Debug, Clone, PartialEq)]
pub struct Faults {
    pub drop: f64,
    pub duplicate: f64,
    /// Delivery delay range [min, max] in ticks (reordering comes from different delays).
    pub min_delay: u64,
    pub max_delay: u64,
}

impl Faults {
    /// A perfect network: one tick per message.
    pub fn none() -> Self {
        Faults {
            drop: 0.0,
            duplicate: 0.0,
            min_delay: 1,
            max_delay: 1,
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
}

#[derive(Debug)]
struct Node {
    raft: Option<Raft>,
    storage: MemStorage,
    config: Config,
}

/// The witness's cluster id in simulations.
pub const CLUSTER_ID: u64 = 0xc1;

/// A simulated cluster.
#[derive(Debug)]
pub struct Cluster {
    rng: StdRng,
    nodes: BTreeMap<NodeId, Node>,
    membership: Membership,
    witness: WitnessState,
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
        let membership = Membership::new(1..=regular, witness.then_some(regular + 1))
            .expect("a valid simulated configuration");
        let mut rng = StdRng::seed_from_u64(seed);
        let nodes = membership
            .regular
            .iter()
            .map(|&id| {
                let mut config = Config::new(id);
                config.cluster_id = CLUSTER_ID;
                config.seed = rng.random();
                tune(&mut config);
                let storage = MemStorage::bootstrap(membership.clone());
                let raft = Raft::new(config.clone(), &storage).expect("valid simulated config");
                (
                    id,
                    Node {
                        raft: Some(raft),
                        storage,
                        config,
                    },
                )
            })
            .collect();
        let witness_state = WitnessState::new(0, "witness", "witness:sim");
        Cluster {
            rng,
            nodes,
            checker: Checker::new(&membership, &witness_state),
            membership,
            witness: witness_state,
            now: 0,
            queue: BTreeMap::new(),
            seq: 0,
            cut: BTreeSet::new(),
            faults: Faults::none(),
            stats: Stats::default(),
            #[cfg(feature = "mutations")]
            witness_mutation: None,
        }
    }

    pub fn membership(&self) -> &Membership {
        &self.membership
    }
    pub fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
    pub fn raft(&self, id: NodeId) -> Option<&Raft> {
        self.nodes[&id].raft.as_ref()
    }
    /// Entries applied (known committed) so far, by index.
    pub fn committed(&self) -> &BTreeMap<u64, Entry> {
        self.checker.committed()
    }

    /// The node that is leader in the highest term, if any.
    pub fn leader(&self) -> Option<NodeId> {
        self.nodes
            .values()
            .filter_map(|n| n.raft.as_ref())
            .filter(|r| r.role() == Role::Leader)
            .max_by_key(|r| r.term())
            .map(|r| r.id())
    }

    // ---- faults ----

    pub fn crash(&mut self, id: NodeId) {
        if self.nodes.get_mut(&id).expect("node").raft.take().is_some() {
            self.stats.crashes += 1;
        }
    }

    pub fn restart(&mut self, id: NodeId) {
        let node = self.nodes.get_mut(&id).expect("node");
        if node.raft.is_none() {
            node.raft = Some(Raft::new(node.config.clone(), &node.storage).expect("restart"));
        }
    }

    /// Cuts the link between two regular nodes.
    pub fn partition(&mut self, a: NodeId, b: NodeId) {
        self.cut.insert(link(a, b));
    }

    /// Cuts a node off from the witness storage.
    pub fn cut_witness(&mut self, id: NodeId) {
        self.cut.insert(link(id, WITNESS_LINK));
    }

    pub fn heal(&mut self) {
        self.cut.clear();
    }

    fn connected(&self, a: NodeId, b: NodeId) -> bool {
        !self.cut.contains(&link(a, b))
    }

    /// Proposes on the current leader; returns the index if it took it.
    pub fn propose(&mut self, data: Vec<u8>) -> Option<u64> {
        let leader = self.leader()?;
        let raft = self.nodes.get_mut(&leader)?.raft.as_mut()?;
        let index = raft.propose(data).ok()?;
        self.process(leader);
        Some(index)
    }

    /// Forces `id` to campaign now.
    pub fn campaign(&mut self, id: NodeId) {
        if let Some(r) = self.nodes.get_mut(&id).and_then(|n| n.raft.as_mut()) {
            r.campaign();
            self.process(id);
        }
    }

    // ---- time ----

    fn schedule(&mut self, event: Event, from: NodeId, to: NodeId) {
        if !self.connected(from, to) {
            return;
        }
        let copies = if self.rng.random_bool(self.faults.duplicate) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            if self.rng.random_bool(self.faults.drop) {
                continue;
            }
            let delay = self
                .rng
                .random_range(self.faults.min_delay..=self.faults.max_delay);
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
            };
            self.queue.insert((self.now + delay, self.seq), e);
        }
    }

    /// Runs a node's Ready: persist, send, run witness steps, apply, advance.
    fn process(&mut self, id: NodeId) {
        loop {
            let node = self.nodes.get_mut(&id).expect("node");
            let Some(raft) = node.raft.as_mut() else {
                return;
            };
            if !raft.has_ready() {
                return;
            }
            let ready = raft.ready();
            node.storage.append(&ready.entries);
            if let Some(hs) = ready.hard_state {
                node.storage.set_hard_state(hs);
            }
            raft.advance(&ready);
            for m in ready.messages {
                self.stats.messages += 1;
                let to = m.to;
                self.schedule(Event::Message(m), id, to);
            }
            for request in ready.witness_requests {
                self.schedule(Event::WitnessStep { node: id, request }, id, WITNESS_LINK);
            }
            for e in &ready.committed {
                self.stats.committed += 1;
                self.checker.applied(id, e);
            }
        }
    }

    /// Executes a witness step on the register: the rule runs on the current state, atomically.
    fn witness_step(&mut self, node: NodeId, request: WitnessRequest) {
        self.stats.witness_steps += 1;
        let view = self.witness_view(&request);
        let (response, write) = match apply_rule(&view, &request, "sim") {
            Ok(out) => (out.reply, out.write),
            Err(_) => (
                WitnessResponse::Failed {
                    request: request.clone(),
                },
                None,
            ),
        };
        if let Some(next) = write {
            let next = self.witness_written(next);
            self.stats.witness_writes += 1;
            self.checker
                .witness_write(&self.witness, &next, node, &request);
            self.witness = next;
        }
        self.schedule(Event::WitnessReply { node, response }, WITNESS_LINK, node);
    }

    /// The state the witness rule sees: the register, or a doctored view under a mutation.
    fn witness_view(&self, request: &WitnessRequest) -> WitnessState {
        #[cfg(feature = "mutations")]
        {
            use crate::raft::Mutation;
            let mut view = self.witness.clone();
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
            self.witness.clone()
        }
    }

    /// What a step writes: the rule's state, with what a doctored view hid put back.
    fn witness_written(&self, next: WitnessState) -> WitnessState {
        #[cfg(feature = "mutations")]
        {
            use crate::raft::Mutation;
            let old = &self.witness;
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
        next
    }

    /// One tick: every live node ticks, due events are delivered, invariants are checked.
    pub fn tick(&mut self) -> Result<(), Violation> {
        self.now += 1;
        self.stats.ticks += 1;
        let ids: Vec<NodeId> = self.nodes.keys().copied().collect();
        for &id in &ids {
            if let Some(r) = self.nodes.get_mut(&id).and_then(|n| n.raft.as_mut()) {
                r.tick();
                self.process(id);
            }
        }
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            match entry.remove() {
                Event::Message(m) => {
                    let to = m.to;
                    if let Some(r) = self.nodes.get_mut(&to).and_then(|n| n.raft.as_mut()) {
                        r.step(m);
                        self.process(to);
                    }
                }
                Event::WitnessStep { node, request } => self.witness_step(node, request),
                Event::WitnessReply { node, response } => {
                    if let Some(r) = self.nodes.get_mut(&node).and_then(|n| n.raft.as_mut()) {
                        r.step_witness(response);
                        self.process(node);
                    }
                }
            }
        }
        let live: Vec<&Raft> = self
            .nodes
            .values()
            .filter_map(|n| n.raft.as_ref())
            .collect();
        self.checker.check(self.now, &live)
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
