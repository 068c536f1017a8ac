//! witness-mount: a [`witness_core::WitnessStore`] on a directory of a mounted file system (NFS,
//! SMB, or a local directory shared by processes of one machine).
//!
//! Each version of the witness state is its own file, made visible atomically with a hard link
//! and made durable with fsync; see [`store`] for the invariants and `docs/witness-format.md`
//! for the layout.
//!
//! ```
//! use witness_core::{Witness, WitnessState, WitnessStore};
//! use witness_mount::{MountOptions, MountStore};
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let dir = tempfile::tempdir().unwrap();
//! let report = witness_mount::check_directory(dir.path()).unwrap();
//! println!("file system: {}", report.fs_type);
//! let store = MountStore::open(dir.path(), MountOptions::default()).unwrap();
//! store.create(&WitnessState::new(0, "infra2", "witness:mount?path=%2Fw")).await.unwrap();
//! let loaded = store.load().await.unwrap().unwrap();
//! assert_eq!(loaded.state.name, "infra2");
//! # });
//! ```

mod errors;
pub mod fsinfo;
pub mod store;

pub use fsinfo::{FsReport, check_directory, fs_report};
pub use store::{MountOptions, MountStore};
