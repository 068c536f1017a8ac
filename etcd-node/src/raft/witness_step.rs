//! The bridge from a node's [`WitnessRequest`] to witness-core's pure rules: the one place that
//! says which rule answers which request. A host runs it inside `witness_core::Witness::step`
//! (load -> this -> compare-and-swap); the simulator runs it on its register.

use witness_core::rules::{self, Outcome};
use witness_core::{Result, WitnessState};

use super::types::{WitnessRequest, WitnessResponse};

/// The witness's answer to `request` given its stored `state`, and the state to write, if any.
pub fn apply_rule(
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
                },
                write: out.write,
            }
        }
        WitnessRequest::ReadTerm {
            caller,
            term,
            round,
        } => Outcome {
            reply: WitnessResponse::ReadTerm {
                witness: caller.witness_id,
                term: *term,
                round: *round,
                witness_term: rules::read_term(state, *caller, location)?,
            },
            write: None,
        },
    })
}
