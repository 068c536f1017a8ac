//! The bridge from a node's [`WitnessRequest`] to witness-core's pure rules: the one place that
//! says which rule answers which request. A host runs it inside `witness_core::Witness::step`
//! (load -> this -> compare-and-swap); the simulator runs it on its register.

use witness_core::rules::{self, Outcome};
use witness_core::{Result, Seen, WitnessState};

use super::types::{WitnessRequest, WitnessResponse};

/// The witness's answer to `request` given its stored `state`, and the state to write, if any.
/// The answer carries what it saw: the state written, else the state it was computed from.
pub fn apply_rule(
    state: &WitnessState,
    request: &WitnessRequest,
    location: &str,
) -> Result<Outcome<WitnessResponse>> {
    let mut out = answer(state, request, location)?;
    let seen_now = Seen::of(out.write.as_ref().unwrap_or(state));
    match &mut out.reply {
        WitnessResponse::Append { seen, .. }
        | WitnessResponse::Vote { seen, .. }
        | WitnessResponse::ReadTerm { seen, .. } => *seen = seen_now,
        WitnessResponse::Failed { .. } => {}
    }
    Ok(out)
}

fn answer(
    state: &WitnessState,
    request: &WitnessRequest,
    location: &str,
) -> Result<Outcome<WitnessResponse>> {
    Ok(match request {
        WitnessRequest::Append(r) => {
            let out = rules::append(state, r, location)?;
            Outcome {
                reply: WitnessResponse::Append {
                    request: r.clone(),
                    reply: out.reply,
                    seen: Seen::NOTHING,
                },
                write: out.write,
            }
        }
        WitnessRequest::Vote {
            pre: true,
            request: r,
        } => Outcome {
            reply: WitnessResponse::Vote {
                pre: true,
                request: r.clone(),
                reply: rules::pre_vote(state, r, location)?,
                seen: Seen::NOTHING,
            },
            write: None,
        },
        WitnessRequest::Vote {
            pre: false,
            request: r,
        } => {
            let out = rules::vote(state, r, location)?;
            Outcome {
                reply: WitnessResponse::Vote {
                    pre: false,
                    request: r.clone(),
                    reply: out.reply,
                    seen: Seen::NOTHING,
                },
                write: out.write,
            }
        }
        WitnessRequest::ReadTerm {
            caller,
            term,
            round,
        } => {
            let witness_term = rules::read_term(state, *caller, location)?;
            Outcome {
                reply: WitnessResponse::ReadTerm {
                    witness: caller.witness_id,
                    term: *term,
                    round: *round,
                    witness_term,
                    seen: Seen::NOTHING,
                },
                // A confirmation must come from the current state, not a cached one (a mount's
                // attribute or directory cache can serve an older version): the same state is
                // written back with a compare-and-swap, which fails on a stale load and makes
                // the step load again. A refusal needs no such care.
                write: (witness_term == *term).then(|| state.clone()),
            }
        }
    })
}
