//! witness-core: the witness of an extended-Raft etcd cluster, without any storage backend.
//!
//! A tour:
//! - [`state::WitnessState`] is everything a witness knows; [`codec`] frames it as a
//!   checksummed record (`docs/witness-format.md`).
//! - [`rules`] are the witness's rules as pure functions: append, vote, pre-vote, read-term.
//! - [`store::WitnessStore`] is shared storage with optimistic compare-and-swap;
//!   [`memory::MemoryStore`] keeps it in memory, with fault injection.
//! - [`client::Witness`] runs a step: load, apply a rule, compare-and-swap, retry.
//! - [`url::WitnessUrl`] parses `witness:mount?path=...` and `witness:azblob?uri=...`.
//!
//! ```
//! use witness_core::{Caller, MemoryStore, Seen, VoteRequest, Witness, WitnessState, WitnessStore};
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let store = MemoryStore::new();
//! store.create(&WitnessState::new(0, "infra2", "witness:mount?path=%2Fw")).await.unwrap();
//! let witness = Witness::new(store);
//! let caller = Caller { cluster_id: 0xc1, witness_id: 0x3, seen: Seen::NOTHING };
//! let ask = |candidate| VoteRequest {
//!     caller, term: 2, candidate, last_log_term: 1, last_log_subterm: 0,
//!     granted: vec![candidate], granted_outgoing: vec![],
//! };
//! assert!(witness.vote(&ask(1)).await.unwrap().reply.granted);
//! // One vote per term: member 2 is refused in term 2.
//! assert!(!witness.vote(&ask(2)).await.unwrap().reply.granted);
//! # });
//! ```

pub mod client;
pub mod codec;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod error;
pub mod memory;
pub mod rules;
pub mod state;
pub mod store;
pub mod url;

pub use client::{LOST_STATE_LOADS, RetryPolicy, Stepped, Witness, WitnessCounters};
pub use error::{Error, Result};
pub use memory::{Fault, MemoryStore};
pub use rules::{AppendReply, AppendRequest, Caller, Outcome, Refusal, VoteReply, VoteRequest};
pub use state::{NONE, Seen, WitnessState};
pub use store::{CasOutcome, Loaded, Version, WitnessStore};
pub use url::{BlobSasUri, WitnessUrl};
