//! Snapshot files: `snap/<term:016x>-<index:016x>.snap`, each
//! `magic | meta length u32 LE | data length u64 LE | meta | data | crc32c u32 LE` (the CRC
//! covers everything before it); the magic is `SNAP` for a snapshot with its data (a dump) and
//! `SNP2` for a snapshot in place ([`IN_PLACE`], no data). Written to a temporary name,
//! fsynced, renamed, directory fsynced. Loading takes the newest valid file; a newer file that fails its checks is reported
//! and skipped (an older snapshot plus the WAL still describes the state), and a directory with
//! files but no valid one is an error.

use std::fs;
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};

use super::StorageError;
use super::codec::{PbSnapshotMeta, decode, encode};
use crate::raft::{Snapshot, SnapshotMeta};

const MAGIC: &[u8; 4] = b"SNAP";
/// Format 2: a snapshot in place. The same layout with no data: the key space file
/// (`member/kv.redb`) is the data, made durable at the snapshot's index before the file was
/// written. A binary that reads format 1 only refuses it (its magic says a newer release
/// wrote it) rather than send or restore an empty key space.
const IN_PLACE: &[u8; 4] = b"SNP2";
/// The extension of a snapshot received, not yet taken by the Raft core.
const RECEIVED: &str = "received";

/// The snapshot directory.
#[derive(Debug, Clone)]
pub struct SnapDir {
    dir: PathBuf,
}

/// What loading found.
#[derive(Debug)]
pub struct Loaded {
    pub snapshot: Option<Snapshot>,
    /// Files that failed their checks, with the reason (newest first).
    pub rejected: Vec<(PathBuf, String)>,
}

fn name(meta: &SnapshotMeta) -> String {
    format!("{:016x}-{:016x}.snap", meta.term, meta.index)
}

/// The index in a snapshot file's name (0 if it has none).
fn index_of(path: &Path) -> u64 {
    let n = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    n.get(17..33)
        .and_then(|i| u64::from_str_radix(i, 16).ok())
        .unwrap_or(0)
}

/// Reads the data of one snapshot file piece by piece, so that sending a snapshot needs a piece
/// of memory, not the key space. The file's checksum is checked along the way: the last piece
/// is only returned once it matched.
#[derive(Debug)]
pub struct DataReader {
    file: io::BufReader<fs::File>,
    path: PathBuf,
    remaining: u64,
    crc: u32,
    pub data_len: u64,
    /// A snapshot in place ([`IN_PLACE`]): no data, the key space file is it.
    in_place: bool,
}

impl DataReader {
    /// Opens the file of the snapshot `meta` in `dir` (it stays readable if it is purged
    /// meanwhile); its header and metadata must say it is that snapshot, and it must hold
    /// data: a snapshot in place is an error, never an empty key space.
    pub fn open(dir: &Path, meta: &SnapshotMeta) -> io::Result<DataReader> {
        let (reader, stored) = Self::open_file(&dir.join(name(meta)))?;
        if stored != *meta {
            return Err(io::Error::other(format!(
                "{}: its metadata is not the snapshot's",
                reader.path.display()
            )));
        }
        if reader.in_place {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{}: snapshot {} holds no data: it records that the key space file was \
                     durable at that index",
                    reader.path.display(),
                    meta.index
                ),
            ));
        }
        Ok(reader)
    }

    /// Opens the snapshot file `path`, whichever snapshot it holds: the reader, and the
    /// snapshot's metadata.
    fn open_file(path: &Path) -> io::Result<(DataReader, SnapshotMeta)> {
        let file = fs::File::open(path)?;
        let size = file.metadata()?.len();
        let mut file = io::BufReader::new(file);
        let bad = |why: &str| io::Error::other(format!("{}: {why}", path.display()));
        let mut head = [0u8; 16];
        file.read_exact(&mut head)
            .map_err(|_| bad("not a snapshot file (too short)"))?;
        let meta_len = u64::from(u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")));
        let data_len = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
        if &head[..3] == b"SNP" && head[3].is_ascii_digit() && head[3] >= b'3' {
            // (the magic is the format's version: "SNAP" is 1, "SNP2" 2 ([`IN_PLACE`]), a
            // later one "SNP3"...)
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "a snapshot of format {} (etcd-node {} reads formats 1 and 2): a newer \
                     release wrote it. Run that release (or a later one) on this data \
                     directory; a data directory is not downgraded (docs/operations.md, \
                     \"Upgrades and going back\")",
                    char::from(head[3]),
                    crate::version::BINARY
                ),
            ));
        }
        let in_place = &head[..4] == IN_PLACE;
        if &head[..4] != MAGIC && !in_place {
            return Err(bad("not a snapshot file (bad magic)"));
        }
        if meta_len.checked_add(data_len) != size.checked_sub(20) {
            return Err(bad("its lengths do not match its size"));
        }
        if in_place && data_len > 0 {
            return Err(bad("a snapshot in place that holds data"));
        }
        let mut stored = vec![0; meta_len as usize];
        file.read_exact(&mut stored)?;
        let meta = decode::<PbSnapshotMeta>("snapshot metadata", &stored)
            .and_then(SnapshotMeta::try_from)
            .map_err(|e| bad(&e.to_string()))?;
        let mut reader = DataReader {
            file,
            path: path.to_path_buf(),
            remaining: data_len,
            crc: crc32c::crc32c_append(crc32c::crc32c(&head), &stored),
            data_len,
            in_place,
        };
        if data_len == 0 {
            reader.check_crc()?;
        }
        Ok((reader, meta))
    }

    /// After the data: the stored checksum must match what was read.
    fn check_crc(&mut self) -> io::Result<()> {
        let mut stored = [0u8; 4];
        self.file.read_exact(&mut stored)?;
        if stored != self.crc.to_le_bytes() {
            return Err(io::Error::other(format!(
                "{}: checksum mismatch",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// The next piece of at most `max` bytes; None after the last.
    pub fn next_piece(&mut self, max: usize) -> io::Result<Option<Vec<u8>>> {
        if self.remaining == 0 {
            return Ok(None);
        }
        let mut piece = vec![0; self.remaining.min(max as u64) as usize];
        io::Read::read_exact(self, &mut piece)?;
        Ok(Some(piece))
    }
}

/// The data, read as a stream: the end comes only once the checksum matched.
impl io::Read for DataReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 || buf.is_empty() {
            return Ok(0);
        }
        let n = self.remaining.min(buf.len() as u64) as usize;
        let n = self.file.read(&mut buf[..n])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{}: it ends before its data", self.path.display()),
            ));
        }
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        self.remaining -= n as u64;
        if self.remaining == 0 {
            self.check_crc()?;
        }
        Ok(n)
    }
}

/// A writer that passes bytes on, counting them and computing their CRC-32C.
struct Checksummed<W> {
    out: W,
    crc: u32,
    len: u64,
}

impl<W: io::Write> io::Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.out.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// True if `dir` holds one of the member's snapshot files (false if it does not exist);
/// creates nothing.
pub fn holds_snapshot(dir: &Path) -> io::Result<bool> {
    if !dir.exists() {
        return Ok(false);
    }
    let snaps = SnapDir {
        dir: dir.to_path_buf(),
    };
    Ok(!snaps.files()?.is_empty())
}

impl SnapDir {
    /// The directory's path.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn open(dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        Ok(SnapDir {
            dir: dir.to_path_buf(),
        })
    }

    /// Writes `snapshot` durably. The data is written as it is, not copied: the file is the
    /// header, the metadata, the data, and a checksum computed along the way.
    pub fn save(&self, snapshot: &Snapshot) -> io::Result<PathBuf> {
        self.save_streamed(&snapshot.meta, |out| out.write_all(&snapshot.data))
    }

    /// Writes the snapshot `meta` durably, its data written by `data` as it goes (never held
    /// whole): the length in the header is filled in once the data is written, and the
    /// checksum is computed along the way.
    pub fn save_streamed(
        &self,
        meta: &SnapshotMeta,
        data: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
    ) -> io::Result<PathBuf> {
        self.write(meta, self.dir.join(name(meta)), MAGIC, data)
    }

    /// Writes the snapshot in place `meta` durably ([`IN_PLACE`]): the caller made the key
    /// space durable at `meta.index` first.
    pub fn save_in_place(&self, meta: &SnapshotMeta) -> io::Result<PathBuf> {
        self.write(meta, self.dir.join(name(meta)), IN_PLACE, |_| Ok(()))
    }

    /// As [`SnapDir::save_streamed`], for a snapshot received from the leader: its file is not
    /// a snapshot of this member (nor loaded at start) until [`SnapDir::publish_received`]
    /// renames it, once the Raft core took the snapshot.
    pub fn receive(
        &self,
        meta: &SnapshotMeta,
        data: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
    ) -> io::Result<PathBuf> {
        self.write(meta, self.received(meta), MAGIC, data)
    }

    fn received(&self, meta: &SnapshotMeta) -> PathBuf {
        self.dir.join(name(meta)).with_extension(RECEIVED)
    }

    /// Makes the received snapshot `meta` one of this member's; false if none was received.
    pub fn publish_received(&self, meta: &SnapshotMeta) -> io::Result<bool> {
        match fs::rename(self.received(meta), self.dir.join(name(meta))) {
            Ok(()) => {
                super::sync_dir(&self.dir)?;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes the received snapshots not published (at start: the core never took them), and
    /// unfinished files.
    pub fn clear_received(&self) -> io::Result<()> {
        for entry in fs::read_dir(&self.dir)? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(&format!(".{RECEIVED}")) || name.ends_with(".tmp") {
                fs::remove_file(&path)?;
            }
        }
        Ok(())
    }

    /// Writes the file of snapshot `meta` at `path` durably (through a temporary file, removed
    /// if writing fails).
    fn write(
        &self,
        meta: &SnapshotMeta,
        path: PathBuf,
        magic: &[u8; 4],
        data: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
    ) -> io::Result<PathBuf> {
        let tmp = path.with_extension(format!(
            "{}.tmp",
            path.extension().and_then(|x| x.to_str()).unwrap_or("")
        ));
        if let Err(e) = write_file(&tmp, meta, magic, data) {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        crate::crash!("snap-before-rename");
        fs::rename(&tmp, &path)?;
        super::sync_dir(&self.dir)?;
        Ok(path)
    }

    /// The snapshot files (extension `snap`), or received ones, newest first.
    fn files_of(&self, extension: &str) -> io::Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == extension))
            .collect();
        files.sort_by_key(|p| index_of(p));
        files.reverse();
        Ok(files)
    }

    fn files(&self) -> io::Result<Vec<PathBuf>> {
        self.files_of("snap")
    }

    /// The newest valid snapshot: its metadata (its data stays in its file, see
    /// [`DataReader`]), after its checksum was checked reading the file piece by piece.
    pub fn load(&self) -> Result<Loaded, StorageError> {
        let files = self.files().map_err(|source| StorageError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let mut rejected = Vec::new();
        for path in &files {
            let checked = DataReader::open_file(path).and_then(|(mut reader, meta)| {
                io::copy(&mut reader, &mut io::sink())?;
                Ok(meta)
            });
            match checked {
                Ok(meta) => {
                    return Ok(Loaded {
                        snapshot: Some(Snapshot {
                            meta,
                            data: bytes::Bytes::new(),
                        }),
                        rejected,
                    });
                }
                Err(why)
                    if matches!(
                        why.kind(),
                        io::ErrorKind::Other | io::ErrorKind::UnexpectedEof
                    ) =>
                {
                    let why = why.to_string();
                    let prefix = format!("{}: ", path.display());
                    let why = why.strip_prefix(&prefix).unwrap_or(&why).to_string();
                    rejected.push((path.clone(), why));
                }
                Err(source) => {
                    return Err(StorageError::Io {
                        path: path.clone(),
                        source,
                    });
                }
            }
        }
        if !files.is_empty() {
            return Err(StorageError::NoValidSnapshot {
                dir: self.dir.clone(),
                rejected: rejected
                    .iter()
                    .map(|(p, w)| format!("{}: {w}", p.display()))
                    .collect::<Vec<_>>()
                    .join("; "),
            });
        }
        Ok(Loaded {
            snapshot: None,
            rejected,
        })
    }

    /// Removes all but the newest `keep` snapshot files.
    /// Received snapshots no newer than the newest one are dropped too (the core refused
    /// them, or one replaced them).
    pub fn purge(&self, keep: usize) -> io::Result<()> {
        let files = self.files()?;
        for path in files.iter().skip(keep) {
            fs::remove_file(path)?;
        }
        let newest = files.first().map_or(0, |p| index_of(p));
        for path in self.files_of(RECEIVED)? {
            if index_of(&path) <= newest {
                fs::remove_file(path)?;
            }
        }
        Ok(())
    }
}

/// Writes the snapshot file of `meta` at `tmp`, `magic` first, its data written by `data`,
/// and syncs it.
fn write_file(
    tmp: &Path,
    meta: &SnapshotMeta,
    magic: &[u8; 4],
    data: impl FnOnce(&mut dyn io::Write) -> io::Result<()>,
) -> io::Result<()> {
    let encoded = encode(&PbSnapshotMeta::from(meta));
    let mut head = Vec::with_capacity(16 + encoded.len());
    head.extend_from_slice(magic);
    head.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
    head.extend_from_slice(&0u64.to_le_bytes());
    head.extend_from_slice(&encoded);
    let file = fs::File::create(tmp)?;
    let mut out = Checksummed {
        out: io::BufWriter::new(&file),
        crc: 0,
        len: 0,
    };
    out.out.write_all(&head)?;
    data(&mut out)?;
    let Checksummed {
        out: mut buffered,
        crc: data_crc,
        len,
    } = out;
    head[8..16].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c_combine(crc32c::crc32c(&head), data_crc, len as usize);
    buffered.write_all(&crc.to_le_bytes())?;
    buffered.flush()?;
    drop(buffered);
    std::os::unix::fs::FileExt::write_all_at(&file, &len.to_le_bytes(), 8)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::Membership;

    fn snap(index: u64) -> Snapshot {
        Snapshot {
            meta: SnapshotMeta {
                index,
                term: 2,
                subterm: 1,
                membership: Membership::new([1, 2], Some(3)).unwrap(),
            },
            data: format!("state at {index}").into_bytes().into(),
        }
    }

    #[test]
    fn a_snapshot_of_a_later_format_stops_the_load_instead_of_being_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let s = SnapDir::open(dir.path()).unwrap();
        s.save(&snap(10)).unwrap();
        let newest = s.save(&snap(20)).unwrap();
        let mut bytes = fs::read(&newest).unwrap();
        bytes[..4].copy_from_slice(b"SNP3");
        fs::write(&newest, &bytes).unwrap();
        let err = s.load().unwrap_err().to_string();
        assert!(
            err.contains("format 3") && err.contains("a newer release wrote it"),
            "{err}"
        );
    }

    #[test]
    fn a_snapshot_in_place_loads_but_is_never_read_as_data() {
        let dir = tempfile::tempdir().unwrap();
        let s = SnapDir::open(dir.path()).unwrap();
        s.save(&snap(10)).unwrap();
        let path = s.save_in_place(&snap(20).meta).unwrap();
        assert_eq!(&fs::read(&path).unwrap()[..4], b"SNP2");
        let loaded = s.load().unwrap();
        assert_eq!(loaded.snapshot.map(|s| s.meta), Some(snap(20).meta));
        assert!(loaded.rejected.is_empty(), "{:?}", loaded.rejected);
        // Sending or restoring it is an error, never an empty key space.
        let err = DataReader::open(dir.path(), &snap(20).meta).unwrap_err();
        assert!(err.to_string().contains("holds no data"), "{err}");
        // It replaces the snapshot with data before it, as any newer snapshot does.
        s.purge(1).unwrap();
        assert_eq!(s.files().unwrap(), std::slice::from_ref(&path));
        // One that says it holds data is damaged.
        let mut bytes = fs::read(&path).unwrap();
        bytes[8] = 1;
        bytes.insert(bytes.len() - 4, 0);
        fs::write(&path, &bytes).unwrap();
        let err = s.load().unwrap_err().to_string();
        assert!(err.contains("in place that holds data"), "{err}");
    }

    #[test]
    fn newest_valid_snapshot_wins_and_a_damaged_one_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let s = SnapDir::open(dir.path()).unwrap();
        assert!(s.load().unwrap().snapshot.is_none());
        s.save(&snap(10)).unwrap();
        let newest = s.save(&snap(20)).unwrap();
        // (loading checks the file, and leaves the data in it)
        let meta_of = |l: Loaded| l.snapshot.map(|s| (s.meta, s.data.len()));
        assert_eq!(meta_of(s.load().unwrap()), Some((snap(20).meta, 0)));
        let mut bytes = fs::read(&newest).unwrap();
        let n = bytes.len();
        bytes[n - 10] ^= 1;
        fs::write(&newest, &bytes).unwrap();
        let loaded = s.load().unwrap();
        assert!(loaded.rejected[0].1.contains("checksum"), "{loaded:?}");
        assert_eq!(meta_of(loaded), Some((snap(10).meta, 0)));
        // The data read piece by piece is the data; a damaged file fails on its last piece.
        let mut reader = DataReader::open(dir.path(), &snap(10).meta).unwrap();
        let mut data = Vec::new();
        while let Some(piece) = reader.next_piece(3).unwrap() {
            data.extend(piece);
        }
        assert_eq!(data, snap(10).data);
        let mut other = snap(10).meta;
        other.subterm = 2;
        let err = DataReader::open(dir.path(), &other).unwrap_err();
        assert!(err.to_string().contains("metadata"), "{err}");
        let mut reader = DataReader::open(dir.path(), &snap(20).meta).unwrap();
        let err = std::iter::from_fn(|| reader.next_piece(3).transpose())
            .find_map(Result::err)
            .expect("the damaged file fails");
        assert!(err.to_string().contains("checksum"), "{err}");
        s.purge(1).unwrap();
        // Only the damaged newest remains: an error, not silence.
        let err = s.load().unwrap_err();
        assert!(err.to_string().contains("no valid snapshot"), "{err}");
    }

    #[test]
    fn a_received_snapshot_is_not_loaded_until_published() {
        let dir = tempfile::tempdir().unwrap();
        let s = SnapDir::open(dir.path()).unwrap();
        s.save(&snap(10)).unwrap();
        let received = snap(30);
        s.receive(&received.meta, |out| out.write_all(&received.data))
            .unwrap();
        s.receive(&snap(5).meta, |out| out.write_all(b"stale"))
            .unwrap();
        let loaded = |s: &SnapDir| s.load().unwrap().snapshot.map(|s| s.meta.index);
        assert_eq!(loaded(&s), Some(10), "not taken by the core yet");
        assert!(
            !s.publish_received(&snap(20).meta).unwrap(),
            "none received"
        );
        assert!(s.publish_received(&received.meta).unwrap());
        assert_eq!(loaded(&s), Some(30));
        let mut data = Vec::new();
        io::Read::read_to_end(
            &mut DataReader::open(dir.path(), &received.meta).unwrap(),
            &mut data,
        )
        .unwrap();
        assert_eq!(data, received.data);
        // The stale one goes with the purge; another goes at the next start.
        s.receive(&snap(40).meta, |out| out.write_all(b"x"))
            .unwrap();
        s.purge(1).unwrap();
        let left = |ext: &str| {
            s.files_of(ext)
                .unwrap()
                .iter()
                .map(|p| index_of(p))
                .collect::<Vec<_>>()
        };
        assert_eq!(left("snap"), [30]);
        assert_eq!(left(RECEIVED), [40]);
        s.clear_received().unwrap();
        assert!(left(RECEIVED).is_empty());
        // A transfer that stops leaves nothing to publish.
        let err = s
            .receive(&snap(50).meta, |_| {
                Err(io::Error::other("the transfer stopped"))
            })
            .unwrap_err();
        assert!(err.to_string().contains("stopped"));
        assert!(!s.publish_received(&snap(50).meta).unwrap());
    }
}
