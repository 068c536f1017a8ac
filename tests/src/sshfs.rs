//! Two client mounts of one directory, through a real sshd and sshfs (FUSE) on loopback: the
//! closest thing to an NFS share this machine can make. A mount's caching is chosen per mount.
//!
//! Invariants: the sshd and every mount are torn down on drop (unmount first, then SIGTERM to
//! sshd); keys and config live in a temp dir; nothing listens beyond 127.0.0.1.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A private sshd on a free loopback port, accepting one generated key for root.
#[derive(Debug)]
pub struct SshServer {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tool(path: &str, package: &str) -> PathBuf {
    let p = PathBuf::from(path);
    assert!(
        p.exists(),
        "{path} is missing: install Debian's {package} (the README's test command does), and run as root"
    );
    p
}

impl SshServer {
    pub fn start() -> SshServer {
        Self::start_at(&[], "127.0.0.1", crate::free_port())
    }

    /// An sshd listening on `ip`:`port`, started through `wrapper` (such as `ip netns exec
    /// NAME`: a network namespace of its own; none: directly).
    pub fn start_at(wrapper: &[String], ip: &str, port: u16) -> SshServer {
        let sshd = tool("/usr/sbin/sshd", "openssh-server");
        let dir = tempfile::tempdir().expect("sshd dir");
        let d = dir.path();
        for (key, comment) in [("host", "host"), ("client", "client")] {
            run(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
                    .arg(d.join(key)),
                "ssh-keygen",
            );
        }
        std::fs::copy(d.join("client.pub"), d.join("authorized_keys")).expect("authorized_keys");
        let config = format!(
            "Port {port}\nListenAddress {ip}\nHostKey {host}\nAuthorizedKeysFile {auth}\n\
             PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             UsePAM no\nStrictModes no\nPidFile {pid}\nSubsystem sftp internal-sftp\n",
            host = d.join("host").display(),
            auth = d.join("authorized_keys").display(),
            pid = d.join("sshd.pid").display(),
        );
        std::fs::write(d.join("sshd_config"), config).expect("sshd_config");
        std::fs::create_dir_all("/run/sshd").expect("sshd privilege separation dir /run/sshd");
        let log = std::fs::File::create(d.join("sshd.log")).expect("sshd log");
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(sshd);
                c
            }
            None => Command::new(sshd),
        };
        let child = command
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start sshd");
        let mut server = SshServer { child, port, dir };
        crate::eventually(Duration::from_secs(20), "sshd listening", || {
            if let Ok(Some(status)) = server.child.try_wait() {
                let log =
                    std::fs::read_to_string(server.dir.path().join("sshd.log")).unwrap_or_default();
                panic!("sshd exited at start-up ({status}): {log}");
            }
            TcpStream::connect((ip, port)).is_ok()
        });
        server
    }

    /// Mounts `remote` (a directory on this machine) with sshfs, adding `options` (`-o` list).
    pub fn mount(&self, remote: &Path, options: &str) -> SshfsMount {
        let point = tempfile::tempdir().expect("mount point");
        let command = self.mount_command(remote, point.path(), options);
        run(Command::new(&command[0]).args(&command[1..]), "sshfs mount");
        SshfsMount { point }
    }

    /// The sshfs command line that mounts `remote` at `point` with `options` added (for a
    /// mount made elsewhere, such as inside another mount namespace).
    pub fn mount_command(&self, remote: &Path, point: &Path, options: &str) -> Vec<String> {
        self.mount_command_via("127.0.0.1", self.port, remote, point, options)
    }

    /// As [`SshServer::mount_command`], reaching the server at `host`:`port` (a proxy, say).
    pub fn mount_command_via(
        &self,
        host: &str,
        port: u16,
        remote: &Path,
        point: &Path,
        options: &str,
    ) -> Vec<String> {
        let sshfs = tool("/usr/bin/sshfs", "sshfs");
        let base = format!(
            "port={port},IdentityFile={},UserKnownHostsFile=/dev/null,StrictHostKeyChecking=no,BatchMode=yes,LogLevel=ERROR",
            self.dir.path().join("client").display()
        );
        let opts = if options.is_empty() {
            base
        } else {
            format!("{base},{options}")
        };
        vec![
            sshfs.display().to_string(),
            format!("root@{host}:{}", remote.display()),
            point.display().to_string(),
            "-o".into(),
            opts,
        ]
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// An sshfs mount; unmounted on drop (drop mounts before their server).
#[derive(Debug)]
pub struct SshfsMount {
    point: tempfile::TempDir,
}

impl SshfsMount {
    pub fn path(&self) -> &Path {
        self.point.path()
    }
}

impl Drop for SshfsMount {
    fn drop(&mut self) {
        let ok = Command::new("fusermount3")
            .arg("-u")
            .arg(self.point.path())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.point.path())
                .status();
        }
    }
}

/// sshfs options for a mount that caches nothing (every lookup and read asks the server).
pub const COHERENT: &str = "dir_cache=no,entry_timeout=0,attr_timeout=0,negative_timeout=0";
/// sshfs's defaults: directory listings cached 20 s, names and attributes 1 s, like an NFS
/// client's attribute and directory caches (no negative caching, as with lookupcache=positive).
pub const CACHED: &str = "";
/// Caches kept 30 s: directory listings, names and attributes (no negative caching), like an
/// NFS client mounted with `actimeo=30,lookupcache=positive`.
pub const CACHED_30S: &str = "dcache_timeout=30,entry_timeout=30,attr_timeout=30";
