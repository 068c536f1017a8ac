//! A deterministic simulator for the extended Raft: clusters of regular nodes with or without a
//! witness, a network that drops, delays, duplicates, reorders and partitions, crashes that lose
//! exactly what was not persisted, and a witness register on which the real witness-core rules
//! run, one step at a time, in the order the steps reach it (as compare-and-swap makes them).
//!
//! [`Cluster`] is the harness (scripted scenarios use it directly); [`random`] drives it with
//! random faults from one seed. After every tick [`invariants`] are checked; the first
//! violation stops the run with a message that names the seed.

pub mod cluster;
pub mod invariants;
pub mod random;
pub mod trace;

pub use cluster::{Cluster, Faults, Stats};
pub use invariants::Violation;
pub use random::{RandomRun, SeedFailed, run_seed};
pub use trace::Trace;
