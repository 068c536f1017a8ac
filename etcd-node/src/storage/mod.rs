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

/// The directory holding `path`'s entry: its parent, or `.` for a relative path of one
/// component (etcd's default `--data-dir` is `<name>.etcd`); None for `/`.
pub fn parent_dir(path: &Path) -> Option<&Path> {
    path.parent().map(|p| {
        if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        }
    })
}

/// Makes durable what a member's first start creates in its data directory: the entries in
/// `member_dir` (`wal`, `snap`, `kv.redb`) and `member_dir`'s own entry in the data directory,
/// by an fsync of both directories. Every start calls it (a start cut short before it ran may
/// have left them undurable). Without it a power cut soon after a member's first start can take
/// the whole `member` directory, on any file system that does not commit a new directory with
/// the first fsync of a file in it (found by the power-cut faults, docs/testing.md).
pub fn sync_member_dir(member_dir: &Path) -> Result<(), StorageError> {
    for dir in [Some(member_dir), parent_dir(member_dir)]
        .into_iter()
        .flatten()
    {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_data_directory_is_named_in_the_working_directory() {
        assert_eq!(parent_dir(Path::new("n1.etcd")), Some(Path::new(".")));
        assert_eq!(parent_dir(Path::new("a/n1.etcd")), Some(Path::new("a")));
        assert_eq!(
            parent_dir(Path::new("/var/lib/etcd")),
            Some(Path::new("/var/lib"))
        );
        assert_eq!(parent_dir(Path::new("/")), None);
    }
}
