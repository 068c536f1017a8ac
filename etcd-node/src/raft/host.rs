//! The one order in which a `Ready` is carried out, shared by every host (the server's Raft loop
//! and the simulator): what differs between them is only how each effect is done, behind
//! [`Host`]. A host that processed a `Ready` in its own order could break a promise the core
//! made (an acknowledgement sent before the entry it acknowledges is durable), and the
//! simulator would not see it.

use super::{Entry, Message, Raft, ReadState, Ready, Snapshot, WitnessRequest};

/// The effects of a `Ready`, as one host does them. Each gets the node (read-only) for context.
pub trait Host {
    /// Why the host stops processing this `Ready` (a storage failure; a simulated crash).
    type Error;

    /// Sends messages to regular peers (may be lost; never blocks on them).
    fn send(&mut self, raft: &Raft, messages: &[Message]);
    /// Makes the `Ready`'s snapshot, entries and hard state durable (one fsync).
    fn persist(&mut self, raft: &Raft, ready: &Ready) -> Result<(), Self::Error>;
    /// Starts a witness step; its outcome comes back later through `Raft::step_witness`.
    fn step_witness(&mut self, raft: &Raft, request: WitnessRequest);
    /// Replaces the state machine by the leader's snapshot (already persisted).
    fn install(&mut self, raft: &Raft, snapshot: &Snapshot) -> Result<(), Self::Error>;
    /// Applies committed entries to the state machine, in order.
    fn apply(&mut self, raft: &Raft, committed: &[Entry]) -> Result<(), Self::Error>;
    /// A linearizable read may be served once the state machine reaches `read.index`.
    fn read_ready(&mut self, raft: &Raft, read: &ReadState);
}

/// Takes the node's `Ready` and carries it out: a leader's early messages leave first (its
/// fsync overlaps its followers'), then everything is persisted, then the messages that promise
/// durability leave, witness steps start, the snapshot and the committed entries are applied,
/// reads are released, and the node is told it is done. On an error the node is left awaiting
/// `advance`: the host must stop it (restart it from storage).
pub fn handle_ready<H: Host>(raft: &mut Raft, host: &mut H) -> Result<(), H::Error> {
    let mut ready = raft.ready();
    host.send(raft, &ready.early_messages);
    host.persist(raft, &ready)?;
    host.send(raft, &ready.messages);
    for request in std::mem::take(&mut ready.witness_requests) {
        host.step_witness(raft, request);
    }
    if let Some(snapshot) = &ready.snapshot {
        host.install(raft, snapshot)?;
    }
    host.apply(raft, &ready.committed)?;
    for read in &ready.read_states {
        host.read_ready(raft, read);
    }
    raft.advance(&ready);
    Ok(())
}
