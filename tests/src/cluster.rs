//! A local etcd-node cluster of real processes for end-to-end tests: two regular members on
//! 127.0.0.1 plus a witness (a directory, or any `witness:` URL such as an Azurite blob),
//! initialised with the real `etcdutl witness init`. Members can be killed (SIGKILL), stopped
//! (SIGTERM) and restarted on the same data directory. Every process is stopped on drop.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::free_port;
use crate::proxy::Proxy;

/// One regular member.
#[derive(Debug)]
pub struct Member {
    pub name: String,
    pub client_port: u16,
    /// The peer port the others reach this member at (its proxy's, when it has one).
    pub peer_port: u16,
    /// The peer port this member listens on (`peer_port` without a proxy).
    listen_peer_port: u16,
    /// Joins a running cluster (`--initial-cluster-state existing`) instead of bootstrapping.
    join: bool,
    /// "http" or "https" (client and peer URLs).
    pub scheme: &'static str,
    child: Option<Child>,
}

impl Member {
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }
    pub fn url(&self) -> String {
        format!("{}://{}", self.scheme, self.endpoint())
    }
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
    /// The running process's id (for a test that kills it from another program).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
    pub fn peer_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.peer_port)
    }
}

/// Two etcd-node members and a witness.
#[derive(Debug)]
pub struct Cluster {
    pub dir: tempfile::TempDir,
    node_bin: PathBuf,
    pub witness_url: String,
    pub members: Vec<Member>,
    initial_cluster: String,
    /// Extra flags every start of a member gets.
    flags: Vec<String>,
    /// One proxy in front of each member's peer port (partitionable clusters only).
    proxies: Vec<Proxy>,
    /// A command each member is started through (its arguments follow: the member's binary,
    /// then its flags), such as a mount namespace with the member's own mount of the witness.
    wrapper: Vec<String>,
    /// TLS on every URL: the directory with `ca.crt` and each member's `<name>.crt` and
    /// `<name>.key` (see [`Cluster::start_tls`]).
    pki: Option<PathBuf>,
}

/// A temporary directory with a `witness` directory in it, and the witness URL of that.
pub fn witness_dir() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("temp dir");
    let witness_dir = dir.path().join("witness");
    std::fs::create_dir_all(&witness_dir).expect("witness dir");
    let url = format!(
        "witness:mount?path={}",
        percent_encoding::utf8_percent_encode(
            witness_dir.to_str().expect("utf-8 temp path"),
            percent_encoding::NON_ALPHANUMERIC
        )
    );
    (dir, url)
}

/// The `--data-dir` of member `name` of a cluster in `dir`.
pub fn data_dir(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.etcd"))
}

/// The snapshot files (`member/snap/*.snap`) in the `--data-dir` `data_dir`, each read whole,
/// in name order: a snapshot in place starts with `SNP2` and is a few dozen bytes.
pub fn snapshot_files(data_dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data_dir.join("member/snap"))
        .expect("the member's snapshot directory")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "snap"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).expect("a snapshot file");
            (p, bytes)
        })
        .collect()
}

/// The names of the two members a cluster starts with.
pub const MEMBERS: [&str; 2] = ["n1", "n2"];

/// A member's TLS flags: its certificate `<pki>/<name>.crt` for clients and peers, client
/// certificates signed by `<pki>/ca.crt` required on both.
pub(crate) fn tls_flags(pki: &Path, name: &str) -> Vec<String> {
    let file = |f: String| pki.join(f).to_string_lossy().into_owned();
    let (cert, key, ca) = (
        file(format!("{name}.crt")),
        file(format!("{name}.key")),
        file("ca.crt".into()),
    );
    [
        ["--cert-file", &cert],
        ["--key-file", &key],
        ["--trusted-ca-file", &ca],
        ["--peer-cert-file", &cert],
        ["--peer-key-file", &key],
        ["--peer-trusted-ca-file", &ca],
    ]
    .into_iter()
    .flatten()
    .map(String::from)
    .chain([
        "--client-cert-auth".into(),
        "--peer-client-cert-auth".into(),
    ])
    .collect()
}

/// Runs `etcdutl witness init` for `url`; panics with its output on failure.
pub fn init_witness(etcdutl: &Path, name: &str, url: &str) {
    let out = Command::new(etcdutl)
        .args([
            "witness",
            "init",
            "--name",
            name,
            "--advertise-peer-url",
            url,
        ])
        .output()
        .expect("run etcdutl");
    assert!(
        out.status.success(),
        "etcdutl witness init failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Cluster {
    /// Two members and a witness in a local directory, started with `flags` (on every start).
    pub fn start(node_bin: &Path, etcdutl: &Path, flags: &[&str]) -> Cluster {
        let (dir, url) = witness_dir();
        Self::start_with(dir, node_bin, etcdutl, url, flags)
    }

    /// As [`Cluster::start`], no member started yet (start each with
    /// [`Cluster::start_member_with`]: its own flags or environment from the first start on).
    pub fn prepare(node_bin: &Path, etcdutl: &Path, flags: &[&str]) -> Cluster {
        let (dir, url) = witness_dir();
        Self::assemble(dir, node_bin, etcdutl, url, flags, false, Vec::new(), None)
    }

    /// Two members and the witness at `witness_url` (initialised here), started with `flags`.
    pub fn start_with(
        dir: tempfile::TempDir,
        node_bin: &Path,
        etcdutl: &Path,
        witness_url: String,
        flags: &[&str],
    ) -> Cluster {
        Self::assemble(
            dir,
            node_bin,
            etcdutl,
            witness_url,
            flags,
            false,
            Vec::new(),
            None,
        )
        .start_all()
    }

    /// Two members with TLS on every client and peer URL, client certificates required on
    /// both, a witness in a local directory, and `flags`. Each member's certificate is
    /// `<pki>/<name>.crt` (with `<name>.key`), signed by `<pki>/ca.crt`: the caller writes them
    /// (and may replace them while the cluster runs).
    pub fn start_tls(node_bin: &Path, etcdutl: &Path, pki: &Path, flags: &[&str]) -> Cluster {
        let (dir, url) = witness_dir();
        Self::assemble(
            dir,
            node_bin,
            etcdutl,
            url,
            flags,
            false,
            Vec::new(),
            Some(pki.to_path_buf()),
        )
        .start_all()
    }

    /// Two members reaching each other only through proxies, so that [`Cluster::partition`]
    /// can cut them apart, with the witness at `witness_url` (initialised here) and each
    /// member started through `wrapper` (a command that ends by running its arguments; none:
    /// the member itself).
    pub fn start_partitionable(
        dir: tempfile::TempDir,
        node_bin: &Path,
        etcdutl: &Path,
        witness_url: String,
        flags: &[&str],
        wrapper: Vec<String>,
    ) -> Cluster {
        Self::assemble(
            dir,
            node_bin,
            etcdutl,
            witness_url,
            flags,
            true,
            wrapper,
            None,
        )
        .start_all()
    }

    #[allow(clippy::too_many_arguments)] // (private: the public constructors name the cases)
    fn assemble(
        dir: tempfile::TempDir,
        node_bin: &Path,
        etcdutl: &Path,
        witness_url: String,
        flags: &[&str],
        proxied: bool,
        wrapper: Vec<String>,
        pki: Option<PathBuf>,
    ) -> Cluster {
        let scheme = if pki.is_some() { "https" } else { "http" };
        init_witness(etcdutl, "w", &witness_url);
        // A proxied member's advertised peer port is its proxy's, bound here and kept: a port
        // only looked up here and bound later was once taken meanwhile by one of the parallel
        // tests' outgoing connections (the fault campaign failed with "Address already in use").
        let (members, listeners): (Vec<Member>, Vec<_>) = MEMBERS
            .iter()
            .map(|n| {
                let listener = proxied.then(|| {
                    std::net::TcpListener::bind("127.0.0.1:0").expect("bind a proxy's port")
                });
                let peer_port = match &listener {
                    Some(l) => l.local_addr().expect("the proxy's address").port(),
                    None => free_port(),
                };
                let member = Member {
                    name: n.to_string(),
                    client_port: free_port(),
                    peer_port,
                    listen_peer_port: if proxied { free_port() } else { peer_port },
                    join: false,
                    scheme,
                    child: None,
                };
                (member, listener)
            })
            .unzip();
        let proxies = members
            .iter()
            .zip(listeners)
            .filter_map(|(m, l)| {
                let target = SocketAddr::from(([127, 0, 0, 1], m.listen_peer_port));
                l.map(|l| Proxy::on(l, target, Duration::ZERO))
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .chain([format!("w={witness_url}")])
            .collect::<Vec<_>>()
            .join(",");
        Cluster {
            dir,
            node_bin: node_bin.to_path_buf(),
            witness_url,
            members,
            initial_cluster,
            flags: flags.iter().map(|f| f.to_string()).collect(),
            proxies,
            wrapper,
            pki,
        }
    }

    /// Starts every member.
    fn start_all(mut self) -> Cluster {
        for i in 0..self.members.len() {
            self.start_member(i);
        }
        self
    }

    /// Cuts the members apart (every peer connection closed, new ones refused; clients and the
    /// witness still reach each member), or heals the cut. Only for a partitionable cluster.
    pub fn partition(&self, cut: bool) {
        assert!(!self.proxies.is_empty(), "not a partitionable cluster");
        self.proxies.iter().for_each(|p| p.set_cut(cut));
    }

    /// Closes every connection between the members once, leaving them free to reconnect at
    /// once (only a partitionable cluster).
    pub fn reset_peer_connections(&self) {
        assert!(!self.proxies.is_empty(), "not a partitionable cluster");
        self.proxies.iter().for_each(Proxy::reset);
    }

    /// The `--initial-cluster` every member is started with.
    pub fn initial_cluster(&self) -> &str {
        &self.initial_cluster
    }

    /// Member `i`'s client and peer ports (the ones it listens on, not its proxy's).
    pub fn ports(&self, i: usize) -> [u16; 2] {
        [
            self.members[i].client_port,
            self.members[i].listen_peer_port,
        ]
    }

    /// Member `i`'s `--data-dir`.
    pub fn data_dir(&self, i: usize) -> PathBuf {
        data_dir(self.dir.path(), &self.members[i].name)
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::url).collect()
    }

    /// A new member `name` (not started) that will join the running cluster once added with
    /// `etcdctl member add`; its index. Later starts of any member list it in
    /// `--initial-cluster`.
    pub fn new_member(&mut self, name: &str) -> usize {
        let peer_port = free_port();
        let m = Member {
            name: name.to_string(),
            client_port: free_port(),
            peer_port,
            listen_peer_port: peer_port,
            join: true,
            scheme: self.members[0].scheme,
            child: None,
        };
        self.initial_cluster = format!("{},{}={}", self.initial_cluster, name, m.peer_url());
        self.members.push(m);
        self.members.len() - 1
    }

    /// Member `i` (not running) listens for peers on a new port from its next start on, and
    /// later starts list it there in `--initial-cluster` (after `etcdctl member update`); the
    /// new peer URL.
    pub fn move_peer_port(&mut self, i: usize) -> String {
        assert!(
            self.proxies.is_empty(),
            "a partitionable cluster's ports stay"
        );
        let old = self.members[i].peer_url();
        let port = free_port();
        self.members[i].peer_port = port;
        self.members[i].listen_peer_port = port;
        let new = self.members[i].peer_url();
        self.initial_cluster = self.initial_cluster.replace(&old, &new);
        new
    }

    /// Later starts of any member run `bin` (a rolling upgrade: stop a member, switch, start
    /// it again).
    pub fn set_binary(&mut self, bin: &Path) {
        self.node_bin = bin.to_path_buf();
    }

    /// Starts member `i` (again) on its data directory.
    pub fn start_member(&mut self, i: usize) {
        self.start_member_with(i, &[], &[]);
    }

    /// As [`Cluster::start_member`] with extra flags and environment variables.
    pub fn start_member_with(&mut self, i: usize, extra: &[&str], env: &[(&str, &str)]) {
        let m = &self.members[i];
        assert!(m.child.is_none(), "{} is already running", m.name);
        let log = log_path(self.dir.path(), &m.name);
        let peer = m.peer_url();
        let state = if m.join { "existing" } else { "new" };
        let mut command = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(&self.node_bin);
                c
            }
            None => Command::new(&self.node_bin),
        };
        command
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(self.data_dir(i))
            .args(["--listen-client-urls", &m.url()])
            .args(["--advertise-client-urls", &m.url()])
            .args([
                "--listen-peer-urls",
                &format!("{}://127.0.0.1:{}", m.scheme, m.listen_peer_port),
            ])
            .args(self.pki.iter().flat_map(|pki| tls_flags(pki, &m.name)))
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial_cluster])
            .args(["--initial-cluster-state", state])
            .args(&self.flags)
            .args(extra)
            .envs(env.iter().copied());
        self.members[i].child = Some(spawn_member(&mut command, &log));
    }

    fn signal(&mut self, i: usize, sig: Signal) {
        if let Some(mut child) = self.members[i].child.take() {
            let pid = Pid::from_raw(child.id() as i32);
            let _ = kill(pid, sig);
            // A paused member (a test that failed before resuming it) would never act on a
            // SIGTERM, and waiting for it would hang the test run.
            let _ = kill(pid, Signal::SIGCONT);
            let _ = child.wait();
        }
    }

    /// SIGSTOP (`resume` continues it): the process is frozen, its sockets stay open. Returns
    /// once the kernel shows it stopped (a signal is delivered after `kill` returns: a request
    /// sent at once could still be answered).
    pub fn pause(&self, i: usize) {
        self.signal_running(i, Signal::SIGSTOP);
        if let Some(child) = &self.members[i].child {
            let stat = format!("/proc/{}/stat", child.id());
            for _ in 0..1000 {
                let state = std::fs::read_to_string(&stat).unwrap_or_default();
                // The state follows the command name, which is in parentheses.
                if state
                    .rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('T'))
                {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// SIGCONT after [`Cluster::pause`].
    pub fn resume(&self, i: usize) {
        self.signal_running(i, Signal::SIGCONT);
    }

    fn signal_running(&self, i: usize, sig: Signal) {
        if let Some(child) = &self.members[i].child {
            let _ = kill(Pid::from_raw(child.id() as i32), sig);
        }
    }

    /// Has member `i`'s process ended by itself (a failpoint aborted it)?
    pub fn exited(&mut self, i: usize) -> bool {
        self.members[i]
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// Waits up to 30 s for member `i` to exit by itself; fails saying `what`, with its log.
    pub fn wait_exited(&mut self, i: usize, what: &str) {
        let started = Instant::now();
        while !self.exited(i) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{what}:\n{}",
                self.log(i)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILL: the member loses whatever it had not made durable.
    pub fn kill(&mut self, i: usize) {
        self.signal(i, Signal::SIGKILL);
    }

    /// SIGTERM: a clean stop.
    pub fn stop(&mut self, i: usize) {
        self.signal(i, Signal::SIGTERM);
    }

    /// SIGTERM, then waits up to `limit` for member `i` to exit: whether it did (if not, it is
    /// killed).
    pub fn stop_within(&mut self, i: usize, limit: Duration) -> bool {
        self.signal_running(i, Signal::SIGTERM);
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.exited(i) {
                self.members[i].child = None;
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill(i);
        false
    }

    /// The member's log so far (for failure messages).
    pub fn log(&self, i: usize) -> String {
        read_log(&log_path(self.dir.path(), &self.members[i].name))
    }

    /// GET `path` on member `i`'s client URL.
    pub fn http_get(&self, i: usize, path: &str) -> Option<(u16, String)> {
        let url = format!("{}{path}", self.members[i].url());
        if let Some(pki) = &self.pki {
            // (with the member's own certificate as the client's)
            return curl_tls(&url, pki, &self.members[i].name);
        }
        let r = reqwest::blocking::Client::new()
            .get(url)
            .timeout(Duration::from_secs(10))
            .send()
            .ok()?;
        let code = r.status().as_u16();
        Some((code, r.text().ok()?))
    }

    /// GET `path` on member `i` until it answers `code`, for up to `limit`: the body.
    pub fn wait_http(&self, i: usize, path: &str, code: u16, limit: Duration) -> String {
        let started = Instant::now();
        loop {
            let answer = self.http_get(i, path);
            if let Some((got, body)) = &answer
                && *got == code
            {
                return body.clone();
            }
            assert!(
                started.elapsed() < limit,
                "{path} on member {i} never answered {code} in {limit:?}: {answer:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// POST `path` (empty body) on member `i`'s plain-HTTP client URL: the status and the
    /// `Allow` header. None if no answer came.
    pub fn http_post(&self, i: usize, path: &str) -> Option<(u16, Option<String>)> {
        let url = format!("{}{path}", self.members[i].url());
        let r = reqwest::blocking::Client::new()
            .post(url)
            .timeout(Duration::from_secs(10))
            .send()
            .ok()?;
        let allow = r.headers().get("allow").and_then(|v| v.to_str().ok());
        Some((r.status().as_u16(), allow.map(String::from)))
    }

    /// A metric's value on member `i` (the first sample whose line starts with `name`).
    pub fn metric(&self, i: usize, name: &str) -> Option<f64> {
        let (_, page) = self.http_get(i, "/metrics")?;
        metric_in(&page, name)
    }

    /// The index of the member that reports itself leader, waiting up to `limit`.
    pub fn wait_leader(&self, limit: Duration) -> usize {
        let started = Instant::now();
        loop {
            for (i, m) in self.members.iter().enumerate() {
                if m.is_running() && self.metric(i, "etcd_server_is_leader") == Some(1.0) {
                    return i;
                }
            }
            assert!(
                started.elapsed() < limit,
                "no leader within {limit:?}; logs:\n{}\n{}",
                self.log(0),
                self.log(1)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.stop(i);
        }
    }
}

/// Where member `name`'s log is, in a cluster's directory `dir`.
pub(crate) fn log_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.log"))
}

/// A log file's text so far (empty if there is none yet).
pub(crate) fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Starts a member's `command`, its log level from `NODE_LOG` (default info), its log
/// appended to `log`.
pub(crate) fn spawn_member(command: &mut Command, log: &Path) -> Child {
    let log = File::options()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    command
        .env(
            "RUST_LOG",
            std::env::var("NODE_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start etcd-node")
}

/// Whether `etcdctl endpoint hashkv` printed two members and the same hash for both.
/// GET `url` with curl over TLS: the CA `<pki>/ca.crt`, the client certificate
/// `<pki>/<who>.crt` and its key. (status, body); None if no answer came.
pub fn curl_tls(url: &str, pki: &Path, who: &str) -> Option<(u16, String)> {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}"])
        .arg("--cacert")
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join(format!("{who}.crt")))
        .arg("--key")
        .arg(pki.join(format!("{who}.key")))
        .arg(url)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n')?;
    Some((code.parse().ok().filter(|c| *c != 0)?, body.to_string()))
}

/// The value of metric `name` in a `/metrics` page (its first sample).
pub fn metric_in(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .find(|l| l.starts_with(name) && !l.starts_with('#'))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

pub fn two_hashes_agree(out: &str) -> bool {
    let hashes: Vec<&str> = out.lines().filter_map(|l| l.split(", ").nth(1)).collect();
    hashes.len() == 2 && hashes[0] == hashes[1]
}

/// Runs the real `etcdctl` (Debian's `etcd-client`) against `endpoints`.
pub fn etcdctl(endpoints: &[String], args: &[&str], stdin: Option<&str>) -> Output {
    etcdctl_at(Path::new("etcdctl"), endpoints, args, stdin)
}

/// As [`etcdctl`] with the etcdctl at `bin` (another release's).
pub fn etcdctl_at(bin: &Path, endpoints: &[String], args: &[&str], stdin: Option<&str>) -> Output {
    run_etcdctl(Command::new(bin), endpoints, args, stdin)
}

/// As [`etcdctl`] for a command that does not end by itself (`watch`, `lease keep-alive`):
/// stopped after `secs` seconds; its output until then.
pub fn etcdctl_for(secs: u32, endpoints: &[String], args: &[&str]) -> Output {
    etcdctl_at_for(secs, Path::new("etcdctl"), endpoints, args)
}

/// As [`etcdctl_for`] with the etcdctl at `bin`.
pub fn etcdctl_at_for(secs: u32, bin: &Path, endpoints: &[String], args: &[&str]) -> Output {
    let mut timeout = Command::new("timeout");
    timeout.arg(secs.to_string()).arg(bin);
    run_etcdctl(timeout, endpoints, args, None)
}

fn run_etcdctl(
    mut command: Command,
    endpoints: &[String],
    args: &[&str],
    stdin: Option<&str>,
) -> Output {
    use std::io::Write;
    let mut child = command
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("etcdctl not found: install Debian's etcd-client (scripts/test.sh does)");
    if let Some(input) = stdin
        && let Some(mut s) = child.stdin.take()
    {
        s.write_all(input.as_bytes()).expect("etcdctl stdin");
    }
    child.wait_with_output().expect("etcdctl output")
}
