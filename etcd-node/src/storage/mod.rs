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

pub use disk::{BootKeySpace, DiskStorage, OpenReport};

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

/// Makes `dir`'s entries durable (an fsync of the directory): after a file in it was created,
/// renamed or removed.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Creates `dir` and whatever of its ancestors is missing, each made durable in its parent (a
/// power cut must not take a WAL directory that already holds acknowledged entries: with
/// `--wal-dir` it is not under the data directory, whose entries the member syncs itself).
pub fn create_dir_durably(dir: &Path) -> io::Result<()> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
    std::fs::create_dir_all(dir)?;
    for created in missing.iter().rev() {
        if let Some(parent) = parent_dir(created) {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Renames `from` to `to` and makes the rename durable (an fsync of `to`'s directory, and of
/// `from`'s when that is another one). On an error the rename may or may not have happened.
pub fn rename_durably(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::rename(from, to)?;
    let (old, new) = (parent_dir(from), parent_dir(to));
    if let Some(dir) = new {
        sync_dir(dir)?;
    }
    match old {
        Some(dir) if Some(dir) != new => sync_dir(dir),
        _ => Ok(()),
    }
}

/// Takes an exclusive lock on the directory `dir` for as long as the returned value lives, so
/// that a second process opening it stops before it reads or changes anything: an error of kind
/// `WouldBlock` when another process holds it. A file system without locks (NFS refuses an
/// exclusive lock on a directory) gets a warning naming `what` and no lock.
pub fn lock_dir(dir: &Path, what: &str) -> io::Result<Option<nix::fcntl::Flock<std::fs::File>>> {
    let file = std::fs::File::open(dir)?;
    match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(io::ErrorKind::WouldBlock.into()),
        Err((_, errno)) => {
            tracing::warn!(dir = %dir.display(), error = %errno, "cannot lock the {what}: make sure no other member runs on it");
            Ok(None)
        }
    }
}

/// Locks the member directory `member_dir` (its snapshots and key space) while the returned
/// value lives ([`lock_dir`]): [`StorageError::Locked`] when another process has it.
pub fn lock_member_dir(
    member_dir: &Path,
) -> Result<Option<nix::fcntl::Flock<std::fs::File>>, StorageError> {
    lock_dir(member_dir, "member directory").map_err(|source| {
        if source.kind() == io::ErrorKind::WouldBlock {
            StorageError::Locked(member_dir.to_path_buf())
        } else {
            StorageError::Io {
                path: member_dir.to_path_buf(),
                source,
            }
        }
    })
}

/// The WAL directory of the member whose data directory is `data_dir`: `--wal-dir` when given
/// and not empty (etcd's dedicated WAL directory, for a disk of the WAL's own), else
/// `<data-dir>/member/wal`. Refuses a `--wal-dir` that is the data directory, inside it (other
/// than `member/wal` itself: the rest is the snapshots and the key space, and a restore renames
/// the data directory into place whole), or holding it. Paths are compared as written, made
/// absolute, with `.` and `..` resolved (not symbolic links).
pub fn wal_dir(data_dir: &Path, flag: Option<&Path>) -> Result<PathBuf, String> {
    let default = data_dir.join("member").join("wal");
    let Some(flag) = flag.filter(|f| !f.as_os_str().is_empty()) else {
        return Ok(default);
    };
    let (wal, data) = (lexical_absolute(flag), lexical_absolute(data_dir));
    if wal == data.join("member").join("wal") {
        return Ok(default);
    }
    if wal.starts_with(&data) || data.starts_with(&wal) {
        return Err(format!(
            "--wal-dir {} is {} the data directory {}: give the WAL a directory of its own, \
             outside it (such as /var/lib/etcd-wal, on the disk meant for it), or leave \
             --wal-dir out to keep it in {}",
            flag.display(),
            if data.starts_with(&wal) {
                "or holds"
            } else {
                "inside"
            },
            data_dir.display(),
            default.display()
        ));
    }
    Ok(flag.to_path_buf())
}

/// `path` made absolute (against the working directory), with `.` and `..` resolved as text.
fn lexical_absolute(path: &Path) -> PathBuf {
    use std::path::Component;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for c in absolute.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
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
        sync_dir(dir).map_err(|source| StorageError::Io {
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
    /// Another process holds the member directory's lock ([`lock_member_dir`]).
    #[error(
        "another process has the member directory {0} open: a member is already running on this data directory. Nothing was changed. Stop that member first (two processes on one data directory would damage it); if two members were given the same --data-dir, give each a directory of its own"
    )]
    Locked(PathBuf),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wal_is_in_the_data_directory_unless_wal_dir_names_a_directory_of_its_own() {
        let data = Path::new("/var/lib/etcd");
        let default = PathBuf::from("/var/lib/etcd/member/wal");
        assert_eq!(wal_dir(data, None).unwrap(), default);
        // (etcd's default is an empty --wal-dir)
        assert_eq!(wal_dir(data, Some(Path::new(""))).unwrap(), default);
        for same in ["/var/lib/etcd/member/wal", "/var/lib/etcd/./member/wal/"] {
            assert_eq!(wal_dir(data, Some(Path::new(same))).unwrap(), default);
        }
        for own in [
            "/var/lib/etcd-wal",
            "/fast/wal",
            "/var/lib/etcd/member/../../wal",
        ] {
            assert_eq!(
                wal_dir(data, Some(Path::new(own))).unwrap(),
                PathBuf::from(own)
            );
        }
        for inside in [
            "/var/lib/etcd",
            "/var/lib/etcd/member",
            "/var/lib/etcd/member/snap",
            "/var/lib/etcd/member/wal2",
            "/var/lib/etcd/wal",
            "/var/lib/etcd/x/../member/snap",
            "/var/lib",
        ] {
            let err = wal_dir(data, Some(Path::new(inside))).unwrap_err();
            assert!(
                err.contains(inside) && err.contains("a directory of its own"),
                "{err}"
            );
        }
        // A relative data directory and an absolute --wal-dir naming the same place.
        let cwd = std::env::current_dir().unwrap();
        let inside = cwd.join("n1.etcd/member/snap");
        assert!(wal_dir(Path::new("n1.etcd"), Some(&inside)).is_err());
    }

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
