//! The key space's memory budget (`--backend-cache-bytes`): a process that writes far more than
//! its budget keeps its resident memory within it, where redb's default cache (1 GiB) grows with
//! the data. Its own test binary: it measures its own process.

use std::time::Instant;

use etcd_client::proto::PbPutRequest;
use etcd_node::mvcc::{Command, Mvcc, Op, Proposal};

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// Applies `total` bytes of 32 KiB puts over 64 keys (as the Raft loop applies: batches of 64,
/// durable every 10,000 entries); returns how much the process's RSS grew.
fn growth_writing(cache: usize, total: u64) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    let mvcc = Mvcc::open_with_cache(&dir.path().join("kv.redb"), cache).unwrap();
    let value = vec![b'v'; 32 << 10];
    let before = rss_bytes();
    let started = Instant::now();
    let mut index = 0;
    while index * (32 << 10) < total {
        let batch: Vec<(u64, Command)> = (1..=64)
            .map(|i| {
                let n = index + i;
                let put = PbPutRequest {
                    key: format!("k{}", n % 64).into_bytes(),
                    value: value.clone(),
                    ..Default::default()
                };
                (
                    n,
                    Command::Kv(Proposal {
                        id: n,
                        op: Some(Op::Put(put)),
                    }),
                )
            })
            .collect();
        index += 64;
        mvcc.apply(&batch, index % 10_000 < 64).unwrap();
    }
    let grew = rss_bytes().saturating_sub(before);
    println!(
        "cache {} MiB: {} MiB written in {:?}, RSS grew {} MiB",
        cache >> 20,
        total >> 20,
        started.elapsed(),
        grew >> 20
    );
    grew
}

#[test]
fn resident_memory_stays_within_the_cache_budget() {
    let written = 128 << 20;
    let budget = 16 << 20;
    let small = growth_writing(budget, written);
    // The budget, plus what a batch holds in flight (64 values: 2 MiB) and the allocator's slack.
    assert!(
        small < budget as u64 + (24 << 20),
        "with a {} MiB cache RSS grew {} MiB writing {} MiB",
        budget >> 20,
        small >> 20,
        written >> 20
    );
    // The same writes with redb's default cache: RSS follows the data (the check above can fail).
    let big = growth_writing(1 << 30, written);
    assert!(
        big > 4 * small,
        "a 1 GiB cache grew RSS {} MiB, a {} MiB one {} MiB",
        big >> 20,
        budget >> 20,
        small >> 20
    );
}
