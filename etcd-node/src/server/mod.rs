//! The etcd-node server: opens the member's storage (WAL, snapshots, key space), starts the
//! Raft loop thread, the peer transport, and the client API on the client URLs (gRPC plus
//! `/health` and `/metrics`), and stops them on shutdown. The witness member is served here,
//! locally: witness steps run against the storage its `witness:` URL names.

pub mod api;
pub mod applier;
pub mod bootstrap;
pub mod contract;
pub mod driver;
pub mod force;
pub mod lessor;
pub mod metrics;
pub mod node;
pub mod peer;
pub mod peer_thread;
pub mod proposals;
pub mod reads;
pub mod removal;
pub mod restore;
pub mod snapshot_file;
pub mod wal_dump;
pub mod watch_hub;
pub mod wire;
pub mod witness_probe;
pub mod witness_slot;

pub use bootstrap::{SHUTDOWN_GRACE, run};
