//! The write-ahead log: segmented, preallocated files of CRC-checked records, one fsync per
//! batch (group commit).
//!
//! Layout: `wal/<seq:016x>-<first index:016x>.wal`, each preallocated to the segment size
//! (zeros). A record is `length u32 LE | crc32c u32 LE | kind u8 | payload`, padded with zeros
//! to a multiple of 8; `length` counts kind and payload; the CRC covers them. A zero length
//! marks the end of the written part.
//!
//! Recovery rules:
//! - in the last segment, a record that is cut short or fails its CRC, with no valid record
//!   after it, is a torn write from a crash: it and everything after it is zeroed (the batch it
//!   belonged to was never acknowledged, since acknowledgement follows the fsync);
//! - a bad record with a valid record after it, or in any segment but the last, is corruption:
//!   recovery stops with an error naming the file and offset (never skipped silently);
//! - entries replace any earlier entries at the same index and after (a follower's overwritten
//!   suffix); hard states replace each other; a snapshot marker drops the entries it covers.
//!
//! Invariants: a batch is acknowledged (the call returns) only after its bytes are fsynced,
//! except a batch that only moves the commit index (no entries, same term and vote), which is
//! written without an fsync and becomes durable with the next batch, as etcd does: a crash may
//! lose it, and the member then learns the commit index again from the leader (replaying the
//! key space is idempotent, so a key space ahead of the recovered commit index is harmless); a
//! new segment is fully preallocated, fsynced and renamed into place (directory fsynced) before
//! it is written; every segment starts with the snapshot marker and hard state current when it
//! was opened, so removing older segments ([`Wal::release_to`]) never loses the hard state; a
//! segment named with first index F holds no entry below F written after it was opened.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::codec::{Invalid, PbEntry, PbHardState, decode, encode};
use crate::raft::{Entry, HardState};

/// Default segment size (etcd uses 64 MiB too).
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

const KIND_ENTRY: u8 = 1;
const KIND_HARD_STATE: u8 = 2;
/// A snapshot was persisted at (index, term): entries up to index are no longer needed.
const KIND_SNAPSHOT: u8 = 3;
const HEADER: usize = 8;
/// The kinds this release reads.
const KNOWN_KINDS: [u8; 3] = [KIND_ENTRY, KIND_HARD_STATE, KIND_SNAPSHOT];

/// What is wrong with the WAL.
#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("WAL I/O on {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "WAL corrupt: {path} at offset {offset}: {what}; the log after it cannot be trusted. Restore this member from a snapshot or remove it and add it back (etcdctl member remove/add)"
    )]
    Corrupt {
        path: PathBuf,
        offset: u64,
        what: String,
    },
    /// A whole record (its checksum holds) of a kind this release does not know: a later
    /// release's format. Record kinds are the WAL's version: a format change adds a kind.
    #[error(
        "WAL {path} at offset {offset} holds a record of kind {kind}, which etcd-node {} does not know: a newer release wrote it. Run that release (or a later one) on this data directory; a data directory is not downgraded (docs/operations.md, \"Upgrades and going back\")",
        crate::version::BINARY
    )]
    Newer {
        path: PathBuf,
        offset: u64,
        kind: u8,
    },
    /// Another process holds the WAL directory's lock ([`lock_dir`]).
    #[error(
        "another process has the WAL in {0} open: a member is already running on it. Nothing was changed. Stop that member first (two processes writing one WAL would damage it); if two members were given the same --wal-dir, give each a directory of its own"
    )]
    Locked(PathBuf),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> WalError + '_ {
    move |source| WalError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What recovery found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovered {
    pub hard_state: HardState,
    /// The last snapshot marker: (index, term).
    pub snapshot: (u64, u64),
    /// Entries after the snapshot marker, contiguous.
    pub entries: Vec<Entry>,
    /// Bytes of a torn tail that were zeroed.
    pub torn_bytes: u64,
    /// Bytes a failed fsync had left unsynced, zeroed before reading ([`FSYNC_FAILED`]).
    pub unsynced_bytes: u64,
}

/// An open WAL, positioned after the last valid record.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    segment_bytes: u64,
    file: File,
    path: PathBuf,
    offset: u64,
    seq: u64,
    /// (seq, first index, path) of every segment, oldest first.
    segments: Vec<(u64, u64, PathBuf)>,
    /// The latest hard state and snapshot marker written, repeated at each segment's start.
    hard_state: HardState,
    snapshot: (u64, u64),
    /// Index after the last entry written.
    next_index: u64,
    /// How much of the current segment is durable (fsynced).
    synced: u64,
    /// The directory's lock, held while the WAL is open (None where the file system has no
    /// locks).
    _lock: Option<nix::fcntl::Flock<File>>,
}

/// The note a failed fsync leaves in the WAL directory: `<segment> <durable end> <written end>`
/// ([`Wal::fsync_failed`]).
const FSYNC_FAILED: &str = "fsync-failed";

/// Zeroes what a failed fsync left unsynced ([`Wal::fsync_failed`]), then removes its note.
/// Returns the bytes zeroed.
fn discard_unsynced(dir: &Path) -> Result<u64, WalError> {
    let path = dir.join(FSYNC_FAILED);
    let note = match fs::read_to_string(&path) {
        Ok(note) => note,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err(&path)(e)),
    };
    let fields: Vec<&str> = note.split_whitespace().collect();
    let (segment, from, to) = match fields[..] {
        [segment, from, to] => match (from.parse::<u64>(), to.parse::<u64>()) {
            (Ok(from), Ok(to)) if from <= to && parse_segment_name(segment).is_some() => {
                (dir.join(segment), from, to)
            }
            _ => return Err(bad_note(&path, &note)),
        },
        _ => return Err(bad_note(&path, &note)),
    };
    if segment.exists() {
        let mut file = OpenOptions::new()
            .write(true)
            .open(&segment)
            .map_err(io_err(&segment))?;
        file.seek(SeekFrom::Start(from)).map_err(io_err(&segment))?;
        file.write_all(&vec![0; (to - from) as usize])
            .map_err(io_err(&segment))?;
        file.sync_all().map_err(io_err(&segment))?;
    }
    fs::remove_file(&path).map_err(io_err(&path))?;
    sync_dir(dir)?;
    Ok(to - from)
}

fn bad_note(path: &Path, note: &str) -> WalError {
    WalError::Corrupt {
        path: path.to_path_buf(),
        offset: 0,
        what: format!("the note of a failed fsync reads {note:?}, not \"<segment> <from> <to>\""),
    }
}

fn segment_name(seq: u64, first_index: u64) -> String {
    format!("{seq:016x}-{first_index:016x}.wal")
}

/// The name a segment is created under, before it is preallocated and renamed into place.
fn unfinished_segment_name(seq: u64, first_index: u64) -> String {
    format!("{}{UNFINISHED}", segment_name(seq, first_index))
}

/// What [`unfinished_segment_name`] adds to a segment's name.
const UNFINISHED: &str = ".tmp";

fn parse_segment_name(name: &str) -> Option<(u64, u64)> {
    let stem = name.strip_suffix(".wal")?;
    let (a, b) = stem.split_once('-')?;
    Some((
        u64::from_str_radix(a, 16).ok()?,
        u64::from_str_radix(b, 16).ok()?,
    ))
}

/// Removes what a crash left of a segment being created ([`unfinished_segment_name`]),
/// preallocated but never renamed into place. Nothing was written to it and the log never
/// referred to it, so it holds nothing; left, it would take a segment's worth of disk (64 MiB
/// by default) for good, since the next segment is rarely given the same name.
fn remove_unfinished_segments(dir: &Path) -> Result<(), WalError> {
    let mut removed = false;
    for e in fs::read_dir(dir).map_err(io_err(dir))? {
        let path = e.map_err(io_err(dir))?.path();
        let unfinished = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(UNFINISHED))
            .is_some_and(|stem| parse_segment_name(stem).is_some());
        if unfinished {
            fs::remove_file(&path).map_err(io_err(&path))?;
            tracing::info!(file = %path.display(), "removed a WAL segment a crash left unfinished (it held nothing)");
            removed = true;
        }
    }
    if removed {
        sync_dir(dir)?;
    }
    Ok(())
}

fn pad(len: usize) -> usize {
    (HEADER + len).div_ceil(8) * 8
}

fn frame(buf: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    let len = payload.len() + 1;
    let mut body = Vec::with_capacity(len);
    body.push(kind);
    body.extend_from_slice(payload);
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    buf.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    buf.extend_from_slice(&body);
    buf.resize(buf.len() + pad(len) - HEADER - len, 0);
}

/// A valid record: its kind, payload, and the offset of the next record.
type Record<'a> = (u8, &'a [u8], usize);

/// The record at an offset: Ok(Some(record)), Ok(None) at the end, Err(why) when the bytes
/// there are not a valid record.
fn read_record(data: &[u8], at: usize) -> Result<Option<Record<'_>>, Invalid> {
    if at + HEADER > data.len() {
        return Ok(None);
    }
    let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(data[at + 4..at + 8].try_into().expect("4 bytes"));
    if len == 0 {
        return if crc == 0 {
            Ok(None)
        } else {
            Err(Invalid("zero length with a checksum".into()))
        };
    }
    let end = at + pad(len);
    if at + HEADER + len > data.len() || end > data.len() {
        return Err(Invalid(format!(
            "record of {len} bytes runs past the end of the file"
        )));
    }
    let body = &data[at + HEADER..at + HEADER + len];
    if crc32c::crc32c(body) != crc {
        return Err(Invalid("checksum mismatch".into()));
    }
    Ok(Some((body[0], &body[1..], end)))
}

/// Is there any valid record at an 8-byte aligned offset after `from`?
fn valid_record_after(data: &[u8], from: usize) -> bool {
    (from + 8..data.len())
        .step_by(8)
        .any(|at| matches!(read_record(data, at), Ok(Some(_))))
}

fn sync_dir(dir: &Path) -> Result<(), WalError> {
    super::sync_dir(dir).map_err(io_err(dir))
}

/// Takes an exclusive lock on the WAL directory for as long as the returned value lives
/// ([`super::lock_dir`]): [`WalError::Locked`] when another process holds it.
pub fn lock_dir(dir: &Path) -> Result<Option<nix::fcntl::Flock<File>>, WalError> {
    super::lock_dir(dir, "WAL directory").map_err(|e| {
        if e.kind() == io::ErrorKind::WouldBlock {
            WalError::Locked(dir.to_path_buf())
        } else {
            io_err(dir)(e)
        }
    })
}

/// True if the WAL directories `a` and `b` hold the same segments, byte for byte (a copy of a
/// WAL), read a block at a time.
pub fn same_segments(a: &Path, b: &Path) -> io::Result<bool> {
    let names = |dir: &Path| -> io::Result<Vec<std::ffi::OsString>> {
        let mut names: Vec<_> = fs::read_dir(dir)?
            .filter_map(|e| e.ok().map(|e| e.file_name()))
            .filter(|n| n.to_str().is_some_and(|n| parse_segment_name(n).is_some()))
            .collect();
        names.sort();
        Ok(names)
    };
    let (in_a, in_b) = (names(a)?, names(b)?);
    if in_a != in_b {
        return Ok(false);
    }
    for name in in_a {
        let (fa, fb) = (File::open(a.join(&name))?, File::open(b.join(&name))?);
        if fa.metadata()?.len() != fb.metadata()?.len() {
            return Ok(false);
        }
        let (mut ra, mut rb) = (io::BufReader::new(fa), io::BufReader::new(fb));
        loop {
            use io::BufRead;
            let (ba, bb) = (ra.fill_buf()?, rb.fill_buf()?);
            let n = ba.len().min(bb.len());
            if n == 0 {
                break;
            }
            if ba[..n] != bb[..n] {
                return Ok(false);
            }
            ra.consume(n);
            rb.consume(n);
        }
    }
    Ok(true)
}

/// True if `dir` holds a WAL segment (false if it does not exist).
pub fn holds_segments(dir: &Path) -> io::Result<bool> {
    match fs::read_dir(dir) {
        Ok(entries) => {
            for e in entries {
                if e?
                    .file_name()
                    .to_str()
                    .is_some_and(|n| parse_segment_name(n).is_some())
                {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

impl Wal {
    /// Opens (creating if needed) the WAL in `dir` and recovers its contents.
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<(Wal, Recovered), WalError> {
        super::create_dir_durably(dir).map_err(io_err(dir))?;
        let lock = lock_dir(dir)?;
        let discarded = discard_unsynced(dir)?;
        remove_unfinished_segments(dir)?;
        let Scan {
            mut segments,
            mut rec,
            tail,
            ..
        } = scan(dir, false)?;
        rec.unsynced_bytes = discarded;
        let tail = match (tail, segments.last()) {
            (Some((offset, torn)), Some((_, _, path))) => {
                let mut file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .map_err(io_err(path))?;
                if torn > 0 {
                    // A torn write: zero it (up to the last byte written; the preallocated
                    // rest is zeros already).
                    file.seek(SeekFrom::Start(offset)).map_err(io_err(path))?;
                    file.write_all(&vec![0; torn as usize])
                        .map_err(io_err(path))?;
                }
                // What was read may exist only in the page cache (a process killed between a
                // write and its fsync): it is made durable before the member acts on it (votes,
                // acknowledges entries). An fsync that fails here stops the start.
                file.sync_all().map_err(io_err(path))?;
                Some((file, path.clone(), offset))
            }
            _ => None,
        };
        let next_index = rec
            .entries
            .last()
            .map_or(rec.snapshot.0 + 1, |e| e.index + 1);
        let (file, path, offset, seq) = match tail {
            Some((file, path, offset)) => {
                let seq = segments.last().expect("a tail segment").0;
                (file, path, offset, seq)
            }
            None => {
                let (file, path) = create_segment(dir, 0, next_index, segment_bytes)?;
                segments.push((0, next_index, path.clone()));
                (file, path, 0, 0)
            }
        };
        let mut wal = Wal {
            dir: dir.to_path_buf(),
            segment_bytes,
            file,
            path,
            offset,
            seq,
            segments,
            hard_state: rec.hard_state,
            snapshot: rec.snapshot,
            next_index,
            synced: offset,
            _lock: lock,
        };
        wal.file
            .seek(SeekFrom::Start(wal.offset))
            .map_err(io_err(&wal.path))?;
        Ok((wal, rec))
    }

    /// Appends a hard state and entries as one batch and fsyncs once. Returns after the bytes
    /// are durable, except for a batch that only moves the commit index (see the module notes);
    /// says whether it fsynced.
    pub fn save(
        &mut self,
        hard_state: Option<HardState>,
        entries: &[Entry],
    ) -> Result<bool, WalError> {
        if hard_state.is_none() && entries.is_empty() {
            return Ok(false);
        }
        let mut buf = Vec::new();
        for e in entries {
            frame(&mut buf, KIND_ENTRY, &encode(&PbEntry::from(e)));
        }
        if let Some(hs) = hard_state {
            frame(&mut buf, KIND_HARD_STATE, &encode(&PbHardState::from(hs)));
        }
        let first = entries.first().map_or(self.next_index, |e| e.index);
        let commit_only = entries.is_empty()
            && hard_state.is_some_and(|hs| {
                (hs.term, hs.vote) == (self.hard_state.term, self.hard_state.vote)
            });
        self.write(&buf, first, !commit_only)?;
        if let Some(last) = entries.last() {
            self.next_index = last.index + 1;
        }
        if let Some(hs) = hard_state {
            self.hard_state = hs;
        }
        Ok(!commit_only)
    }

    /// Records that a snapshot at (index, term) is durable: recovery drops entries up to it, and
    /// segments holding only such entries can be removed ([`Wal::release_to`]).
    pub fn mark_snapshot(&mut self, index: u64, term: u64) -> Result<(), WalError> {
        let mut buf = Vec::new();
        frame_snapshot(&mut buf, (index, term));
        self.write(&buf, self.next_index.max(index + 1), true)?;
        self.snapshot = (index, term);
        self.next_index = self.next_index.max(index + 1);
        Ok(())
    }

    /// Writes `buf`, in a new segment (named with `first_index`) if it does not fit; fsyncs if
    /// `sync`.
    fn write(&mut self, buf: &[u8], first_index: u64, sync: bool) -> Result<(), WalError> {
        let prologue = 2 * pad(64) as u64; // the repeated snapshot marker and hard state
        if self.offset > 0 && self.offset + buf.len() as u64 + prologue > self.segment_bytes {
            self.roll(first_index)?;
        }
        crate::storage_error!(
            "wal-write-enospc",
            crate::failpoint::ENOSPC,
            io_err(&self.path)
        );
        self.file.write_all(buf).map_err(io_err(&self.path))?;
        self.offset += buf.len() as u64;
        if sync {
            crate::crash!("wal-before-fsync");
            self.sync_data().map_err(|e| self.fsync_failed(e))?;
            self.synced = self.offset;
            crate::crash!("wal-after-fsync");
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        crate::storage_error!("wal-fsync-eio", crate::failpoint::EIO, |e| e);
        // (a slow disk: `FAILPOINTS=wal-fsync-stall=sleep(ms)`)
        fail::fail_point!("wal-fsync-stall");
        self.file.sync_data()
    }

    /// An fsync failed. The pages it was to write may be gone from the disk while the page
    /// cache still shows them (Linux marks them clean after a failed writeback), so a restart
    /// in the same boot would read the unsynced bytes back as if they were durable, and could
    /// acknowledge them (PostgreSQL's "fsyncgate"). This notes where the durable part of the
    /// log ends ([`FSYNC_FAILED`]); the next open zeroes what follows before reading the log.
    /// Nothing past that point was acknowledged: acknowledgements follow the fsync.
    fn fsync_failed(&self, e: io::Error) -> WalError {
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        let note = format!(
            "{} {} {}\n",
            name.unwrap_or_default(),
            self.synced,
            self.offset
        );
        let tmp = self.dir.join(format!("{FSYNC_FAILED}.tmp"));
        let noted = fs::write(&tmp, note)
            .and_then(|()| File::open(&tmp)?.sync_all())
            .and_then(|()| fs::rename(&tmp, self.dir.join(FSYNC_FAILED)))
            .map_err(io_err(&tmp))
            .and_then(|()| sync_dir(&self.dir));
        if let Err(n) = noted {
            eprintln!(
                "could not note where the WAL's durable part ends ({n}): if this member is \
                 started again before the machine restarts, it may trust WAL bytes that are not \
                 on the disk; restart the machine first"
            );
        }
        io_err(&self.path)(e)
    }

    /// Starts the next segment (the current one is complete and fsynced).
    fn roll(&mut self, first_index: u64) -> Result<(), WalError> {
        self.file.sync_all().map_err(|e| self.fsync_failed(e))?;
        let seq = self.seq + 1;
        let (file, path) = create_segment(&self.dir, seq, first_index, self.segment_bytes)?;
        self.segments.push((seq, first_index, path.clone()));
        (self.file, self.path, self.offset, self.seq) = (file, path, 0, seq);
        self.synced = 0;
        let mut prologue = Vec::new();
        frame_snapshot(&mut prologue, self.snapshot);
        frame(
            &mut prologue,
            KIND_HARD_STATE,
            &encode(&PbHardState::from(self.hard_state)),
        );
        self.file.write_all(&prologue).map_err(io_err(&self.path))?;
        self.offset = prologue.len() as u64;
        Ok(())
    }

    /// Removes segments whose entries all lie at or below `index` (covered by a snapshot).
    pub fn release_to(&mut self, index: u64) -> Result<(), WalError> {
        while self.segments.len() > 1 {
            if self.segments[1].1 > index + 1 {
                break;
            }
            let (_, _, path) = self.segments.remove(0);
            fs::remove_file(&path).map_err(io_err(&path))?;
        }
        sync_dir(&self.dir)
    }

    /// Segment files, oldest first.
    pub fn segment_paths(&self) -> Vec<PathBuf> {
        self.segments.iter().map(|(_, _, p)| p.clone()).collect()
    }
}

/// What reading every segment found, before anything is changed.
struct Scan {
    /// (seq, first index, path) of every segment, oldest first.
    segments: Vec<(u64, u64, PathBuf)>,
    rec: Recovered,
    /// In the last segment: the offset after its last valid record, and how many bytes after
    /// that are a torn write.
    tail: Option<(u64, u64)>,
    /// The first record of the first segment ever written (sequence 0), when it is a snapshot
    /// marker: the snapshot the member began from.
    first_marker: Option<(u64, u64)>,
}

/// Reads every record of every segment in `dir` (see the module notes for the rules), changing
/// nothing. `keep_covered`: keep the entries a snapshot marker covers (while their segment
/// exists), and restart the list at a gap (entries a snapshot replaced).
fn scan(dir: &Path, keep_covered: bool) -> Result<Scan, WalError> {
    let mut segments: Vec<(u64, u64, PathBuf)> = fs::read_dir(dir)
        .map_err(io_err(dir))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (seq, first) = parse_segment_name(&name)?;
            Some((seq, first, e.path()))
        })
        .collect();
    segments.sort();
    let mut rec = Recovered::default();
    let mut tail = None;
    let mut first_marker = None;
    let count = segments.len();
    for (i, (seq, _, path)) in segments.iter().enumerate() {
        let data = fs::read(path).map_err(io_err(path))?;
        if *seq == 0
            && let Ok(Some((KIND_SNAPSHOT, payload, _))) = read_record(&data, 0)
            && let Ok(marker) = parse_snapshot_marker(payload)
        {
            first_marker = Some(marker);
        }
        let last = i + 1 == count;
        let mut at = 0;
        let mut torn = 0;
        loop {
            match read_record(&data, at) {
                Ok(Some((kind, _, _))) if !KNOWN_KINDS.contains(&kind) => {
                    return Err(WalError::Newer {
                        path: path.clone(),
                        offset: at as u64,
                        kind,
                    });
                }
                Ok(Some((kind, payload, next))) => {
                    apply(&mut rec, kind, payload, keep_covered).map_err(|what| {
                        WalError::Corrupt {
                            path: path.clone(),
                            offset: at as u64,
                            what: what.to_string(),
                        }
                    })?;
                    at = next;
                }
                Ok(None) => break,
                Err(what) => {
                    if !last || valid_record_after(&data, at) {
                        return Err(WalError::Corrupt {
                            path: path.clone(),
                            offset: at as u64,
                            what: what.to_string(),
                        });
                    }
                    torn = data[at..]
                        .iter()
                        .rposition(|&b| b != 0)
                        .map_or(0, |l| l + 1);
                    rec.torn_bytes = torn as u64;
                    break;
                }
            }
        }
        if last {
            tail = Some((at as u64, torn as u64));
        }
    }
    Ok(Scan {
        segments,
        rec,
        tail,
        first_marker,
    })
}

/// Everything the WAL in `dir` still holds, changing nothing (for `etcdutl wal dump`, safe on
/// a running member's directory): the last hard state, the entries in index order (each index
/// as last written, entries a snapshot covers included while their segment exists, starting
/// after the last gap a snapshot left), and the length of a torn tail (not read; a running
/// member may be writing it).
pub fn read_only(dir: &Path) -> Result<LogContents, WalError> {
    let scan = scan(dir, true)?;
    let from_first_snapshot = scan.first_marker.filter(|(index, _)| {
        scan.rec
            .entries
            .first()
            .is_none_or(|e| e.index == index + 1)
    });
    Ok(LogContents {
        rec: scan.rec,
        from_first_snapshot,
    })
}

/// What [`read_only`] found.
#[derive(Debug)]
pub struct LogContents {
    pub rec: Recovered,
    /// The snapshot the member began from (index, term: a new cluster's starting position, a
    /// restored snapshot, or the first snapshot a joining member received), when the entries
    /// run on from it unbroken (nothing released or replaced by a later snapshot since).
    pub from_first_snapshot: Option<(u64, u64)>,
}

fn frame_snapshot(buf: &mut Vec<u8>, (index, term): (u64, u64)) {
    let mut payload = Vec::with_capacity(16);
    payload.extend_from_slice(&index.to_le_bytes());
    payload.extend_from_slice(&term.to_le_bytes());
    frame(buf, KIND_SNAPSHOT, &payload);
}

fn create_segment(
    dir: &Path,
    seq: u64,
    first_index: u64,
    bytes: u64,
) -> Result<(File, PathBuf), WalError> {
    let path = dir.join(segment_name(seq, first_index));
    let tmp = dir.join(unfinished_segment_name(seq, first_index));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    // Blocks allocated now (not a sparse file): a full disk refuses a new segment here, before
    // anything is written to it, never in the middle of a record (as etcd's preallocation).
    let len = i64::try_from(bytes).unwrap_or(i64::MAX);
    nix::fcntl::posix_fallocate(&file, 0, len).map_err(|e| io_err(&tmp)(e.into()))?;
    file.sync_all().map_err(io_err(&tmp))?;
    crate::crash!("wal-segment-before-rename");
    fs::rename(&tmp, &path).map_err(io_err(&path))?;
    sync_dir(dir)?;
    Ok((file, path))
}

/// A snapshot marker's (index, term).
fn parse_snapshot_marker(payload: &[u8]) -> Result<(u64, u64), Invalid> {
    if payload.len() != 16 {
        return Err(Invalid("snapshot marker of the wrong size".into()));
    }
    let index = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
    let term = u64::from_le_bytes(payload[8..].try_into().expect("8 bytes"));
    Ok((index, term))
}

/// Applies one recovered record.
fn apply(rec: &mut Recovered, kind: u8, payload: &[u8], keep_covered: bool) -> Result<(), Invalid> {
    match kind {
        KIND_ENTRY => {
            let e: Entry = decode::<PbEntry>("entry", payload)?.try_into()?;
            if e.index <= rec.snapshot.0 && !keep_covered {
                return Ok(()); // covered by the snapshot
            }
            let Some(first) = rec.entries.first().map(|f| f.index) else {
                // The first entry kept (older segments may have been released).
                rec.entries.push(e);
                return Ok(());
            };
            let next = rec.entries.last().map_or(first, |l| l.index + 1);
            if e.index > next && keep_covered {
                rec.entries.clear(); // a snapshot replaced the entries between
                rec.entries.push(e);
                return Ok(());
            }
            if e.index > next {
                return Err(Invalid(format!(
                    "entry {} leaves a gap after {}",
                    e.index,
                    next - 1
                )));
            }
            if e.index < first {
                return Err(Invalid(format!(
                    "entry {} before the first entry {first}",
                    e.index
                )));
            }
            rec.entries.truncate((e.index - first) as usize);
            rec.entries.push(e);
        }
        KIND_HARD_STATE => {
            rec.hard_state = decode::<PbHardState>("hard state", payload)?.into();
        }
        KIND_SNAPSHOT => {
            let (index, term) = parse_snapshot_marker(payload)?;
            if !keep_covered {
                rec.entries.retain(|e| e.index > index);
            }
            rec.snapshot = rec.snapshot.max((index, term));
        }
        k => return Err(Invalid(format!("unknown record kind {k}"))),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::EntryData;

    fn entry(index: u64, term: u64) -> Entry {
        Entry {
            term,
            subterm: 0,
            index,
            data: EntryData::Normal(format!("e{index}t{term}").into_bytes()),
        }
    }

    fn hs(term: u64, commit: u64) -> HardState {
        HardState {
            term,
            vote: 1,
            commit,
            // (what the member knows of its witness is kept with the hard state)
            witness: Some(crate::raft::KnownWitness {
                id: 3,
                seen: witness_core::Seen {
                    generation: 0xabc,
                    term,
                    log_term: term,
                    log_subterm: 1,
                },
            }),
        }
    }

    #[test]
    fn batches_survive_reopen_and_later_entries_replace_a_suffix() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut wal, rec) = Wal::open(dir.path(), 4096).unwrap();
            assert_eq!(rec, Recovered::default());
            wal.save(Some(hs(1, 0)), &[entry(1, 1), entry(2, 1), entry(3, 1)])
                .unwrap();
            wal.save(Some(hs(2, 2)), &[entry(3, 2)]).unwrap();
        }
        let (mut wal, rec) = Wal::open(dir.path(), 4096).unwrap();
        assert_eq!(rec.hard_state, hs(2, 2));
        assert_eq!(rec.entries, vec![entry(1, 1), entry(2, 1), entry(3, 2)]);
        wal.save(None, &[entry(4, 2)]).unwrap();
        drop(wal);
        let (_, rec) = Wal::open(dir.path(), 4096).unwrap();
        assert_eq!(rec.entries.len(), 4);
    }

    #[test]
    fn only_a_batch_that_moves_nothing_but_the_commit_index_skips_the_fsync() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 4096).unwrap();
        assert!(wal.save(Some(hs(1, 0)), &[]).unwrap(), "a new term");
        assert!(wal.save(Some(hs(1, 0)), &[entry(1, 1)]).unwrap(), "entries");
        assert!(!wal.save(Some(hs(1, 1)), &[]).unwrap(), "commit only");
        assert!(wal.save(None, &[entry(2, 1)]).unwrap(), "entries");
        let vote = HardState {
            vote: 2,
            ..hs(1, 1)
        };
        assert!(wal.save(Some(vote), &[]).unwrap(), "a vote");
        assert!(wal.save(Some(hs(2, 1)), &[]).unwrap(), "a term");
        assert!(!wal.save(Some(hs(2, 2)), &[]).unwrap(), "commit only");
        drop(wal);
        // Written all the same: a clean reopen finds it.
        let (_, rec) = Wal::open(dir.path(), 4096).unwrap();
        assert_eq!(rec.hard_state, hs(2, 2));
    }

    #[test]
    fn segments_roll_and_are_released_behind_a_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 1024).unwrap();
        for i in 1..=100 {
            wal.save(Some(hs(1, i - 1)), &[entry(i, 1)]).unwrap();
        }
        let segments = wal.segment_paths().len();
        assert!(segments > 3, "{segments} segments");
        for p in wal.segment_paths() {
            assert_eq!(fs::metadata(&p).unwrap().len(), 1024, "preallocated");
        }
        wal.mark_snapshot(60, 1).unwrap();
        wal.release_to(60).unwrap();
        assert!(wal.segment_paths().len() < segments);
        drop(wal);
        let (_, rec) = Wal::open(dir.path(), 1024).unwrap();
        assert_eq!(rec.snapshot, (60, 1));
        assert_eq!(rec.entries.first().map(|e| e.index), Some(61));
        assert_eq!(rec.entries.len(), 40, "contiguous 61..=100");
        assert_eq!(rec.entries.last().map(|e| e.index), Some(100));
        assert_eq!(rec.hard_state, hs(1, 99));
    }

    fn only_segment(dir: &Path) -> PathBuf {
        let mut files: Vec<PathBuf> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(files.len(), 1);
        files.pop().unwrap()
    }

    #[test]
    fn a_segment_a_crash_left_unfinished_is_removed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 4096).unwrap();
        wal.save(Some(hs(1, 2)), &[entry(1, 1), entry(2, 1)])
            .unwrap();
        drop(wal);
        // What a crash at `wal-segment-before-rename` leaves, and a file that is not the WAL's.
        let unfinished = dir.path().join(unfinished_segment_name(1, 3));
        fs::write(&unfinished, vec![0; 4096]).unwrap();
        let other = dir.path().join("notes.tmp");
        fs::write(&other, b"kept").unwrap();
        let (_, rec) = Wal::open(dir.path(), 4096).unwrap();
        assert!(!unfinished.exists(), "the unfinished segment is removed");
        assert!(other.exists(), "a file the WAL did not name is left alone");
        assert_eq!(rec.entries, vec![entry(1, 1), entry(2, 1)]);
        assert_eq!(rec.hard_state, hs(1, 2));
    }

    /// A second open of a WAL directory while the first is open (a second member started on
    /// the same `--wal-dir` or data directory) stops before it reads or changes anything.
    #[test]
    fn a_wal_directory_is_opened_by_one_member_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let wal_dir = dir.path().join("a/b/wal");
        let (mut wal, _) = Wal::open(&wal_dir, 4096).unwrap();
        wal.save(Some(hs(1, 1)), &[entry(1, 1)]).unwrap();
        assert!(holds_segments(&wal_dir).unwrap());
        assert!(!holds_segments(&dir.path().join("nothing")).unwrap());
        assert!(!holds_segments(dir.path()).unwrap());
        let segment = fs::read(only_segment(&wal_dir)).unwrap();
        let err = Wal::open(&wal_dir, 4096).unwrap_err();
        assert!(matches!(err, WalError::Locked(_)), "{err}");
        assert!(
            err.to_string()
                .contains("a member is already running on it"),
            "{err}"
        );
        assert_eq!(
            fs::read(only_segment(&wal_dir)).unwrap(),
            segment,
            "nothing changed"
        );
        drop(wal);
        let (_, rec) = Wal::open(&wal_dir, 4096).unwrap();
        assert_eq!(rec.entries, vec![entry(1, 1)]);
    }

    #[test]
    fn a_torn_tail_is_truncated_and_the_rest_kept() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 4096).unwrap();
        wal.save(Some(hs(1, 1)), &[entry(1, 1)]).unwrap();
        let good = wal.offset;
        wal.save(Some(hs(1, 2)), &[entry(2, 1)]).unwrap();
        let end = wal.offset;
        drop(wal);
        // A crash in the middle of the second batch: only its first bytes reached the disk (a
        // few bytes into its first record, whatever the records' sizes).
        let path = only_segment(dir.path());
        let mut data = fs::read(&path).unwrap();
        let torn = good as usize + 6;
        assert!((torn as u64) < end);
        data[torn..end as usize].fill(0);
        fs::write(&path, &data).unwrap();
        let (mut wal, rec) = Wal::open(dir.path(), 4096).unwrap();
        assert_eq!(rec.entries, vec![entry(1, 1)]);
        assert_eq!(rec.hard_state, hs(1, 1));
        // What counts is what was written, not the zeroed rest of the preallocated segment.
        assert!((1..=6).contains(&rec.torn_bytes), "{}", rec.torn_bytes);
        // Writing continues where the valid log ends.
        wal.save(None, &[entry(2, 2)]).unwrap();
        drop(wal);
        let (_, rec) = Wal::open(dir.path(), 4096).unwrap();
        assert_eq!(rec.entries, vec![entry(1, 1), entry(2, 2)]);
        assert_eq!(rec.torn_bytes, 0);
    }

    /// A batch whose fsync failed is in the page cache, valid to every reader, but may not be on
    /// the disk: the note the failure leaves makes the next open discard it (and only it).
    #[test]
    fn a_batch_whose_fsync_failed_is_discarded_at_the_next_open() {
        let unsynced_batch = |noted: bool| {
            let dir = tempfile::tempdir().unwrap();
            let (mut wal, _) = Wal::open(dir.path(), 4096).unwrap();
            wal.save(Some(hs(1, 1)), &[entry(1, 1)]).unwrap();
            let mut buf = Vec::new();
            frame(&mut buf, KIND_ENTRY, &encode(&PbEntry::from(&entry(2, 1))));
            wal.write(&buf, 2, false).unwrap();
            if noted {
                let e = wal.fsync_failed(io::Error::from_raw_os_error(5));
                assert!(e.to_string().contains("Input/output error"), "{e}");
                assert!(dir.path().join(FSYNC_FAILED).exists());
            }
            drop(wal);
            let (wal, rec) = Wal::open(dir.path(), 4096).unwrap();
            assert!(!dir.path().join(FSYNC_FAILED).exists());
            (dir, wal, rec, buf.len() as u64)
        };
        // (without the note, the bytes in the page cache read as a valid batch)
        let (_, _, rec, _) = unsynced_batch(false);
        assert_eq!(rec.entries, vec![entry(1, 1), entry(2, 1)]);
        let (dir, mut wal, rec, len) = unsynced_batch(true);
        assert_eq!(rec.entries, vec![entry(1, 1)]);
        assert_eq!((rec.unsynced_bytes, rec.torn_bytes), (len, 0));
        // Writing continues where the durable log ended.
        wal.save(None, &[entry(2, 2)]).unwrap();
        drop(wal);
        let (_, rec) = Wal::open(dir.path(), 4096).unwrap();
        assert_eq!(rec.entries, vec![entry(1, 1), entry(2, 2)]);
        assert_eq!(rec.unsynced_bytes, 0);
    }

    #[test]
    fn a_malformed_fsync_note_stops_the_open_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        drop(Wal::open(dir.path(), 4096).unwrap());
        fs::write(dir.path().join(FSYNC_FAILED), "garbage\n").unwrap();
        let e = Wal::open(dir.path(), 4096).unwrap_err().to_string();
        assert!(e.contains(FSYNC_FAILED) && e.contains("garbage"), "{e}");
    }

    #[test]
    fn a_record_of_a_later_format_is_refused_as_newer_not_as_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 4096).unwrap();
        wal.save(None, &[entry(1, 1)]).unwrap();
        let end = wal.offset as usize;
        drop(wal);
        let path = only_segment(dir.path());
        let mut data = fs::read(&path).unwrap();
        let mut record = Vec::new();
        frame(&mut record, 9, b"from a later release");
        data[end..end + record.len()].copy_from_slice(&record);
        fs::write(&path, &data).unwrap();
        let err = Wal::open(dir.path(), 4096).unwrap_err().to_string();
        assert!(
            err.contains("record of kind 9") && err.contains("a newer release wrote it"),
            "{err}"
        );
        assert!(!err.contains("corrupt"), "{err}");
        assert_eq!(fs::read(&path).unwrap(), data, "nothing was changed");
    }

    #[test]
    fn corruption_in_the_middle_is_reported_not_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path(), 4096).unwrap();
        wal.save(None, &[entry(1, 1)]).unwrap();
        let first_end = wal.offset as usize;
        wal.save(None, &[entry(2, 1)]).unwrap();
        wal.save(None, &[entry(3, 1)]).unwrap();
        drop(wal);
        let path = only_segment(dir.path());
        let mut data = fs::read(&path).unwrap();
        data[first_end + HEADER + 3] ^= 0x40; // a bit flip inside entry 2
        fs::write(&path, &data).unwrap();
        let err = Wal::open(dir.path(), 4096).unwrap_err().to_string();
        assert!(
            err.contains("corrupt") && err.contains(&format!("offset {first_end}")),
            "{err}"
        );
        assert!(err.contains("checksum"), "{err}");
        // Nothing was changed by the failed recovery.
        assert_eq!(fs::read(&path).unwrap(), data);
    }
}
