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
use std::path::{Path, PathBuf};

/// Makes durable what a member's first start creates in its data directory: the entries in
/// `member_dir` (`wal`, `snap`, `kv.redb`) and `member_dir`'s own entry in the data directory,
/// by an fsync of both directories. Every start calls it (a start cut short before it ran may
/// have left them undurable). Without it a power cut soon after a member's first start can take
/// the whole `member` directory, on any file system that does not commit a new directory with
/// the first fsync of a file in it (found by the power-cut faults, docs/testing.md).
pub fn sync_member_dir(member_dir: &Path) -> Result<(), StorageError> {
    let parent = member_dir.parent().filter(|p| !p.as_os_str().is_empty());
    for dir in [Some(member_dir), parent].into_iter().flatten() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| StorageError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
    }
    Ok(())
}

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
