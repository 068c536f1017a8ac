//! etcd-node: an etcd-compatible node whose Raft is extended with a witness on shared storage.
//!
//! A tour, from the inside out:
//! - [`raft`]: the extended Raft core, pure and deterministic (input by `step`/`tick`, output
//!   what to persist, send and apply); [`sim`]: the simulator that runs it under faults.
//! - [`storage`]: the WAL and snapshot files; [`mvcc`]: the key space (revisions, history,
//!   leases, auth) on redb.
//! - [`witness`]: the witness steps against the storage a `witness:` URL names
//!   ([`witness::open_store`]), and the library behind `etcdutl witness init|status|add`.
//! - [`server`]: a member: bootstrap, the Raft loop and its driver, the peer transport, and
//!   etcd's client API in `server::api` (gRPC, the HTTP/JSON gateway, Lock and Election, the
//!   probes, `/metrics`).
//! - [`config`]: etcd's flags, `ETCD_*` variables and config files, validated once; [`tls`];
//!   [`version`]: releases, peer protocols and feature gates; [`reconcile`]: the plan of
//!   `etcdutl cluster reconcile`; [`errors`]: etcd's client-visible errors in one table.
//!
//! The example initialises a witness in a directory and reads it back, as `etcdutl witness
//! init` and `etcdutl witness status` do:
//!
//! ```
//! use etcd_node::witness::{InitOptions, init, status};
//! use witness_core::WitnessUrl;
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let dir = tempfile::tempdir().unwrap();
//! let url = WitnessUrl::mount(dir.path()).unwrap();
//! let report = init(&InitOptions { name: "infra2".into(), url: url.clone(), force: false }).await.unwrap();
//! assert!(!report.warnings.is_empty(), "a temp dir is not a network share");
//! assert_eq!(status(&url).await.unwrap().name, "infra2");
//! # });
//! ```

pub mod config;
pub mod errors;
pub mod failpoint;
pub mod mvcc;
pub mod raft;
pub mod reconcile;
pub mod server;
pub mod sim;
pub mod storage;
pub mod tls;
pub mod version;
pub mod witness;

#[cfg(test)]
mod layers;
