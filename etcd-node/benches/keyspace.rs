//! The key space alone (no Raft, no network): puts applied as the Raft loop applies them, to
//! see what a revision costs on disk and in memory as the history grows.
//!
//!   cargo bench -p etcd-node --bench keyspace -- [writes] [keys] [value bytes] [cache MiB]
//!
//! Prints one line per 100,000 writes: writes/s of that stretch, file size, bytes per revision,
//! the process's RSS; then the time of a range over every key (values, and count only).
//! `BATCH=<n>` sets the entries applied per transaction (64), `SYNC_EVERY=<n>` the entries
//! between durable commits (10,000).
//!
//!   FORMAT2=1 cargo bench -p etcd-node --bench keyspace -- [rows] [keys] [value bytes]
//!
//! Writes a key-space file as format 2 stored it (values inside `history`), then times the
//! open that upgrades it to the current format, and a defragment after it.

use std::os::unix::fs::MetadataExt;
use std::time::Instant;

use etcd_client::proto::PbPutRequest;
use etcd_node::mvcc::{Command, Mvcc, Op, Proposal};
use rand::SeedableRng;

/// Entries per applied batch (`BATCH`), and entries between durable commits (`SYNC_EVERY`), as
/// the server's applier takes them by default.
const BATCH: u64 = 64;
const SYNC_EVERY: u64 = 10_000;
fn from_env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

fn peak_rss_kib() -> u64 {
    proc_status_kib("VmHWM:")
}

fn rss_kib() -> u64 {
    proc_status_kib("VmRSS:")
}

fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A file as format 2 wrote it: `history` (key, revision) -> `KeyValue` without its key,
/// `live` key -> revision, `meta` (format 2), the guard table `current`; `rows` puts over
/// `keys` keys, one revision each.
fn write_format2(path: &std::path::Path, rows: u64, keys: u64, value: &[u8]) {
    use prost::Message;
    use redb::TableDefinition;
    const HISTORY: TableDefinition<(&[u8], u64), &[u8]> = TableDefinition::new("history");
    const LIVE: TableDefinition<&[u8], u64> = TableDefinition::new("live");
    const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
    const GUARD: TableDefinition<u64, ()> = TableDefinition::new("current");
    let db = redb::Database::create(path).expect("create");
    let mut versions = vec![0i64; keys as usize];
    let mut created = vec![0i64; keys as usize];
    let mut rev = 1u64;
    while rev <= rows {
        let tx = db.begin_write().expect("write");
        {
            let mut history = tx.open_table(HISTORY).expect("history");
            let mut live = tx.open_table(LIVE).expect("live");
            let mut meta = tx.open_table(META).expect("meta");
            tx.open_table(GUARD).expect("guard");
            for _ in 0..100_000 {
                if rev > rows {
                    break;
                }
                rev += 1;
                let k = ((rev * 7919) % keys) as usize;
                let key = format!("key/{k:08}").into_bytes();
                versions[k] += 1;
                if versions[k] == 1 {
                    created[k] = rev as i64;
                }
                let kv = etcd_client::proto::PbKeyValue {
                    key: Vec::new(),
                    create_revision: created[k],
                    mod_revision: rev as i64,
                    version: versions[k],
                    value: value.to_vec(),
                    lease: 0,
                };
                history
                    .insert((key.as_slice(), rev), kv.encode_to_vec().as_slice())
                    .expect("insert");
                live.insert(key.as_slice(), rev).expect("live");
            }
            meta.insert("format", 2).expect("format");
            meta.insert("revision", rev).expect("revision");
        }
        tx.commit().expect("commit");
    }
}

/// FORMAT2=1: a format-2 file upgraded by opening it, in a process of its own (its peak RSS is
/// the upgrade's, not the writer's).
fn upgrade(rows: u64, keys: u64, value_len: u64) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("kv.redb");
    write_format2(&path, rows, keys, &vec![b'v'; value_len as usize]);
    let status = std::process::Command::new(std::env::current_exe().expect("this program"))
        .env_remove("FORMAT2")
        .env("FORMAT2_OPEN", &path)
        .status()
        .expect("run the upgrade");
    assert!(status.success(), "the upgrade failed: {status}");
}

/// FORMAT2_OPEN=<file>: opens (upgrades) it, then defragments it.
fn open_format2(path: &std::path::Path) {
    let on_disk =
        |p: &std::path::Path| std::fs::metadata(p).map_or(0.0, |m| (m.blocks() * 512) as f64 / 1e6);
    let before = on_disk(path);
    let started = Instant::now();
    let mvcc = Mvcc::open(path).expect("open and upgrade");
    let upgrade_s = started.elapsed().as_secs_f64();
    let (after, peak) = (on_disk(path), peak_rss_kib() as f64 / 1024.0);
    let started = Instant::now();
    mvcc.defragment().expect("defragment");
    println!(
        "RESULT upgrade format2_mb={before:.1} upgrade_s={upgrade_s:.1} upgraded_mb={after:.1} \
         peak_rss_mb={peak:.1} defragment_s={:.1} defragmented_mb={:.1}",
        started.elapsed().as_secs_f64(),
        on_disk(path)
    );
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let arg = |i: usize, default: u64| args.get(i).copied().unwrap_or(default);
    let (writes, keys, value_len) = (arg(0, 300_000), arg(1, 100_000), arg(2, 256));
    if let Some(path) = std::env::var_os("FORMAT2_OPEN") {
        return open_format2(std::path::Path::new(&path));
    }
    if std::env::var_os("FORMAT2").is_some() {
        return upgrade(writes, keys, value_len);
    }
    let cache = arg(3, 0);
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("kv.redb");
    let mvcc = if cache == 0 {
        Mvcc::open(&path)
    } else {
        Mvcc::open_with_cache(&path, (cache as usize) << 20)
    }
    .expect("open the key space");
    // (random bytes, as etcd's benchmark tool writes: values that do not compress)
    let mut value = vec![0u8; value_len as usize];
    rand::Rng::fill(
        &mut rand::rngs::StdRng::seed_from_u64(1),
        value.as_mut_slice(),
    );
    let mut index = 0u64;
    let mut unsynced = 0u64;
    let mut started = Instant::now();
    let mut stretch = 0u64;
    let (batch_len, sync_every) = (from_env("BATCH", BATCH), from_env("SYNC_EVERY", SYNC_EVERY));
    while index < writes {
        let batch: Vec<(u64, Command)> = (0..batch_len)
            .map(|i| {
                let n = index + i + 1;
                let key = format!("key/{:08}", (n * 7919) % keys).into_bytes();
                let put = PbPutRequest {
                    key,
                    value: value.clone(),
                    ..Default::default()
                };
                let op = Some(Op::Put(put));
                (n, Command::Kv(Proposal { id: n, op }))
            })
            .collect();
        index += batch_len;
        unsynced += batch_len;
        let durable = unsynced >= sync_every;
        if durable {
            unsynced = 0;
        }
        mvcc.apply(&batch, durable).expect("apply");
        stretch += batch_len;
        if index % 100_032 < batch_len {
            let secs = started.elapsed().as_secs_f64();
            let meta = std::fs::metadata(&path).expect("the key-space file");
            // (the file may be sparse: blocks are what the disk holds)
            let (size, on_disk) = (meta.len(), meta.blocks() * 512);
            let (allocated, stored) = mvcc.space().expect("space");
            println!(
                "RESULT writes={index} writes_per_s={:.0} file_mb={:.1} on_disk_mb={:.1} allocated_mb={:.1} stored_mb={:.1} allocated_per_revision={:.0} rss_mb={:.1}",
                stretch as f64 / secs,
                size as f64 / 1e6,
                on_disk as f64 / 1e6,
                allocated as f64 / 1e6,
                stored as f64 / 1e6,
                allocated as f64 / index as f64,
                rss_kib() as f64 / 1024.0
            );
            started = Instant::now();
            stretch = 0;
        }
    }
    // A range over every key, as a list of a prefix: with few keys written many times and never
    // compacted (e.g. `-- 300000 100`), each key has thousands of rows.
    for (what, count_only) in [("values", false), ("count", true)] {
        let req = etcd_client::proto::PbRangeRequest {
            key: b"key/".to_vec(),
            range_end: b"key0".to_vec(),
            count_only,
            ..Default::default()
        };
        let started = Instant::now();
        let rounds = 20;
        let mut found = 0;
        for _ in 0..rounds {
            found = mvcc.range(&req).expect("range").expect("answered").count;
        }
        println!(
            "RESULT range_all={what} keys={found} revisions_per_key={} ms_per_range={:.2}",
            writes / keys.max(1),
            started.elapsed().as_secs_f64() * 1000.0 / rounds as f64
        );
    }
}
