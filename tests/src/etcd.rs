//! A real etcd (Debian's etcd-server, 3.4) as a one-member cluster, for the tests that move
//! data between etcd and etcd-node. Stopped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// One etcd process.
#[derive(Debug)]
pub struct Etcd {
    pub name: String,
    pub data_dir: PathBuf,
    pub client_port: u16,
    pub peer_port: u16,
    log: PathBuf,
    child: Option<Child>,
}

impl Etcd {
    /// An etcd member named `name` with its data directory in `dir`, not started yet.
    pub fn new(dir: &Path, name: &str) -> Etcd {
        Etcd {
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

    /// Starts it (a new cluster, or the data directory a restore made) and waits until it
    /// answers `etcdctl endpoint status` (which needs no user, with auth on) with a leader.
    pub fn start(&mut self) {
        let client = format!("http://{}", self.endpoint());
        let log = std::fs::File::create(&self.log).expect("etcd log");
        let child = Command::new("etcd")
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
            .expect("start etcd (Debian's etcd-server)");
        self.child = Some(child);
        let started = Instant::now();
        loop {
            let status = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .args([
                    "--endpoints",
                    &self.endpoint(),
                    "endpoint",
                    "status",
                    "-w",
                    "json",
                ])
                .output()
                .expect("run etcdctl");
            let said = String::from_utf8_lossy(&status.stdout);
            if status.status.success() && !said.contains("\"leader\":0,") {
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
