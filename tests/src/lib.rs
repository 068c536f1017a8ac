//! Test support shared by the workspace's tests: a real Azurite for the blob backend, account
//! SAS tokens for it, and the paths of this workspace's binaries.
//!
//! Invariants: every server started here is stopped when its handle drops, with SIGTERM (never
//! SIGKILL: Azurite loses acknowledged writes when killed); a missing tool is a test failure
//! that says how to install it, never a silent skip.

pub mod azurite;

use std::path::PathBuf;

/// The workspace root (where README.md and node_modules live).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf()
}
