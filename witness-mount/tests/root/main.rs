//! witness-mount's root tier: real mounts (tmpfs, and sshfs over a loopback sshd), which need
//! root. Not part of the default `cargo test` (`test = false` in Cargo.toml); run it with
//! `cargo test -p witness-mount --test root` as root, or `bash scripts/test.sh root`.

mod sshfs;
mod tmpfs;

use std::path::Path;

use witness_core::WitnessState;
use witness_mount::{MountOptions, MountStore};

const RETENTION: usize = 4;

fn options() -> MountOptions {
    MountOptions {
        retention: RETENTION,
        ..MountOptions::default()
    }
}

fn open(dir: &Path) -> MountStore {
    MountStore::open(dir, options()).expect("open witness dir")
}

fn state(term: u64, nonce: u64) -> WitnessState {
    WitnessState {
        term,
        writer_nonce: nonce,
        ..WitnessState::new(0, "w", "witness:mount?path=%2Fw")
    }
}
