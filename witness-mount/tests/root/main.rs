//! witness-mount's root tier: real mounts (tmpfs, and sshfs over a loopback sshd), which need
//! root. Not part of the default `cargo test` (`test = false` in Cargo.toml); run it with
//! `cargo test -p witness-mount --test root` as root, or `bash scripts/test.sh root`.

#[path = "../common/mod.rs"]
mod common;
mod sshfs;
mod tmpfs;

use common::{RETENTION, open, state};
