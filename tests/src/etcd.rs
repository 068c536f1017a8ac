//! A real etcd as a one-member cluster, for the tests that move data between etcd and
//! etcd-node: Debian's etcd-server 3.4, or etcd 3.6 built from its Go module by
//! `scripts/build-go.sh`. Stopped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// An etcd release's commands.
#[derive(Debug, Clone)]
pub struct Release {
    pub name: &'static str,
    pub etcd: PathBuf,
    pub etcdctl: PathBuf,
    /// The command with etcd's own `snapshot restore`: etcdutl since 3.5, 3.4's etcdctl.
    restore: PathBuf,
}

impl Release {
    /// Debian's etcd-server and etcd-client (3.4), from PATH.
    pub fn debian_3_4() -> Release {
        Release {
            name: "3.4",
            etcd: "etcd".into(),
            etcdctl: "etcdctl".into(),
            restore: "etcdctl".into(),
        }
    }

    /// etcd 3.6 from `target/go/etcd36`; a missing build fails with the command that makes it.
    pub fn v3_6() -> Release {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/go/etcd36");
        for bin in ["etcd", "etcdctl", "etcdutl"] {
            assert!(
                dir.join(bin).exists(),
                "{} is missing: run `bash scripts/build-go.sh etcd` (it builds etcd 3.6 from \
                 the Go module pinned in tests/go/etcd36)",
                dir.join(bin).display()
            );
        }
        Release {
            name: "3.6",
            etcd: dir.join("etcd"),
            etcdctl: dir.join("etcdctl"),
            restore: dir.join("etcdutl"),
        }
    }

    /// This release's `etcdctl` with `args` (API v3).
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        Command::new(&self.etcdctl)
            .env("ETCDCTL_API", "3")
            .args(args)
            .output()
            .expect("run etcdctl")
    }

    /// etcd's own restore of `file` into `member`'s data directory.
    pub fn restore(&self, file: &Path, member: &Etcd) -> Output {
        Command::new(&self.restore)
            .env("ETCDCTL_API", "3")
            .args(["snapshot", "restore"])
            .arg(file)
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args(["--initial-cluster", &member.initial_cluster()])
            .args(["--initial-advertise-peer-urls", &member.peer_url()])
            .output()
            .expect("run etcd's snapshot restore")
    }
}

/// One etcd process.
#[derive(Debug)]
pub struct Etcd {
    pub release: Release,
    pub name: String,
    pub data_dir: PathBuf,
    pub client_port: u16,
    pub peer_port: u16,
    log: PathBuf,
    child: Option<Child>,
}

impl Etcd {
    /// An etcd member of `release` named `name` with its data directory in `dir`, not started
    /// yet.
    pub fn new(release: &Release, dir: &Path, name: &str) -> Etcd {
        Etcd {
            release: release.clone(),
            name: name.to_string(),
            data_dir: dir.join(format!("{name}.etcd")),
            client_port: free_port(),
            peer_port: free_port(),
            log: dir.join(format!("{name}.log")),
            child: None,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub fn peer_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.peer_port)
    }

    /// `--initial-cluster` of this one-member cluster.
    pub fn initial_cluster(&self) -> String {
        format!("{}={}", self.name, self.peer_url())
    }

    /// Starts it (a new cluster, or the data directory a restore made) and waits until its
    /// `/health` says it is healthy (which needs no user with auth on, where etcd 3.6's Status
    /// does).
    pub fn start(&mut self) {
        let client = format!("http://{}", self.endpoint());
        let log = std::fs::File::create(&self.log).expect("etcd log");
        let child = Command::new(&self.release.etcd)
            .args(["--name", &self.name, "--data-dir"])
            .arg(&self.data_dir)
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args(["--listen-peer-urls", &self.peer_url()])
            .args(["--initial-advertise-peer-urls", &self.peer_url()])
            .args(["--initial-cluster", &self.initial_cluster()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd log"))
            .stderr(log)
            .spawn()
            .expect("start etcd");
        self.child = Some(child);
        let started = Instant::now();
        loop {
            let health = reqwest::blocking::Client::new()
                .get(format!("http://{}/health", self.endpoint()))
                .timeout(Duration::from_secs(2))
                .send()
                .and_then(|r| r.text());
            if health.is_ok_and(|h| h.contains("\"health\":\"true\"")) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "etcd did not start: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
