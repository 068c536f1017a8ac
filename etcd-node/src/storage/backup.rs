//! The snapshot file a client saves from `Maintenance.Snapshot` (`etcdctl snapshot save`) and
//! `etcdutl snapshot restore` reads: the key space as one consistent dump, sealed with a
//! SHA-256 so a damaged or truncated copy is refused.
//!
//! Layout (docs/formats.md): `MAGIC` (8 bytes), the dump's length (u64, little-endian), the
//! dump (`mvcc` encoding), zeros up to a multiple of 512 bytes, then the SHA-256 of everything
//! before it (32 bytes). As in etcd, the hash comes last so the file can be streamed as it is
//! produced, and the size is 512·n + 32: etcdctl checks exactly that before it keeps a saved
//! file ("sha256 checksum not found" otherwise). etcd's own (bbolt) snapshots are a different
//! format: they are recognised and refused with a message saying so.

use std::io::{self, Read, Seek, SeekFrom, Write};

use sha2::{Digest, Sha256};

/// The first bytes of every etcd-node snapshot file (format version 1).
pub const MAGIC: &[u8; 8] = b"ENSNAP\x00\x01";
const HASH_BYTES: usize = 32;
const LEN_BYTES: usize = 8;
/// The body (everything before the hash) is padded to a multiple of this.
const SECTOR: usize = 512;
/// bbolt's magic number, at byte 16 of an etcd (bbolt) file, little-endian.
const BBOLT_MAGIC: [u8; 4] = 0xED0C_DAEDu32.to_le_bytes();

/// The file for `dump`.
pub fn seal(dump: &[u8]) -> Vec<u8> {
    let mut sealer = Sealer::new(Vec::new(), dump.len() as u64).expect("writing to memory");
    sealer.write_all(dump).expect("writing to memory");
    sealer.finish().expect("writing to memory")
}

/// The size of the file for a dump of `dump_len` bytes.
pub fn sealed_len(dump_len: u64) -> u64 {
    (MAGIC.len() as u64 + LEN_BYTES as u64 + dump_len).next_multiple_of(SECTOR as u64)
        + HASH_BYTES as u64
}

/// Writes the file for a dump of a known length to `out` as the dump is written to it (the
/// dump is never held whole): the header first, the dump as it comes, then [`Sealer::finish`]
/// adds the padding and the hash.
#[derive(Debug)]
pub struct Sealer<W: Write> {
    out: W,
    sha: Sha256,
    written: u64,
}

impl<W: Write> Sealer<W> {
    pub fn new(out: W, dump_len: u64) -> io::Result<Self> {
        let mut sealer = Sealer {
            out,
            sha: Sha256::new(),
            written: 0,
        };
        sealer.put(MAGIC)?;
        sealer.put(&dump_len.to_le_bytes())?;
        Ok(sealer)
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.sha.update(bytes);
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// The padding and the hash; returns the writer.
    pub fn finish(mut self) -> io::Result<W> {
        let body = self.written.next_multiple_of(SECTOR as u64);
        let zeros = vec![0u8; (body - self.written) as usize];
        self.put(&zeros)?;
        let hash = self.sha.finalize_reset();
        self.out.write_all(&hash)?;
        Ok(self.out)
    }
}

impl<W: Write> Write for Sealer<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.put(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// The dump inside `file`: `file` positioned at its start, limited to its length, after
/// checking the file's format and (unless `check_hash` is false) its hash. The file is read a
/// piece at a time, never held whole. The error says what is wrong with the file.
pub fn open<R: Read + Seek>(
    mut file: R,
    check_hash: bool,
) -> Result<io::Take<R>, SnapshotFileError> {
    let size = file.seek(SeekFrom::End(0))?;
    file.seek(SeekFrom::Start(0))?;
    let mut head = [0u8; 20];
    let got = read_up_to(&mut file, &mut head)?;
    if got == head.len() && head[16..20] == BBOLT_MAGIC {
        return Err(SnapshotFileError::EtcdKind);
    }
    if got < MAGIC.len() || &head[..MAGIC.len()] != MAGIC {
        return Err(SnapshotFileError::NotSnapshot);
    }
    let whole = (SECTOR + HASH_BYTES) as u64;
    if size < whole || size % SECTOR as u64 != HASH_BYTES as u64 {
        return Err(SnapshotFileError::Truncated { size });
    }
    let body = size - HASH_BYTES as u64;
    if check_hash {
        hash_body(&mut file, body, true)?;
    }
    let start = (MAGIC.len() + LEN_BYTES) as u64;
    let len = u64::from_le_bytes(
        head[MAGIC.len()..start as usize]
            .try_into()
            .expect("8 bytes"),
    );
    if start.checked_add(len).is_none_or(|end| end > body) {
        return Err(SnapshotFileError::LengthPastEnd);
    }
    file.seek(SeekFrom::Start(start))?;
    Ok(file.take(len))
}

/// Checks the SHA-256 that ends the etcd-node snapshot file at `path` (one [`open`] accepted
/// without checking it), reading it in pieces of a MiB.
pub fn check_hash(path: &std::path::Path) -> Result<(), SnapshotFileError> {
    let mut file = io::BufReader::with_capacity(1 << 20, std::fs::File::open(path)?);
    let size = file.seek(SeekFrom::End(0))?;
    let body = size
        .checked_sub(HASH_BYTES as u64)
        .ok_or(SnapshotFileError::Truncated { size })?;
    hash_body(&mut file, body, true).map(|_| ())
}

/// Whether `file` is an etcd (bbolt) snapshot or database file rather than an etcd-node one.
pub fn is_etcd(file: &mut (impl Read + Seek)) -> io::Result<bool> {
    file.seek(SeekFrom::Start(0))?;
    let mut head = [0u8; 20];
    let got = read_up_to(file, &mut head)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(got == head.len() && &head[..MAGIC.len()] != MAGIC && head[16..20] == BBOLT_MAGIC)
}

/// Why a snapshot file is refused ([`open`], [`check_etcd`]).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotFileError {
    #[error("reading it: {0}")]
    Read(#[from] io::Error),
    #[error(
        "this is an etcd (bbolt) snapshot, not an etcd-node one (`etcdutl snapshot restore` and \
         `status` read both kinds)"
    )]
    EtcdKind,
    #[error(
        "not an etcd-node snapshot file (it does not start with the etcd-node snapshot magic; \
         was the save interrupted, or is it another file?)"
    )]
    NotSnapshot,
    #[error("truncated: {size} bytes is not the size of a whole snapshot (512·n + 32)")]
    Truncated { size: u64 },
    #[error("its length field points past its end: the file is damaged")]
    LengthPastEnd,
    #[error(
        "this etcd file ({size} bytes) does not end with a SHA-256, so it is not a file \
         `etcdctl snapshot save` wrote whole: a database copied from a data directory \
         (member/snap/db) has none, and a truncated snapshot has lost its end. Save the \
         snapshot again with `etcdctl snapshot save`, or, for a database file you know is \
         whole (copied while its etcd was stopped), add --skip-hash-check"
    )]
    NoHash { size: u64 },
    #[error(
        "its SHA-256 does not match its contents: the file is damaged or truncated (save it \
         again; --skip-hash-check restores it anyway, at your own risk)"
    )]
    HashMismatch,
}

/// Checks an etcd file as etcd's restore does: a file `etcdctl snapshot save` wrote is
/// 512·n + 32 bytes, the database then its SHA-256, which must match; any other size is a
/// database copied from a data directory (`member/snap/db`), restored only with `check_hash`
/// false. Returns the database's length and its SHA-256.
pub fn check_etcd(
    file: &mut (impl Read + Seek),
    check_hash: bool,
) -> Result<(u64, [u8; 32]), SnapshotFileError> {
    let size = file.seek(SeekFrom::End(0))?;
    let hashed = size % SECTOR as u64 == HASH_BYTES as u64;
    let len = if hashed {
        size - HASH_BYTES as u64
    } else {
        size
    };
    if !hashed && check_hash {
        return Err(SnapshotFileError::NoHash { size });
    }
    let sha = hash_body(file, len, hashed && check_hash)?;
    file.seek(SeekFrom::Start(0))?;
    Ok((len, sha))
}

/// The SHA-256 of the first `len` bytes of `file`; with `verify`, the 32 bytes after them
/// must be that hash (the file is left after them), or the error says the file is damaged.
fn hash_body(
    file: &mut (impl Read + Seek),
    len: u64,
    verify: bool,
) -> Result<[u8; 32], SnapshotFileError> {
    file.seek(SeekFrom::Start(0))?;
    let mut sha = Sha256::new();
    io::copy(&mut file.take(len), &mut HashInto(&mut sha))?;
    let sha: [u8; 32] = sha.finalize().into();
    if verify {
        let mut stored = [0u8; HASH_BYTES];
        file.read_exact(&mut stored)?;
        if sha != stored {
            return Err(SnapshotFileError::HashMismatch);
        }
    }
    Ok(sha)
}

/// Ends the etcd file `file` (written whole, positioned at its end) with the SHA-256 of its
/// contents, as `etcdctl snapshot save` does, so etcd's restore checks it.
pub fn seal_etcd(file: &mut std::fs::File) -> io::Result<()> {
    file.seek(SeekFrom::Start(0))?;
    let mut sha = Sha256::new();
    io::copy(file, &mut HashInto(&mut sha))?;
    file.write_all(&sha.finalize())?;
    file.sync_all()
}

/// Reads as much of `buf` as `r` holds; returns how much.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Feeds what is written to a SHA-256.
struct HashInto<'a>(&'a mut Sha256);

impl Write for HashInto<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dump `open` finds in `file`.
    fn opened(file: &[u8], check_hash: bool) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let mut dump = Vec::new();
        open(io::Cursor::new(file), check_hash)?.read_to_end(&mut dump)?;
        Ok(dump)
    }

    #[test]
    fn a_sealed_dump_opens_to_itself() {
        let file = seal(b"the key space");
        assert_eq!(file.len() % 512, 32, "etcdctl's size check");
        assert_eq!(opened(&file, true).unwrap(), b"the key space");
        let big = vec![7u8; 2000];
        assert_eq!(opened(&seal(&big), true).unwrap(), big.as_slice());
        assert_eq!(opened(&seal(b""), true).unwrap(), b"");
        for n in [0, 1, 487, 488, 489, 2000] {
            assert_eq!(
                seal(&vec![1u8; n]).len() as u64,
                sealed_len(n as u64),
                "{n} bytes"
            );
        }
    }

    /// `check_hash` on a file holding `bytes`.
    fn checked(bytes: &[u8]) -> Result<(), SnapshotFileError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.snap");
        std::fs::write(&path, bytes).unwrap();
        check_hash(&path)
    }

    #[test]
    fn check_hash_passes_a_whole_file_and_refuses_a_damaged_one() {
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let file = seal(&big);
        checked(&file).unwrap();
        for i in [MAGIC.len() + 9, file.len() / 2, file.len() - 1] {
            let mut bad = file.clone();
            bad[i] ^= 1;
            let err = checked(&bad).unwrap_err();
            assert!(
                matches!(err, SnapshotFileError::HashMismatch),
                "byte {i}: {err}"
            );
        }
        let err = checked(&file[..20]).unwrap_err();
        assert!(
            matches!(err, SnapshotFileError::Truncated { size: 20 }),
            "{err}"
        );
    }

    #[test]
    fn every_damaged_byte_and_every_truncation_is_refused() {
        let file = seal(b"some dump bytes");
        for i in MAGIC.len()..file.len() {
            let mut bad = file.clone();
            bad[i] ^= 0x40;
            let err = opened(&bad, true).unwrap_err().to_string();
            assert!(err.contains("SHA-256"), "byte {i}: {err}");
        }
        let mut bad = file.clone();
        bad[MAGIC.len() + 7] = 0xff; // a length past the end
        assert!(
            opened(&bad, false)
                .unwrap_err()
                .to_string()
                .contains("length")
        );
        for len in 0..file.len() {
            assert!(opened(&file[..len], true).is_err(), "truncated to {len}");
        }
        let mut bad = file.clone();
        bad[20] ^= 1;
        // --skip-hash-check: restored as it is.
        assert_eq!(opened(&bad, false).unwrap(), b"some!dump bytes");
    }

    #[test]
    fn an_etcd_bbolt_snapshot_is_named_as_such() {
        let mut bbolt = vec![0u8; 4096];
        bbolt[16..20].copy_from_slice(&BBOLT_MAGIC);
        assert!(
            opened(&bbolt, true)
                .unwrap_err()
                .to_string()
                .contains("bbolt")
        );
        assert!(
            opened(b"hello", true)
                .unwrap_err()
                .to_string()
                .contains("not an etcd-node")
        );
    }
}
