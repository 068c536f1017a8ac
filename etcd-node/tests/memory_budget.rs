//! Memory that must not grow with the key space: its page cache (`--backend-cache-bytes`: a
//! process that writes far more than its budget keeps its resident memory within it, where
//! redb's default cache of 1 GiB grows with the data), a snapshot's dump, which goes to its
//! file as it is read, and a key space restored from such a file, read a part at a time. Its
//! own test binary, one test: it measures its own process.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use etcd_client::proto::PbPutRequest;
use etcd_node::mvcc::{Command, Commits, Mvcc, Op, Proposal, rewrite, summarize};

fn rss_bytes() -> u64 {
    status_bytes("VmRSS:")
}

/// A line of /proc/self/status, in bytes.
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib * 1024
}

/// Applies `total` bytes of 32 KiB puts over 64 keys (as the Raft loop applies: batches of 64,
/// durable every 10,000 entries) to a key space in `dir`; returns it and how much the
/// process's RSS grew.
fn growth_writing(dir: &Path, cache: usize, total: u64) -> (Mvcc, u64) {
    let mvcc = Mvcc::open_with_cache(&dir.join("kv.redb"), cache).unwrap();
    // (bytes the key space cannot compress: the file must grow with what is written)
    let value = e2e_tests::incompressible(32 << 10, 1).into_bytes();
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
    (mvcc, grew)
}

/// How much the process's peak RSS grows while `f` runs.
fn peak_growth(f: impl FnOnce()) -> u64 {
    // Writing 5 to clear_refs resets the peak (VmHWM) to the current RSS (Linux 4.0+).
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
    let before = status_bytes("VmHWM:");
    f();
    status_bytes("VmHWM:").saturating_sub(before)
}

#[test]
fn memory_does_not_grow_with_the_key_space() {
    let written = 128 << 20;
    let budget = 16 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (mvcc, small) = growth_writing(dir.path(), budget, written);
    // The budget, plus what a batch holds in flight (64 values: 2 MiB) and the allocator's slack.
    assert!(
        small < budget as u64 + (24 << 20),
        "with a {} MiB cache RSS grew {} MiB writing {} MiB",
        budget >> 20,
        small >> 20,
        written >> 20
    );

    // A snapshot's dump (what the snapshot thread writes into the file) of those 128 MiB.
    let mut file = std::fs::File::create(dir.path().join("dump")).unwrap();
    let streamed = peak_growth(|| {
        mvcc.dump_to(&mut file, || {}).unwrap();
    });
    let whole = peak_growth(|| {
        let (dump, _) = mvcc.dump_with_revision().unwrap();
        assert!(dump.len() as u64 >= written);
    });
    println!(
        "a dump of {} MiB: peak RSS grew {} MiB streamed to its file, {} MiB held whole",
        written >> 20,
        streamed >> 20,
        whole >> 20
    );
    assert!(
        streamed < 16 << 20,
        "streaming the dump grew the peak RSS {} MiB",
        streamed >> 20
    );
    assert!(
        whole > written / 2,
        "the dump held whole is visible (this check can fail)"
    );
    drop(mvcc);

    // The receiving side: the dump rewritten for a restored cluster (`etcdutl snapshot
    // restore`), then a key space restored from a file (restore, and a member installing a
    // snapshot it received into its file), a part at a time.
    let dump_path = dir.path().join("dump");
    let rewritten_path = dir.path().join("rewritten");
    let mut summary = None;
    let rewrite = peak_growth(|| {
        let input = BufReader::new(File::open(&dump_path).unwrap());
        let mut out = BufWriter::new(File::create(&rewritten_path).unwrap());
        summary = Some(rewrite(input, &mut out, &[], 0, false).unwrap());
        out.flush().unwrap();
    });
    let restored = Mvcc::open_with_cache(&dir.path().join("restored.redb"), budget).unwrap();
    let restore = peak_growth(|| {
        let input = BufReader::new(File::open(&rewritten_path).unwrap());
        restored.restore(input, 1, Commits::Chunked).unwrap();
    });
    println!(
        "from a dump of {} MiB: peak RSS grew {} MiB rewriting it, {} MiB restoring a key space \
         with a {} MiB cache",
        written >> 20,
        rewrite >> 20,
        restore >> 20,
        budget >> 20
    );
    assert!(
        rewrite < 16 << 20,
        "rewriting the dump grew the peak RSS {} MiB",
        rewrite >> 20
    );
    assert!(
        restore < budget as u64 + (24 << 20),
        "restoring the key space grew the peak RSS {} MiB",
        restore >> 20
    );
    assert_eq!(
        summarize(restored.dump().unwrap().as_slice()).ok(),
        summary,
        "the restored key space holds what was written"
    );
    drop(restored);

    // The same writes with redb's default cache: RSS follows the data (the check above can fail).
    let other = tempfile::tempdir().unwrap();
    let (_, big) = growth_writing(other.path(), 1 << 30, written);
    assert!(
        big > 4 * small,
        "a 1 GiB cache grew RSS {} MiB, a {} MiB one {} MiB",
        big >> 20,
        budget >> 20,
        small >> 20
    );
}
