//! Linearizable reads as a member's Raft loop handles them, written once for the server and the
//! simulator (which checks every answer). The reads that arrive in one turn of the loop share
//! one ReadIndex round; a follower forwards its round to the leader it knows and fails it when
//! that leader changes; a leader runs rounds for its followers too; the rounds of a lost
//! leadership fail at once. An answer is the index the state machine must reach before the read
//! may be served (the caller waits for that).

use std::collections::HashMap;

use tokio::sync::oneshot;

use super::contract::refused;
use super::wire::Envelope;
use crate::errors::EtcdError;
use crate::raft::{Mutation, NONE, NodeId, Raft, ReadState, Role};

/// Whoever waits for a request's answer (a client's channel in the server; the checker's in the
/// simulator).
pub trait Waiter {
    type Answer;
    fn answer(self, answer: Result<Self::Answer, EtcdError>);
    /// The client gave up (its waiter can be forgotten).
    fn is_closed(&self) -> bool;
}

impl<T> Waiter for oneshot::Sender<Result<T, EtcdError>> {
    type Answer = T;
    fn answer(self, answer: Result<T, EtcdError>) {
        let _ = self.send(answer);
    }
    fn is_closed(&self) -> bool {
        oneshot::Sender::is_closed(self)
    }
}

/// Envelopes for other members, sent by the caller after each call.
pub type Outbox = Vec<(NodeId, Envelope)>;

/// A round this member started as leader: who waits for it.
#[derive(Debug)]
enum Round<W> {
    Local(Vec<W>),
    Remote { member: NodeId, ctx: u64 },
}

/// A round forwarded to a leader (as known in a term): who waits for it.
#[derive(Debug)]
struct Forwarded<W> {
    leader: NodeId,
    term: u64,
    waiters: Vec<W>,
}

/// The reads of one member.
#[derive(Debug)]
pub struct Reads<W> {
    /// Arrived this turn, not started yet.
    arrived: Vec<W>,
    /// Started on this member as leader, by context.
    rounds: HashMap<u64, Round<W>>,
    /// Forwarded to the leader, by context.
    forwarded: HashMap<u64, Forwarded<W>>,
    next_ctx: u64,
}

impl<W> Reads<W> {
    /// No reads yet; contexts count from `first_ctx`. A process must not start from the same
    /// context each time: an answer to its previous incarnation's forwarded round, still queued
    /// on the leader's link, would answer a new round with an old index.
    pub fn new(first_ctx: u64) -> Self {
        Reads {
            arrived: Vec::new(),
            rounds: HashMap::new(),
            forwarded: HashMap::new(),
            next_ctx: first_ctx,
        }
    }
}

impl<W: Waiter<Answer = u64>> Reads<W> {
    /// A local read arrived; it starts with the others of this turn ([`Reads::start`]).
    pub fn push(&mut self, waiter: W) {
        self.arrived.push(waiter);
    }

    fn next_ctx(&mut self) -> u64 {
        let ctx = self.next_ctx;
        self.next_ctx = self.next_ctx.wrapping_add(1);
        ctx
    }

    /// Starts one round for every read that arrived this turn: on the leader, a ReadIndex
    /// round; on a follower, a round forwarded to the leader it knows.
    pub fn start(&mut self, raft: &mut Raft, out: &mut Outbox) {
        if self.arrived.is_empty() {
            return;
        }
        let batch = std::mem::take(&mut self.arrived);
        let ctx = self.next_ctx();
        if raft.role() == Role::Leader {
            if raft.mutated(Mutation::ReadsWithoutRound) {
                let index = raft.commit();
                batch.into_iter().for_each(|w| w.answer(Ok(index)));
                return;
            }
            match raft.read_index(ctx.to_be_bytes().to_vec()) {
                Ok(()) => {
                    self.rounds.insert(ctx, Round::Local(batch));
                }
                Err(r) => batch.into_iter().for_each(|w| w.answer(Err(refused(&r)))),
            }
        } else if raft.leader() != NONE {
            out.push((raft.leader(), Envelope::ReadIndex { ctx }));
            let forwarded = Forwarded {
                leader: raft.leader(),
                term: raft.term(),
                waiters: batch,
            };
            self.forwarded.insert(ctx, forwarded);
        } else {
            batch
                .into_iter()
                .for_each(|w| w.answer(Err(EtcdError::NO_LEADER)));
        }
    }

    /// A follower asks this member (as leader) for a read index.
    pub fn asked(&mut self, raft: &mut Raft, from: NodeId, ctx: u64, out: &mut Outbox) {
        let round = self.next_ctx();
        match raft.read_index_for(round.to_be_bytes().to_vec(), from) {
            Ok(()) => {
                self.rounds
                    .insert(round, Round::Remote { member: from, ctx });
            }
            Err(_) => out.push((from, Envelope::ReadIndexResp { ctx, index: 0 })),
        }
    }

    /// The leader answered a forwarded round (index 0: refused).
    pub fn answered(&mut self, ctx: u64, index: u64) {
        for w in self
            .forwarded
            .remove(&ctx)
            .map(|f| f.waiters)
            .unwrap_or_default()
        {
            w.answer(if index == 0 {
                Err(EtcdError::LEADER_CHANGED)
            } else {
                Ok(index)
            });
        }
    }

    /// A round of this leader is confirmed (a `Ready`'s read state).
    pub fn ready(&mut self, read: &ReadState, out: &mut Outbox) {
        let Ok(bytes) = <[u8; 8]>::try_from(read.ctx.as_slice()) else {
            return;
        };
        match self.rounds.remove(&u64::from_be_bytes(bytes)) {
            Some(Round::Local(ws)) => ws.into_iter().for_each(|w| w.answer(Ok(read.index))),
            Some(Round::Remote { member, ctx }) => out.push((
                member,
                Envelope::ReadIndexResp {
                    ctx,
                    index: read.index,
                },
            )),
            None => {}
        }
    }

    /// After a `Ready`: the rounds of a lost leadership never complete, and neither do those
    /// forwarded to a leader this member no longer follows: fail them now (a client retries).
    pub fn settle(&mut self, raft: &Raft, out: &mut Outbox) {
        if raft.role() != Role::Leader {
            for (_, round) in self.rounds.drain() {
                match round {
                    Round::Local(ws) => ws
                        .into_iter()
                        .for_each(|w| w.answer(Err(EtcdError::LEADER_CHANGED))),
                    Round::Remote { member, ctx } => {
                        out.push((member, Envelope::ReadIndexResp { ctx, index: 0 }))
                    }
                }
            }
        }
        let (leader, term) = (raft.leader(), raft.term());
        let gone: Vec<u64> = self
            .forwarded
            .iter()
            .filter(|(_, f)| f.leader != leader || f.term != term)
            .map(|(&ctx, _)| ctx)
            .collect();
        for ctx in gone {
            self.answered(ctx, 0);
        }
    }
}
