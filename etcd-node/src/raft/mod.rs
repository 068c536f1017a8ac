//! The extended Raft core, sans-IO: no tokio, no clock, no file system; randomness only from the
//! seed in [`Config`].
//!
//! A host drives a [`Raft`]: it calls `tick` on a timer, `step` with messages from regular
//! peers, `step_witness` with the outcome of each witness step it ran (through witness-core,
//! against the witness's storage), and `propose`; then takes a [`Ready`], persists its entries
//! and hard state, sends its messages, runs its witness requests, applies its committed entries,
//! and calls `advance`. See `docs/raft.md`.
//!
//! Files: `types.rs` (entries, messages, Ready), `node.rs` (the state machine), `host.rs` (the
//! one order in which every host carries out a Ready),
//! `progress.rs` (per-follower flow control), `replication_set.rs` (R adjustment),
//! `membership.rs` (configurations and their changes), `log.rs` (the log after the snapshot),
//! `storage.rs` (what is persisted), `config.rs`.

mod config;
mod errors;
mod host;
mod log;
mod membership;
mod mutation;
mod node;
mod progress;
pub mod replication_set;
mod storage;
mod types;
mod witness_step;

pub use config::Config;
pub use errors::{ConfigError, MembershipError};
pub use host::{Host, handle_ready};
pub use log::RaftLog;
pub use membership::{Change, ChangeKind, ConfChange, Membership, Voters};
pub use mutation::Mutation;
pub use node::{Raft, Refused, Role};
pub use progress::Progress;
pub use storage::{MemStorage, Storage};
pub use types::{
    Body, Entry, EntryData, HardState, KnownWitness, Message, NONE, NodeId, ReadState, Ready,
    Snapshot, SnapshotMeta, WitnessRequest, WitnessResponse,
};
pub use witness_step::apply_rule;
