//! Two sites and a witness site on one machine: each regular member in a network namespace of
//! its own (site A, site B), the witness's share served by an sshd in a third (site W), TLS on
//! every client and peer URL. The sites reach each other only through "the WAN": TCP proxies
//! in the root namespace on 10.77.0.1, which delay the peer link (a WAN round trip) and can
//! be cut one by one. A whole site can be cut off (its link down). Needs root (`ip netns`).
//!
//! Addresses: site N (1 = A, 2 = B, 3 = W) is 10.77.N.2 on a veth link to the root namespace
//! (10.77.N.1), with a route to 10.77.0.0/16 through it. The root namespace does not forward,
//! so nothing crosses between sites except through the proxies. Members listen on their own
//! address (client 2379, peer 2380) and advertise their peer URL at their WAN proxy; the test
//! (in the root namespace) reaches each member's client URL directly, as a client in that
//! member's site would.
//!
//! The witness is either a share: each member mounts it with sshfs (through its own proxy to
//! the sshd in site W) inside its own mount namespace, at the same path, and runs there; or a
//! blob on Azurite: Azurite runs in the root namespace (standing for site W) and each site
//! reaches it only through a forwarder listening on the site's own loopback at Azurite's port
//! (so the witness URL is the same `http://127.0.0.1:PORT/...` everywhere, and a loopback
//! `http` URL is what the blob backend accepts without TLS). Cutting a member's way to the
//! witness cuts its proxy or forwarder. Everything is torn down on drop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

use nix::sched::CloneFlags;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::azurite::Azurite;
use crate::cluster::{curl_tls, log_path, metric_in, read_log, spawn_member, tls_flags};
use crate::pki::Ca;
use crate::proxy::Proxy;
use crate::sshfs::{COHERENT, SshServer};

/// Where the WAN proxies listen (on the root namespace's loopback).
pub const WAN: &str = "10.77.0.1";

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Removes what a two-site run killed before its teardown (a test binary stopped by a signal, a
/// CI job cancelled) left behind: its namespaces and its root-side links, which keep their
/// `10.77.N.1/24` routes, so a later run's traffic to a site would go to the dead run's empty
/// namespace instead (seen in CI: sshd "did not listen", members that never heard each
/// other). Names carry the owner's process id (`ts<pid>a`, `ts<pid>r1`); anything of a live
/// process other than `own` is left alone and refused, with its owner named.
fn sweep_leftovers(own: u32) {
    let owner = |name: &str| -> Option<u32> {
        let digits: String = name
            .strip_prefix("ts")?
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    let listed = |args: &[&str]| -> Vec<String> {
        Command::new("ip")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .collect()
    };
    let namespaces = listed(&["netns", "list"]);
    let links = listed(&["-br", "link"]);
    for (kind, name) in namespaces
        .iter()
        .map(|n| ("netns", n))
        .chain(links.iter().map(|n| ("link", n)))
    {
        let Some(pid) = owner(name) else { continue };
        if pid == own {
            continue;
        }
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "{kind} {name} belongs to a two-site run still going (process {pid}): the sites use \
             fixed addresses, so one run at a time; wait for it or stop it"
        );
        eprintln!(
            "removing {kind} {name}, left behind by a two-site run that died (process {pid})"
        );
        let _ = Command::new("ip").args([kind, "del", name]).output();
    }
}

/// A network namespace, deleted on drop.
#[derive(Debug)]
struct Netns(String);

impl Netns {
    fn create(name: String) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        Netns(name)
    }

    /// The command prefix that runs a program in this namespace.
    fn exec(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.0].map(String::from).to_vec()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Where the witness lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WitnessKind {
    /// A directory served by an sshd in site W, mounted with sshfs by each member.
    Sshfs,
    /// A blob on Azurite, reached through a forwarder in each site.
    Azurite,
}

/// The witness's storage and each member's way to it.
#[derive(Debug)]
enum WitnessSite {
    Sshfs {
        ssh: SshServer,
        /// The WAN ports of each member's proxy to the sshd.
        ports: Vec<u16>,
        mount_point: PathBuf,
    },
    /// (kept for its lifetime: dropping it stops Azurite)
    Azurite { _server: Azurite },
}

/// A listener on `addr` inside network namespace `ns` (a socket stays in the namespace it was
/// made in; the thread that made it ends there).
fn listen_in(ns: &str, addr: SocketAddr) -> std::net::TcpListener {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let f = std::fs::File::open(&path).expect("the namespace's file");
        nix::sched::setns(&f, CloneFlags::CLONE_NEWNET).expect("setns into the site");
        std::net::TcpListener::bind(addr).expect("bind in the site")
    })
    .join()
    .expect("the binding thread")
}

/// A regular member of site A (0) or B (1).
#[derive(Debug)]
pub struct SiteMember {
    pub name: String,
    /// Its address in its site.
    pub ip: String,
    /// Its peer URL's port on the WAN address.
    pub wan_port: u16,
    child: Option<Child>,
}

impl SiteMember {
    pub fn client_url(&self) -> String {
        format!("https://{}:2379", self.ip)
    }
}

/// The two sites, the witness site and the WAN between them.
#[derive(Debug)]
pub struct TwoSites {
    pub dir: tempfile::TempDir,
    pub pki: PathBuf,
    pub members: Vec<SiteMember>,
    pub witness_url: String,
    node_bin: PathBuf,
    initial_cluster: String,
    /// The root ends of the sites' links (A, B, W).
    links: Vec<String>,
    /// The WAN proxies of the members' peer ports (A, B).
    peer_proxies: Vec<Proxy>,
    /// Each member's way to the witness (A, B).
    witness_proxies: Vec<Proxy>,
    witness: WitnessSite,
    // (dropped last: the namespaces, then the turn)
    namespaces: Vec<Netns>,
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// One set of sites at a time in a process: they use fixed addresses.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl TwoSites {
    /// Builds the sites, starts the witness's sshd, initialises the witness, and starts both
    /// members; `one_way` is the WAN's delay each way on the peer link.
    pub fn start(
        node_bin: &Path,
        etcdutl: &Path,
        one_way: Duration,
        kind: WitnessKind,
    ) -> TwoSites {
        let turn = TURN
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = tempfile::tempdir().expect("temp dir");
        let tag = std::process::id();
        sweep_leftovers(tag);
        let namespaces: Vec<Netns> = ["a", "b", "w"]
            .iter()
            .map(|s| Netns::create(format!("ts{tag}{s}")))
            .collect();
        // A /32 on loopback: the WAN proxies' address, reachable from every site.
        ip(&["addr", "replace", &format!("{WAN}/32"), "dev", "lo"]);
        let mut links = Vec::new();
        for (i, ns) in namespaces.iter().enumerate() {
            let n = i + 1;
            let (root_if, site_if) = (format!("ts{tag}r{n}"), format!("ts{tag}n{n}"));
            let _ = Command::new("ip").args(["link", "del", &root_if]).output();
            ip(&[
                "link", "add", &root_if, "type", "veth", "peer", "name", &site_if,
            ]);
            ip(&["link", "set", &site_if, "netns", &ns.0]);
            ip(&["addr", "add", &format!("10.77.{n}.1/24"), "dev", &root_if]);
            ip(&["link", "set", &root_if, "up"]);
            ip(&[
                "-n",
                &ns.0,
                "addr",
                "add",
                &format!("10.77.{n}.2/24"),
                "dev",
                &site_if,
            ]);
            ip(&["-n", &ns.0, "link", "set", &site_if, "up"]);
            ip(&[
                "-n",
                &ns.0,
                "route",
                "add",
                "10.77.0.0/16",
                "via",
                &format!("10.77.{n}.1"),
            ]);
            links.push(root_if);
        }
        let wan = |port: u16| -> SocketAddr { format!("{WAN}:{port}").parse().expect("addr") };
        let members: Vec<SiteMember> = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(i, name)| SiteMember {
                name: name.to_string(),
                ip: format!("10.77.{}.2", i + 1),
                wan_port: crate::free_port(),
                child: None,
            })
            .collect();
        let peer_proxies = members
            .iter()
            .map(|m| {
                let target: SocketAddr = format!("{}:2380", m.ip).parse().expect("addr");
                Proxy::between(wan(m.wan_port), target, one_way)
            })
            .collect();
        let pki = dir.path().join("pki");
        let ca = Ca::new("two-site CA");
        for m in &members {
            ca.write(&pki, &m.name, "etcd-member", &[&m.ip, WAN, "localhost"]);
        }
        ca.write(&pki, "root", "root", &[]);
        let (witness, witness_proxies, witness_url) = match kind {
            WitnessKind::Sshfs => {
                let ssh = SshServer::start_at(&namespaces[2].exec(), "10.77.3.2", 22);
                let ports: Vec<u16> = (0..2).map(|_| crate::free_port()).collect();
                let sshd: SocketAddr = "10.77.3.2:22".parse().expect("addr");
                let proxies = ports
                    .iter()
                    .map(|p| Proxy::between(wan(*p), sshd, Duration::ZERO))
                    .collect();
                std::fs::create_dir_all(dir.path().join("witness")).expect("witness dir");
                let mount_point = dir.path().join("mnt");
                std::fs::create_dir_all(&mount_point).expect("mount point");
                let url = format!(
                    "witness:mount?path={}",
                    percent_encoding::utf8_percent_encode(
                        mount_point.to_str().expect("utf-8 path"),
                        percent_encoding::NON_ALPHANUMERIC
                    )
                );
                let site = WitnessSite::Sshfs {
                    ssh,
                    ports,
                    mount_point,
                };
                (site, proxies, url)
            }
            WitnessKind::Azurite => {
                let az = Azurite::start();
                let local: SocketAddr = format!("127.0.0.1:{}", az.port()).parse().expect("addr");
                let proxies = namespaces[..2]
                    .iter()
                    .map(|ns| Proxy::on(listen_in(&ns.0, local), local, Duration::ZERO))
                    .collect();
                let url = az.witness_url("two-sites", "w");
                (WitnessSite::Azurite { _server: az }, proxies, url)
            }
        };
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=https://{WAN}:{}", m.name, m.wan_port))
            .chain([format!("w={witness_url}")])
            .collect::<Vec<_>>()
            .join(",");
        let mut sites = TwoSites {
            dir,
            pki,
            members,
            witness_url,
            node_bin: node_bin.to_path_buf(),
            initial_cluster,
            links,
            peer_proxies,
            witness_proxies,
            witness,
            namespaces,
            _turn: turn,
        };
        // Initialise the witness from site A (through its mount or forwarder).
        let init = format!(
            "{} witness init --name w --advertise-peer-url '{}'",
            etcdutl.display(),
            sites.witness_url
        );
        let out = sites
            .in_site(0, &init)
            .output()
            .expect("etcdutl witness init");
        assert!(
            out.status.success(),
            "etcdutl witness init in site A: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for i in 0..2 {
            sites.start_member(i);
        }
        sites
    }

    /// A shell command run in member `i`'s site, with a shared witness mounted (in a mount
    /// namespace of its own: `ip netns exec` makes one) at the same path as everywhere.
    fn in_site(&self, i: usize, command: &str) -> Command {
        let script = match &self.witness {
            WitnessSite::Azurite { .. } => command.to_string(),
            WitnessSite::Sshfs {
                ssh,
                ports,
                mount_point,
            } => {
                let mount = ssh
                    .mount_command_via(
                        WAN,
                        ports[i],
                        &self.dir.path().join("witness"),
                        mount_point,
                        &format!(
                            "{COHERENT},reconnect,ServerAliveInterval=1,ServerAliveCountMax=2"
                        ),
                    )
                    .iter()
                    .map(|a| format!("'{a}'"))
                    .collect::<Vec<_>>()
                    .join(" ");
                format!(
                    "{mount} || echo 'the witness could not be mounted' >&2; {command}; \
                     status=$?; fusermount3 -u '{}' 2>/dev/null; exit $status",
                    mount_point.display()
                )
            }
        };
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.namespaces[i].0, "sh", "-c", &script]);
        c
    }

    /// Starts member `i` (again) on its data directory.
    pub fn start_member(&mut self, i: usize) {
        let m = &self.members[i];
        assert!(m.child.is_none(), "{} is already running", m.name);
        let mut flags = vec![
            format!("'{}'", self.node_bin.display()),
            format!("--name {}", m.name),
            format!(
                "--data-dir '{}'",
                self.dir.path().join(format!("{}.etcd", m.name)).display()
            ),
            format!("--listen-client-urls {}", m.client_url()),
            format!("--advertise-client-urls {}", m.client_url()),
            format!("--listen-peer-urls https://{}:2380", m.ip),
            format!("--initial-advertise-peer-urls https://{WAN}:{}", m.wan_port),
            format!("--initial-cluster '{}'", self.initial_cluster),
            "--initial-cluster-state new".into(),
            "--witness-probe-interval 1s".into(),
        ];
        flags.extend(
            tls_flags(&self.pki, &m.name)
                .into_iter()
                .map(|f| format!("'{f}'")),
        );
        // (exec: the member is the shell's process, so a signal to it reaches the member)
        let command = format!("exec {}", flags.join(" "));
        let log = log_path(self.dir.path(), &m.name);
        let child = spawn_member(&mut self.in_site(i, &command), &log);
        self.members[i].child = Some(child);
    }

    /// SIGKILL to member `i` (and its mount of the witness, as a dead site's would go).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            // The child is `ip netns exec`, which exec'd the shell, which exec'd the member.
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            // (its threads waiting on an unanswered request of the mount end only when the
            // mount's daemon goes: the mount first, then the wait)
            self.unmount(i);
            let _ = child.wait();
        }
        self.unmount(i);
    }

    fn unmount(&self, i: usize) {
        if let WitnessSite::Sshfs { ports, .. } = &self.witness {
            let _ = Command::new("pkill")
                .args(["-KILL", "-f", &format!("port={},", ports[i])])
                .status();
        }
    }

    /// Takes site `site`'s link (0 = A, 1 = B, 2 = W) down (the site is cut off from
    /// everything) or up again.
    pub fn set_site_up(&self, site: usize, up: bool) {
        ip(&[
            "link",
            "set",
            &self.links[site],
            if up { "up" } else { "down" },
        ]);
    }

    /// Cuts the peer link between the sites (both directions), or heals it.
    pub fn cut_wan(&self, cut: bool) {
        self.peer_proxies.iter().for_each(|p| p.set_cut(cut));
    }

    /// Cuts member `i`'s way to the witness site (its connections closed, new ones refused),
    /// or heals it.
    pub fn cut_witness(&self, i: usize, cut: bool) {
        self.witness_proxies[i].set_cut(cut);
    }

    /// Member `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        read_log(&log_path(self.dir.path(), &self.members[i].name))
    }

    /// A metric's value on member `i` (its first sample), read with the `root` certificate.
    pub fn metric(&self, i: usize, name: &str) -> Option<f64> {
        let url = format!("{}/metrics", self.members[i].client_url());
        let (_, page) = curl_tls(&url, &self.pki, "root")?;
        metric_in(&page, name)
    }

    /// etcdctl's flags: the client certificate `root` and the CA.
    pub fn etcdctl_tls(&self) -> Vec<String> {
        let f = |s: &str| self.pki.join(s).to_string_lossy().into_owned();
        vec![
            format!("--cacert={}", f("ca.crt")),
            format!("--cert={}", f("root.crt")),
            format!("--key={}", f("root.key")),
        ]
    }
}

impl Drop for TwoSites {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        for link in &self.links {
            let _ = Command::new("ip").args(["link", "del", link]).output();
        }
        let _ = Command::new("ip")
            .args(["addr", "del", &format!("{WAN}/32"), "dev", "lo"])
            .output();
    }
}
