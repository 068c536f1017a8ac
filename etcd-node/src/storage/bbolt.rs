//! bbolt's file format, the one etcd keeps its key space in and saves snapshots as: a reader
//! that walks the buckets of a file a page at a time, and a writer that bulk-loads sorted
//! buckets into a new file. Only what moving data in and out of etcd needs: no transactions,
//! no free-page reuse, no nested buckets (etcd has none).
//!
//! The format (docs/formats.md, "etcd's snapshot files"), all integers little-endian (bbolt
//! writes the machine's order; every platform etcd ships for is little-endian):
//! - the file is pages of `page size` bytes; a page starts with a 16-byte header: id (u64),
//!   flags (u16: 0x01 branch, 0x02 leaf, 0x04 meta, 0x10 freelist), count (u16), overflow (u32:
//!   how many pages after this one it also takes);
//! - pages 0 and 1 are meta pages: magic 0xED0CDAED, version 2, page size, flags, the root
//!   bucket (root page, sequence), the freelist page, the page count, the transaction id and an
//!   FNV-1a 64 checksum of the fields before it. The valid one with the larger id is current;
//! - a B+tree node is a header, `count` 16-byte elements, then the keys and values they point
//!   at. A branch element is (pos u32, key size u32, child page u64); a leaf element is (flags
//!   u32, pos u32, key size u32, value size u32), `pos` counting from the element itself;
//! - a bucket is a leaf element with flag 0x01 whose value starts with its root page and
//!   sequence (u64 each); root page 0 means the bucket's leaf node follows inline.

use std::collections::HashSet;
use std::io::{self, Seek, SeekFrom, Write};

const MAGIC: u32 = 0xED0C_DAED;
const VERSION: u32 = 2;
const HEADER: usize = 16;
const ELEMENT: usize = 16;
const BRANCH: u16 = 0x01;
const LEAF: u16 = 0x02;
const META: u16 = 0x04;
const FREELIST: u16 = 0x10;
const BUCKET: u32 = 0x01;
/// The meta fields before the checksum (the bytes it covers).
const META_SUMMED: usize = 56;
/// The page size of the files the writer makes (etcd's on every common platform).
pub const PAGE_SIZE: usize = 4096;
/// A tree deeper than this is a damaged (or cyclic) file, not data.
const MAX_DEPTH: usize = 32;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A meta page's fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Meta {
    page_size: u32,
    root: u64,
    freelist: u64,
    pages: u64,
    txid: u64,
}

impl Meta {
    /// The meta in `page` (a whole meta page), if it is a valid one.
    fn parse(page: &[u8]) -> Option<Meta> {
        let m = page.get(HEADER..HEADER + META_SUMMED + 8)?;
        let valid = u32_at(m, 0) == MAGIC
            && u32_at(m, 4) == VERSION
            && u64_at(m, META_SUMMED) == fnv1a64(&m[..META_SUMMED]);
        valid.then(|| Meta {
            page_size: u32_at(m, 8),
            root: u64_at(m, 16),
            freelist: u64_at(m, 32),
            pages: u64_at(m, 40),
            txid: u64_at(m, 48),
        })
    }

    /// The meta page `id` holding this meta.
    fn page(&self, id: u64) -> Vec<u8> {
        let mut p = vec![0u8; self.page_size as usize];
        p[..8].copy_from_slice(&id.to_le_bytes());
        p[8..10].copy_from_slice(&META.to_le_bytes());
        let mut m = Vec::with_capacity(META_SUMMED + 8);
        for v in [MAGIC, VERSION, self.page_size, 0] {
            m.extend(v.to_le_bytes());
        }
        for v in [self.root, 0, self.freelist, self.pages, self.txid] {
            m.extend(v.to_le_bytes());
        }
        m.extend(fnv1a64(&m).to_le_bytes());
        p[HEADER..HEADER + m.len()].copy_from_slice(&m);
        p
    }
}

/// A bbolt file being read. Pages are read when they are visited, so memory does not grow
/// with the file.
#[derive(Debug)]
pub struct Reader {
    file: std::fs::File,
    /// Only the first `len` bytes count (a snapshot file has its hash after them).
    len: u64,
    meta: Meta,
}

/// Where a bucket's tree starts.
#[derive(Debug, Clone)]
enum Root {
    Page(u64),
    /// The leaf node stored in the bucket's value.
    Inline(Vec<u8>),
}

/// A bbolt file that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum BboltError {
    /// The file is damaged, truncated or not a bbolt file; the message says where and what.
    #[error("{0}")]
    Damaged(String),
    #[error("reading it at byte {at}: {source}")]
    Read { at: u64, source: io::Error },
}

fn damaged(what: String) -> BboltError {
    BboltError::Damaged(what)
}

/// Called with each key and value of a bucket; its error (`E`, which a [`BboltError`] becomes
/// too) stops the walk.
pub type PairFn<'a, E> = dyn FnMut(&[u8], &[u8]) -> Result<(), E> + 'a;
/// Called with each element of a node: (is a bucket, key, value).
type VisitFn<'a, E> = dyn FnMut(bool, &[u8], &[u8]) -> Result<(), E> + 'a;

/// A bucket of a [`Reader`]'s file.
#[derive(Debug, Clone)]
pub struct Bucket(Root);

/// One element of a node, as found.
enum Element<'a> {
    Child(u64),
    Pair {
        bucket: bool,
        key: &'a [u8],
        value: &'a [u8],
    },
}

impl Reader {
    /// Opens the bbolt file whose first `len` bytes `file` holds.
    pub fn open(file: std::fs::File, len: u64) -> Result<Reader, BboltError> {
        let mut r = Reader {
            file,
            len,
            meta: Meta {
                page_size: PAGE_SIZE as u32,
                root: 0,
                freelist: 0,
                pages: 0,
                txid: 0,
            },
        };
        let first = r.read(0, PAGE_SIZE.min(len as usize))?;
        let meta0 = Meta::parse(&first);
        // (the second meta page is one page in: the first's page size, or the common ones if
        // the first is damaged)
        let sizes = match meta0 {
            Some(m) => vec![u64::from(m.page_size)],
            None => (12..=16).map(|s| 1u64 << s).collect(),
        };
        let mut best = meta0;
        for size in sizes {
            if size >= len || !(512..=1 << 20).contains(&size) {
                continue;
            }
            let page = r.read(size, size.min(len - size) as usize)?;
            if let Some(m) = Meta::parse(&page)
                && best.is_none_or(|b| m.txid > b.txid)
            {
                best = Some(m);
            }
        }
        let Some(meta) = best else {
            return Err(damaged(
                "neither of its meta pages is valid (a bbolt file starts with two meta pages; \
                 this one is damaged, or not a bbolt file)"
                    .into(),
            ));
        };
        let size = u64::from(meta.page_size);
        if !(512..=1 << 20).contains(&size) || !size.is_power_of_two() {
            return Err(damaged(format!(
                "its page size {size} is not one bbolt uses: the file is damaged"
            )));
        }
        // (so that every page a tree names lies within the file, and offsets cannot overflow)
        if meta.pages.checked_mul(size).is_none_or(|end| end > len) {
            return Err(damaged(format!(
                "its meta page counts {} pages of {size} bytes, more than its {len} bytes: the \
                 file is truncated or damaged",
                meta.pages
            )));
        }
        r.meta = meta;
        Ok(r)
    }

    fn read(&self, at: u64, len: usize) -> Result<Vec<u8>, BboltError> {
        use std::os::unix::fs::FileExt;
        if at.checked_add(len as u64).is_none_or(|end| end > self.len) {
            return Err(damaged(format!(
                "it ends at byte {} inside a page that starts at byte {at}: the file is \
                 truncated or damaged",
                self.len
            )));
        }
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, at)
            .map_err(|source| BboltError::Read { at, source })?;
        Ok(buf)
    }

    /// Page `id` with its overflow pages.
    fn page(&self, id: u64, want: u16) -> Result<Vec<u8>, BboltError> {
        let size = u64::from(self.meta.page_size);
        let bad = |why: String| damaged(format!("page {id}: {why}: the file is damaged"));
        if id < 2 || id >= self.meta.pages {
            return Err(bad(format!(
                "a tree points at it, but the file has pages 2 to {}",
                self.meta.pages.saturating_sub(1)
            )));
        }
        let head = self.read(id * size, HEADER)?;
        let overflow = u64::from(u32_at(&head, 12));
        if id + overflow >= self.meta.pages {
            return Err(bad(format!(
                "its {overflow} overflow pages run past the end"
            )));
        }
        let flags = u16_at(&head, 8);
        if flags & want == 0 {
            return Err(bad(format!(
                "flags {flags:#x} where a tree node was expected"
            )));
        }
        self.read(id * size, ((1 + overflow) * size) as usize)
    }

    /// The root bucket: the one whose elements are the file's buckets.
    fn top(&self) -> Bucket {
        Bucket(Root::Page(self.meta.root))
    }

    /// The bucket `name` of the file, if it has one.
    pub fn bucket(&self, name: &[u8]) -> Result<Option<Bucket>, BboltError> {
        let mut found = None;
        self.walk(&self.top(), &mut |bucket, key, value| {
            if bucket && key == name {
                found = Some(Bucket::from_value(value)?);
            }
            Ok(())
        })?;
        Ok(found)
    }

    /// Calls `f` with every key and value of `bucket`, in key order, skipping nested buckets.
    pub fn for_each<E: From<BboltError>>(
        &self,
        bucket: &Bucket,
        f: &mut PairFn<'_, E>,
    ) -> Result<(), E> {
        self.walk(bucket, &mut |nested, k, v| {
            if nested { Ok(()) } else { f(k, v) }
        })
    }

    fn walk<E: From<BboltError>>(&self, bucket: &Bucket, f: &mut VisitFn<'_, E>) -> Result<(), E> {
        match &bucket.0 {
            Root::Page(id) => self.walk_page(*id, 0, &mut HashSet::new(), f),
            Root::Inline(node) => visit(node, f),
        }
    }

    /// Walks the tree at page `id`; `seen` holds the pages walked so far (a tree reaches each
    /// page once: a damaged file whose pages point back at each other must not loop).
    fn walk_page<E: From<BboltError>>(
        &self,
        id: u64,
        depth: usize,
        seen: &mut HashSet<u64>,
        f: &mut VisitFn<'_, E>,
    ) -> Result<(), E> {
        if depth > MAX_DEPTH {
            return Err(damaged(format!(
                "page {id}: a tree deeper than {MAX_DEPTH} levels: the file is damaged"
            ))
            .into());
        }
        if !seen.insert(id) {
            return Err(damaged(format!("page {id} is reached twice: the file is damaged")).into());
        }
        let page = self.page(id, BRANCH | LEAF)?;
        let mut children = Vec::new();
        elements::<E>(&format!("page {id}"), &page, &mut |e| {
            match e {
                Element::Child(child) => children.push(child),
                Element::Pair { bucket, key, value } => f(bucket, key, value)?,
            }
            Ok(())
        })?;
        for child in children {
            self.walk_page(child, depth + 1, seen, f)?;
        }
        Ok(())
    }
}

impl Bucket {
    fn from_value(value: &[u8]) -> Result<Bucket, BboltError> {
        if value.len() < 16 {
            return Err(damaged(format!(
                "a bucket's value of {} bytes (at least 16): the file is damaged",
                value.len()
            )));
        }
        Ok(Bucket(match u64_at(value, 0) {
            0 => Root::Inline(value[16..].to_vec()),
            id => Root::Page(id),
        }))
    }
}

/// Calls `f` with the pairs of an inline leaf node.
fn visit<E: From<BboltError>>(node: &[u8], f: &mut VisitFn<'_, E>) -> Result<(), E> {
    elements("an inline bucket", node, &mut |e| match e {
        Element::Pair { bucket, key, value } => f(bucket, key, value),
        Element::Child(_) => Err(damaged("an inline bucket with a branch node".into()).into()),
    })
}

/// The elements of the node `node` (header first), every offset checked; `place` names the
/// node in messages.
fn elements<E: From<BboltError>>(
    place: &str,
    node: &[u8],
    f: &mut dyn FnMut(Element<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let damaged = |what: &str| {
        damaged(format!(
            "{place}: {what} out of the node's bounds: the file is damaged"
        ))
    };
    if node.len() < HEADER {
        return Err(damaged("a node header").into());
    }
    let flags = u16_at(node, 8);
    let count = usize::from(u16_at(node, 10));
    let leaf = flags & LEAF != 0;
    if !leaf && flags & BRANCH == 0 {
        return Err(BboltError::Damaged(format!(
            "{place}: flags {flags:#x} where a tree node was expected"
        ))
        .into());
    }
    for i in 0..count {
        let at = HEADER + i * ELEMENT;
        let e = node
            .get(at..at + ELEMENT)
            .ok_or_else(|| damaged("an element"))?;
        let slice = |pos: u32, len: u32| {
            let start = at
                .checked_add(pos as usize)
                .ok_or_else(|| damaged("a key"))?;
            let end = start
                .checked_add(len as usize)
                .ok_or_else(|| damaged("a key"))?;
            node.get(start..end)
                .ok_or_else(|| damaged("a key or value"))
        };
        if leaf {
            let (eflags, pos, ksize, vsize) =
                (u32_at(e, 0), u32_at(e, 4), u32_at(e, 8), u32_at(e, 12));
            let both = slice(
                pos,
                ksize.checked_add(vsize).ok_or_else(|| damaged("a value"))?,
            )?;
            let (key, value) = both.split_at(ksize as usize);
            f(Element::Pair {
                bucket: eflags & BUCKET != 0,
                key,
                value,
            })?;
        } else {
            f(Element::Child(u64_at(e, 8)))?;
        }
    }
    Ok(())
}

/// The node page `id` holding `items`, padded to whole pages (with overflow pages if they need
/// more than one).
fn encode_node(id: u64, items: &[Item], leaf: bool) -> io::Result<Vec<u8>> {
    let size = HEADER + items.iter().map(Item::size).sum::<usize>();
    let pages = size.div_ceil(PAGE_SIZE).max(1);
    let mut node = vec![0u8; pages * PAGE_SIZE];
    node[..8].copy_from_slice(&id.to_le_bytes());
    node[8..10].copy_from_slice(&(if leaf { LEAF } else { BRANCH }).to_le_bytes());
    let count = u16::try_from(items.len()).expect("a page holds fewer than 2^16 elements");
    node[10..12].copy_from_slice(&count.to_le_bytes());
    let overflow = u32::try_from(pages - 1).map_err(|_| io::Error::other("a huge value"))?;
    node[12..16].copy_from_slice(&overflow.to_le_bytes());
    let mut data = HEADER + items.len() * ELEMENT;
    for (i, item) in items.iter().enumerate() {
        let at = HEADER + i * ELEMENT;
        let pos = (data - at) as u32;
        let e = &mut node[at..at + ELEMENT];
        match item {
            Item::Leaf { flags, key, value } => {
                e[..4].copy_from_slice(&flags.to_le_bytes());
                e[4..8].copy_from_slice(&pos.to_le_bytes());
                e[8..12].copy_from_slice(&(key.len() as u32).to_le_bytes());
                e[12..16].copy_from_slice(&(value.len() as u32).to_le_bytes());
                node[data..data + key.len()].copy_from_slice(key);
                data += key.len();
                node[data..data + value.len()].copy_from_slice(value);
                data += value.len();
            }
            Item::Branch { key, child } => {
                e[..4].copy_from_slice(&pos.to_le_bytes());
                e[4..8].copy_from_slice(&(key.len() as u32).to_le_bytes());
                e[8..16].copy_from_slice(&child.to_le_bytes());
                node[data..data + key.len()].copy_from_slice(key);
                data += key.len();
            }
        }
    }
    Ok(node)
}

/// One pending element of a node being built.
enum Item {
    Leaf {
        flags: u32,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Branch {
        key: Vec<u8>,
        child: u64,
    },
}

impl Item {
    fn key(&self) -> &[u8] {
        match self {
            Item::Leaf { key, .. } | Item::Branch { key, .. } => key,
        }
    }
    fn size(&self) -> usize {
        ELEMENT
            + match self {
                Item::Leaf { key, value, .. } => key.len() + value.len(),
                Item::Branch { key, .. } => key.len(),
            }
    }
}

/// One level of a tree being built: the node being filled, and whether a node of this level
/// was written already (then it is not the root).
#[derive(Default)]
struct Level {
    items: Vec<Item>,
    size: usize,
    wrote: bool,
}

/// A new bbolt file written to `out`, page by page: buckets are added whole, their keys in
/// order ([`Writer::bucket`]); [`Writer::finish`] writes the meta pages. Memory holds one node
/// per level of the tree being built, never the data.
#[derive(Debug)]
pub struct Writer<W: Write + Seek> {
    out: W,
    next: u64,
    /// The file's buckets: (name, the bucket's value: its root page and sequence).
    buckets: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Builds one bucket's tree (see [`Writer::bucket`]).
pub struct TreeBuilder<'w, W: Write + Seek> {
    writer: &'w mut Writer<W>,
    levels: Vec<Level>,
    last: Option<Vec<u8>>,
}

impl<W: Write + Seek> std::fmt::Debug for TreeBuilder<'_, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TreeBuilder")
            .field("levels", &self.levels.len())
            .finish()
    }
}

impl<W: Write + Seek> Writer<W> {
    /// Starts the file: the meta pages (filled in by `finish`) and an empty freelist.
    pub fn new(mut out: W) -> io::Result<Writer<W>> {
        out.write_all(&[0u8; 2 * PAGE_SIZE])?;
        let mut freelist = vec![0u8; PAGE_SIZE];
        freelist[..8].copy_from_slice(&2u64.to_le_bytes());
        freelist[8..10].copy_from_slice(&FREELIST.to_le_bytes());
        out.write_all(&freelist)?;
        Ok(Writer {
            out,
            next: 3,
            buckets: Vec::new(),
        })
    }

    /// Starts the bucket `name`; names must come in order, and so must its keys.
    pub fn bucket(&mut self, name: &[u8]) -> TreeBuilder<'_, W> {
        assert!(
            self.buckets
                .last()
                .is_none_or(|(last, _)| last.as_slice() < name),
            "buckets in name order"
        );
        self.buckets.push((name.to_vec(), Vec::new()));
        TreeBuilder {
            writer: self,
            levels: vec![Level::default()],
            last: None,
        }
    }

    /// Writes `items` as one node (with overflow pages if they need more than a page); returns
    /// its page id.
    fn node(&mut self, items: &[Item], leaf: bool) -> io::Result<u64> {
        let id = self.next;
        let node = encode_node(id, items, leaf)?;
        self.out.write_all(&node)?;
        self.next += (node.len() / PAGE_SIZE) as u64;
        Ok(id)
    }

    /// Writes the root bucket and the meta pages; returns the writer, positioned at the end
    /// of the file.
    pub fn finish(mut self) -> io::Result<W> {
        let buckets = std::mem::take(&mut self.buckets);
        let mut top = TreeBuilder {
            writer: &mut self,
            levels: vec![Level::default()],
            last: None,
        };
        for (name, value) in buckets {
            top.add(Item::Leaf {
                flags: BUCKET,
                key: name,
                value,
            })?;
        }
        let root = top.root()?;
        let mut meta = Meta {
            page_size: PAGE_SIZE as u32,
            root,
            freelist: 2,
            pages: self.next,
            txid: 1,
        };
        self.out.seek(SeekFrom::Start(0))?;
        self.out.write_all(&meta.page(0))?;
        meta.txid = 2;
        self.out.write_all(&meta.page(1))?;
        self.out.seek(SeekFrom::End(0))?;
        Ok(self.out)
    }
}

impl<W: Write + Seek> TreeBuilder<'_, W> {
    /// Adds `key` -> `value`; keys must come in increasing order.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> io::Result<()> {
        if self.last.as_deref().is_some_and(|last| last >= key) {
            return Err(io::Error::other(format!(
                "keys out of order: {key:?} after {:?}",
                self.last
            )));
        }
        self.last = Some(key.to_vec());
        self.add(Item::Leaf {
            flags: 0,
            key: key.to_vec(),
            value: value.to_vec(),
        })
    }

    fn add(&mut self, item: Item) -> io::Result<()> {
        self.add_at(0, item)
    }

    fn add_at(&mut self, level: usize, item: Item) -> io::Result<()> {
        let l = &self.levels[level];
        if !l.items.is_empty() && HEADER + l.size + item.size() > PAGE_SIZE {
            self.flush(level)?;
        }
        let l = &mut self.levels[level];
        l.size += item.size();
        l.items.push(item);
        Ok(())
    }

    /// Writes level `level`'s node and adds it to the level above.
    fn flush(&mut self, level: usize) -> io::Result<()> {
        let l = &mut self.levels[level];
        let items = std::mem::take(&mut l.items);
        l.size = 0;
        l.wrote = true;
        let id = self.writer.node(&items, level == 0)?;
        if self.levels.len() == level + 1 {
            self.levels.push(Level::default());
        }
        let key = items.into_iter().next().map(|i| i.key().to_vec());
        self.add_at(
            level + 1,
            Item::Branch {
                key: key.unwrap_or_default(),
                child: id,
            },
        )
    }

    /// Writes what is pending; returns the tree's root page.
    fn root(&mut self) -> io::Result<u64> {
        let mut level = 0;
        loop {
            let top = level + 1 == self.levels.len();
            if top && !self.levels[level].wrote {
                let items = std::mem::take(&mut self.levels[level].items);
                return self.writer.node(&items, level == 0);
            }
            self.flush(level)?;
            level += 1;
        }
    }

    /// Ends the bucket.
    pub fn finish(mut self) -> io::Result<()> {
        let root = self.root()?;
        let mut value = root.to_le_bytes().to_vec();
        value.extend(0u64.to_le_bytes());
        self.writer
            .buckets
            .last_mut()
            .expect("a bucket was started")
            .1 = value;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    type Buckets = Vec<(Vec<u8>, Vec<(Vec<u8>, Vec<u8>)>)>;

    fn write(buckets: &Buckets) -> tempfile::NamedTempFile {
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut w = Writer::new(file.reopen().unwrap()).unwrap();
        for (name, pairs) in buckets {
            let mut b = w.bucket(name);
            for (k, v) in pairs {
                b.put(k, v).unwrap();
            }
            b.finish().unwrap();
        }
        w.finish().unwrap().sync_all().unwrap();
        file
    }

    fn read(file: &std::fs::File, names: &[Vec<u8>]) -> Result<Buckets, BboltError> {
        let len = file.metadata().unwrap().len();
        let r = Reader::open(file.try_clone().unwrap(), len)?;
        let mut out = Vec::new();
        for name in names {
            let mut pairs = Vec::new();
            if let Some(b) = r.bucket(name)? {
                r.for_each(&b, &mut |k, v| {
                    pairs.push((k.to_vec(), v.to_vec()));
                    Ok(())
                })?;
            }
            out.push((name.clone(), pairs));
        }
        Ok(out)
    }

    fn sample(seed: u64) -> Buckets {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let big: Vec<(Vec<u8>, Vec<u8>)> = (0..20_000u64)
            .map(|i| {
                let len = match i % 500 {
                    0 => 3 * PAGE_SIZE + 17,
                    1 => PAGE_SIZE,
                    _ => rng.random_range(0..300),
                };
                (
                    i.to_be_bytes().to_vec(),
                    (0..len).map(|_| rng.random()).collect(),
                )
            })
            .collect();
        vec![
            (b"a-empty".to_vec(), Vec::new()),
            (b"key".to_vec(), big),
            (b"meta".to_vec(), vec![(b"x".to_vec(), b"1".to_vec())]),
        ]
    }

    #[test]
    fn buckets_written_read_back_the_same() {
        let seed = 7;
        let buckets = sample(seed);
        let file = write(&buckets);
        let names: Vec<Vec<u8>> = buckets.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(
            read(file.as_file(), &names).unwrap(),
            buckets,
            "seed {seed}"
        );
        assert!(
            read(file.as_file(), &[b"missing".to_vec()]).unwrap()[0]
                .1
                .is_empty()
        );
        // Both meta pages valid; the newer one is used.
        let len = file.as_file().metadata().unwrap().len();
        assert_eq!(len % PAGE_SIZE as u64, 0);
        let r = Reader::open(file.reopen().unwrap(), len).unwrap();
        assert_eq!((r.meta.txid, r.meta.pages * PAGE_SIZE as u64), (2, len));
    }

    #[test]
    fn a_damaged_meta_page_falls_back_to_the_other_and_two_are_refused() {
        let buckets = sample(1);
        let file = write(&buckets);
        let names = vec![b"key".to_vec()];
        let mut bytes = std::fs::read(file.path()).unwrap();
        bytes[PAGE_SIZE + 40] ^= 1;
        std::fs::write(file.path(), &bytes).unwrap();
        assert_eq!(read(file.as_file(), &names).unwrap()[0].1, buckets[1].1);
        bytes[40] ^= 1;
        std::fs::write(file.path(), &bytes).unwrap();
        let err = read(file.as_file(), &names).unwrap_err();
        assert!(err.to_string().contains("meta pages"), "{err}");
    }

    #[test]
    fn a_truncated_file_is_named_as_such() {
        let file = write(&sample(2));
        let bytes = std::fs::read(file.path()).unwrap();
        std::fs::write(file.path(), &bytes[..bytes.len() - PAGE_SIZE]).unwrap();
        let err = read(file.as_file(), &[b"key".to_vec()]).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
    }

    /// bbolt stores a small bucket inline, in its parent's leaf (etcd's `meta`, `auth`, ...):
    /// root page 0, then the bucket's leaf node.
    #[test]
    fn an_inline_bucket_is_read() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let mut w = Writer::new(file.reopen().unwrap()).unwrap();
        let pairs = [
            (b"k1".to_vec(), b"v1".to_vec()),
            (b"k2".to_vec(), Vec::new()),
        ];
        let items: Vec<Item> = pairs
            .iter()
            .map(|(key, value)| Item::Leaf {
                flags: 0,
                key: key.clone(),
                value: value.clone(),
            })
            .collect();
        let node = encode_node(0, &items, true).unwrap();
        let used = HEADER + items.iter().map(Item::size).sum::<usize>();
        let mut value = vec![0u8; 16];
        value.extend(&node[..used]);
        w.buckets.push((b"inline".to_vec(), value));
        w.finish().unwrap().sync_all().unwrap();
        let got = read(file.as_file(), &[b"inline".to_vec()]).unwrap();
        assert_eq!(got[0].1, pairs.to_vec());
    }

    /// Damage anywhere is an error or other data, never a panic, a hang or a huge allocation.
    #[test]
    fn random_damage_never_panics() {
        let seed: u64 = std::env::var("BBOLT_DAMAGE_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(rand::random);
        println!("seed {seed} (BBOLT_DAMAGE_SEED={seed} replays it)");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let buckets: Buckets = vec![(
            b"key".to_vec(),
            (0..3000u32)
                .map(|i| (i.to_be_bytes().to_vec(), vec![i as u8; (i % 700) as usize]))
                .collect(),
        )];
        let file = write(&buckets);
        let good = std::fs::read(file.path()).unwrap();
        for _ in 0..200 {
            let mut bad = good.clone();
            for _ in 0..rng.random_range(1..8) {
                let at = rng.random_range(0..bad.len());
                bad[at] = rng.random();
            }
            if rng.random_bool(0.2) {
                bad.truncate(rng.random_range(0..bad.len()));
            }
            std::fs::write(file.path(), &bad).unwrap();
            let _ = read(file.as_file(), &[b"key".to_vec()]);
        }
    }
}
