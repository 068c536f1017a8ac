//! Durable storage of a node: the write-ahead log (`wal.rs`), snapshot files (`snap.rs`),
//! `DiskStorage` combining them for the Raft core (`disk.rs`), the snapshot files clients save
//! and restore (`backup.rs`), and
//! the encodings they share (`codec.rs`). Formats: `docs/formats.md`.

pub mod backup;
pub mod codec;
pub mod disk;
pub mod snap;
pub mod wal;

pub use disk::{DiskStorage, OpenReport};
