//! The witness rules: pure functions from (stored state, request) to (reply, state to write).
//!
//! These are the rules of `shared/design/extended-raft.md` ("Log replication to the witness",
//! "Elections", "Reads") and of the extended Raft paper (`algorithm.tex`). Invariants:
//! - a higher request term first moves the witness to that term and clears its vote, and never
//!   touches the log position or the replication sets;
//! - `(last_log_term, last_log_subterm)` only grows; an equal pair is acknowledged without a write
//!   (retries are idempotent);
//! - at most one vote per term: a vote is only granted when `voted_for` is none or the candidate;
//! - pre-vote and term reads never produce a write;
//! - the first request from a cluster binds the witness to it; a witness bound elsewhere refuses;
//! - a witness whose generation differs from the one the caller saw, or whose term or log
//!   position is older than what the caller saw, lost its state (wiped, re-initialised, restored
//!   from an old copy): every step refuses it, before any binding or write.
//!
//! Every function is deterministic and does no I/O: [`crate::client::Witness`] runs them between a
//! load and a compare-and-swap.

use crate::error::{Error, Result};
use crate::state::{NONE, Seen, WitnessState};

/// Who is asking: the cluster, the member id it gives its witness, and what the asking member
/// has seen of that witness ([`Seen::NOTHING`] when it knows nothing yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub cluster_id: u64,
    pub witness_id: u64,
    pub seen: Seen,
}

/// The leader asks the witness to acknowledge the entry at `index`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendRequest {
    pub caller: Caller,
    /// The leader's term.
    pub term: u64,
    /// The leader's id.
    pub leader: u64,
    /// Term of the entry (equals `term` when the leader follows condition 1).
    pub entry_term: u64,
    /// Subterm of the entry.
    pub entry_subterm: u64,
    /// Index of the entry.
    pub index: u64,
    /// The leader's replication set for this subterm (sorted member ids).
    pub replication_set: Vec<u64>,
    /// The outgoing half's replication set in a joint configuration, else empty.
    pub replication_set_outgoing: Vec<u64>,
}

/// The witness's answer to an [`AppendRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendReply {
    /// The entry at `index` is acknowledged (stored now, or already stored at this position).
    Ack { term: u64, index: u64 },
    /// The request's term is older than the witness's: the sender must step down.
    StaleTerm { term: u64 },
    /// Same term, but the witness already holds a later (term, subterm): a delayed request.
    StalePosition {
        term: u64,
        last_log_term: u64,
        last_log_subterm: u64,
    },
}

/// A candidate asks the witness for its vote (or, with pre-vote, whether it would get it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoteRequest {
    pub caller: Caller,
    /// The term of the election (for a pre-vote, the term the candidate would campaign in).
    pub term: u64,
    pub candidate: u64,
    pub last_log_term: u64,
    pub last_log_subterm: u64,
    /// Voters of the (incoming) configuration that granted their vote, candidate included.
    pub granted: Vec<u64>,
    /// During a joint configuration: voters of the outgoing configuration that granted.
    pub granted_outgoing: Vec<u64>,
}

/// The witness's answer to a [`VoteRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VoteReply {
    /// The witness's term after the step.
    pub term: u64,
    pub granted: bool,
    /// Why the vote was refused, for logs and tests.
    pub refusal: Option<Refusal>,
}

/// Why a vote was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The request's term is older than the witness's.
    StaleTerm,
    /// The witness already voted for someone else in this term.
    AlreadyVoted { voted_for: u64 },
    /// The candidate's (last log term, subterm) is behind the witness's.
    LogBehind,
    /// Equal log position, but a granting voter is outside the recorded replication set, so the
    /// candidate's side may lack entries the witness acknowledged.
    OutsideReplicationSet { voter: u64 },
}

/// The reply to a step and the state to write, if any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome<R> {
    pub reply: R,
    /// `Some` when the step changes the stored state; `None` when nothing need be written.
    pub write: Option<WitnessState>,
}

/// Refuses a witness that is not the one `seen` describes, or is older than it: a voter that
/// forgot its votes (see [`Seen`]).
pub fn check_history(state: &WitnessState, seen: &Seen, location: &str) -> Result<()> {
    if seen.generation != 0 && state.generation != seen.generation {
        return Err(Error::Replaced {
            location: location.to_string(),
            expected: seen.generation,
            found: state.generation,
        });
    }
    let found = Seen::of(state);
    if found.term < seen.term || found.position() < seen.position() {
        return Err(Error::Reverted {
            location: location.to_string(),
            seen: *seen,
            found,
        });
    }
    Ok(())
}

/// Checks the caller against the witness identity and history; binds an unbound witness.
///
/// Returns true when `next` was changed by binding.
fn bind(next: &mut WitnessState, caller: Caller, location: &str) -> Result<bool> {
    check_history(next, &caller.seen, location)?;
    let mut changed = false;
    if next.cluster_id == 0 {
        next.cluster_id = caller.cluster_id;
        changed = true;
    } else if next.cluster_id != caller.cluster_id {
        return Err(Error::WrongCluster {
            location: location.to_string(),
            stored: next.cluster_id,
            requested: caller.cluster_id,
        });
    }
    if next.member_id == 0 {
        next.member_id = caller.witness_id;
        changed = true;
    } else if next.member_id != caller.witness_id {
        return Err(Error::WrongMember {
            location: location.to_string(),
            stored: next.member_id,
            requested: caller.witness_id,
        });
    }
    Ok(changed)
}

/// Checks the caller without binding (for read-only steps).
fn check(state: &WitnessState, caller: Caller, location: &str) -> Result<()> {
    bind(&mut state.clone(), caller, location).map(|_| ())
}

/// Moves to a higher term, clearing the vote. Returns true if the term changed.
fn observe_term(next: &mut WitnessState, term: u64) -> bool {
    if term > next.term {
        next.term = term;
        next.voted_for = NONE;
        true
    } else {
        false
    }
}

fn outcome<R>(reply: R, state: &WitnessState, next: WitnessState, changed: bool) -> Outcome<R> {
    debug_assert_eq!(changed, !next.same_content(state));
    Outcome {
        reply,
        write: changed.then_some(next),
    }
}

/// AppendToWitness (paper `algorithm.tex`, "Log replication"; design note "Log replication to the
/// witness"): store a strictly greater (term, subterm) with its replication set, acknowledge an
/// equal one again, refuse a lower term.
pub fn append(
    state: &WitnessState,
    req: &AppendRequest,
    location: &str,
) -> Result<Outcome<AppendReply>> {
    let mut next = state.clone();
    let mut changed = bind(&mut next, req.caller, location)?;
    changed |= observe_term(&mut next, req.term);
    if req.term < next.term {
        return Ok(outcome(
            AppendReply::StaleTerm { term: next.term },
            state,
            next,
            changed,
        ));
    }
    let incoming = (req.entry_term, req.entry_subterm);
    let reply = if incoming > next.last_log_position() {
        next.last_log_term = req.entry_term;
        next.last_log_subterm = req.entry_subterm;
        next.last_log_index = req.index;
        next.replication_set = sorted(&req.replication_set);
        next.replication_set_outgoing = sorted(&req.replication_set_outgoing);
        changed = true;
        AppendReply::Ack {
            term: next.term,
            index: req.index,
        }
    } else if incoming == next.last_log_position() {
        AppendReply::Ack {
            term: next.term,
            index: req.index,
        }
    } else {
        AppendReply::StalePosition {
            term: next.term,
            last_log_term: next.last_log_term,
            last_log_subterm: next.last_log_subterm,
        }
    };
    Ok(outcome(reply, state, next, changed))
}

/// The log half of the vote rule (design note "Elections", clauses a-c).
fn log_rule(state: &WitnessState, req: &VoteRequest) -> Option<Refusal> {
    let candidate = (req.last_log_term, req.last_log_subterm);
    let witness = state.last_log_position();
    if candidate > witness {
        // (a) a later term, or (b) the same term and a later subterm.
        return None;
    }
    if candidate < witness {
        return Some(Refusal::LogBehind);
    }
    // (c) equal: every granting voter must be in the replication set the witness recorded,
    // in each half of a joint configuration.
    let halves = [
        (&req.granted, &state.replication_set),
        (&req.granted_outgoing, &state.replication_set_outgoing),
    ];
    for (granted, set) in halves {
        if let Some(&voter) = granted.iter().find(|v| !set.contains(v)) {
            return Some(Refusal::OutsideReplicationSet { voter });
        }
    }
    None
}

fn vote_decision(state: &WitnessState, req: &VoteRequest) -> Option<Refusal> {
    if req.term < state.term {
        return Some(Refusal::StaleTerm);
    }
    if req.term == state.term && state.voted_for != NONE && state.voted_for != req.candidate {
        return Some(Refusal::AlreadyVoted {
            voted_for: state.voted_for,
        });
    }
    log_rule(state, req)
}

/// RequestVote to the witness: grant iff the term is current, the witness has not voted for
/// someone else in it, and the log rule holds; a grant persists `voted_for`.
pub fn vote(state: &WitnessState, req: &VoteRequest, location: &str) -> Result<Outcome<VoteReply>> {
    let mut next = state.clone();
    let mut changed = bind(&mut next, req.caller, location)?;
    changed |= observe_term(&mut next, req.term);
    let refusal = vote_decision(&next, req);
    if refusal.is_none() && next.voted_for != req.candidate {
        next.voted_for = req.candidate;
        changed = true;
    }
    let reply = VoteReply {
        term: next.term,
        granted: refusal.is_none(),
        refusal,
    };
    Ok(outcome(reply, state, next, changed))
}

/// Pre-vote: would the witness grant a vote in `req.term`? Evaluated as [`vote`] would after
/// moving to that term, but nothing is written (not even a binding).
pub fn pre_vote(state: &WitnessState, req: &VoteRequest, location: &str) -> Result<VoteReply> {
    check(state, req.caller, location)?;
    let mut hypothetical = state.clone();
    observe_term(&mut hypothetical, req.term);
    let refusal = vote_decision(&hypothetical, req);
    Ok(VoteReply {
        term: state.term,
        granted: refusal.is_none(),
        refusal,
    })
}

/// The witness's current term, for a leader that counts the witness in a ReadIndex quorum only
/// after seeing `term == leader term` in a fresh read.
pub fn read_term(state: &WitnessState, caller: Caller, location: &str) -> Result<u64> {
    check(state, caller, location)?;
    Ok(state.term)
}

fn sorted(ids: &[u64]) -> Vec<u64> {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}
