//! What a member's loop does with the Raft core, written once for the server and the simulator:
//! client writes (appended, held while the core holds proposals, or forwarded to the leader),
//! linearizable reads (one ReadIndex round per turn, forwarded by followers), the envelopes
//! members send each other for them, each `Ready` carried out in the core's order
//! ([`handle_ready`]), and the rule that stops a removed member. What differs between the
//! server and the simulator is only the world the member acts on, behind [`World`]: the
//! server's disk, key space, peer links and witness tasks, or the simulator's.
//!
//! The server's loop adds what the simulator does not drive (leases, membership changes asked
//! by clients, snapshots of the key space, the status it publishes); see `server::node`.

use super::proposals::Proposals;
use super::reads::{Outbox, Reads, Waiter};
use super::removal::Removal;
use super::wire::Envelope;
use crate::raft::{
    ChangeKind, Entry, EntryData, Host, Message, NodeId, Raft, ReadState, Ready, Refused, Snapshot,
    WitnessRequest, handle_ready,
};

/// What a member acts on. Each call gets the node (read-only) for context.
pub trait World {
    /// Why the member stops processing a `Ready` (a storage failure; a simulated crash).
    type Error;
    /// Who waits for a client write (answered once this member applies it).
    type Write: Waiter;

    /// Sends Raft messages to regular peers (may be lost; never blocks on them).
    fn send_raft(&mut self, raft: &Raft, messages: &[Message]);
    /// Sends another member-to-member envelope (a forwarded write, a read round's question or
    /// answer).
    fn send(&mut self, to: NodeId, envelope: Envelope);
    /// Makes the `Ready`'s snapshot, entries and hard state durable (one fsync).
    fn persist(&mut self, raft: &Raft, ready: &Ready) -> Result<(), Self::Error>;
    /// Starts a witness step; its outcome comes back later through `Raft::step_witness`.
    fn step_witness(&mut self, raft: &Raft, request: WitnessRequest);
    /// Replaces the state machine by the leader's snapshot (already persisted).
    fn install(&mut self, raft: &Raft, snapshot: &Snapshot) -> Result<(), Self::Error>;
    /// Applies committed entries to the state machine, in order, and answers the waiters of
    /// the client writes among them (taken from `writes` by proposal id).
    fn apply(
        &mut self,
        raft: &Raft,
        committed: &[Entry],
        writes: &mut Proposals<Self::Write>,
    ) -> Result<(), Self::Error>;
    /// An envelope the driver leaves to the world (the server's lease questions and forwarded
    /// membership changes).
    fn receive(&mut self, raft: &mut Raft, from: NodeId, envelope: Envelope);
    /// After each `Ready` is carried out (the simulator's checks; the server's log lines).
    fn after_ready(&mut self, raft: &Raft);
}

/// One member: its Raft core and what its loop keeps in memory (lost when the process stops).
#[derive(Debug)]
pub struct Driver<W, R> {
    pub raft: Raft,
    pub proposals: Proposals<W>,
    reads: Reads<R>,
    removal: Removal,
    outbox: Outbox,
}

impl<W: Waiter, R: Waiter<Answer = u64>> Driver<W, R> {
    /// A member started from `raft`; its read rounds count from `first_ctx` (see
    /// [`Reads::new`]).
    pub fn new(raft: Raft, first_ctx: u64) -> Self {
        Driver {
            raft,
            proposals: Proposals::default(),
            reads: Reads::new(first_ctx),
            removal: Removal::default(),
            outbox: Outbox::new(),
        }
    }

    /// One tick of the member's clock.
    pub fn tick(&mut self) {
        self.raft.tick();
        self.removal.tick();
    }

    /// A client's write `data` (which carries proposal `id`): appended, held or forwarded;
    /// `waiter` is answered at once if it cannot be, else when this member applies it.
    pub fn submit<H: World<Write = W>>(
        &mut self,
        world: &mut H,
        id: u64,
        data: Vec<u8>,
        waiter: W,
    ) {
        self.proposals
            .submit(&mut self.raft, id, data, waiter, &mut self.outbox);
        flush(world, &mut self.outbox);
    }

    /// A proposal of the member's own, with no waiter: appended, or held while the core holds
    /// proposals.
    pub fn propose(&mut self, data: Vec<u8>) -> Result<(), Refused> {
        let term = self.raft.term();
        self.proposals
            .propose_or_hold(&mut self.raft, data, None, term)
    }

    /// A client's linearizable read: it starts with the others of this turn.
    pub fn read(&mut self, waiter: R) {
        self.reads.push(waiter);
    }

    /// An envelope from member `from`.
    pub fn receive<H: World<Write = W>>(
        &mut self,
        world: &mut H,
        from: NodeId,
        envelope: Envelope,
    ) {
        match envelope {
            Envelope::Raft(m) => self.raft.step(m),
            Envelope::Forward { term, data } => {
                self.proposals.forwarded(&mut self.raft, term, data);
            }
            Envelope::ReadIndex { ctx } => {
                self.reads
                    .asked(&mut self.raft, from, ctx, &mut self.outbox)
            }
            Envelope::ReadIndexResp { ctx, index } => self.reads.answered(ctx, index),
            other => world.receive(&mut self.raft, from, other),
        }
        flush(world, &mut self.outbox);
    }

    /// Forgets the waiters whose clients gave up.
    pub fn forget_closed(&mut self) {
        self.proposals.forget_closed();
    }

    /// The end of a turn of the loop: appends the writes held until now, starts this turn's
    /// read round, and carries out every `Ready` the core has. Returns whether the member must
    /// stop now (it applied its own removal: [`Removal::should_stop`]). On an error the node
    /// is left awaiting `advance`: the caller must stop it (restart it from storage).
    pub fn turn<H: World<Write = W>>(&mut self, world: &mut H) -> Result<bool, H::Error> {
        self.reads.start(&mut self.raft, &mut self.outbox);
        flush(world, &mut self.outbox);
        loop {
            self.proposals.release_held(&mut self.raft);
            if !self.raft.has_ready() {
                return Ok(self.removal.should_stop(&self.raft));
            }
            handle_ready(
                &mut self.raft,
                &mut Turn {
                    world: &mut *world,
                    proposals: &mut self.proposals,
                    reads: &mut self.reads,
                    removal: &mut self.removal,
                    outbox: &mut self.outbox,
                },
            )?;
            self.reads.settle(&self.raft, &mut self.outbox);
            self.proposals.settle(&self.raft);
            flush(world, &mut self.outbox);
            world.after_ready(&self.raft);
        }
    }
}

/// Sends what the reads and writes put in the outbox.
fn flush<H: World>(world: &mut H, outbox: &mut Outbox) {
    for (to, envelope) in outbox.drain(..) {
        world.send(to, envelope);
    }
}

/// One `Ready` of a member: the world, and the loop's waiters.
struct Turn<'a, H: World, R> {
    world: &'a mut H,
    proposals: &'a mut Proposals<H::Write>,
    reads: &'a mut Reads<R>,
    removal: &'a mut Removal,
    outbox: &'a mut Outbox,
}

impl<H: World, R: Waiter<Answer = u64>> Host for Turn<'_, H, R> {
    type Error = H::Error;

    fn send(&mut self, raft: &Raft, messages: &[Message]) {
        self.world.send_raft(raft, messages);
    }

    fn persist(&mut self, raft: &Raft, ready: &Ready) -> Result<(), H::Error> {
        self.world.persist(raft, ready)
    }

    fn step_witness(&mut self, raft: &Raft, request: WitnessRequest) {
        self.world.step_witness(raft, request);
    }

    fn install(&mut self, raft: &Raft, snapshot: &Snapshot) -> Result<(), H::Error> {
        self.world.install(raft, snapshot)?;
        self.proposals.installed(snapshot.meta.term);
        Ok(())
    }

    fn apply(&mut self, raft: &Raft, committed: &[Entry]) -> Result<(), H::Error> {
        for e in committed {
            if removes(e, raft.id()) {
                self.removal.applied_own_removal(e.index);
            }
        }
        self.world.apply(raft, committed, self.proposals)?;
        if let Some(last) = committed.last() {
            self.proposals.applied_through(last.term);
        }
        Ok(())
    }

    fn read_ready(&mut self, _: &Raft, read: &ReadState) {
        self.reads.ready(read, self.outbox);
        flush(self.world, self.outbox);
    }
}

/// Whether `e` is a configuration change that removes member `me` (a change of its own: the
/// server proposes one change per entry).
fn removes(e: &Entry, me: NodeId) -> bool {
    matches!(&e.data, EntryData::ConfChange(cc)
        if cc.changes.len() == 1
            && cc.changes.iter().any(|c| c.kind == ChangeKind::Remove && c.node == me))
}
