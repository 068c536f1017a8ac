//! etcd-node: an etcd-compatible node whose Raft is extended with a witness on shared storage.
//!
//! Today this crate holds the witness tooling: [`witness::open_store`] maps a `witness:` URL to
//! its backend, and [`witness::init`] / [`witness::status`] are the library functions behind
//! `etcdutl witness init` and `etcdutl witness status`.
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
