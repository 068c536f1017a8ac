//! `MountStore`: the witness state as versioned files in one directory on a shared mount.
//!
//! Layout: `<seq>.st` (20-digit zero-padded sequence number) holds one framed witness record;
//! `<node>.<seq>.<nonce>.tmp` is a writer's temporary file. See `docs/witness-format.md`.
//!
//! Invariants:
//! - a `<seq>.st` file is complete and fsynced before it gets its name (write temp, fsync,
//!   `link()`, fsync the directory): a reader never sees a partial record;
//! - `link()` fails if the name exists, so of racing writers holding the same version exactly
//!   one creates `<seq+1>.st`; a failed link whose target exists (`EEXIST`, or `EPERM` over
//!   SFTP) is resolved by comparing the writer nonce stored in the target with ours, which also
//!   covers an NFS `LINK` retransmitted after a lost reply;
//! - the newest version is never removed; clean-up removes versions older than the newest
//!   `retention` in ascending order, so if `<v+1>.st` was ever removed then `<v>.st` was removed
//!   before it. A writer that linked `<v+1>.st` therefore checks that `<v>.st` still holds the
//!   nonce it loaded; if not, `<v+2>.st` tells whether others built on our write (its
//!   `previous_nonce` is ours) or we filled a gap left by clean-up, which we undo (a writer
//!   stalled for a long time can never overwrite history);
//! - the latest version is found by opening names forward from the last one seen (open by name
//!   revalidates on NFS); the directory listing is used only when there is no hint and for
//!   clean-up, and a listing with no version (perhaps cached from before the witness existed)
//!   makes the names be tried from version 0 before the witness counts as absent.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use witness_core::{CasOutcome, Error, Loaded, Result, Version, WitnessState, WitnessStore, codec};

use crate::errors::io_error;

const NO_HINT: u64 = u64::MAX;
const STATE_SUFFIX: &str = ".st";
const TEMP_SUFFIX: &str = ".tmp";

/// Tuning for a [`MountStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    /// How many of the newest versions to keep (at least 2).
    pub retention: usize,
    /// Temporary files older than this are a crashed writer's and are removed.
    pub temp_grace: Duration,
    /// This writer's name in temporary file names (default: host name and process id).
    pub node: String,
}

impl Default for MountOptions {
    fn default() -> Self {
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_else(|| "node".into());
        MountOptions {
            retention: 8,
            temp_grace: Duration::from_secs(600),
            node: format!("{}-{}", sanitize(&host), std::process::id()),
        }
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A witness store on a mounted directory.
#[derive(Debug, Clone)]
pub struct MountStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    options: MountOptions,
    /// The newest sequence number seen, or [`NO_HINT`].
    hint: AtomicU64,
    /// How many times the directory was listed (tests).
    #[cfg(test)]
    listings: AtomicU64,
    /// Listings show no version, as a directory cache from before the witness was initialised
    /// would (tests).
    #[cfg(test)]
    empty_listings: std::sync::atomic::AtomicBool,
    /// Runs once right after a compare-and-swap linked its version: a writer stalled there
    /// (tests).
    #[cfg(test)]
    after_link: std::sync::Mutex<Option<tests::Stall>>,
}

/// How many names past a missing version `find_latest` tries before listing the directory
/// again. Versions only grow, so a missing one was cleaned up behind newer ones; a listing can
/// lag the names for a while on a network file system (an NFS client's or sshfs's directory
/// cache: seconds, and many versions under load), and listing again would return the same
/// stale names. The tries step by the retention (the newest `retention` versions are always
/// there, so a step that size cannot jump over them), so they reach this many times the
/// retention ahead.
const PROBES_AHEAD: u64 = 256;

/// Checks that `dir` exists and is a directory.
pub(crate) fn check_is_directory(dir: &Path) -> Result<()> {
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(Error::NotADirectory {
            location: dir.display().to_string(),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Error::NoSuchDirectory {
            location: dir.display().to_string(),
        }),
        Err(e) => Err(io_error("open", dir, e)),
    }
}

/// A mount version is `<seq>:<nonce hex>`; the nonce is unknown for a record that did not decode.
fn format_version(seq: u64, nonce: Option<u64>) -> Version {
    match nonce {
        Some(n) => Version::new(format!("{seq}:{n:016x}")),
        None => Version::new(seq.to_string()),
    }
}

fn parse_version(v: &Version) -> Option<(u64, Option<u64>)> {
    match v.as_str().split_once(':') {
        Some((seq, nonce)) => Some((
            seq.parse().ok()?,
            Some(u64::from_str_radix(nonce, 16).ok()?),
        )),
        None => Some((v.as_str().parse().ok()?, None)),
    }
}

fn state_name(seq: u64) -> String {
    format!("{seq:020}{STATE_SUFFIX}")
}

fn parse_state_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(STATE_SUFFIX)?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

impl MountStore {
    /// Opens the witness directory `dir` (which must exist).
    pub fn open(dir: impl Into<PathBuf>, options: MountOptions) -> Result<Self> {
        let dir = dir.into();
        assert!(
            options.retention >= 2,
            "MountOptions::retention must be at least 2"
        );
        check_is_directory(&dir)?;
        Ok(MountStore {
            inner: Arc::new(Inner {
                dir,
                options,
                hint: AtomicU64::new(NO_HINT),
                #[cfg(test)]
                listings: AtomicU64::new(0),
                #[cfg(test)]
                empty_listings: std::sync::atomic::AtomicBool::new(false),
                #[cfg(test)]
                after_link: std::sync::Mutex::new(None),
            }),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Sequence numbers of the stored versions, ascending (from the directory listing).
    pub fn list_versions(&self) -> Result<Vec<u64>> {
        self.inner.list().map(|(versions, _)| versions)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Inner) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .expect("witness mount I/O task panicked")
    }
}

/// A version's record as found on disk.
struct Found {
    seq: u64,
    bytes: Vec<u8>,
}

impl Inner {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// (state sequence numbers ascending, temp file names).
    fn list(&self) -> Result<(Vec<u64>, Vec<String>)> {
        #[cfg(test)]
        self.listings.fetch_add(1, Ordering::Relaxed);
        #[cfg(test)]
        if self.empty_listings.load(Ordering::Relaxed) {
            return Ok((Vec::new(), Vec::new()));
        }
        let mut versions = Vec::new();
        let mut temps = Vec::new();
        let entries = fs::read_dir(&self.dir).map_err(|e| match e.kind() {
            // The share is gone (unmounted, renamed, deleted): say so, not "failed to list".
            io::ErrorKind::NotFound => Error::NoSuchDirectory {
                location: self.dir.display().to_string(),
            },
            _ => io_error("list", &self.dir, e),
        })?;
        for entry in entries {
            let entry = entry.map_err(|e| io_error("list", &self.dir, e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if let Some(seq) = parse_state_name(&name) {
                versions.push(seq);
            } else if name.ends_with(TEMP_SUFFIX) && !name.starts_with(".witness-probe") {
                temps.push(name);
            }
        }
        versions.sort_unstable();
        Ok((versions, temps))
    }

    /// Opens `<seq>.st`; `Ok(None)` if it does not exist.
    fn open_version(&self, seq: u64) -> Result<Option<File>> {
        let path = self.path(&state_name(seq));
        match File::open(&path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_error("open", &path, e)),
        }
    }

    fn read_file(&self, mut f: File, seq: u64) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        f.read_to_end(&mut bytes)
            .map_err(|e| io_error("read", &self.path(&state_name(seq)), e))?;
        Ok(bytes)
    }

    /// Finds and reads the newest version by probing forward from the hint.
    fn find_latest(&self) -> Result<Option<Found>> {
        for _ in 0..8 {
            // A listing with no version may be a directory cache from before the witness was
            // initialised (an NFS client's or sshfs's, for up to a minute; seen as a spurious
            // "not initialised" on a cached sshfs mount): the names are tried from the first
            // version on before the witness counts as absent.
            let (start, listed_none) = match self.hint.load(Ordering::Acquire) {
                NO_HINT => match self.list()?.0.last() {
                    Some(&seq) => (seq, false),
                    None => (0, true),
                },
                seq => (seq, false),
            };
            // Missing: removed by clean-up (we are behind: newer versions follow it) or the
            // directory was reset. Look a little further first, then list again.
            let step = self.options.retention as u64;
            let mut found = None;
            for seq in (0..=PROBES_AHEAD).map(|n| start.saturating_add(n * step)) {
                if let Some(file) = self.open_version(seq)? {
                    found = Some((seq, file));
                    break;
                }
            }
            let Some((mut seq, mut file)) = found else {
                if listed_none {
                    return Ok(None);
                }
                self.hint.store(NO_HINT, Ordering::Release);
                continue;
            };
            while let Some(next) = self.open_version(seq + 1)? {
                file = next;
                seq += 1;
            }
            let bytes = self.read_file(file, seq)?;
            self.hint.store(seq, Ordering::Release);
            return Ok(Some(Found { seq, bytes }));
        }
        Err(Error::Io {
            op: "find the newest version in",
            location: self.dir.display().to_string(),
            source: io::Error::other(
                "versions keep disappearing while probing; is another process deleting them?",
            ),
        })
    }

    fn load(&self) -> Result<Option<Loaded>> {
        let Some(Found { seq, bytes }) = self.find_latest()? else {
            return Ok(None);
        };
        let location = self.path(&state_name(seq)).display().to_string();
        let state = codec::decode(&bytes).map_err(|source| Error::Corrupt {
            location,
            version: format_version(seq, None),
            source,
        })?;
        let version = format_version(seq, Some(state.writer_nonce));
        Ok(Some(Loaded { state, version }))
    }

    /// Writes `bytes` to a new temp file and fsyncs it.
    fn write_temp(&self, seq: u64, nonce: u64, bytes: &[u8]) -> Result<PathBuf> {
        let path = self.path(&format!(
            "{}.{seq}.{nonce:016x}{TEMP_SUFFIX}",
            self.options.node
        ));
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io_error("create", &path, e))?;
        let written = f
            .write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| io_error("write", &path, e));
        if let Err(e) = written {
            let _ = fs::remove_file(&path);
            return Err(e);
        }
        Ok(path)
    }

    fn sync_dir(&self) -> Result<()> {
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_error("fsync", &self.dir, e))
    }

    /// Decodes `<seq>.st` and returns its writer nonce, `None` if absent or undecodable.
    fn nonce_of(&self, seq: u64) -> Result<Option<u64>> {
        let Some(f) = self.open_version(seq)? else {
            return Ok(None);
        };
        let bytes = self.read_file(f, seq)?;
        Ok(codec::decode(&bytes).ok().map(|s| s.writer_nonce))
    }

    /// Links a temp file holding `state` to `<seq>.st`. `Ok(true)` if this writer owns the name.
    fn link_version(&self, seq: u64, state: &WitnessState) -> Result<bool> {
        let bytes = codec::encode(state);
        let temp = self.write_temp(seq, state.writer_nonce, &bytes)?;
        let target = self.path(&state_name(seq));
        let linked = match fs::hard_link(&temp, &target) {
            Ok(()) => Ok(true),
            // The name exists: another writer won, or our own LINK was retransmitted after a
            // lost reply. The nonce in the target says which (0 is no nonce: never ours).
            // Not every file system says EEXIST: over SFTP (sshfs) a link onto an existing name
            // fails with EPERM. So whatever the error, if the target is there now, it decides.
            Err(e) => match self.nonce_of(seq) {
                Ok(Some(n)) => Ok(state.writer_nonce != 0 && n == state.writer_nonce),
                Ok(None) if self.open_version(seq)?.is_some() => Ok(false),
                Ok(None) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
                Ok(None) => Err(io_error("link", &target, e)),
                Err(read_err) => Err(read_err),
            },
        };
        let _ = fs::remove_file(&temp);
        linked
    }

    /// After linking `<seq>.st` on top of `expected`: is the predecessor still the version we
    /// computed from? If not, clean-up removed it, before our link or after it.
    fn predecessor_intact(&self, expected_seq: u64, expected_nonce: Option<u64>) -> Result<bool> {
        match expected_nonce {
            Some(n) => Ok(self.nonce_of(expected_seq)? == Some(n)),
            None => Ok(self.open_version(expected_seq)?.is_some()),
        }
    }

    /// Our `<seq>.st` (writer nonce `ours`) is linked, but its predecessor is gone. Either others
    /// built on our write and went more than the retention past it, so clean-up removed the
    /// predecessor after our link (the write stands), or clean-up had removed the predecessor
    /// and `<seq>.st` before we linked (we filled a gap and must undo). The version after ours
    /// tells which: the one built on ours names our nonce as its `previous_nonce` (the witness
    /// client sets it to the nonce of the state it computed from). Without it
    /// (our successor is gone, or was written by a release that did not record the field) the
    /// outcome is unknown: our file is removed and the caller re-reads. `Ok(true)`: the write
    /// stands; `Ok(false)`: it was a gap, now undone.
    fn settle_without_predecessor(&self, seq: u64, ours: u64) -> Result<bool> {
        let target = self.path(&state_name(seq));
        let unknown = |why: &str| Error::Io {
            op: "learn the outcome of a compare-and-swap in",
            location: self.dir.display().to_string(),
            source: io::Error::new(io::ErrorKind::Interrupted, why.to_owned()),
        };
        let successor = match self.open_version(seq + 1)? {
            Some(f) => Some(codec::decode(&self.read_file(f, seq + 1)?).ok()),
            None => None,
        };
        match successor.map(|s| s.map_or(0, |s| s.previous_nonce)) {
            Some(previous) if previous == ours => Ok(true),
            Some(0) => {
                self.undo(&target)?;
                Err(unknown(
                    "the version we replaced was cleaned up and the next one does not say what it replaced",
                ))
            }
            Some(_) => self.undo_gap(&target).map(|_| false),
            // Removal is ascending: had others built on ours, the next version could only be
            // gone after ours. Ours is still there, so nobody built on it: a gap.
            None if self.undo_gap(&target)? => Ok(false),
            None => Err(unknown(
                "the version we wrote was cleaned up before its outcome could be read",
            )),
        }
    }

    /// Removes a version this writer linked: `Ok(false)` if clean-up had removed it already.
    fn undo(&self, target: &Path) -> Result<bool> {
        match fs::remove_file(target) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_error("remove", target, e)),
        }
    }

    /// [`Inner::undo`] for a version that filled a gap left by clean-up, saying so.
    fn undo_gap(&self, target: &Path) -> Result<bool> {
        let removed = self.undo(target)?;
        if removed {
            tracing::warn!(path = %target.display(), "stale writer filled a gap left by clean-up; removed its version");
        }
        Ok(removed)
    }

    fn cas(&self, expected: &Version, state: &WitnessState) -> Result<CasOutcome> {
        let Some((seq, nonce)) = parse_version(expected) else {
            return Err(Error::Io {
                op: "compare-and-swap",
                location: self.dir.display().to_string(),
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{expected:?} is not a mount version"),
                ),
            });
        };
        let next = seq + 1;
        if !self.link_version(next, state)? {
            return Ok(CasOutcome::Conflict);
        }
        #[cfg(test)]
        if let Some(tests::Stall(stall)) = self.after_link.lock().unwrap().take() {
            stall();
        }
        if !self.predecessor_intact(seq, nonce)?
            && !self.settle_without_predecessor(next, state.writer_nonce)?
        {
            return Ok(CasOutcome::Conflict);
        }
        self.sync_dir()?;
        self.hint.fetch_max(next, Ordering::AcqRel);
        self.clean_up(next);
        Ok(CasOutcome::Written(format_version(
            next,
            Some(state.writer_nonce),
        )))
    }

    fn create(&self, state: &WitnessState) -> Result<CasOutcome> {
        if !self.list()?.0.is_empty() {
            return Ok(CasOutcome::Conflict);
        }
        if !self.link_version(0, state)? {
            return Ok(CasOutcome::Conflict);
        }
        // If version 0 had been cleaned up, newer versions exist: then this was no creation.
        if self.list()?.0.iter().any(|&s| s > 0) {
            self.undo_gap(&self.path(&state_name(0)))?;
            return Ok(CasOutcome::Conflict);
        }
        self.sync_dir()?;
        self.hint.fetch_max(0, Ordering::AcqRel);
        Ok(CasOutcome::Written(format_version(
            0,
            Some(state.writer_nonce),
        )))
    }

    /// Removes versions older than the newest `retention` (ascending) and stale temp files.
    /// Best effort: failures are logged, the write already succeeded.
    fn clean_up(&self, newest: u64) {
        let keep_from = newest.saturating_sub(self.options.retention as u64 - 1);
        let (versions, temps) = match self.list() {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "witness clean-up: listing failed");
                return;
            }
        };
        for seq in versions.into_iter().filter(|&s| s < keep_from) {
            let path = self.path(&state_name(seq));
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    // Stop: removing a newer one while an older remains would break the
                    // ascending-order invariant.
                    tracing::warn!(path = %path.display(), error = %e, "witness clean-up stopped");
                    return;
                }
            }
        }
        let now = SystemTime::now();
        for name in temps {
            let path = self.path(&name);
            let old = fs::metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > self.options.temp_grace);
            if old && fs::remove_file(&path).is_ok() {
                tracing::info!(path = %path.display(), "removed an orphaned witness temp file");
            }
        }
    }
}

#[async_trait]
impl WitnessStore for MountStore {
    fn location(&self) -> String {
        self.inner.dir.display().to_string()
    }

    async fn load(&self) -> Result<Option<Loaded>> {
        self.blocking(|i| i.load()).await
    }

    async fn create(&self, state: &WitnessState) -> Result<CasOutcome> {
        let state = state.clone();
        self.blocking(move |i| i.create(&state)).await
    }

    async fn compare_and_swap(
        &self,
        expected: &Version,
        state: &WitnessState,
    ) -> Result<CasOutcome> {
        let (expected, state) = (expected.clone(), state.clone());
        self.blocking(move |i| i.cas(&expected, &state)).await
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// What another writer does while a compare-and-swap is stalled after its link.
    pub(crate) struct Stall(pub(crate) Box<dyn FnOnce() + Send>);

    impl std::fmt::Debug for Stall {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Stall")
        }
    }

    fn small(dir: &Path) -> MountStore {
        let options = MountOptions {
            retention: 2,
            ..MountOptions::default()
        };
        MountStore::open(dir, options).unwrap()
    }

    /// Writes `terms` on top of the newest version, as another node would; the terms it built on.
    fn write_on_top(store: &MountStore, terms: std::ops::Range<u64>) -> Vec<u64> {
        let mut built_on = Vec::new();
        for term in terms {
            let loaded = store.inner.load().unwrap().unwrap();
            built_on.push(loaded.state.term);
            let next = WitnessState {
                term,
                ..loaded.state.clone()
            }
            .succeeding(&loaded.state);
            let outcome = store.inner.cas(&loaded.version, &next).unwrap();
            assert!(matches!(outcome, CasOutcome::Written(_)), "{outcome:?}");
        }
        built_on
    }

    /// A writer stalls right after linking its version; others build on it and go past the
    /// retention, so clean-up removes the version it replaced. Its write stands: it says
    /// written (a conflict would make its caller write a second time), and nothing is removed.
    /// Had clean-up removed its own version too, the outcome is unknown (the client re-reads).
    #[tokio::test]
    async fn a_stalled_write_that_others_built_on_stands() {
        for (others, versions_after) in [(1, vec![2, 3]), (4, vec![5, 6])] {
            let dir = tempfile::tempdir().unwrap();
            let store = small(dir.path());
            let version = write_terms(&store, 1).await;
            let path = dir.path().to_owned();
            let (seen, saw) = std::sync::mpsc::channel();
            *store.inner.after_link.lock().unwrap() = Some(Stall(Box::new(move || {
                seen.send(write_on_top(&small(&path), 10..10 + others))
                    .unwrap();
            })));
            let ours = WitnessState {
                term: 2,
                ..store.load().await.unwrap().unwrap().state
            }
            .with_fresh_nonce();
            let outcome = store.compare_and_swap(&version, &ours).await;
            assert_eq!(saw.recv().unwrap()[0], 2, "built on ours");
            if others == 1 {
                let written = format_version(2, Some(ours.writer_nonce));
                assert_eq!(outcome.unwrap(), CasOutcome::Written(written));
            } else {
                assert!(outcome.unwrap_err().is_transient(), "ours cleaned up too");
            }
            assert_eq!(store.list_versions().unwrap(), versions_after);
            assert_eq!(store.load().await.unwrap().unwrap().state.term, 9 + others);
        }
    }

    /// A writer that stalled before linking fills a gap left by clean-up, beside a version that
    /// was built on the version it replaces: it removes its file and reports a lost race.
    #[tokio::test]
    async fn a_gap_filled_beside_another_history_is_undone() {
        let dir = tempfile::tempdir().unwrap();
        let store = small(dir.path());
        let stale = write_terms(&store, 0).await;
        write_on_top(&small(dir.path()), 1..4);
        assert_eq!(
            store.list_versions().unwrap(),
            vec![2, 3],
            "0 and 1 cleaned up"
        );
        let ours = WitnessState::new(7, "w", "witness:x").with_fresh_nonce();
        let outcome = store.compare_and_swap(&stale, &ours).await.unwrap();
        assert_eq!(outcome, CasOutcome::Conflict);
        assert_eq!(
            store.list_versions().unwrap(),
            vec![2, 3],
            "the gap file removed"
        );
    }

    /// When the version after a gap does not say what it replaced (written by a release before
    /// `previous_nonce`), the outcome is unknown: the file is removed and the error is one the
    /// client re-reads after.
    #[tokio::test]
    async fn a_gap_beside_a_version_without_previous_nonce_is_an_unknown_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let store = small(dir.path());
        let stale = write_terms(&store, 0).await;
        let old_release = small(dir.path());
        for seq in 1..4 {
            let state = WitnessState {
                term: seq,
                ..WitnessState::new(7, "w", "witness:x").with_fresh_nonce()
            };
            assert!(old_release.inner.link_version(seq, &state).unwrap());
        }
        for seq in 0..2 {
            fs::remove_file(dir.path().join(state_name(seq))).unwrap();
        }
        let ours = WitnessState::new(7, "w", "witness:x").with_fresh_nonce();
        let err = store.compare_and_swap(&stale, &ours).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
        assert_eq!(store.list_versions().unwrap(), vec![2, 3]);
    }

    /// Creates a witness in `store`, then writes terms 1 to `last`; the newest version.
    async fn write_terms(store: &MountStore, last: u64) -> Version {
        let state = || WitnessState::new(7, "w", "witness:x").with_fresh_nonce();
        let CasOutcome::Written(mut version) = store.create(&state()).await.unwrap() else {
            panic!("created");
        };
        for term in 1..=last {
            let next = WitnessState { term, ..state() };
            let CasOutcome::Written(v) = store.compare_and_swap(&version, &next).await.unwrap()
            else {
                panic!("written");
            };
            version = v;
        }
        version
    }

    /// A version named by the hint (or a stale directory listing) that clean-up removed is
    /// followed by newer ones: they are found by name, without listing the directory again
    /// (which on a network file system can return the same stale names for a while).
    #[tokio::test]
    async fn a_cleaned_up_version_is_looked_past_not_listed_again() {
        let dir = tempfile::tempdir().unwrap();
        let options = MountOptions {
            retention: 2,
            ..MountOptions::default()
        };
        let store = MountStore::open(dir.path(), options).unwrap();
        write_terms(&store, 5).await;
        let newest = store.inner.find_latest().unwrap().unwrap().seq;
        assert!(
            store.inner.open_version(newest - 2).unwrap().is_none(),
            "cleaned up"
        );
        // Behind: the hint names a version that is gone (and the next try, a retention
        // further, one that is there).
        store.inner.hint.store(newest - 3, Ordering::Release);
        let listed = store.inner.listings.load(Ordering::Relaxed);
        assert_eq!(store.inner.find_latest().unwrap().unwrap().seq, newest);
        assert_eq!(
            store.inner.listings.load(Ordering::Relaxed),
            listed,
            "no listing"
        );
    }

    /// A listing that shows no version (a directory cache from before the witness was
    /// initialised) does not make a witness with versions count as absent: its names are found
    /// from the first one on.
    #[tokio::test]
    async fn a_listing_cached_from_before_init_does_not_hide_the_witness() {
        let dir = tempfile::tempdir().unwrap();
        let writer = MountStore::open(dir.path(), MountOptions::default()).unwrap();
        let version = write_terms(&writer, 19).await;
        let reader = MountStore::open(dir.path(), MountOptions::default()).unwrap();
        reader.inner.empty_listings.store(true, Ordering::Relaxed);
        let loaded = reader.load().await.unwrap().expect("the witness is found");
        assert_eq!((loaded.state.term, loaded.version), (19, version));
        // An empty directory still has no witness.
        let empty = tempfile::tempdir().unwrap();
        let none = MountStore::open(empty.path(), MountOptions::default()).unwrap();
        none.inner.empty_listings.store(true, Ordering::Relaxed);
        assert!(none.load().await.unwrap().is_none());
    }

    #[test]
    fn names_and_versions_parse() {
        assert_eq!(state_name(42), "00000000000000000042.st");
        assert_eq!(parse_state_name("00000000000000000042.st"), Some(42));
        for bad in [
            "42.st",
            "0000000000000000004x.st",
            "00000000000000000042.tmp",
            "000000000000000000042.st",
        ] {
            assert_eq!(parse_state_name(bad), None, "{bad}");
        }
        assert_eq!(
            parse_version(&format_version(7, Some(0xab))),
            Some((7, Some(0xab)))
        );
        assert_eq!(parse_version(&format_version(7, None)), Some((7, None)));
        assert_eq!(parse_version(&Version::new("etag")), None);
    }
}
