//! The key space alone (no Raft, no network): puts applied as the Raft loop applies them, to
//! see what a revision costs on disk and in memory as the history grows.
//!
//!   cargo bench -p etcd-node --bench keyspace -- [writes] [keys] [value bytes] [cache MiB]
//!
//! Prints one line per 100,000 writes: writes/s of that stretch, file size, bytes per revision,
//! the process's RSS.

use std::os::unix::fs::MetadataExt;
use std::time::Instant;

use etcd_client::proto::PbPutRequest;
use etcd_node::mvcc::{Command, Mvcc, Op, Proposal};

/// Entries per applied batch, and entries between durable commits (the server's loop).
const BATCH: u64 = 64;
const SYNC_EVERY: u64 = 10_000;
fn sync_every() -> u64 {
    std::env::var("SYNC_EVERY")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SYNC_EVERY)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let arg = |i: usize, default: u64| args.get(i).copied().unwrap_or(default);
    let (writes, keys, value_len) = (arg(0, 300_000), arg(1, 100_000), arg(2, 256));
    let cache = arg(3, 0);
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("kv.redb");
    let mvcc = if cache == 0 {
        Mvcc::open(&path)
    } else {
        Mvcc::open_with_cache(&path, (cache as usize) << 20)
    }
    .expect("open the key space");
    let value = vec![b'v'; value_len as usize];
    let mut index = 0u64;
    let mut unsynced = 0u64;
    let mut started = Instant::now();
    let mut stretch = 0u64;
    while index < writes {
        let batch: Vec<(u64, Command)> = (0..BATCH)
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
        index += BATCH;
        unsynced += BATCH;
        let durable = unsynced >= sync_every();
        if durable {
            unsynced = 0;
        }
        mvcc.apply(&batch, durable).expect("apply");
        stretch += BATCH;
        if index % 100_032 < BATCH {
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
}
