//! What file system a witness directory is on, and whether it can hold a witness.
//!
//! Invariant: [`check_directory`] leaves the directory as it found it (its probe files are
//! removed even when a check fails).

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

use nix::sys::statfs::statfs;
use witness_core::{Error, Result};

use crate::errors::io_error;

/// The file system under a witness directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsReport {
    /// A name for the file system type (from statfs), e.g. "nfs", "smb2", "ext4".
    pub fs_type: String,
    /// The raw statfs magic number.
    pub magic: i64,
    /// True for file systems that other machines can share (NFS, SMB/CIFS, FUSE such as sshfs).
    pub is_network: bool,
}

/// Names a statfs magic number. Values from Linux `include/uapi/linux/magic.h` and the CIFS/SMB
/// client sources.
fn fs_name(magic: i64) -> (&'static str, bool) {
    match magic as u32 {
        0x6969 => ("nfs", true),
        0xFF53_4D42 => ("cifs", true),
        0xFE53_4D42 => ("smb2", true),
        0x517B => ("smb", true),
        0x6573_5546 => ("fuse", true),
        0x0BD0_0BD0 => ("lustre", true),
        0x4750_4653 => ("gpfs", true),
        0x0102_1994 => ("tmpfs", false),
        0xEF53 => ("ext2/3/4", false),
        0x5846_5342 => ("xfs", false),
        0x9123_683E => ("btrfs", false),
        0x2FC1_2FC1 => ("zfs", false),
        0x794C_7630 => ("overlayfs", false),
        0x0027_E0EB => ("cgroup", false),
        _ => ("unknown", false),
    }
}

/// The file system type of `dir`.
pub fn fs_report(dir: &Path) -> Result<FsReport> {
    let st = statfs(dir).map_err(|e| io_error("statfs", dir, e.into()))?;
    let magic = st.filesystem_type().0 as i64;
    let (name, is_network) = fs_name(magic);
    Ok(FsReport {
        fs_type: name.to_string(),
        magic,
        is_network,
    })
}

/// Checks that `dir` is a writable directory that supports fsync and hard links, as the
/// witness needs, and reports its file system.
pub fn check_directory(dir: &Path) -> Result<FsReport> {
    crate::store::check_is_directory(dir)?;
    let report = fs_report(dir)?;
    let nonce: u64 = rand::random();
    let a = dir.join(format!(".witness-probe.{nonce:016x}.tmp"));
    let b = dir.join(format!(".witness-probe.{nonce:016x}.lnk"));
    let result = probe(dir, &a, &b, nonce);
    let _ = fs::remove_file(&a);
    let _ = fs::remove_file(&b);
    result.map(|()| report)
}

fn probe(dir: &Path, a: &Path, b: &Path, nonce: u64) -> Result<()> {
    let content = nonce.to_le_bytes();
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(a)
        .map_err(|e| io_error("create a probe file in", dir, e))?;
    f.write_all(&content)
        .map_err(|e| io_error("write a probe file in", dir, e))?;
    f.sync_all()
        .map_err(|e| match io_error("fsync a probe file in", dir, e) {
            Error::Io { source, .. } => Error::Unsupported {
                location: dir.display().to_string(),
                reason: format!("fsync of a file failed ({source}); the witness needs fsync"),
            },
            other => other,
        })?;
    fs::hard_link(a, b).map_err(|e| match io_error("hard-link a probe file in", dir, e) {
        Error::Io { source, .. } => Error::Unsupported {
            location: dir.display().to_string(),
            reason: format!("hard links are not supported ({source}); use an NFS or SMB share with hard links enabled"),
        },
        other => other,
    })?;
    let read = fs::read(b).map_err(|e| io_error("read a probe file in", dir, e))?;
    if read != content {
        return Err(Error::Unsupported {
            location: dir.display().to_string(),
            reason: "a hard link does not show the linked file's content".into(),
        });
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::Unsupported {
            location: dir.display().to_string(),
            reason: format!(
                "fsync of the directory failed ({e}); the witness needs directory fsync"
            ),
        })
}
