//! witness-mount through two client mounts of one directory (sshfs over a real sshd on
//! loopback): one mount caches nothing, the other keeps sshfs's default caches (directory
//! listings 20 s, names and attributes 1 s), as an NFS client does. Clients alternate between
//! the two mounts, so every race in the conformance suite is a race between two file-system
//! clients, not two handles of one. Needs root and Debian's sshfs and openssh-server.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use e2e_tests::sshfs::{CACHED, COHERENT, SshServer, SshfsMount};
use witness_core::WitnessStore;
use witness_core::conformance::{self, Backend, Location};

use crate::{RETENTION, open};

/// One shared directory and its two client mounts. Field order matters: mounts drop first.
struct Shared {
    mounts: [SshfsMount; 2],
    dir: tempfile::TempDir,
    next: AtomicUsize,
}

impl Shared {
    fn newest_file(&self) -> std::path::PathBuf {
        let seq = *open(self.dir.path())
            .list_versions()
            .unwrap()
            .last()
            .expect("a version");
        self.dir.path().join(format!("{seq:020}.st"))
    }
}

#[async_trait::async_trait]
impl Location for Shared {
    async fn client(&self) -> Arc<dyn WitnessStore> {
        let i = self.next.fetch_add(1, Ordering::SeqCst) % 2;
        Arc::new(open(self.mounts[i].path()))
    }
    async fn read_raw(&self) -> Vec<u8> {
        std::fs::read(self.newest_file()).unwrap()
    }
    async fn write_raw(&self, bytes: &[u8]) {
        std::fs::write(self.newest_file(), bytes).unwrap()
    }
    async fn stored_versions(&self) -> usize {
        open(self.dir.path()).list_versions().unwrap().len()
    }
    fn retention(&self) -> Option<usize> {
        Some(RETENTION)
    }
}

struct Sshfs {
    server: SshServer,
}

impl Sshfs {
    fn shared(&self) -> Shared {
        let dir = tempfile::tempdir().unwrap();
        let mounts = [
            self.server.mount(dir.path(), COHERENT),
            self.server.mount(dir.path(), CACHED),
        ];
        Shared {
            mounts,
            dir,
            next: AtomicUsize::new(0),
        }
    }
}

#[async_trait::async_trait]
impl Backend for Sshfs {
    async fn fresh(&self) -> Arc<dyn Location> {
        Arc::new(self.shared())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sshfs_mounts_pass_the_conformance_suite() {
    let backend = Sshfs {
        server: SshServer::start(),
    };
    let fs = witness_mount::check_directory(backend.shared().mounts[1].path())
        .expect("hard links and fsync over sshfs");
    assert_eq!(fs.fs_type, "fuse");
    assert!(fs.is_network);
    conformance::run_all(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_on_two_sshfs_mounts_lose_nothing() {
    // (the name the test harness knows it by: its module in the root binary, then its own)
    const NAME: &str = "sshfs::processes_on_two_sshfs_mounts_lose_nothing";
    // The location names both mounts; each process picks one by its pid.
    let opener = |loc: &str| {
        let paths: Vec<&str> = loc.split('|').collect();
        let mine = paths[std::process::id() as usize % paths.len()];
        Arc::new(open(Path::new(mine))) as Arc<dyn WitnessStore>
    };
    if let Some(loc) = conformance::child_location() {
        return conformance::increments_in_processes(NAME, &loc, opener, 0, 30).await;
    }
    let backend = Sshfs {
        server: SshServer::start(),
    };
    let shared = backend.shared();
    let loc = format!(
        "{}|{}",
        shared.mounts[0].path().display(),
        shared.mounts[1].path().display()
    );
    conformance::increments_in_processes(NAME, &loc, opener, 4, 30).await;
}
