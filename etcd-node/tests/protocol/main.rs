//! The protocol tier: the Raft core and the witness rules in the deterministic simulator, in
//! process (no server started). Part of the default `cargo test`; one test binary for all of it.
//!
//! - `sim`: random runs over many seeds for each cluster shape (`SIM_SEEDS`).
//! - `scenarios`: the readable scripts in `tests/scenarios/`, with their golden traces.
//! - `mutations`: each deliberate protocol bug is caught within a bounded number of seeds.
//! - `witness_reset`: a witness whose storage was lost is refused, nothing committed is lost.

mod mutations;
mod scenarios;
mod sim;
mod witness_reset;
