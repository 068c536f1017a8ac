//! Snapshot files: `snap/<term:016x>-<index:016x>.snap`, each
//! `magic "SNAP" | meta length u32 LE | data length u64 LE | meta | data | crc32c u32 LE` (the
//! CRC covers everything before it). Written to a temporary name, fsynced, renamed, directory
//! fsynced. Loading takes the newest valid file; a newer file that fails its checks is reported
//! and skipped (an older snapshot plus the WAL still describes the state), and a directory with
//! files but no valid one is an error.

use std::fs;
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};

use super::StorageError;
use super::codec::{Invalid, PbSnapshotMeta, decode, encode};
use crate::raft::{Snapshot, SnapshotMeta};

const MAGIC: &[u8; 4] = b"SNAP";

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

fn parse(bytes: Vec<u8>) -> Result<Snapshot, Invalid> {
    if bytes.len() < 20 || &bytes[..4] != MAGIC {
        return Err(Invalid(
            "not a snapshot file (bad magic or too short)".into(),
        ));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err(Invalid("checksum mismatch".into()));
    }
    let meta_len = u32::from_le_bytes(body[4..8].try_into().expect("4 bytes")) as usize;
    let data_len = u64::from_le_bytes(body[8..16].try_into().expect("8 bytes")) as usize;
    if 16 + meta_len + data_len != body.len() {
        return Err(Invalid("lengths do not match the file size".into()));
    }
    let meta: SnapshotMeta =
        decode::<PbSnapshotMeta>("snapshot metadata", &body[16..16 + meta_len])?.try_into()?;
    let data_at = 16 + meta_len;
    let data = bytes::Bytes::from(bytes).slice(data_at..data_at + data_len);
    Ok(Snapshot { meta, data })
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
}

impl DataReader {
    /// Opens the file of the snapshot `meta` in `dir` (it stays readable if it is purged
    /// meanwhile); its header and metadata must say it is that snapshot.
    pub fn open(dir: &Path, meta: &SnapshotMeta) -> io::Result<DataReader> {
        let path = dir.join(name(meta));
        let file = fs::File::open(&path)?;
        let size = file.metadata()?.len();
        let mut file = io::BufReader::new(file);
        let bad = |why: &str| io::Error::other(format!("{}: {why}", path.display()));
        let mut head = [0u8; 16];
        file.read_exact(&mut head)?;
        let meta_len = u64::from(u32::from_le_bytes(head[4..8].try_into().expect("4 bytes")));
        let data_len = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
        if &head[..4] != MAGIC || meta_len.checked_add(data_len) != size.checked_sub(20) {
            return Err(bad(
                "not a snapshot file, or its lengths do not match its size",
            ));
        }
        let mut stored = vec![0; meta_len as usize];
        file.read_exact(&mut stored)?;
        let same = decode::<PbSnapshotMeta>("snapshot metadata", &stored)
            .ok()
            .and_then(|pb| SnapshotMeta::try_from(pb).ok())
            .is_some_and(|m| m == *meta);
        if !same {
            return Err(bad("its metadata is not the snapshot's"));
        }
        let mut reader = DataReader {
            file,
            path: path.clone(),
            remaining: data_len,
            crc: crc32c::crc32c_append(crc32c::crc32c(&head), &stored),
            data_len,
        };
        if data_len == 0 {
            reader.check_crc()?;
        }
        Ok(reader)
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
        let n = self.remaining.min(max as u64) as usize;
        let mut piece = vec![0; n];
        self.file.read_exact(&mut piece)?;
        self.crc = crc32c::crc32c_append(self.crc, &piece);
        self.remaining -= n as u64;
        if self.remaining == 0 {
            self.check_crc()?;
        }
        Ok(Some(piece))
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
        let encoded = encode(&PbSnapshotMeta::from(meta));
        let mut head = Vec::with_capacity(16 + encoded.len());
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
        head.extend_from_slice(&0u64.to_le_bytes());
        head.extend_from_slice(&encoded);
        let path = self.dir.join(name(meta));
        let tmp = path.with_extension("snap.tmp");
        let file = fs::File::create(&tmp)?;
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
        file.sync_all()?;
        crate::crash!("snap-before-rename");
        fs::rename(&tmp, &path)?;
        fs::File::open(&self.dir)?.sync_all()?;
        Ok(path)
    }

    fn files(&self) -> io::Result<Vec<PathBuf>> {
        let mut files: Vec<PathBuf> = fs::read_dir(&self.dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "snap"))
            .collect();
        // Names sort by (term, index); order by index, newest first.
        files.sort_by_key(|p| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            n.get(17..33)
                .map(|i| u64::from_str_radix(i, 16).unwrap_or(0))
        });
        files.reverse();
        Ok(files)
    }

    /// The newest valid snapshot.
    pub fn load(&self) -> Result<Loaded, StorageError> {
        let files = self.files().map_err(|source| StorageError::Io {
            path: self.dir.clone(),
            source,
        })?;
        let mut rejected = Vec::new();
        for path in &files {
            let bytes = fs::read(path).map_err(|source| StorageError::Io {
                path: path.clone(),
                source,
            })?;
            match parse(bytes) {
                Ok(snapshot) => {
                    return Ok(Loaded {
                        snapshot: Some(snapshot),
                        rejected,
                    });
                }
                Err(why) => rejected.push((path.clone(), why.to_string())),
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
    pub fn purge(&self, keep: usize) -> io::Result<()> {
        for path in self.files()?.into_iter().skip(keep) {
            fs::remove_file(path)?;
        }
        Ok(())
    }
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
    fn newest_valid_snapshot_wins_and_a_damaged_one_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let s = SnapDir::open(dir.path()).unwrap();
        assert!(s.load().unwrap().snapshot.is_none());
        s.save(&snap(10)).unwrap();
        let newest = s.save(&snap(20)).unwrap();
        assert_eq!(s.load().unwrap().snapshot, Some(snap(20)));
        let mut bytes = fs::read(&newest).unwrap();
        let n = bytes.len();
        bytes[n - 10] ^= 1;
        fs::write(&newest, &bytes).unwrap();
        let loaded = s.load().unwrap();
        assert_eq!(loaded.snapshot, Some(snap(10)));
        assert!(loaded.rejected[0].1.contains("checksum"));
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
}
