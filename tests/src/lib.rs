//! Test support shared by the workspace's tests: a real Azurite for the blob backend and account
//! SAS tokens for it; a real sshd with sshfs mounts for two clients of one directory; a local
//! etcd-node cluster of real processes; a Python venv with a PyPI etcd client.
//!
//! Invariants: every server started here is stopped when its handle drops, with SIGTERM (never
//! SIGKILL: Azurite loses acknowledged writes when killed); a missing tool is a test failure
//! that says how to install it, never a silent skip.

pub mod azurite;
pub mod cluster;
pub mod etcd;
pub mod faults;
pub mod linearizable;
pub mod pki;
pub mod powercut;
pub mod proxy;
pub mod python;
pub mod sshfs;
pub mod two_sites;
pub mod watch_check;

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How often [`within`] and [`eventually`] poll.
pub const POLL: Duration = Duration::from_millis(200);

/// Polls `cond` every [`POLL`] until it holds (true) or `limit` has passed (false). It is
/// always asked at least once, and once more at the limit.
pub fn within(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    loop {
        if cond() {
            return true;
        }
        if started.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(POLL.min(limit.saturating_sub(started.elapsed())));
    }
}

/// Polls `cond` until it holds; fails the test with `what` if it does not within `limit`.
#[track_caller]
pub fn eventually(limit: Duration, what: impl std::fmt::Display, cond: impl FnMut() -> bool) {
    if !within(limit, cond) {
        panic!("{what}: not within {limit:?}");
    }
}

/// `len` random characters of 64 kinds (the same for the same `seed`): a value the key space
/// cannot compress (LZ4 finds almost no repeats in it), for tests whose files must grow with
/// what they write (a quota, a snapshot's size).
pub fn incompressible(len: usize, seed: u64) -> String {
    use rand::{Rng, SeedableRng};
    const KINDS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len)
        .map(|_| char::from(KINDS[rng.random_range(0..64)]))
        .collect()
}

/// A free TCP port on 127.0.0.1, never the same one twice in this process (tests run in
/// parallel threads: a port released by one probe could otherwise be handed to two servers).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind a free loopback port")
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// The workspace root (where README.md and node_modules live).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}
