//! `etcdutl snapshot status` and `etcdutl snapshot export`: what a snapshot file holds, of
//! either kind (etcd-node's, or etcd's bbolt file), and an etcd-node snapshot rewritten as an
//! etcd one that etcd's own restore accepts.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

use crate::mvcc::etcd::{self, EtcdFileSummary};
use crate::mvcc::{DumpSummary, summarize};
use crate::storage::backup;

/// What `etcdutl snapshot status` shows.
#[derive(Debug, Clone, Copy)]
pub struct FileStatus {
    pub summary: DumpSummary,
    /// CRC-32C of the key space's dump (of the converted dump, for an etcd file).
    pub hash: u32,
    /// The file's size.
    pub size: u64,
    /// What an etcd file held, when it is one.
    pub etcd: Option<EtcdFileSummary>,
}

/// The status of the snapshot file `file`, its hash checked. An etcd file is converted (to a
/// scratch file in the system's temporary directory) to be counted the same way.
pub fn status(file: &Path) -> anyhow::Result<FileStatus> {
    let mut opened = std::fs::File::open(file)
        .with_context(|| format!("reading the snapshot file {}", file.display()))?;
    let size = opened.metadata()?.len();
    if backup::is_etcd(&mut opened)? {
        let (len, sha) = backup::check_etcd(&mut opened, true).map_err(anyhow::Error::msg)?;
        let work = tempfile::tempdir().context("creating a scratch directory")?;
        let converted = work.path().join("etcd.dump");
        let mut out = BufWriter::new(std::fs::File::create(&converted)?);
        let imported =
            etcd::import(opened, len, &sha, work.path(), &mut out).map_err(anyhow::Error::msg)?;
        out.flush()?;
        drop(out);
        let (summary, hash) = summarize_crc(BufReader::new(std::fs::File::open(&converted)?))?;
        return Ok(FileStatus {
            summary,
            hash,
            size,
            etcd: Some(imported),
        });
    }
    let dump = backup::open(BufReader::new(opened), true).map_err(anyhow::Error::msg)?;
    let (summary, hash) = summarize_crc(dump)?;
    Ok(FileStatus {
        summary,
        hash,
        size,
        etcd: None,
    })
}

fn summarize_crc(dump: impl Read) -> anyhow::Result<(DumpSummary, u32)> {
    let mut dump = Crc32c {
        inner: dump,
        crc: 0,
    };
    let s = summarize(&mut dump).map_err(anyhow::Error::msg)?;
    Ok((s, dump.crc))
}

/// A reader that computes the CRC-32C of what passes.
struct Crc32c<R> {
    inner: R,
    crc: u32,
}

impl<R: Read> Read for Crc32c<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        Ok(n)
    }
}

/// Writes the etcd-node snapshot file `file` to `output` as an etcd snapshot file (a bbolt
/// database ending with its SHA-256, as `etcdctl snapshot save` writes), for etcd's own
/// `snapshot restore`. `output` must not exist; it is written aside (`<output>.part`) and
/// renamed when whole, so a failed export leaves no file that looks finished.
pub fn export_etcd(
    file: &Path,
    output: &Path,
    skip_hash_check: bool,
) -> anyhow::Result<EtcdFileSummary> {
    if output.exists() {
        bail!(
            "--output {} already exists; name a new file (an export never overwrites one)",
            output.display()
        );
    }
    let mut opened = std::fs::File::open(file)
        .with_context(|| format!("reading the snapshot file {}", file.display()))?;
    if backup::is_etcd(&mut opened)? {
        bail!("{} is already an etcd snapshot file", file.display());
    }
    let dump =
        backup::open(BufReader::new(opened), !skip_hash_check).map_err(anyhow::Error::msg)?;
    let dir = crate::storage::parent_dir(output)
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let mut part = output.as_os_str().to_os_string();
    part.push(".part");
    let part = PathBuf::from(part);
    let result = (|| {
        // (read too: the hash is computed from what was written)
        let out = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&part)
            .with_context(|| format!("creating {}", part.display()))?;
        let (summary, out) =
            etcd::export(dump, BufWriter::new(out), &dir).map_err(anyhow::Error::msg)?;
        let mut out = out.into_inner().map_err(|e| e.into_error())?;
        backup::seal_etcd(&mut out).with_context(|| format!("writing {}", part.display()))?;
        crate::storage::rename_durably(&part, output)
            .with_context(|| format!("renaming {} to {}", part.display(), output.display()))?;
        Ok(summary)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    result
}
