//! The fault campaign: a local cluster of real etcd-node processes (two members and a witness in
//! a directory) under a mixed client workload (puts, linearizable reads, compare-and-swap
//! transactions through etcd's gRPC API), with one fault per run chosen and timed from a seed:
//! SIGKILL and restart of a member, SIGSTOP/SIGCONT of a member, the members cut apart (their
//! peer links go through proxies the campaign cuts), the witness's directory made
//! unreachable, a full disk, and power cuts that lose what was not made durable (on the
//! power-cut file system, `powercut.rs`). After each run the faults are healed and the campaign checks that every key's
//! history is linearizable (acknowledged writes lost or reordered show there), that both
//! members hold the same value for every key, and that their HashKV agree. It reports how long
//! each fault family took to recover (from the heal to the first acknowledged write).
//!
//! `bash scripts/faults.sh [--runs N] [--seed S]` runs it; `cargo test` runs a short slice
//! (etcd-node/tests/root/faults.rs).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use std::path::PathBuf;
use std::process::Command;

use clap::ValueEnum;

use crate::azurite::Azurite;
use crate::cluster::{self, Cluster};
use crate::linearizable::{self, Event, Op};
use crate::powercut::{CutReport, Data, Disk, Entries, Failure};
use crate::sshfs::{self, SshServer};
use crate::watch_check;

/// What a campaign does.
#[derive(Debug, Clone)]
pub struct Options {
    pub runs: u64,
    pub seed: u64,
    /// Concurrent clients (each on one member, alternating).
    pub clients: usize,
    /// Keys per run (each run writes its own keys, so histories stay short).
    pub keys: u64,
    /// Where the witness lives.
    pub witness: WitnessKind,
    /// What the members' data directories (and the witness's directory) live on, and so
    /// which disk faults apply.
    pub disks: DiskKind,
    /// The faults to choose from (None: every one that applies).
    pub families: Option<Vec<Family>>,
}

/// Where the campaign's witness lives, and so what "the witness gone" means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WitnessKind {
    /// A local directory; gone: renamed away.
    Dir,
    /// A directory served by a loopback sshd, each member mounting it with sshfs in its own
    /// mount namespace with 30 s directory, name and attribute caches (two clients of one
    /// share, as two machines mounting NFS); gone: renamed away on the server.
    Sshfs,
    /// A blob in Azurite; gone: Azurite stopped (SIGTERM) and started again.
    Azurite,
}

/// What the members' data directories live on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskKind {
    /// The cluster's temporary directory.
    Plain,
    /// A tmpfs of its own per member, and full disks among the faults (needs root).
    Tmpfs,
    /// A power-cut file system of its own per member and one for the witness's directory
    /// (tests/src/powercut.rs; needs /dev/fuse and root), and power cuts among the faults.
    PowerCut,
}

/// A fault, as injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Family {
    Kill,
    Pause,
    WitnessGone,
    /// The members cut apart (clients and the witness still reach both).
    Partition,
    /// Connections to a member's client and peer ports that send garbage.
    Garbage,
    /// A member's data disk filled to the last byte, then freed.
    FullDisk,
    /// The leader's site loses power: the leader killed, what its disk and the witness's
    /// share had not made durable lost; both off for a while, then on, the member started.
    PowerLeaderSite,
    /// The follower's site loses power (its member and disk; the witness lives elsewhere).
    PowerFollowerSite,
    /// Both members and the witness's share lose power at once; then both members start.
    PowerBoth,
    /// The witness's server alone loses power (the members keep running).
    PowerWitness,
    /// A member's site loses power again and again while the member recovers.
    PowerLoop,
    /// A member's data disk fails with `EIO` for a while: every fsync (what it was to make
    /// durable dropped, reads still returning it), or writes too. A member that stopped must
    /// have said why; it is started again once the disk is healed, half the time (always, when
    /// its message asks for a restart of the machine first) after a power cut of that disk
    /// (then what the failed fsyncs dropped is gone from what it reads too).
    DiskEio,
}

impl Family {
    /// Needs the power-cut disks.
    fn is_power_cut(self) -> bool {
        matches!(
            self,
            Family::PowerLeaderSite
                | Family::PowerFollowerSite
                | Family::PowerBoth
                | Family::PowerWitness
                | Family::PowerLoop
                | Family::DiskEio
        )
    }
}

/// What a campaign saw.
#[derive(Debug, Default)]
pub struct Report {
    pub runs: u64,
    pub operations: u64,
    pub acknowledged_writes: u64,
    pub unknown_outcomes: u64,
    /// Lease operations (grants with a put of the lease's key, keep-alives, revokes).
    pub lease_ops: u64,
    /// Watch events checked (each member's watcher and the replay).
    pub watch_events: u64,
    /// Times a watcher's stream broke and it resumed from its next revision.
    pub watch_resumes: u64,
    /// Full-disk runs in which the member stopped (and was started again once space was
    /// freed, as an operator would).
    pub stopped_on_full_disk: u64,
    /// Disk-error runs in which the member stopped (and was started again on the healed disk).
    pub stopped_on_disk_error: u64,
    /// Power cuts (one per disk cut), and what they dropped that had not been made durable.
    pub power_cuts: u64,
    pub cut: CutReport,
    /// Per fault family: the recovery times (heal to the first acknowledged write).
    pub recoveries: BTreeMap<Family, Vec<Duration>>,
    /// Per fault family: the longest time with no write acknowledged by any member, from the
    /// fault's start to the end of the run (the availability clients saw during the fault).
    pub gaps: BTreeMap<Family, Vec<Duration>>,
    /// Times a member's peer link found its stream stuck and dialled again (its warning
    /// [`LINK_STALL`] in the members' logs): the guard of seeds 70141 and 20131.
    pub link_stalls: u64,
}

/// The warning of a peer link whose stream took no frame for a while (etcd-node's peer.rs).
const LINK_STALL: &str = "the stream to this peer took no frame";

impl Report {
    /// One line per fault family: runs, median and longest recovery.
    pub fn summary(&self) -> String {
        let mut out = format!(
            "{} runs, {} operations ({} acknowledged writes, {} unknown outcomes, {} lease \
             operations), 0 lost, 0 linearizability violations; {} watch events checked \
             ({} resumed streams), 0 watch violations\n",
            self.runs,
            self.operations,
            self.acknowledged_writes,
            self.unknown_outcomes,
            self.lease_ops,
            self.watch_events,
            self.watch_resumes
        );
        if self.link_stalls > 0 {
            out.push_str(&format!(
                "  a peer link found its stream stuck and dialled again {} times\n",
                self.link_stalls
            ));
        }
        if self.stopped_on_full_disk > 0 {
            out.push_str(&format!(
                "  a member stopped on its full disk {} times (with the message; started again \
                 once space was freed)\n",
                self.stopped_on_full_disk
            ));
        }
        if self.stopped_on_disk_error > 0 {
            out.push_str(&format!(
                "  a member stopped on its failing disk {} times (with the message; started \
                 again once it was healed)\n",
                self.stopped_on_disk_error
            ));
        }
        if self.power_cuts > 0 {
            out.push_str(&format!(
                "  {} power cuts dropped what was not durable: {} pages in {} files, {} directory \
                 entries undone, {} files or directories gone\n",
                self.power_cuts,
                self.cut.pages_lost,
                self.cut.files_changed,
                self.cut.entries_undone,
                self.cut.nodes_gone
            ));
            if !self.cut.gone.is_empty() {
                out.push_str(&format!("    gone: {}\n", self.cut.gone.join(", ")));
            }
        }
        let spread = |times: &[Duration]| {
            let mut t = times.to_vec();
            t.sort();
            let at = |q: usize| t[(t.len() - 1) * q / 100].as_secs_f64();
            format!(
                "median {:.2} s, p90 {:.2} s, longest {:.2} s",
                at(50),
                at(90),
                at(100)
            )
        };
        for (family, times) in &self.recoveries {
            let gaps = self.gaps.get(family).map(Vec::as_slice).unwrap_or_default();
            out.push_str(&format!(
                "  {family:?}: {} runs; recovery (heal to first write): {}; longest write gap during the fault: {}\n",
                times.len(),
                spread(times),
                if gaps.is_empty() { "-".into() } else { spread(gaps) },
            ));
        }
        out
    }
}

type History = Arc<Mutex<BTreeMap<String, Vec<Event>>>>;

/// The cluster and what serves its witness, torn down in order: members stopped, their disks
/// unmounted, then the cluster's directory removed, then the witness's site stopped.
struct Rig {
    cluster: Cluster,
    /// Azurite, when the witness is a blob in it.
    azurite: Option<Azurite>,
    /// The sshd serving the witness's directory, when it is an sshfs share.
    _share: Option<SshfsShare>,
    /// The members' data disks, when the full-disk fault is on.
    disks: Option<Disks>,
    /// The members' and the witness's power-cut disks, when power cuts are on.
    power: Option<PowerDisks>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        for i in 0..self.cluster.members.len() {
            self.cluster.stop(i);
        }
        self.disks.take();
        self.power.take();
    }
}

/// A power-cut file system on each member's data directory (index: the member's) and one on
/// the witness's directory.
struct PowerDisks {
    members: Vec<Disk>,
    witness: Disk,
}

impl PowerDisks {
    /// Mounts them in `cluster_dir`, before the witness is initialised and the members start.
    fn mount(cluster_dir: &Path) -> Result<PowerDisks, String> {
        let mut members = Vec::new();
        for name in cluster::MEMBERS {
            let dir = cluster::data_dir(cluster_dir, name);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            members.push(Disk::mount(&dir)?);
        }
        let witness = Disk::mount(&cluster_dir.join("witness"))?;
        Ok(PowerDisks { members, witness })
    }
}

/// The sshd serving the witness's directory; the members' mounts (one per start, in their own
/// mount namespaces) end with it.
struct SshfsShare {
    _server: SshServer,
    remote: PathBuf,
}

impl Drop for SshfsShare {
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .arg("-f")
            .arg(format!("sshfs root@127.0.0.1:{} ", self.remote.display()))
            .status();
    }
}

/// Each member's data directory on a tmpfs of its own, which the full-disk fault fills.
struct Disks {
    dirs: Vec<PathBuf>,
}

/// The size of each member's data disk.
const DISK_SIZE: &str = "1g";

impl Disks {
    /// Mounts a tmpfs on each member's data directory in `cluster_dir` (needs root).
    fn mount(cluster_dir: &Path) -> Result<Disks, String> {
        let mut disks = Disks { dirs: Vec::new() };
        for name in cluster::MEMBERS {
            let dir = cluster::data_dir(cluster_dir, name);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let mounted = Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={DISK_SIZE}"), "tmpfs"])
                .arg(&dir)
                .status()
                .is_ok_and(|s| s.success());
            if !mounted {
                return Err(format!(
                    "the full-disk fault mounts a tmpfs on each data directory: mounting one \
                     on {} failed (run as root, or leave out --full-disk)",
                    dir.display()
                ));
            }
            disks.dirs.push(dir);
        }
        Ok(disks)
    }

    fn filler(&self, i: usize) -> PathBuf {
        self.dirs[i].join("filler")
    }

    /// Fills member `i`'s disk to the last byte.
    fn fill(&self, i: usize) {
        // (dd stops with "No space left on device": that is the point)
        let _ = Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", self.filler(i).display()))
            .args(["bs=1M", "status=none"])
            .stderr(std::process::Stdio::null())
            .status();
    }

    /// Frees what [`Disks::fill`] took.
    fn free(&self, i: usize) -> Result<(), String> {
        std::fs::remove_file(self.filler(i)).map_err(|e| format!("freeing the disk: {e}"))
    }
}

impl Drop for Disks {
    fn drop(&mut self) {
        for dir in &self.dirs {
            let _ = Command::new("umount").arg("-l").arg(dir).status();
        }
    }
}

/// Starts the witness's site and the cluster on it.
fn start(node_bin: &Path, etcdutl: &Path, o: &Options) -> Result<Rig, String> {
    let (dir, dir_url) = cluster::witness_dir();
    let disks = match o.disks {
        DiskKind::Tmpfs => Some(Disks::mount(dir.path())?),
        DiskKind::Plain | DiskKind::PowerCut => None,
    };
    let power = match o.disks {
        DiskKind::PowerCut if o.witness != WitnessKind::Dir => {
            return Err("power cuts need the witness in a directory (--witness dir)".into());
        }
        DiskKind::PowerCut => {
            for at in crate::powercut::unmount_stale() {
                eprintln!(
                    "unmounted {}: a power-cut disk left by a campaign that was killed",
                    at.display()
                );
            }
            Some(PowerDisks::mount(dir.path())?)
        }
        DiskKind::Plain | DiskKind::Tmpfs => None,
    };
    let (mut azurite, mut share) = (None, None);
    let (url, wrapper) = match o.witness {
        WitnessKind::Dir => (dir_url, Vec::new()),
        WitnessKind::Sshfs => {
            let remote = dir.path().join("witness");
            let server = SshServer::start();
            // Each member mounts the share over the directory's own path, in a mount namespace
            // of its own: the same witness URL everywhere, a separate client cache per member.
            let mount = server.mount_command(&remote, &remote, sshfs::CACHED_30S);
            let quoted: Vec<String> = mount.iter().map(|a| format!("'{a}'")).collect();
            let wrapper = [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                &format!("{} && exec \"$0\" \"$@\"", quoted.join(" ")),
            ]
            .map(String::from)
            .to_vec();
            share = Some(SshfsShare {
                _server: server,
                remote,
            });
            (dir_url, wrapper)
        }
        WitnessKind::Azurite => {
            let az = Azurite::start();
            let url = az.witness_url("faults", "witness");
            azurite = Some(az);
            (url, Vec::new())
        }
    };
    // On power-cut disks, a snapshot every 1,000 entries: snapshot files written, received,
    // renamed and purged, and WAL segments released, all within reach of the cuts.
    let flags: &[&str] = match o.disks {
        DiskKind::PowerCut => &["--snapshot-count", "1000"],
        DiskKind::Plain | DiskKind::Tmpfs => &[],
    };
    let cluster = Cluster::start_partitionable(dir, node_bin, etcdutl, url, flags, wrapper);
    Ok(Rig {
        cluster,
        azurite,
        _share: share,
        disks,
        power,
    })
}

/// Runs the campaign; the error names the seed and run that failed and what it found.
pub fn campaign(node_bin: &Path, etcdutl: &Path, o: &Options) -> Result<Report, String> {
    let mut rig = start(node_bin, etcdutl, o)?;
    rig.cluster.wait_leader(Duration::from_secs(30));
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let mut report = Report::default();
    let started = Instant::now();
    for run in 0..o.runs {
        let seed = o.seed.wrapping_add(run);
        one_run(&mut rig, &rt, o, seed, &mut report).map_err(|e| {
            report.link_stalls = link_stalls(&rig.cluster);
            format!(
                "fault run with seed {seed} failed: {e}\n{stalls}replay: {}\nmember logs in {}",
                replay_command(o, seed),
                keep_logs(&rig.cluster, seed),
                stalls = match report.link_stalls {
                    0 => String::new(),
                    n => format!("(peer links found their streams stuck {n} times so far)\n"),
                }
            )
        })?;
        report.runs += 1;
        if report.runs % 50 == 0 && report.runs < o.runs {
            // Long campaigns: a running summary, so an interrupted one still reports.
            report.link_stalls = link_stalls(&rig.cluster);
            eprint!(
                "after {} s: {}",
                started.elapsed().as_secs(),
                report.summary()
            );
        }
    }
    report.link_stalls = link_stalls(&rig.cluster);
    Ok(report)
}

/// The stuck-link warnings in the members' logs (kept across runs and restarts), counted when
/// a summary needs them rather than after every run (the logs only grow).
fn link_stalls(cluster: &Cluster) -> u64 {
    (0..cluster.members.len())
        .map(|i| cluster.log(i).matches(LINK_STALL).count() as u64)
        .sum()
}

/// The command that runs the failed run's seed again with the campaign's options (alone: the
/// cluster's state from the runs before is not replayed).
fn replay_command(o: &Options, seed: u64) -> String {
    let name = |v: Option<clap::builder::PossibleValue>| v.map(|v| v.get_name().to_string());
    let mut out = format!(
        "bash scripts/faults.sh --runs 1 --seed {seed} --clients {} --keys {} --witness {}",
        o.clients,
        o.keys,
        name(o.witness.to_possible_value()).unwrap_or_else(|| "dir".into())
    );
    match o.disks {
        DiskKind::Plain => {}
        DiskKind::Tmpfs => out.push_str(" --full-disk"),
        DiskKind::PowerCut => out.push_str(" --power-cut"),
    }
    if let Some(families) = &o.families {
        let names: Vec<String> = families
            .iter()
            .filter_map(|f| name(f.to_possible_value()))
            .collect();
        out.push_str(&format!(" --faults {}", names.join(",")));
    }
    out
}

/// Copies the members' logs out of the cluster's directory (removed with the cluster), with
/// the thread stacks of each running member (`<name>.stacks`: where a stuck Raft loop waits);
/// where.
fn keep_logs(cluster: &Cluster, seed: u64) -> String {
    let to = std::env::temp_dir().join(format!("faults-{seed}"));
    let copied = std::fs::create_dir_all(&to).and_then(|()| {
        for (i, m) in cluster.members.iter().enumerate() {
            let log = format!("{}.log", m.name);
            std::fs::copy(cluster.dir.path().join(&log), to.join(&log))?;
            if m.is_running() {
                let stacks = thread_stacks(&cluster.data_dir(i));
                std::fs::write(to.join(format!("{}.stacks", m.name)), stacks)?;
            }
        }
        Ok(())
    });
    match copied {
        Ok(()) => to.display().to_string(),
        Err(e) => format!(
            "{} (copying them failed: {e})",
            cluster.dir.path().display()
        ),
    }
}

/// The thread stacks of the etcd-node process using `data_dir`, by gdb (or why there are none).
fn thread_stacks(data_dir: &Path) -> String {
    let pattern = format!("--data-dir {}", data_dir.display());
    let pids = Command::new("pgrep").args(["-f", "--", &pattern]).output();
    let Ok(pids) = pids else {
        return "pgrep failed to run\n".into();
    };
    let mut out = String::new();
    for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
        let gdb = Command::new("timeout")
            .args([
                "60",
                "gdb",
                "-batch",
                "-p",
                pid,
                "-ex",
                "thread apply all bt",
            ])
            .output();
        out.push_str(&match gdb {
            Ok(o) => format!(
                "== pid {pid}\n{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => format!("== pid {pid}: gdb did not run: {e}\n"),
        });
    }
    if out.is_empty() {
        out.push_str("no process found\n");
    }
    out
}

fn one_run(
    rig: &mut Rig,
    rt: &tokio::runtime::Runtime,
    o: &Options,
    seed: u64,
    report: &mut Report,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let cluster = &mut rig.cluster;
    let endpoints = cluster.endpoints();
    let history: History = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let epoch = Instant::now();
    let prefix = format!("faults/{seed}/");
    // One watcher per member, from the revision after the one every member reached.
    let from = rt.block_on(current_revision(&endpoints[0]))? + 1;
    let end_key = format!("{prefix}end-{}", watch_check::PROBE);
    let give_up = Arc::new(AtomicBool::new(false));
    let mut watchers = Vec::new();
    for ep in &endpoints {
        let received = Arc::new(Mutex::new(watch_check::Received::default()));
        let task = rt.spawn(watch_check::watch_until(
            ep.clone(),
            prefix.clone(),
            from,
            end_key.clone(),
            received.clone(),
            give_up.clone(),
        ));
        watchers.push((ep.clone(), received, task));
    }
    let mut clients = Vec::new();
    for c in 0..o.clients {
        let endpoint = endpoints[c % endpoints.len()].clone();
        let (history, stop, prefix) = (history.clone(), stop.clone(), prefix.clone());
        let (keys, client_seed) = (o.keys, rng.random::<u64>());
        clients.push(rt.spawn(async move {
            workload(
                endpoint,
                c as u64,
                keys,
                prefix,
                client_seed,
                epoch,
                history,
                stop,
            )
            .await
        }));
    }
    std::thread::sleep(Duration::from_millis(rng.random_range(500..1500)));
    let families: Vec<Family> = match &o.families {
        Some(chosen) => chosen.clone(),
        None => Family::value_variants()
            .iter()
            .copied()
            .filter(|&f| f != Family::FullDisk || rig.disks.is_some())
            .filter(|&f| !f.is_power_cut() || rig.power.is_some())
            .collect(),
    };
    let family = families[rng.random_range(0..families.len())];
    let mut member = rng.random_range(0..cluster.members.len());
    let fault_at = nanos(epoch);
    let witness_dir = cluster.dir.path().join("witness");
    let gone = cluster.dir.path().join("witness.gone");
    match family {
        Family::Kill => {
            cluster.kill(member);
            std::thread::sleep(Duration::from_millis(rng.random_range(1000..5000)));
            cluster.start_member(member);
        }
        Family::Pause => {
            cluster.pause(member);
            std::thread::sleep(Duration::from_millis(rng.random_range(3000..12000)));
            cluster.resume(member);
        }
        Family::WitnessGone => {
            let lasts = Duration::from_millis(rng.random_range(3000..12000));
            if let Some(az) = &mut rig.azurite {
                az.stop();
                std::thread::sleep(lasts);
                az.restart();
            } else {
                std::fs::rename(&witness_dir, &gone).map_err(|e| e.to_string())?;
                std::thread::sleep(lasts);
                std::fs::rename(&gone, &witness_dir).map_err(|e| e.to_string())?;
            }
        }
        Family::Partition => {
            cluster.partition(true);
            std::thread::sleep(Duration::from_millis(rng.random_range(3000..12000)));
            cluster.partition(false);
        }
        Family::FullDisk => {
            let disks = rig.disks.as_ref().ok_or("full disks need --full-disk")?;
            disks.fill(member);
            std::thread::sleep(Duration::from_millis(rng.random_range(3000..12000)));
            disks.free(member)?;
            if stopped_saying(cluster, member, "No space left on device", "a full disk")? {
                // It stopped on the full disk; an operator frees space and starts it again.
                report.stopped_on_full_disk += 1;
                cluster.kill(member);
                cluster.start_member(member);
            }
        }
        Family::Garbage => {
            let until = Instant::now() + Duration::from_millis(rng.random_range(3000..12000));
            send_garbage(cluster.ports(member), until, rng.random());
            if cluster.exited(member) {
                return Err(format!(
                    "member {member} exited after garbage on its ports; its log:\n{}",
                    cluster.log(member)
                ));
            }
        }
        Family::PowerLeaderSite
        | Family::PowerFollowerSite
        | Family::PowerBoth
        | Family::PowerWitness
        | Family::PowerLoop => {
            let power = rig.power.as_ref().ok_or("power cuts need --power-cut")?;
            member = power_cut(cluster, power, family, member, &mut rng, report)?;
        }
        Family::DiskEio => {
            let power = rig.power.as_ref().ok_or("disk errors need --power-cut")?;
            disk_errors(cluster, &power.members[member], member, &mut rng, report)?;
        }
    }
    let healed = Instant::now();
    let recovered = rt.block_on(first_write(&endpoints, &prefix));
    let Some(took) = recovered.map(|at| at.duration_since(healed)) else {
        return Err(format!(
            "{family:?} of member {member}: no write acknowledged within 60 s of the heal"
        ));
    };
    if family.is_power_cut() {
        for i in 0..cluster.members.len() {
            serving_or_log(cluster, i)
                .map_err(|e| format!("{family:?} of member {member}: {e}"))?;
        }
    }
    report.recoveries.entry(family).or_default().push(took);
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let stopped = nanos(epoch);
    for c in clients {
        report.lease_ops += rt
            .block_on(c)
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{family:?} of member {member}: {e}"))?;
    }
    // A request of the check itself may fail (a connection reset under load, a member that has
    // not heard from the leader yet): check again, for up to about 30 s.
    let mut attempts = 0;
    let mut keys: Vec<String> = (0..o.keys).map(|k| format!("{prefix}{k}")).collect();
    keys.extend(
        history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned(),
    );
    keys.sort();
    keys.dedup();
    let revision = loop {
        match rt.block_on(verify(&endpoints, &keys, epoch, &history)) {
            Ok(revision) => break revision,
            Err(e) if !e.starts_with(RPC_FAILED) || attempts == 30 => return Err(e),
            Err(_) => attempts += 1,
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    let history = history.lock().unwrap_or_else(|e| e.into_inner());
    // The watchers: the end marker, written after the check, ends each one.
    rt.block_on(put_retrying(&endpoints[0], &end_key))?;
    let finished = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), async {
            let mut results = Vec::new();
            for (_, _, task) in &mut watchers {
                results.push(task.await.map_err(|e| e.to_string()).and_then(|r| r));
            }
            results
        })
        .await
    });
    give_up.store(true, Ordering::SeqCst);
    let results = finished.map_err(|_| {
        "a member's watcher did not deliver the end marker within 30 s of its write".to_string()
    })?;
    let mut live = Vec::new();
    for ((ep, received, _), result) in watchers.into_iter().zip(results) {
        result.map_err(|e| format!("{family:?} of member {member}: {e}"))?;
        let received = std::mem::take(&mut *received.lock().unwrap_or_else(|e| e.into_inner()));
        report.watch_resumes += received.resumed;
        report.watch_events += received.events.len() as u64;
        live.push((ep, received.events));
    }
    let replayed = Arc::new(Mutex::new(watch_check::Received::default()));
    rt.block_on(watch_check::watch_until(
        endpoints[1].clone(),
        prefix.clone(),
        from,
        end_key.clone(),
        replayed.clone(),
        Arc::new(AtomicBool::new(false)),
    ))?;
    let replay = std::mem::take(&mut replayed.lock().unwrap_or_else(|e| e.into_inner()).events);
    report.watch_events += replay.len() as u64;
    watch_check::check(&live, &replay, &history)
        .map_err(|e| format!("{family:?} of member {member}: watch: {e}"))?;
    // As a Kubernetes API server does: the history before the run's checked revision goes.
    rt.block_on(compact(&endpoints[0], revision))?;
    let gap = longest_write_gap(history.values().flatten(), fault_at, stopped);
    report.gaps.entry(family).or_default().push(gap);
    for (key, events) in history.iter() {
        report.operations += events.len() as u64;
        for e in events {
            match (e.op, e.ret) {
                (Op::Get(_), _) => {}
                (_, Some(_)) => report.acknowledged_writes += 1,
                (_, None) => report.unknown_outcomes += 1,
            }
        }
        linearizable::check(events, None)
            .map_err(|e| format!("{family:?} of member {member}: key {key}: {e}"))?;
    }
    Ok(())
}

/// A power-cut family: which members' sites lose power (with the witness's share or not), and
/// how often; the member the fault is about (`member`, as drawn, for the loop).
fn power_cut(
    cluster: &mut Cluster,
    power: &PowerDisks,
    family: Family,
    member: usize,
    rng: &mut StdRng,
    report: &mut Report,
) -> Result<usize, String> {
    let leader = cluster.wait_leader(Duration::from_secs(30));
    let follower = 1 - leader;
    let (sites, witness, times): (Vec<usize>, bool, u32) = match family {
        Family::PowerLeaderSite => (vec![leader], true, 1),
        Family::PowerFollowerSite => (vec![follower], false, 1),
        Family::PowerBoth => (vec![0, 1], true, 1),
        Family::PowerWitness => (Vec::new(), true, 1),
        Family::PowerLoop => (vec![member], false, rng.random_range(2..=4)),
        other => return Err(format!("{other:?} is not a power cut")),
    };
    for round in 0..times {
        // Power goes at once: the processes die, then the disks lose what was not durable.
        for &m in &sites {
            cluster.kill(m);
        }
        let mut disks: Vec<&Disk> = sites.iter().map(|&m| &power.members[m]).collect();
        if witness {
            disks.push(&power.witness);
        }
        for disk in &disks {
            let data = if rng.random_bool(0.5) {
                Data::Lost
            } else {
                Data::Torn
            };
            let entries = if rng.random_bool(0.5) {
                Entries::Lost
            } else {
                Entries::Kept
            };
            report.cut.add(&disk.power_off(data, entries, rng.random()));
            report.power_cuts += 1;
        }
        let off = if times > 1 { 200..1000 } else { 1000..5000 };
        std::thread::sleep(Duration::from_millis(rng.random_range(off)));
        for disk in &disks {
            disk.power_on();
        }
        for &m in &sites {
            cluster.start_member(m);
        }
        if round + 1 < times {
            // The next cut comes while the member recovers: reading its log, catching up.
            std::thread::sleep(Duration::from_millis(rng.random_range(50..1500)));
        }
    }
    Ok(sites.first().copied().unwrap_or(member))
}

/// The disk-error family on member `member`'s data disk.
fn disk_errors(
    cluster: &mut Cluster,
    disk: &Disk,
    member: usize,
    rng: &mut StdRng,
    report: &mut Report,
) -> Result<(), String> {
    disk.fail(if rng.random_bool(0.5) {
        Failure::Syncs
    } else {
        Failure::Writes
    });
    std::thread::sleep(Duration::from_millis(rng.random_range(3000..12000)));
    if !stopped_saying(cluster, member, "Input/output error", "a failing disk")? {
        disk.heal();
        return Ok(());
    }
    // It stopped; the operator checks the disk (dmesg), finds the error passed, starts it again.
    let log = cluster.log(member);
    report.stopped_on_disk_error += 1;
    cluster.kill(member);
    // When it could not note where its WAL's durable part ends, its message asks for a
    // restart of the machine first: a power cut here (the page cache goes).
    let restart_machine = log.contains("could not note where the WAL's durable part ends");
    if restart_machine || rng.random_bool(0.5) {
        report
            .cut
            .add(&disk.power_off(Data::Lost, Entries::Lost, rng.random()));
        report.power_cuts += 1;
        disk.power_on();
    }
    disk.heal();
    cluster.start_member(member);
    Ok(())
}

/// Whether member `i` stopped on a disk fault (`fault`): it is given 4 s (one that failed near
/// the end of the fault may still be closing its connections, a grace period of 2 s), and one
/// that stopped must have logged `says`.
fn stopped_saying(
    cluster: &mut Cluster,
    i: usize,
    says: &str,
    fault: &str,
) -> Result<bool, String> {
    let waited = Instant::now();
    while !cluster.exited(i) && waited.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(100));
    }
    if !cluster.exited(i) {
        return Ok(false);
    }
    let log = cluster.log(i);
    if !log.contains(says) {
        return Err(format!(
            "member {i} exited on {fault} without saying \"{says}\"; its log:\n{log}"
        ));
    }
    Ok(true)
}

/// Waits up to 30 s for member `i` to answer `/health` (whatever it says); an error with its
/// log if it exited instead (it could not start from what a power cut left) or never answered.
fn serving_or_log(cluster: &mut Cluster, i: usize) -> Result<(), String> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        if cluster.exited(i) {
            return Err(format!("member {i} exited; its log:\n{}", cluster.log(i)));
        }
        if cluster.http_get(i, "/health").is_some() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "member {i} did not answer /health within 30 s; its log:\n{}",
        cluster.log(i)
    ))
}

/// Until `until`: connections to each of `ports` that send random bytes (half of them after
/// the HTTP/2 preface, so the server parses frames out of them), then close.
fn send_garbage(ports: [u16; 2], until: Instant, seed: u64) {
    use std::io::Write;
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let mut rng = StdRng::seed_from_u64(seed);
    while Instant::now() < until {
        for port in ports {
            let Ok(mut conn) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
                continue;
            };
            let mut bytes: Vec<u8> = (0..rng.random_range(1..4096))
                .map(|_| rng.random())
                .collect();
            if rng.random_bool(0.5) {
                bytes.splice(0..0, PREFACE.iter().copied());
            }
            let _ = conn.set_write_timeout(Some(Duration::from_millis(200)));
            let _ = conn.write_all(&bytes);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The longest stretch of [from, to] (nanoseconds since the run's epoch) in which no write
/// (put or compare-and-swap, whatever its outcome) was acknowledged.
fn longest_write_gap<'a>(events: impl Iterator<Item = &'a Event>, from: u64, to: u64) -> Duration {
    let mut acks: Vec<u64> = events
        .filter(|e| !matches!(e.op, Op::Get(_)))
        .filter_map(|e| e.ret)
        .filter(|&t| t > from && t < to)
        .collect();
    acks.sort_unstable();
    let mut last = from;
    let mut longest = 0;
    for t in acks.into_iter().chain([to]) {
        longest = longest.max(t - last);
        last = t;
    }
    Duration::from_nanos(longest)
}

fn nanos(epoch: Instant) -> u64 {
    epoch.elapsed().as_nanos() as u64
}

/// Errors with which a member says a write was not applied and never will be (etcd-node answers
/// "leader changed" only once the write can never commit: docs/raft.md); other errors leave the
/// outcome unknown.
fn not_applied(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(s)
        if s.message() == "etcdserver: leader changed" || s.message() == "etcdserver: no leader")
}

fn record(history: &History, key: &str, event: Event) {
    history
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key.to_string())
        .or_default()
        .push(event);
}

/// One client: puts, linearizable reads, compare-and-swaps on random keys and lease
/// operations on a key of its own until `stop`; the number of lease operations, or a broken
/// lease promise.
#[allow(clippy::too_many_arguments)]
async fn workload(
    endpoint: String,
    id: u64,
    keys: u64,
    prefix: String,
    seed: u64,
    epoch: Instant,
    history: History,
    stop: Arc<AtomicBool>,
) -> Result<u64, String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut client: Option<Client> = None;
    let mut counter = 0u64;
    let mut last_read: BTreeMap<String, Option<u64>> = BTreeMap::new();
    let mut lease = Leasing {
        key: format!("{prefix}lease-{id}"),
        held: None,
        ops: 0,
    };
    while !stop.load(Ordering::SeqCst) {
        if client.is_none() {
            // After a failure (or before the first connection): a client backs off, so an
            // outage adds a few unknown outcomes per second, not thousands.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(1..5))).await;
        let Some(c) = connected(&mut client, &endpoint).await else {
            continue;
        };
        let key = format!("{prefix}{}", rng.random_range(0..keys));
        counter += 1;
        let value = (id << 32) | counter;
        let call = nanos(epoch);
        let roll: f64 = rng.random();
        let timeout = Duration::from_secs(2);
        if roll >= 0.92 {
            counter += 1;
            let value = (id << 32) | counter;
            if !lease.step(c, &mut rng, value, epoch, &history).await? {
                client = None;
            }
        } else if roll < 0.4 {
            let put = tokio::time::timeout(timeout, c.put(key.as_str(), value.to_string(), None));
            let put = put.await;
            if let Ok(Err(e)) = &put
                && not_applied(e)
            {
                // A definite answer: the write is left out of the history, so a read that
                // sees its value (it was applied after all) is a linearizability violation.
                client = None;
                continue;
            }
            let ret = matches!(put, Ok(Ok(_))).then(|| nanos(epoch));
            record(
                &history,
                &key,
                Event {
                    op: Op::Put(value),
                    call,
                    ret,
                },
            );
            if ret.is_none() {
                client = None;
            }
        } else if roll < 0.8 {
            let got = tokio::time::timeout(timeout, c.get(key.as_str(), None)).await;
            if let Ok(Ok(r)) = got {
                let seen = r
                    .kvs()
                    .first()
                    .and_then(|kv| kv.value_str().ok()?.parse().ok());
                let ret = Some(nanos(epoch));
                record(
                    &history,
                    &key,
                    Event {
                        op: Op::Get(seen),
                        call,
                        ret,
                    },
                );
                last_read.insert(key, seen);
            } else {
                client = None;
            }
        } else {
            let expect = last_read.get(&key).copied().flatten();
            let compare = match expect {
                Some(v) => Compare::value(key.as_str(), CompareOp::Equal, v.to_string()),
                None => Compare::create_revision(key.as_str(), CompareOp::Equal, 0),
            };
            let txn = Txn::new().when([compare]).and_then([TxnOp::put(
                key.as_str(),
                value.to_string(),
                None,
            )]);
            let done = tokio::time::timeout(timeout, c.txn(txn)).await;
            let (ok, ret) = match done {
                Ok(Ok(r)) => (r.succeeded(), Some(nanos(epoch))),
                _ => {
                    client = None;
                    (false, None)
                }
            };
            let op = Op::Cas {
                expect,
                new: value,
                ok,
            };
            record(&history, &key, Event { op, call, ret });
        }
    }
    Ok(lease.ops)
}

/// Leases longer than any run: none expires while its run checks it (a lease's countdown
/// starts again at every leader change, so only a lost lease ends early).
const LEASE_TTL: i64 = 120;

/// A client's lease: granted, its key put with it, kept alive, revoked (deleting the key).
struct Leasing {
    /// The key only this client writes, always with its current lease.
    key: String,
    /// The current lease and whether a revoke of it was sent (an unknown outcome: it may be
    /// gone).
    held: Option<(i64, bool)>,
    ops: u64,
}

impl Leasing {
    /// One lease operation: grant a lease and put the key with it, or keep the lease alive
    /// (an acknowledged lease that was never revoked must be alive), or revoke it (recorded as
    /// a delete of the key). False when the connection failed.
    async fn step(
        &mut self,
        c: &mut Client,
        rng: &mut StdRng,
        value: u64,
        epoch: Instant,
        history: &History,
    ) -> Result<bool, String> {
        self.ops += 1;
        let timeout = Duration::from_secs(2);
        let Some((id, revoking)) = self.held else {
            let id = rng.random_range(1..i64::MAX);
            let options = etcd_client::LeaseGrantOptions::new().with_id(id);
            let granted = tokio::time::timeout(timeout, c.lease_grant(LEASE_TTL, Some(options)));
            if !matches!(granted.await, Ok(Ok(_))) {
                return Ok(false); // (if it was granted, it expires unused)
            }
            self.held = Some((id, false));
            let call = nanos(epoch);
            let options = etcd_client::PutOptions::new().with_lease(id);
            let put = tokio::time::timeout(
                timeout,
                c.put(self.key.as_str(), value.to_string(), Some(options)),
            );
            let ret = matches!(put.await, Ok(Ok(_))).then(|| nanos(epoch));
            let op = Op::Put(value);
            record(history, &self.key, Event { op, call, ret });
            return Ok(ret.is_some());
        };
        if rng.random_bool(0.5) {
            let alive = tokio::time::timeout(timeout, keep_alive(c, id)).await;
            return match alive {
                Ok(Ok(ttl)) if ttl <= 0 && !revoking => Err(format!(
                    "lease {id:x} was granted and never revoked, but a keep-alive through this                      member says it does not exist (TTL {ttl})"
                )),
                Ok(Ok(_)) => Ok(true),
                _ => Ok(false),
            };
        }
        self.held = Some((id, true));
        let call = nanos(epoch);
        let revoked = tokio::time::timeout(timeout, c.lease_revoke(id)).await;
        let ret = match revoked {
            Ok(Ok(_)) => Some(nanos(epoch)),
            // Not found: an earlier revoke of unknown outcome went through.
            Ok(Err(e)) if revoking && e.to_string().contains("lease not found") => {
                Some(nanos(epoch))
            }
            _ => None,
        };
        record(
            history,
            &self.key,
            Event {
                op: Op::Delete,
                call,
                ret,
            },
        );
        if ret.is_some() {
            self.held = None;
        }
        Ok(ret.is_some())
    }
}

/// One keep-alive of lease `id`: the TTL the leader answers (0 or less: no such lease).
async fn keep_alive(c: &mut Client, id: i64) -> Result<i64, etcd_client::Error> {
    let (mut keeper, mut answers) = c.lease_keep_alive(id).await?;
    keeper.keep_alive().await?;
    match answers.message().await? {
        Some(r) => Ok(r.ttl()),
        None => Err(etcd_client::Error::WatchError(
            "the keep-alive stream ended".into(),
        )),
    }
}

async fn connected<'a>(client: &'a mut Option<Client>, endpoint: &str) -> Option<&'a mut Client> {
    if client.is_none() {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(3));
        *client = Client::connect([endpoint], Some(options)).await.ok();
    }
    client.as_mut()
}

/// The time of the first write acknowledged through any member, trying for 60 s.
async fn first_write(endpoints: &[String], prefix: &str) -> Option<Instant> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        for ep in endpoints {
            let mut client = None;
            if let Some(c) = connected(&mut client, ep).await {
                let put = c.put(format!("{prefix}probe"), "1", None);
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), put).await {
                    return Some(Instant::now());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// The revision member `endpoint` is at.
async fn current_revision(endpoint: &str) -> Result<i64, String> {
    let mut last = String::new();
    for _ in 0..50 {
        let mut client = None;
        if let Some(c) = connected(&mut client, endpoint).await {
            match c.status().await {
                Ok(s) => return Ok(s.header().map_or(0, |h| h.revision())),
                Err(e) => last = e.to_string(),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("{RPC_FAILED}status of {endpoint}: {last}"))
}

/// Compacts the key space at `revision` through `endpoint`.
async fn compact(endpoint: &str, revision: i64) -> Result<(), String> {
    let mut client = None;
    let c = connected(&mut client, endpoint)
        .await
        .ok_or_else(|| format!("{RPC_FAILED}{endpoint} does not answer"))?;
    c.compact(revision, None)
        .await
        .map(drop)
        .map_err(|e| format!("compacting at revision {revision}: {e}"))
}

/// Puts `key` through `endpoint`, trying for 10 s.
async fn put_retrying(endpoint: &str, key: &str) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..50 {
        let mut client = None;
        if let Some(c) = connected(&mut client, endpoint).await {
            match c.put(key, "0", None).await {
                Ok(_) => return Ok(()),
                Err(e) => last = e.to_string(),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("{RPC_FAILED}put {key} through {endpoint}: {last}"))
}

/// How a failed request of the check begins (not a finding about the data: retried).
const RPC_FAILED: &str = "request failed: ";

fn rpc(e: etcd_client::Error) -> String {
    format!("{RPC_FAILED}{e}")
}

/// After the run: both members reach the same revision; every key gets a final linearizable
/// read (added to its history) and the same value on both members; HashKV agrees.
async fn verify(
    endpoints: &[String],
    keys: &[String],
    epoch: Instant,
    history: &History,
) -> Result<i64, String> {
    let mut clients = Vec::new();
    for ep in endpoints {
        let mut c = None;
        for _ in 0..100 {
            if connected(&mut c, ep).await.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        clients.push(c.ok_or(format!("member {ep} does not answer after the heal"))?);
    }
    let started = Instant::now();
    let revision = loop {
        let mut revisions = Vec::new();
        for c in &mut clients {
            let status = c.status().await.map_err(rpc)?;
            revisions.push(status.header().map_or(0, |h| h.revision()));
        }
        if revisions.iter().all(|&r| r == revisions[0]) {
            break revisions[0];
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "the members do not converge: revisions {revisions:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for key in keys {
        let call = nanos(epoch);
        let got = clients[0].get(key.as_str(), None).await.map_err(rpc)?;
        let value_of = |r: &etcd_client::GetResponse| -> Option<u64> {
            r.kvs()
                .first()
                .and_then(|kv| kv.value_str().ok()?.parse().ok())
        };
        let seen = value_of(&got);
        let ret = Some(nanos(epoch));
        record(
            history,
            key,
            Event {
                op: Op::Get(seen),
                call,
                ret,
            },
        );
        let other = etcd_client::GetOptions::new().with_serializable();
        let there = clients[1]
            .get(key.as_str(), Some(other))
            .await
            .map_err(rpc)?;
        if value_of(&there) != seen {
            return Err(format!(
                "key {key}: member {} holds {:?}, member {} {seen:?}",
                endpoints[1],
                value_of(&there),
                endpoints[0]
            ));
        }
    }
    let mut hashes = Vec::new();
    for c in &mut clients {
        hashes.push(c.hash_kv(revision).await.map_err(rpc)?.hash());
    }
    if hashes[0] != hashes[1] {
        return Err(format!("HashKV at revision {revision} differs: {hashes:?}"));
    }
    Ok(revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(ret: Option<u64>) -> Event {
        Event {
            op: Op::Put(1),
            call: 0,
            ret,
        }
    }

    #[test]
    fn write_gap_counts_acknowledged_writes_only() {
        let read = Event {
            op: Op::Get(None),
            call: 0,
            ret: Some(50),
        };
        let events = [put(Some(20)), put(None), read, put(Some(90)), put(Some(5))];
        // From 10: acks at 20 and 90, then the end at 100; the read at 50 does not count.
        assert_eq!(
            longest_write_gap(events.iter(), 10, 100),
            Duration::from_nanos(70)
        );
        assert_eq!(
            longest_write_gap([].iter(), 10, 100),
            Duration::from_nanos(90)
        );
    }
}
