//! The storage failures an operator meets (full disk, read-only mount), on real tmpfs mounts.

use std::path::Path;
use std::process::Command;

use witness_core::{AppendRequest, Caller, Error, Witness, WitnessStore};

use crate::{open, state};

/// A small tmpfs mounted for one test; unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "this test mounts a small tmpfs and needs root (CAP_SYS_ADMIN), as the README's test command has: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn remount_read_only(&self) {
        let ok = Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(self.path())
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

fn append(subterm: u64) -> AppendRequest {
    AppendRequest {
        caller: Caller {
            cluster_id: 1,
            witness_id: 3,
            seen: witness_core::Seen::NOTHING,
        },
        term: 1,
        leader: 1,
        entry_term: 1,
        entry_subterm: subterm,
        index: subterm,
        replication_set: vec![1, 3],
        replication_set_outgoing: vec![],
    }
}

#[tokio::test]
async fn a_full_disk_is_a_clear_error_and_changes_nothing() {
    let fs = Tmpfs::mount("64k");
    let store = open(fs.path());
    store.create(&state(0, 1)).await.unwrap();
    let w = Witness::new(store.clone());
    w.append(&append(1)).await.unwrap();
    let before = store.load().await.unwrap().unwrap();
    let files_before = std::fs::read_dir(fs.path()).unwrap().count();
    // Fill the file system.
    let filler = fs.path().join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 1 << 20]);
    let err = w.append(&append(2)).await.unwrap_err();
    assert!(matches!(err, Error::NoSpace { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("free space on the witness storage"),
        "{err}"
    );
    assert_eq!(
        store.load().await.unwrap().unwrap(),
        before,
        "state unchanged"
    );
    assert_eq!(
        std::fs::read_dir(fs.path()).unwrap().count(),
        files_before + 1,
        "only the filler is new: no temp file left behind"
    );
    std::fs::remove_file(&filler).unwrap();
    w.append(&append(2))
        .await
        .expect("works again once space is freed");
}

#[tokio::test]
async fn a_read_only_mount_is_a_clear_error_and_changes_nothing() {
    let fs = Tmpfs::mount("1m");
    let store = open(fs.path());
    store.create(&state(0, 1)).await.unwrap();
    let before = store.load().await.unwrap().unwrap();
    fs.remount_read_only();
    let w = Witness::new(open(fs.path()));
    let err = w.append(&append(1)).await.unwrap_err();
    assert!(matches!(err, Error::ReadOnly { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("mount the witness share read-write"),
        "{err}"
    );
    assert_eq!(store.load().await.unwrap().unwrap(), before);
    let err = witness_mount::check_directory(fs.path()).unwrap_err();
    assert!(matches!(err, Error::ReadOnly { .. }), "{err}");
}

#[test]
fn check_directory_reports_the_file_system_and_leaves_no_trace() {
    let fs = Tmpfs::mount("1m");
    let report = witness_mount::check_directory(fs.path()).unwrap();
    assert_eq!(report.fs_type, "tmpfs");
    assert!(!report.is_network);
    assert_eq!(std::fs::read_dir(fs.path()).unwrap().count(), 0);
}
