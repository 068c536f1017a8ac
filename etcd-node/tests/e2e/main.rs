//! The end-to-end tier: real etcd-node processes, Debian's etcdctl 3.4 and etcd 3.6's, the
//! clients of other languages, Azurite. Not part of the default `cargo test` (`test = false` in
//! Cargo.toml, it needs the tools `scripts/test.sh` installs); run it with
//! `cargo test -p etcd-node --test e2e` or `bash scripts/test.sh e2e`, one module with
//! `cargo test -p etcd-node --test e2e tls::`. Test support shared with the other tiers lives in
//! the `e2e-tests` crate (tests/src); what only this binary shares is here.

mod cluster;
mod etcdutl;
mod main_job;
mod metrics;
mod tls;
mod wal_dir;
mod witness_lifecycle;
mod witness_runtime;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

/// How long a test waits for a cluster to elect its first leader.
const LEADER_WAIT: Duration = Duration::from_secs(30);

/// Every file in `dir` with its contents.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

/// This build's etcd-node and etcdutl.
fn bins() -> (&'static Path, &'static Path) {
    (
        Path::new(env!("CARGO_BIN_EXE_etcd-node")),
        Path::new(env!("CARGO_BIN_EXE_etcdutl")),
    )
}

/// A command's stdout then stderr, as text.
fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The stdout of a command that must have succeeded (etcdctl, mostly).
#[track_caller]
fn ok(out: Output) -> String {
    assert!(out.status.success(), "the command failed: {}", text(&out));
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// The stdout then stderr of a command that must have succeeded (etcdctl 3.4 prints some
/// results, `endpoint health` among them, on stderr).
#[track_caller]
fn ok_all(out: Output) -> String {
    assert!(out.status.success(), "the command failed: {}", text(&out));
    text(&out)
}

/// The `witness:mount` URL of a directory.
fn mount_url(dir: &Path) -> String {
    format!(
        "witness:mount?path={}",
        percent_encoding::utf8_percent_encode(
            dir.to_str().expect("a UTF-8 path"),
            percent_encoding::NON_ALPHANUMERIC
        )
    )
}
