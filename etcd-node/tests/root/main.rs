//! The root tier: end-to-end tests that need root (tmpfs and sshfs mounts, network
//! namespaces, PostgreSQL running as its own user).
//! Not part of the default `cargo test` (`test = false` in Cargo.toml); run it with
//! `cargo test -p etcd-node --test root` as root, or `bash scripts/test.sh root`.
//!
//! - `faults`: short seeded slices of the fault campaign (tests/src/faults.rs).
//! - `powercut`: the power-cut file system the power-cut faults use, through real system calls.
//! - `patroni`: Patroni fails two PostgreSQL servers over on etcd-node.
//! - `two_sites`: two sites in network namespaces, with the delays and cuts between them.

mod faults;
mod patroni;
mod powercut;
mod two_sites;
