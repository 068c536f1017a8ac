//! Client proposals as a member's Raft loop handles them, written once for the server and the
//! simulator (which checks that each is applied once and answered with what was applied). A
//! leader appends a proposal, or holds it while Raft holds proposals (a member catching up to
//! re-enter the replication set) and appends it after; a follower forwards it to the leader it
//! knows. Its waiter is answered when this member applies it; a forwarded proposal that may
//! still commit is never failed here (the client's timeout ends the wait).

use std::collections::HashMap;

use super::contract::{no_leader, refused};
use super::reads::{Outbox, Waiter};
use super::wire::Envelope;
use crate::raft::{Mutation, NONE, Raft, Refused, Role};

/// The proposals of one member.
#[derive(Debug)]
pub struct Proposals<W> {
    /// By proposal id (carried inside the proposal's data).
    waiters: HashMap<u64, W>,
    /// Held while Raft holds proposals: (data, id of the local waiter, if any).
    held: Vec<(Vec<u8>, Option<u64>)>,
}

impl<W> Default for Proposals<W> {
    fn default() -> Self {
        Proposals {
            waiters: HashMap::new(),
            held: Vec::new(),
        }
    }
}

impl<W: Waiter> Proposals<W> {
    /// A client's proposal `data` (which carries `id`): appended, held or forwarded; `waiter` is
    /// answered at once if it cannot be, else when this member applies it.
    pub fn submit(&mut self, raft: &mut Raft, id: u64, data: Vec<u8>, waiter: W, out: &mut Outbox) {
        if raft.role() == Role::Leader {
            if let Err(r) = self.propose_or_hold(raft, data, Some(id)) {
                waiter.answer(Err(refused(&r)));
                return;
            }
        } else if raft.leader() != NONE {
            if raft.mutated(Mutation::ForwardTwice) {
                out.push((raft.leader(), Envelope::Forward(data.clone())));
            }
            out.push((raft.leader(), Envelope::Forward(data)));
        } else {
            waiter.answer(Err(no_leader()));
            return;
        }
        self.waiters.insert(id, waiter);
    }

    /// Appends `data` (a local proposal with waiter `id`, a follower's forwarded one, or the
    /// leader's own), or keeps it for later while Raft holds proposals.
    pub fn propose_or_hold(
        &mut self,
        raft: &mut Raft,
        data: Vec<u8>,
        id: Option<u64>,
    ) -> Result<(), Refused> {
        if raft.proposals_held() {
            self.held.push((data, id));
            return Ok(());
        }
        raft.propose(data).map(drop)
    }

    /// Appends what was held, once the hold is over (each loop turn).
    pub fn release_held(&mut self, raft: &mut Raft) {
        if self.held.is_empty() || raft.proposals_held() {
            return;
        }
        for (data, id) in std::mem::take(&mut self.held) {
            if let Err(r) = raft.propose(data)
                && let Some(w) = id.and_then(|id| self.waiters.remove(&id))
            {
                w.answer(Err(refused(&r)));
            }
        }
    }

    /// The waiter of proposal `id`, now applied here (none: not proposed here, or given up).
    pub fn applied(&mut self, id: u64) -> Option<W> {
        self.waiters.remove(&id)
    }

    /// Forgets the waiters whose clients gave up.
    pub fn forget_closed(&mut self) {
        self.waiters.retain(|_, w| !w.is_closed());
    }
}
