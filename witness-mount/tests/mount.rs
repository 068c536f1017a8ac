//! witness-mount against real directories: the conformance suite on temp dirs, the
//! multi-process race, the stale-writer gap, and the storage failures an operator meets
//! (missing or wrong path); full disks and read-only mounts are in the root tier (tests/root).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use witness_core::conformance::{self, Backend, Location};
use witness_core::{CasOutcome, Error, WitnessStore};
use witness_mount::{MountOptions, MountStore};

mod common;
use common::{RETENTION, open, options, state};

fn newest_file(dir: &Path) -> PathBuf {
    let seq = *open(dir)
        .list_versions()
        .unwrap()
        .last()
        .expect("a version");
    dir.join(format!("{seq:020}.st"))
}

struct DirLocation {
    dir: tempfile::TempDir,
}

#[async_trait::async_trait]
impl Location for DirLocation {
    async fn client(&self) -> Arc<dyn WitnessStore> {
        Arc::new(open(self.dir.path()))
    }
    async fn read_raw(&self) -> Vec<u8> {
        std::fs::read(newest_file(self.dir.path())).unwrap()
    }
    async fn write_raw(&self, bytes: &[u8]) {
        std::fs::write(newest_file(self.dir.path()), bytes).unwrap()
    }
    async fn stored_versions(&self) -> usize {
        open(self.dir.path()).list_versions().unwrap().len()
    }
    fn retention(&self) -> Option<usize> {
        Some(RETENTION)
    }
}

struct TempDirs;

#[async_trait::async_trait]
impl Backend for TempDirs {
    async fn fresh(&self) -> Arc<dyn Location> {
        Arc::new(DirLocation {
            dir: tempfile::tempdir().unwrap(),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn temp_dir_passes_the_conformance_suite() {
    conformance::run_all(&TempDirs).await;
}

static PROCESS_DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn increments_from_separate_processes_lose_nothing() {
    let dir = PROCESS_DIR.get_or_init(|| tempfile::tempdir().unwrap());
    let location = dir.path().to_str().unwrap().to_string();
    conformance::increments_in_processes(
        "increments_from_separate_processes_lose_nothing",
        &location,
        |loc| Arc::new(open(Path::new(loc))) as Arc<dyn WitnessStore>,
        4,
        50,
    )
    .await;
}

async fn initialised() -> (tempfile::TempDir, MountStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path());
    assert!(matches!(
        store.create(&state(0, 1)).await.unwrap(),
        CasOutcome::Written(_)
    ));
    (dir, store)
}

#[tokio::test]
async fn a_stalled_writer_cannot_fill_a_gap_left_by_clean_up() {
    let (dir, store) = initialised().await;
    let stale = store.load().await.unwrap().unwrap().version;
    // Another node writes well past the retention window; clean-up removes version 1.
    let other = open(dir.path());
    for term in 1..=(RETENTION as u64 + 3) {
        let v = other.load().await.unwrap().unwrap().version;
        assert!(matches!(
            other
                .compare_and_swap(&v, &state(term, 100 + term))
                .await
                .unwrap(),
            CasOutcome::Written(_)
        ));
    }
    let before = open(dir.path()).list_versions().unwrap();
    assert!(
        !before.contains(&1),
        "clean-up removed version 1: {before:?}"
    );
    // The stalled writer finally links version 1: it must notice and undo.
    let outcome = store
        .compare_and_swap(&stale, &state(99, 999))
        .await
        .unwrap();
    assert_eq!(outcome, CasOutcome::Conflict);
    assert_eq!(
        open(dir.path()).list_versions().unwrap(),
        before,
        "the gap file was removed"
    );
    assert_eq!(
        store.load().await.unwrap().unwrap().state.term,
        RETENTION as u64 + 3
    );
}

#[tokio::test]
async fn eexist_from_a_retransmitted_link_is_our_success() {
    let (dir, store) = initialised().await;
    let v0 = store.load().await.unwrap().unwrap().version;
    let mine = state(1, 0xfeed);
    // Simulate an NFS LINK that succeeded on the server but whose reply was lost: the target
    // already holds our record when we retry.
    std::fs::write(
        dir.path().join(format!("{:020}.st", 1)),
        witness_core::codec::encode(&mine),
    )
    .unwrap();
    assert!(matches!(
        store.compare_and_swap(&v0, &mine).await.unwrap(),
        CasOutcome::Written(_)
    ));
    // Someone else's record at the target is a lost race.
    let theirs = state(2, 0xbeef);
    std::fs::write(
        dir.path().join(format!("{:020}.st", 2)),
        witness_core::codec::encode(&theirs),
    )
    .unwrap();
    let v1 = open(dir.path()).list_versions().unwrap();
    assert_eq!(v1, vec![0, 1, 2]);
    let from_v1 = witness_core::Version::new(format!("1:{:016x}", 0xfeed));
    assert_eq!(
        store
            .compare_and_swap(&from_v1, &state(2, 0xaaaa))
            .await
            .unwrap(),
        CasOutcome::Conflict
    );
    assert_eq!(store.load().await.unwrap().unwrap().state, theirs);
}

#[tokio::test]
async fn orphaned_temp_files_are_removed_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let store = MountStore::open(
        dir.path(),
        MountOptions {
            temp_grace: Duration::ZERO,
            ..options()
        },
    )
    .unwrap();
    store.create(&state(0, 1)).await.unwrap();
    let orphan = dir.path().join("crashed-node-7.1.00000000000000aa.tmp");
    std::fs::write(&orphan, b"partial").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let v = store.load().await.unwrap().unwrap().version;
    store.compare_and_swap(&v, &state(1, 2)).await.unwrap();
    assert!(!orphan.exists(), "orphaned temp file removed");
    // A young temp file (a writer at work) is left alone with the default grace.
    let young = dir.path().join("busy-node-1.2.00000000000000bb.tmp");
    std::fs::write(&young, b"partial").unwrap();
    let store = open(dir.path());
    let v = store.load().await.unwrap().unwrap().version;
    store.compare_and_swap(&v, &state(2, 3)).await.unwrap();
    assert!(young.exists());
}

#[tokio::test]
async fn missing_path_and_file_path_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let err = MountStore::open(&missing, options()).unwrap_err();
    assert!(matches!(err, Error::NoSuchDirectory { .. }), "{err}");
    assert!(err.to_string().contains("mount the witness share"), "{err}");
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let err = MountStore::open(&file, options()).unwrap_err();
    assert!(matches!(err, Error::NotADirectory { .. }), "{err}");
}
