//! Client proposals as a member's Raft loop handles them, written once for the server and the
//! simulator (which checks that each is applied once, answered with what was applied, and never
//! answered as failed if it commits). A leader appends a proposal, or holds it while Raft holds
//! proposals (a member catching up to re-enter the replication set) and appends it after; a
//! follower forwards it to the leader it knows, naming the term it knows that leader in.
//!
//! A waiter is answered when this member applies its proposal, or with etcd's "leader changed"
//! as soon as this member knows the proposal can never commit:
//!
//! - every proposal is appended in one known term only: the leader's term when a client asked
//!   it, the term a follower named when forwarding (a leader in another term drops the forward),
//!   and a held proposal is dropped rather than appended in a later term;
//! - terms never decrease along the log, and a leader only appends entries of its own term, so
//!   once this member applies an entry of a later term, every entry of the proposal's term that
//!   will ever commit is already applied here. A waiter still waiting then is answered "leader
//!   changed": its proposal was never appended, or was overwritten.
//!
//! A proposal whose leader merely lost its leadership (or died) may still commit: the next
//! leader may hold it. Such a waiter waits until that leader's first entry is applied here (an
//! election, a fraction of a second to seconds), never failed earlier. When this member installs
//! a leader's snapshot instead of applying entries, the waiters of proposals the snapshot may
//! hold get "request timed out" (the outcome is unknown, as after a client's timeout).

use std::collections::HashMap;

use super::contract::refused;
use super::reads::{Outbox, Waiter};
use super::wire::Envelope;
use crate::errors::EtcdError;
use crate::raft::{Mutation, NONE, Raft, Refused, Role};

/// A proposal held while Raft holds proposals.
#[derive(Debug)]
struct Held {
    data: Vec<u8>,
    /// The local waiter's id, if any.
    id: Option<u64>,
    /// The only term it may be appended in.
    term: u64,
}

/// The proposals of one member.
#[derive(Debug)]
pub struct Proposals<W> {
    /// By proposal id (carried inside the proposal's data): the waiter, and the only term its
    /// proposal may be appended in.
    waiters: HashMap<u64, (W, u64)>,
    held: Vec<Held>,
    /// The term of the last entry this member applied (0: none since it started).
    applied_term: u64,
    /// The term [`Proposals::settle`] last answered the waiters before: every waiter since has
    /// a term at least the applied one, so nothing is left to answer until the term moves.
    settled_term: u64,
    /// Waiters answered with an error so far.
    failed: u64,
}

impl<W> Default for Proposals<W> {
    fn default() -> Self {
        Proposals {
            waiters: HashMap::new(),
            held: Vec::new(),
            applied_term: 0,
            settled_term: 0,
            failed: 0,
        }
    }
}

impl<W: Waiter> Proposals<W> {
    /// A client's proposal `data` (which carries `id`): appended, held or forwarded; `waiter` is
    /// answered at once if it cannot be, else when this member applies it or knows it never
    /// will be applied.
    pub fn submit(&mut self, raft: &mut Raft, id: u64, data: Vec<u8>, waiter: W, out: &mut Outbox) {
        let term = raft.term();
        if raft.role() == Role::Leader {
            if let Err(r) = self.propose_or_hold(raft, data, Some(id), term) {
                self.fail(waiter, refused(&r));
                return;
            }
        } else if raft.leader() != NONE {
            let to = raft.leader();
            if raft.mutated(Mutation::ForwardTwice) {
                let data = data.clone();
                out.push((to, Envelope::Forward { term, data }));
            }
            out.push((to, Envelope::Forward { term, data }));
        } else {
            self.fail(waiter, EtcdError::NO_LEADER);
            return;
        }
        self.waiters.insert(id, (waiter, term));
    }

    /// A follower's proposal forwarded in `term` (0: from a member that names none): appended
    /// or held if this member leads in that term, else dropped (the follower answers its client
    /// once it knows: see the module's doc).
    pub fn forwarded(&mut self, raft: &mut Raft, term: u64, data: Vec<u8>) {
        let term = if term == 0 || raft.mutated(Mutation::ForwardInAnyTerm) {
            raft.term()
        } else {
            term
        };
        let _ = self.propose_or_hold(raft, data, None, term);
    }

    /// Appends `data` (a local proposal with waiter `id`, a follower's forwarded one, or the
    /// leader's own) if this member leads in `term`, or keeps it for later while Raft holds
    /// proposals.
    pub fn propose_or_hold(
        &mut self,
        raft: &mut Raft,
        data: Vec<u8>,
        id: Option<u64>,
        term: u64,
    ) -> Result<(), Refused> {
        if raft.role() == Role::Leader && raft.term() != term {
            return Err(Refused::NotLeader {
                leader: raft.leader(),
            });
        }
        if raft.proposals_held() {
            self.held.push(Held { data, id, term });
            return Ok(());
        }
        raft.propose(data).map(drop)
    }

    /// Appends what was held, once the hold is over (each loop turn). What was held in an
    /// earlier term is dropped: its waiter is answered "leader changed".
    pub fn release_held(&mut self, raft: &mut Raft) {
        if self.held.is_empty() || raft.proposals_held() {
            return;
        }
        for h in std::mem::take(&mut self.held) {
            let outcome = if raft.term() == h.term {
                raft.propose(h.data).map(drop)
            } else {
                Err(Refused::NotLeader {
                    leader: raft.leader(),
                })
            };
            if let Err(r) = outcome
                && let Some((w, _)) = h.id.and_then(|id| self.waiters.remove(&id))
            {
                self.fail(w, refused(&r));
            }
        }
    }

    /// The waiter of proposal `id`, now applied here (none: not proposed here, or given up).
    pub fn applied(&mut self, id: u64) -> Option<W> {
        self.waiters.remove(&id).map(|(w, _)| w)
    }

    /// This member applied entries up to one of `term` (its waiters already answered).
    pub fn applied_through(&mut self, term: u64) {
        self.applied_term = self.applied_term.max(term);
    }

    /// This member installed a snapshot that ends in `term`: what it holds of the proposals of
    /// that term or earlier is unknown here, so their waiters are answered "request timed out".
    pub fn installed(&mut self, term: u64) {
        self.answer_older(term + 1, EtcdError::TIMEOUT);
        self.applied_term = self.applied_term.max(term);
    }

    /// After each `Ready`: the waiters of proposals of terms before the last applied entry's
    /// can never be applied (see the module's doc); they are answered "leader changed".
    pub fn settle(&mut self, raft: &Raft) {
        let term = if raft.mutated(Mutation::FailPendingOnNewTerm) {
            raft.term()
        } else {
            self.applied_term
        };
        if term <= self.settled_term {
            return;
        }
        self.settled_term = term;
        self.answer_older(term, EtcdError::LEADER_CHANGED);
    }

    /// Answers `error` to the waiters of proposals of terms before `term`.
    fn answer_older(&mut self, term: u64, error: EtcdError) {
        let older: Vec<u64> = self
            .waiters
            .iter()
            .filter(|(_, (_, t))| *t < term)
            .map(|(&id, _)| id)
            .collect();
        for id in older {
            if let Some((w, _)) = self.waiters.remove(&id) {
                self.fail(w, error.clone());
            }
        }
    }

    fn fail(&mut self, waiter: W, error: EtcdError) {
        self.failed += 1;
        waiter.answer(Err(error));
    }

    /// Writes waiting for their answer.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }

    /// Writes answered with an error so far.
    pub fn failed(&self) -> u64 {
        self.failed
    }

    /// Forgets the waiters whose clients gave up.
    pub fn forget_closed(&mut self) {
        self.waiters.retain(|_, (w, _)| !w.is_closed());
    }
}
