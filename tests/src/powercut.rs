//! A file system that forgets what was not made durable: a power cut for the tests.
//!
//! [`Disk::mount`] serves an empty file system over FUSE at a directory. Everything written to
//! it is kept in memory twice: as it is now, and as a disk would have it after a power cut.
//! Only `fsync` (or `fdatasync`) of a file makes that file's contents and size durable; only an
//! `fsync` of a directory makes its entries durable (a file created, renamed, linked or removed
//! is in the durable tree once its directory is fsynced, not before: the strict POSIX reading,
//! stricter than ext4's journal). [`Disk::power_off`] then does what a power cut does:
//!
//! - each file goes back to its durable contents. With [`Data::Torn`] some of the pages
//!   written since the last fsync reach the disk anyway, in any order, one of them torn at a
//!   512-byte sector, and the size is the old or the new one: what a disk's write cache
//!   leaves;
//! - each directory goes back to its durable entries ([`Entries::Lost`]), or keeps them all
//!   ([`Entries::Kept`]: a journal that had committed every name change, as lazyfs models);
//! - files and directories no longer reachable from the root are gone;
//! - until [`Disk::power_on`], every operation fails with `EIO` (a server that is off, on a
//!   soft mount).
//!
//! [`Disk::fail`] makes it a failing disk: `fsync` fails with `EIO` (and what it was to make
//! durable never reaches the disk, though reads still return it, as Linux does), or writes fail
//! too, until [`Disk::heal`].
//!
//! What it leaves out: hard-mount hangs (docs/two-datacenters.md covers those with sshfs), file
//! locks across a cut (the kernel keeps them, as it does for any FUSE file system), extended
//! attributes, symbolic links and special files. The kernel caches nothing of it (zero TTLs,
//! direct I/O), so what a process reads after a cut is what the model holds.
//!
//! Invariants: a page is shared between the current and the durable contents until one of them
//! changes it (copy on write), so an fsync costs a copy of the page table, not of the data;
//! inode numbers are never reused, so a handle to a file a cut removed fails with `ESTALE`
//! rather than reaching another file.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    BackgroundSession, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow,
    WriteFlags,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const PAGE: usize = 4096;
const SECTOR: usize = 512;
const ROOT: u64 = 1;
/// How many paths of removed files a [`CutReport`] lists.
const GONE_LISTED: usize = 20;

type Page = Arc<[u8; PAGE]>;

/// A file's bytes: pages that were written (a missing page reads as zeros) and a size.
#[derive(Clone, Default, Debug)]
struct Content {
    pages: BTreeMap<u64, Page>,
    size: u64,
}

impl Content {
    fn read(&self, offset: u64, len: usize) -> Vec<u8> {
        let end = self.size.min(offset.saturating_add(len as u64));
        let mut out = vec![0; end.saturating_sub(offset) as usize];
        let mut done = 0;
        while done < out.len() {
            let at = offset + done as u64;
            let (index, within) = (at / PAGE as u64, (at % PAGE as u64) as usize);
            let n = (PAGE - within).min(out.len() - done);
            if let Some(page) = self.pages.get(&index) {
                out[done..done + n].copy_from_slice(&page[within..within + n]);
            }
            done += n;
        }
        out
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let mut done = 0;
        while done < data.len() {
            let at = offset + done as u64;
            let (index, within) = (at / PAGE as u64, (at % PAGE as u64) as usize);
            let n = (PAGE - within).min(data.len() - done);
            let page = self
                .pages
                .entry(index)
                .or_insert_with(|| Arc::new([0; PAGE]));
            Arc::make_mut(page)[within..within + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        self.size = self.size.max(offset + data.len() as u64);
    }

    /// Sets the size; bytes past it are dropped (and read as zeros if it grows again).
    fn set_len(&mut self, len: u64) {
        self.pages.split_off(&len.div_ceil(PAGE as u64));
        let within = (len % PAGE as u64) as usize;
        if within > 0
            && let Some(page) = self.pages.get_mut(&(len / PAGE as u64))
        {
            Arc::make_mut(page)[within..].fill(0);
        }
        self.size = len;
    }

    /// What a power cut leaves of `now` over `durable` when the disk wrote some of it anyway.
    fn torn(durable: &Content, now: &Content, rng: &mut StdRng) -> (Content, u64) {
        let mut left = durable.clone();
        left.size = if rng.random_bool(0.5) {
            now.size
        } else {
            durable.size
        };
        let mut lost = 0;
        let mut tear = rng.random_bool(0.5);
        for (index, page) in &now.pages {
            if durable
                .pages
                .get(index)
                .is_some_and(|d| Arc::ptr_eq(d, page))
            {
                continue;
            }
            if rng.random_bool(0.5) {
                lost += 1;
            } else if tear {
                // One page reached the disk only in part: its first sectors new, the rest old.
                tear = false;
                let sectors = rng.random_range(1..PAGE / SECTOR);
                let old = durable
                    .pages
                    .get(index)
                    .cloned()
                    .unwrap_or_else(|| Arc::new([0; PAGE]));
                let mut mixed = *old;
                mixed[..sectors * SECTOR].copy_from_slice(&page[..sectors * SECTOR]);
                left.pages.insert(*index, Arc::new(mixed));
            } else {
                left.pages.insert(*index, page.clone());
            }
        }
        left.set_len(left.size);
        (left, lost)
    }
}

#[derive(Debug)]
enum Body {
    File {
        now: Content,
        durable: Content,
        /// The contents when an fsync last failed: pages still the same as these were marked
        /// clean without reaching the disk (as Linux does after a writeback error), so a later
        /// fsync leaves them out.
        failed: Option<Content>,
    },
    Dir {
        now: Names,
        durable: Names,
    },
}

type Names = BTreeMap<OsString, u64>;

#[derive(Debug)]
struct Node {
    body: Body,
    perm: u16,
    /// Entries naming it now (the durable tree may hold others).
    links: u32,
    mtime: SystemTime,
}

/// What a power cut does to the data written since the last fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// All of it is lost.
    Lost,
    /// Some pages reach the disk anyway, one torn at a sector; the size is the old or the new.
    Torn,
}

/// What a power cut does to directory entries changed since the directory's last fsync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entries {
    /// Every change since is undone.
    Lost,
    /// Every change is kept.
    Kept,
}

/// How a failing disk fails (until [`Disk::heal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Every fsync fails with `EIO`, and what it was to make durable never reaches the disk,
    /// though reads still return it (Linux marks the pages clean after a writeback error).
    Syncs,
    /// Writes fail with `EIO` too.
    Writes,
}

/// What one power cut dropped.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CutReport {
    /// Files whose contents went back to what was last fsynced (or, torn, part of it).
    pub files_changed: u64,
    /// Pages written since the last fsync that the cut dropped.
    pub pages_lost: u64,
    /// Directory entries that the cut undid (created or removed since the directory's fsync).
    pub entries_undone: u64,
    /// Files and directories that were reachable before the cut and are gone after it.
    pub nodes_gone: u64,
    /// The paths (relative to the mount point) of the first of them.
    pub gone: Vec<String>,
}

impl CutReport {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &CutReport) {
        self.files_changed += other.files_changed;
        self.pages_lost += other.pages_lost;
        self.entries_undone += other.entries_undone;
        self.nodes_gone += other.nodes_gone;
        for path in &other.gone {
            if self.gone.len() < GONE_LISTED && !self.gone.contains(path) {
                self.gone.push(path.clone());
            }
        }
    }
}

/// The file system's state: the pure model, with no FUSE in it.
#[derive(Debug)]
struct Model {
    nodes: HashMap<u64, Node>,
    next_ino: u64,
    handles: HashMap<u64, u64>,
    next_fh: u64,
    off: bool,
    failing: Option<Failure>,
}

type Result<T> = std::result::Result<T, i32>;

/// The attributes a reply needs.
#[derive(Debug, Clone, Copy)]
struct Attr {
    ino: u64,
    dir: bool,
    size: u64,
    perm: u16,
    links: u32,
    mtime: SystemTime,
}

impl Model {
    fn new() -> Model {
        let root = Node {
            body: Body::Dir {
                now: BTreeMap::new(),
                durable: BTreeMap::new(),
            },
            perm: 0o755,
            links: 1,
            mtime: SystemTime::now(),
        };
        Model {
            nodes: HashMap::from([(ROOT, root)]),
            next_ino: ROOT + 1,
            handles: HashMap::new(),
            next_fh: 1,
            off: false,
            failing: None,
        }
    }

    fn node(&self, ino: u64) -> Result<&Node> {
        if self.off {
            return Err(libc::EIO);
        }
        self.nodes.get(&ino).ok_or(libc::ESTALE)
    }

    fn node_mut(&mut self, ino: u64) -> Result<&mut Node> {
        if self.off {
            return Err(libc::EIO);
        }
        self.nodes.get_mut(&ino).ok_or(libc::ESTALE)
    }

    fn entries(&self, dir: u64) -> Result<&Names> {
        match &self.node(dir)?.body {
            Body::Dir { now, .. } => Ok(now),
            Body::File { .. } => Err(libc::ENOTDIR),
        }
    }

    /// What a change is about to change, its modification time set.
    fn touched(&mut self, ino: u64) -> Result<&mut Body> {
        let node = self.node_mut(ino)?;
        node.mtime = SystemTime::now();
        Ok(&mut node.body)
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut Names> {
        match self.touched(dir)? {
            Body::Dir { now, .. } => Ok(now),
            Body::File { .. } => Err(libc::ENOTDIR),
        }
    }

    fn file_mut(&mut self, ino: u64) -> Result<&mut Content> {
        match self.touched(ino)? {
            Body::File { now, .. } => Ok(now),
            Body::Dir { .. } => Err(libc::EISDIR),
        }
    }

    fn attr(&self, ino: u64) -> Result<Attr> {
        let node = self.node(ino)?;
        let (dir, size) = match &node.body {
            Body::File { now, .. } => (false, now.size),
            Body::Dir { now, .. } => (true, now.len() as u64),
        };
        Ok(Attr {
            ino,
            dir,
            size,
            perm: node.perm,
            links: if dir { 2 } else { node.links },
            mtime: node.mtime,
        })
    }

    fn lookup(&self, parent: u64, name: &OsStr) -> Result<Attr> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        self.attr(ino)
    }

    fn make(&mut self, parent: u64, name: &OsStr, dir: bool, perm: u16) -> Result<Attr> {
        if self.entries(parent)?.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let body = if dir {
            Body::Dir {
                now: BTreeMap::new(),
                durable: BTreeMap::new(),
            }
        } else {
            Body::File {
                now: Content::default(),
                durable: Content::default(),
                failed: None,
            }
        };
        let node = Node {
            body,
            perm,
            links: 1,
            mtime: SystemTime::now(),
        };
        self.nodes.insert(ino, node);
        self.entries_mut(parent)?.insert(name.to_owned(), ino);
        self.attr(ino)
    }

    fn unlink(&mut self, parent: u64, name: &OsStr, dir: bool) -> Result<()> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        match (&self.node(ino)?.body, dir) {
            (Body::Dir { now, .. }, true) if !now.is_empty() => return Err(libc::ENOTEMPTY),
            (Body::Dir { .. }, true) | (Body::File { .. }, false) => {}
            (Body::Dir { .. }, false) => return Err(libc::EISDIR),
            (Body::File { .. }, true) => return Err(libc::ENOTDIR),
        }
        self.entries_mut(parent)?.remove(name);
        self.node_mut(ino)?.links -= 1;
        self.collect(ino);
        Ok(())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        to_parent: u64,
        to_name: &OsStr,
        no_replace: bool,
    ) -> Result<()> {
        let ino = *self.entries(parent)?.get(name).ok_or(libc::ENOENT)?;
        let moving_dir = self.attr(ino)?.dir;
        if let Some(&there) = self.entries(to_parent)?.get(to_name) {
            if there == ino {
                return Ok(());
            }
            if no_replace {
                return Err(libc::EEXIST);
            }
            match (&self.node(there)?.body, moving_dir) {
                (Body::Dir { now, .. }, true) if !now.is_empty() => {
                    return Err(libc::ENOTEMPTY);
                }
                (Body::Dir { .. }, false) => return Err(libc::EISDIR),
                (Body::File { .. }, true) => return Err(libc::ENOTDIR),
                _ => {}
            }
            self.node_mut(there)?.links -= 1;
        }
        self.entries_mut(parent)?.remove(name);
        let replaced = self.entries_mut(to_parent)?.insert(to_name.to_owned(), ino);
        if let Some(there) = replaced {
            self.collect(there);
        }
        Ok(())
    }

    fn link(&mut self, ino: u64, to_parent: u64, to_name: &OsStr) -> Result<Attr> {
        if self.attr(ino)?.dir {
            return Err(libc::EPERM);
        }
        if self.entries(to_parent)?.contains_key(to_name) {
            return Err(libc::EEXIST);
        }
        self.entries_mut(to_parent)?.insert(to_name.to_owned(), ino);
        self.node_mut(ino)?.links += 1;
        self.attr(ino)
    }

    fn open(&mut self, ino: u64) -> Result<u64> {
        self.node(ino)?;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, ino);
        Ok(fh)
    }

    fn release(&mut self, fh: u64) {
        if let Some(ino) = self.handles.remove(&fh) {
            self.collect(ino);
        }
    }

    fn read(&self, ino: u64, offset: u64, len: usize) -> Result<Vec<u8>> {
        match &self.node(ino)?.body {
            Body::File { now, .. } => Ok(now.read(offset, len)),
            Body::Dir { .. } => Err(libc::EISDIR),
        }
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<()> {
        if self.failing == Some(Failure::Writes) {
            return Err(libc::EIO);
        }
        self.file_mut(ino)?.write(offset, data);
        Ok(())
    }

    fn set_len(&mut self, ino: u64, len: u64) -> Result<()> {
        self.file_mut(ino)?.set_len(len);
        Ok(())
    }

    /// fallocate: mode 0 extends the size (the new range reads as zeros); KEEP_SIZE allocates
    /// nothing that a read could tell.
    fn allocate(&mut self, ino: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        let file = self.file_mut(ino)?;
        match mode {
            0 => {
                let end = offset.saturating_add(len);
                if end > file.size {
                    file.set_len(end);
                }
                Ok(())
            }
            libc::FALLOC_FL_KEEP_SIZE => Ok(()),
            _ => Err(libc::EOPNOTSUPP),
        }
    }

    /// fsync: a file's contents and size, or a directory's entries, become durable; on a
    /// failing disk, `EIO`, and the file's unsynced pages never will (see `Body::File`).
    fn sync(&mut self, ino: u64) -> Result<()> {
        let failing = self.failing.is_some();
        match &mut self.node_mut(ino)?.body {
            Body::File { now, failed, .. } if failing => {
                *failed = Some(now.clone());
                Err(libc::EIO)
            }
            Body::Dir { .. } if failing => Err(libc::EIO),
            Body::File {
                now,
                durable,
                failed,
            } => {
                let mut next = now.clone();
                if let Some(failed) = failed.take() {
                    for (index, page) in &mut next.pages {
                        if failed
                            .pages
                            .get(index)
                            .is_some_and(|f| Arc::ptr_eq(f, page))
                        {
                            *page = durable
                                .pages
                                .get(index)
                                .cloned()
                                .unwrap_or_else(|| Arc::new([0; PAGE]));
                        }
                    }
                }
                *durable = next;
                Ok(())
            }
            Body::Dir { now, durable } => {
                *durable = now.clone();
                Ok(())
            }
        }
    }

    fn list(&self, dir: u64) -> Result<Vec<(u64, bool, OsString)>> {
        let entries = self.entries(dir)?;
        entries
            .iter()
            .map(|(name, &ino)| Ok((ino, self.attr(ino)?.dir, name.clone())))
            .collect()
    }

    /// Drops `ino` if nothing reaches it any more: no entry now, none in the durable tree, no
    /// open handle.
    fn collect(&mut self, ino: u64) {
        let Some(node) = self.nodes.get(&ino) else {
            return;
        };
        if node.links > 0 || self.handles.values().any(|&h| h == ino) {
            return;
        }
        let durably_named = self.nodes.values().any(|n| match &n.body {
            Body::Dir { durable, .. } => durable.values().any(|&i| i == ino),
            Body::File { .. } => false,
        });
        if !durably_named {
            self.nodes.remove(&ino);
        }
    }

    /// A power cut: what was not made durable is lost (see the module's docs), then the disk
    /// is off until [`Model::power_on`].
    fn power_off(&mut self, data: Data, entries: Entries, seed: u64) -> CutReport {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut report = CutReport::default();
        let paths = self.paths();
        let mut inos: Vec<u64> = self.nodes.keys().copied().collect();
        inos.sort_unstable();
        for ino in inos {
            let node = self.nodes.get_mut(&ino).expect("listed above");
            match &mut node.body {
                Body::File {
                    now,
                    durable,
                    failed,
                } => {
                    *failed = None;
                    let dirty = now
                        .pages
                        .iter()
                        .filter(|(i, p)| !durable.pages.get(i).is_some_and(|d| Arc::ptr_eq(d, p)))
                        .count() as u64;
                    if dirty == 0 && now.size == durable.size {
                        continue;
                    }
                    report.files_changed += 1;
                    let (left, lost) = match data {
                        Data::Lost => (durable.clone(), dirty),
                        Data::Torn => Content::torn(durable, now, &mut rng),
                    };
                    report.pages_lost += lost;
                    *now = left.clone();
                    *durable = left;
                }
                Body::Dir { now, durable } => match entries {
                    Entries::Lost => {
                        let changed = now
                            .iter()
                            .filter(|(k, v)| durable.get(*k) != Some(v))
                            .count()
                            + durable.keys().filter(|k| !now.contains_key(*k)).count();
                        report.entries_undone += changed as u64;
                        *now = durable.clone();
                    }
                    Entries::Kept => *durable = now.clone(),
                },
            }
        }
        // What the root no longer reaches is gone; the rest is counted again.
        let mut links: HashMap<u64, u32> = HashMap::from([(ROOT, 1)]);
        let mut todo = vec![ROOT];
        while let Some(dir) = todo.pop() {
            if let Some(Node {
                body: Body::Dir { now, .. },
                ..
            }) = self.nodes.get(&dir)
            {
                for &ino in now.values() {
                    let count = links.entry(ino).or_insert(0);
                    *count += 1;
                    if *count == 1 {
                        todo.push(ino);
                    }
                }
            }
        }
        // (Counted among the gone only if the root reached them before: a file already
        // removed but still named in the durable tree is no loss.)
        let mut gone: Vec<u64> = self
            .nodes
            .keys()
            .filter(|ino| !links.contains_key(ino) && paths.contains_key(ino))
            .copied()
            .collect();
        gone.sort_unstable();
        report.nodes_gone = gone.len() as u64;
        report.gone = gone
            .iter()
            .take(GONE_LISTED)
            .map(|ino| paths[ino].clone())
            .collect();
        self.nodes.retain(|ino, _| links.contains_key(ino));
        for (ino, node) in &mut self.nodes {
            node.links = links[ino];
        }
        let nodes = &self.nodes;
        self.handles.retain(|_, ino| nodes.contains_key(ino));
        self.off = true;
        report
    }

    /// A path (relative to the root) of every node the root reaches now.
    fn paths(&self) -> HashMap<u64, String> {
        let mut paths = HashMap::new();
        let mut todo = vec![(ROOT, String::new())];
        while let Some((dir, path)) = todo.pop() {
            if let Some(Node {
                body: Body::Dir { now, .. },
                ..
            }) = self.nodes.get(&dir)
            {
                for (name, &ino) in now {
                    let child = format!("{path}/{}", name.to_string_lossy());
                    if let std::collections::hash_map::Entry::Vacant(e) = paths.entry(ino) {
                        e.insert(child.clone());
                        todo.push((ino, child));
                    }
                }
            }
        }
        paths
    }

    fn power_on(&mut self) {
        self.off = false;
    }
}

/// A power-cut file system mounted at a directory; unmounted when dropped.
pub struct Disk {
    model: Arc<Mutex<Model>>,
    session: Option<BackgroundSession>,
    at: PathBuf,
}

impl std::fmt::Debug for Disk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disk").field("at", &self.at).finish()
    }
}

/// Unmounts (lazily) every power-cut file system whose server is gone: a campaign or test that
/// was killed leaves its mounts behind, answering every access with "Transport endpoint is not
/// connected". Returns where they were. Live ones (another campaign's) are left alone.
pub fn unmount_stale() -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let mut gone = Vec::new();
    for line in mounts.lines() {
        let mut fields = line.split(' ');
        let (Some("powercut"), Some(at), Some("fuse")) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        // (/proc/mounts escapes spaces and the like as octal: the temp paths here have none)
        let at = PathBuf::from(at);
        let dead =
            matches!(std::fs::metadata(&at), Err(e) if e.raw_os_error() == Some(libc::ENOTCONN));
        let unmounted = dead
            && std::process::Command::new("umount")
                .arg("-l")
                .arg(&at)
                .status()
                .is_ok_and(|s| s.success());
        if unmounted {
            gone.push(at);
        }
    }
    gone
}

impl Disk {
    /// Mounts an empty power-cut file system at `at` (an existing, empty directory). Needs
    /// `/dev/fuse` and root (or `fusermount3`).
    pub fn mount(at: &Path) -> std::result::Result<Disk, String> {
        let model = Arc::new(Mutex::new(Model::new()));
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("powercut".into()),
            MountOption::RW,
            MountOption::NoAtime,
        ];
        config.n_threads = Some(4);
        let session = fuser::spawn_mount(Fs(model.clone()), at, &config).map_err(|e| {
            format!(
                "mounting the power-cut file system at {} failed: {e} (it needs /dev/fuse, \
                 and root or fusermount3: run the root tier as root)",
                at.display()
            )
        })?;
        Ok(Disk {
            model,
            session: Some(session),
            at: at.to_path_buf(),
        })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.at
    }

    /// Cuts the power: whatever was not made durable is lost as `data` and `entries` say
    /// (seeded by `seed`), and every access fails with `EIO` until [`Disk::power_on`]. Stop
    /// the processes writing here first: a running one would see its files change under it.
    pub fn power_off(&self, data: Data, entries: Entries, seed: u64) -> CutReport {
        self.lock().power_off(data, entries, seed)
    }

    /// The disk starts failing as `how` says.
    pub fn fail(&self, how: Failure) {
        self.lock().failing = Some(how);
    }

    /// The disk stops failing (what a failed fsync dropped stays dropped).
    pub fn heal(&self) {
        self.lock().failing = None;
    }

    /// Power back: the disk answers again, with what survived the cut.
    pub fn power_on(&self) {
        self.lock().power_on();
    }

    fn lock(&self) -> MutexGuard<'_, Model> {
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        self.power_on();
        if let Some(session) = self.session.take()
            && session.umount_and_join().is_err()
        {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.at)
                .status();
        }
    }
}

/// The FUSE side: each request locks the model, asks it, and replies.
struct Fs(Arc<Mutex<Model>>);

/// Nothing is cached in the kernel: after a cut, a lookup or a read sees the model.
const TTL: Duration = Duration::ZERO;

impl Fs {
    fn model(&self) -> MutexGuard<'_, Model> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

fn file_attr(a: Attr, req: &Request) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.mtime,
        mtime: a.mtime,
        ctime: a.mtime,
        crtime: a.mtime,
        kind: if a.dir {
            FileType::Directory
        } else {
            FileType::RegularFile
        },
        perm: a.perm,
        nlink: a.links,
        uid: req.uid(),
        gid: req.gid(),
        rdev: 0,
        blksize: PAGE as u32,
        flags: 0,
    }
}

fn entry(reply: ReplyEntry, req: &Request, result: Result<Attr>) {
    match result {
        Ok(a) => reply.entry(&TTL, &file_attr(a, req), Generation(0)),
        Err(e) => reply.error(errno(e)),
    }
}

fn attr(reply: ReplyAttr, req: &Request, result: Result<Attr>) {
    match result {
        Ok(a) => reply.attr(&TTL, &file_attr(a, req)),
        Err(e) => reply.error(errno(e)),
    }
}

fn empty(reply: ReplyEmpty, result: Result<()>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

fn perm(mode: u32, umask: u32) -> u16 {
    (mode & !umask & 0o7777) as u16
}

impl Filesystem for Fs {
    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        entry(reply, req, self.model().lookup(parent.0, name));
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        attr(reply, req, self.model().attr(ino.0));
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut model = self.model();
        let result = (|| {
            if let Some(len) = size {
                model.set_len(ino.0, len)?;
            }
            if let Some(mode) = mode {
                model.node_mut(ino.0)?.perm = perm(mode, 0);
            }
            model.attr(ino.0)
        })();
        attr(reply, req, result);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let made = self.model().make(parent.0, name, false, perm(mode, umask));
        entry(reply, req, made);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let made = self.model().make(parent.0, name, true, perm(mode, umask));
        entry(reply, req, made);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.model().unlink(parent.0, name, false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.model().unlink(parent.0, name, true));
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let no_replace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let renamed = self
            .model()
            .rename(parent.0, name, newparent.0, newname, no_replace);
        empty(reply, renamed);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entry(reply, req, self.model().link(ino.0, newparent.0, newname));
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.model().open(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mut model = self.model();
        let made = model
            .make(parent.0, name, false, perm(mode, umask))
            .and_then(|a| Ok((a, model.open(a.ino)?)));
        match made {
            Ok((a, fh)) => reply.created(
                &TTL,
                &file_attr(a, req),
                Generation(0),
                FileHandle(fh),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.model().read(ino.0, offset, size as usize) {
            Ok(bytes) => reply.data(&bytes),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.model().write(ino.0, offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() makes nothing durable.
        empty(reply, self.model().node(ino.0).map(|_| ()));
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.model().release(fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _d: bool, reply: ReplyEmpty) {
        empty(reply, self.model().sync(ino.0));
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.model().open(ino.0) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let listed = match self.model().list(ino.0) {
            Ok(listed) => listed,
            Err(e) => return reply.error(errno(e)),
        };
        let dots = [
            (ino.0, true, OsString::from(".")),
            (ino.0, true, OsString::from("..")),
        ];
        for (i, (child, dir, name)) in dots.into_iter().chain(listed).enumerate() {
            if (i as u64) < offset {
                continue;
            }
            let kind = if dir {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            if reply.add(INodeNo(child), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.model().release(fh.0);
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _d: bool, reply: ReplyEmpty) {
        empty(reply, self.model().sync(ino.0));
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        if self.model().off {
            return reply.error(Errno::EIO);
        }
        // 4 GiB, nearly all free: the model lives in memory, and the tests write far less.
        let blocks = (4u64 << 30) / PAGE as u64;
        reply.statfs(
            blocks,
            blocks - 1,
            blocks - 1,
            1 << 20,
            1 << 20,
            PAGE as u32,
            255,
            PAGE as u32,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        empty(reply, self.model().node(ino.0).map(|_| ()));
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.model().allocate(ino.0, offset, length, mode));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(m: &mut Model, parent: u64, name: &str) -> u64 {
        m.make(parent, OsStr::new(name), false, 0o644).unwrap().ino
    }

    fn read_all(m: &Model, ino: u64) -> Vec<u8> {
        m.read(ino, 0, 1 << 20).unwrap()
    }

    fn cut(m: &mut Model, data: Data, entries: Entries) -> CutReport {
        let report = m.power_off(data, entries, 7);
        m.power_on();
        report
    }

    #[test]
    fn only_fsynced_contents_and_fsynced_names_survive_a_cut() {
        let mut m = Model::new();
        let a = file(&mut m, ROOT, "a");
        m.write(a, 0, b"durable").unwrap();
        m.sync(a).unwrap();
        m.sync(ROOT).unwrap();
        m.write(a, 0, b"DURABLE and more").unwrap();
        let b = file(&mut m, ROOT, "b");
        m.write(b, 0, b"fsynced, but its name is not").unwrap();
        m.sync(b).unwrap();
        let report = cut(&mut m, Data::Lost, Entries::Lost);
        assert_eq!(
            read_all(&m, m.lookup(ROOT, OsStr::new("a")).unwrap().ino),
            b"durable"
        );
        assert_eq!(m.lookup(ROOT, OsStr::new("b")).unwrap_err(), libc::ENOENT);
        assert_eq!(m.read(b, 0, 10).unwrap_err(), libc::ESTALE);
        assert_eq!(report.files_changed, 1, "{report:?}");
        assert_eq!((report.entries_undone, report.nodes_gone), (1, 1));
    }

    #[test]
    fn a_removal_or_rename_not_made_durable_is_undone() {
        let mut m = Model::new();
        let a = file(&mut m, ROOT, "a");
        m.write(a, 0, b"x").unwrap();
        m.sync(a).unwrap();
        m.sync(ROOT).unwrap();
        m.rename(ROOT, OsStr::new("a"), ROOT, OsStr::new("c"), false)
            .unwrap();
        let t = file(&mut m, ROOT, "t");
        m.link(t, ROOT, OsStr::new("u")).unwrap();
        m.unlink(ROOT, OsStr::new("t"), false).unwrap();
        cut(&mut m, Data::Lost, Entries::Lost);
        let names: Vec<_> = m
            .list(ROOT)
            .unwrap()
            .into_iter()
            .map(|(_, _, n)| n)
            .collect();
        assert_eq!(names, [OsString::from("a")]);
        assert_eq!(read_all(&m, a), b"x");
    }

    #[test]
    fn kept_entries_keep_names_but_not_unsynced_data() {
        let mut m = Model::new();
        let d = m.make(ROOT, OsStr::new("d"), true, 0o755).unwrap().ino;
        let f = file(&mut m, d, "f");
        m.write(f, 0, &[9; 10_000]).unwrap();
        cut(&mut m, Data::Lost, Entries::Kept);
        assert_eq!(m.lookup(d, OsStr::new("f")).unwrap().size, 0);
    }

    #[test]
    fn a_torn_cut_keeps_the_durable_bytes_and_some_new_pages() {
        let mut m = Model::new();
        let f = file(&mut m, ROOT, "f");
        m.write(f, 0, &[1; 8 * PAGE]).unwrap();
        m.sync(f).unwrap();
        m.sync(ROOT).unwrap();
        m.write(f, 0, &[2; 16 * PAGE]).unwrap();
        let report = cut(&mut m, Data::Torn, Entries::Lost);
        let after = read_all(&m, f);
        assert!(after.len() == 8 * PAGE || after.len() == 16 * PAGE);
        assert!(after.iter().all(|&b| b <= 2));
        assert!(
            report.pages_lost > 0 && report.pages_lost < 16,
            "{report:?}"
        );
        // Whole sectors only: a torn page is old up to some sector boundary and new before it.
        for sector in after.chunks(SECTOR) {
            assert!(sector.iter().all(|&b| b == sector[0]));
        }
    }

    #[test]
    fn a_file_open_elsewhere_outlives_its_name_and_an_off_disk_says_eio() {
        let mut m = Model::new();
        let f = file(&mut m, ROOT, "f");
        let fh = m.open(f).unwrap();
        m.unlink(ROOT, OsStr::new("f"), false).unwrap();
        m.write(f, 0, b"still here").unwrap();
        assert_eq!(read_all(&m, f), b"still here");
        m.release(fh);
        assert_eq!(m.read(f, 0, 1).unwrap_err(), libc::ESTALE);
        m.power_off(Data::Lost, Entries::Lost, 1);
        assert_eq!(m.attr(ROOT).unwrap_err(), libc::EIO);
        m.power_on();
        assert!(m.attr(ROOT).is_ok());
    }

    #[test]
    fn what_a_failed_fsync_was_to_write_never_reaches_the_disk() {
        let mut m = Model::new();
        let f = file(&mut m, ROOT, "f");
        m.sync(ROOT).unwrap();
        m.write(f, 0, &[1; PAGE]).unwrap();
        m.sync(f).unwrap();
        m.write(f, 0, &[2; PAGE]).unwrap();
        m.failing = Some(Failure::Syncs);
        assert_eq!(m.sync(f).unwrap_err(), libc::EIO);
        m.failing = Some(Failure::Writes);
        assert_eq!(m.write(f, PAGE as u64, b"x").unwrap_err(), libc::EIO);
        m.failing = None;
        assert_eq!(
            read_all(&m, f),
            [2; PAGE],
            "reads still see it (the page cache)"
        );
        m.write(f, PAGE as u64, &[3; PAGE]).unwrap();
        m.sync(f).unwrap();
        cut(&mut m, Data::Lost, Entries::Lost);
        let after = read_all(&m, f);
        assert_eq!(
            after[..PAGE],
            [1; PAGE],
            "the retried fsync did not write the page"
        );
        assert_eq!(
            after[PAGE..],
            [3; PAGE],
            "a page written after the failure is written"
        );
    }

    #[test]
    fn truncation_and_allocation_read_back_as_zeros() {
        let mut m = Model::new();
        let f = file(&mut m, ROOT, "f");
        m.write(f, 0, &[5; 6000]).unwrap();
        m.set_len(f, 4100).unwrap();
        m.allocate(f, 0, 9000, 0).unwrap();
        let bytes = read_all(&m, f);
        assert_eq!(bytes.len(), 9000);
        assert!(bytes[..4100].iter().all(|&b| b == 5));
        assert!(bytes[4100..].iter().all(|&b| b == 0));
    }
}
