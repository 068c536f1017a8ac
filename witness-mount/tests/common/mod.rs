//! What witness-mount's test binaries share (the fast `mount` and the root tier's `root`).
#![allow(dead_code)] // (each test binary uses a part of it)

use std::path::Path;

use witness_core::WitnessState;
use witness_mount::{MountOptions, MountStore};

/// Versions kept on a store these tests open.
pub const RETENTION: usize = 4;

pub fn options() -> MountOptions {
    MountOptions {
        retention: RETENTION,
        ..MountOptions::default()
    }
}

pub fn open(dir: &Path) -> MountStore {
    MountStore::open(dir, options()).expect("open witness dir")
}

/// A state of `term` written by the writer `nonce`.
pub fn state(term: u64, nonce: u64) -> WitnessState {
    WitnessState {
        term,
        writer_nonce: nonce,
        ..WitnessState::new(0, "w", "witness:mount?path=%2Fw")
    }
}
