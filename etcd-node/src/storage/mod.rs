//! Durable storage of a node: the write-ahead log (`wal.rs`), snapshot files (`snap.rs`),
//! `DiskStorage` combining them for the Raft core (`disk.rs`), the snapshot files clients save
//! and restore (`backup.rs`), and
//! the encodings they share (`codec.rs`). Formats: `docs/formats.md`.

pub mod backup;
pub mod bbolt;
pub mod codec;
pub mod disk;
pub mod snap;
pub mod wal;

pub use disk::{DiskStorage, OpenReport};

use std::io;
use std::path::PathBuf;

/// A failure of the member's own log storage (WAL and snapshot files): the member cannot go on
/// safely and stops; the message names the file.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error(transparent)]
    Wal(#[from] wal::WalError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("saving snapshot {index} in {}: {source}", dir.display())]
    SaveSnapshot {
        index: u64,
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("no valid snapshot in {}: {rejected}", dir.display())]
    NoValidSnapshot { dir: PathBuf, rejected: String },
    /// The WAL and the snapshots disagree (entries missing between them, a commit index past
    /// the log).
    #[error("{}: {what}", dir.display())]
    Inconsistent { dir: PathBuf, what: String },
}
