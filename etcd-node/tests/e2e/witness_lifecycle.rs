//! End to end, the witness outside the happy path (issue 13): real etcd-node processes, a mount
//! witness in a local directory, the real `etcdutl`.
//! - the fault campaign's sequence that lost acknowledged writes: follower killed, the leader
//!   writes the witness, the witness wiped and initialised again as the old message advised,
//!   the leader killed, the follower started alone: it must refuse the witness and lose nothing;
//! - the probe: a missing, unreadable or re-initialised witness shows in `/health`, Status and
//!   the metrics while both members are up;
//! - a start that fails on the witness writes nothing: the corrected flag is then used;
//! - a witness share that stops answering costs a bounded number of threads (issue 40).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::{LEADER_WAIT, bins, mount_url};
use e2e_tests::cluster::{Cluster, init_witness, snapshot_files};
use e2e_tests::{free_port, within};
use etcd_client::{Client, ConnectOptions, GetOptions};

fn witness_dir(c: &Cluster) -> PathBuf {
    c.dir.path().join("witness")
}

/// Empties the witness directory, as a re-provisioned share would be.
fn wipe(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
}

async fn client(ep: &str) -> Option<Client> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(1))
        .with_timeout(Duration::from_secs(3));
    Client::connect([ep], Some(opts)).await.ok()
}

async fn put(ep: &str, k: &str, v: &str) -> bool {
    match client(ep).await {
        Some(mut c) => c.put(k, v, None).await.is_ok(),
        None => false,
    }
}

async fn status_errors(ep: &str) -> Vec<String> {
    match client(ep).await {
        Some(mut c) => match c.status().await {
            Ok(s) => s.errors().to_vec(),
            Err(e) => vec![format!("status failed: {e}")],
        },
        None => vec!["no connection".into()],
    }
}

/// Waits up to `limit` for `cond`, failing with `what` and the member's log.
#[track_caller]
fn wait(c: &Cluster, i: usize, limit: Duration, what: &str, cond: impl FnMut() -> bool) {
    if !within(limit, cond) {
        panic!("{what}: not within {limit:?}; log:\n{}", c.log(i));
    }
}

#[test]
fn a_wiped_and_reinitialised_witness_is_refused_and_no_acknowledged_write_is_lost() {
    let (node, etcdutl) = bins();
    let mut c = Cluster::start(node, etcdutl, &["--witness-probe-interval", "1s"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let l = c.wait_leader(LEADER_WAIT);
    let f = 1 - l;
    let lep = c.members[l].url();
    wait(&c, l, LEADER_WAIT, "the witness leaves R", || {
        c.metric(l, "etcd_witness_in_replication_set") == Some(0.0)
    });
    // 1. The follower dies; the leader writes the witness once and commits alone.
    c.kill(f);
    let mut acked = Vec::new();
    for i in 0..100 {
        let (k, v) = (format!("k{i:03}"), format!("v{i}"));
        if rt.block_on(put(&lep, &k, &v)) {
            acked.push((k, v));
        }
        if i == 49 {
            assert!(c.metric(l, "etcd_witness_writes_total").unwrap() >= 1.0);
            // 2. The share is re-provisioned, and initialised again as an operator would.
            wipe(&witness_dir(&c));
            init_witness(etcdutl, "w", &c.witness_url);
        }
    }
    assert!(
        acked.len() >= 90,
        "the leader kept committing: {}",
        acked.len()
    );
    // 3. The leader dies; the follower starts alone.
    c.kill(l);
    c.start_member(f);
    let fep = c.members[f].url();
    // 4. It refuses the witness: no leader, and it says why and what to do.
    wait(&c, f, LEADER_WAIT, "Status names the reset witness", || {
        rt.block_on(status_errors(&fep))
            .iter()
            .any(|e| e.contains("not the witness this cluster is bound to"))
    });
    let refusing_since = Instant::now();
    while refusing_since.elapsed() < Duration::from_secs(5) {
        assert_ne!(
            c.metric(f, "etcd_server_has_leader"),
            Some(1.0),
            "the follower was elected with a reset witness; log:\n{}",
            c.log(f)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, body) = c.http_get(f, "/health").expect("/health");
    assert_eq!(code, 503, "{body}");
    let log = c.log(f);
    assert!(
        log.contains("WARN") && log.contains("wiped and initialised again"),
        "a WARN line says what happened:\n{log}"
    );
    assert!(
        log.contains("The witness's storage was lost") && !log.contains("--force"),
        "the log points to the safe recovery and never to --force:\n{log}"
    );
    // The leader comes back: the two elect a leader without the witness, and every write the
    // old leader acknowledged is on both.
    c.start_member(l);
    c.wait_leader(LEADER_WAIT);
    for i in [l, f] {
        let ep = c.members[i].url();
        let have = rt.block_on(async {
            let started = Instant::now();
            loop {
                if let Some(mut cl) = client(&ep).await
                    && let Ok(r) = cl.get("k", Some(GetOptions::new().with_prefix())).await
                {
                    let kvs: Vec<(String, String)> = r
                        .kvs()
                        .iter()
                        .map(|kv| {
                            (
                                kv.key_str().unwrap().to_string(),
                                kv.value_str().unwrap().to_string(),
                            )
                        })
                        .collect();
                    if kvs.len() >= acked.len() || started.elapsed() > Duration::from_secs(30) {
                        return kvs;
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        for kv in &acked {
            assert!(have.contains(kv), "member {i} lost acknowledged {kv:?}");
        }
    }
}

#[test]
fn the_probe_shows_a_missing_unreadable_or_reset_witness_while_both_members_run() {
    let (node, etcdutl) = bins();
    let c = Cluster::start(node, etcdutl, &["--witness-probe-interval", "1s"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let l = c.wait_leader(LEADER_WAIT);
    let healthy = |i: usize| c.http_get(i, "/health").map(|(code, _)| code) == Some(200);
    wait(&c, l, LEADER_WAIT, "healthy at first", || {
        healthy(0) && healthy(1)
    });
    assert_eq!(c.metric(l, "etcd_witness_healthy"), Some(1.0));
    assert!(c.metric(l, "etcd_witness_last_probe_success_timestamp_seconds") > Some(0.0));
    let dir = witness_dir(&c);
    let aside = c.dir.path().join("witness.aside");
    // Each failure kind, then the witness put back: (break it, what /health says).
    /// (failure kind, how to break the witness, what /health then says)
    type Kind<'a> = (&'a str, Box<dyn Fn() + 'a>, &'a str);
    let kinds: [Kind; 3] = [
        (
            "missing",
            Box::new(|| std::fs::rename(&dir, &aside).unwrap()),
            "does not exist",
        ),
        (
            "unreadable (a file where the directory was)",
            Box::new(|| {
                std::fs::rename(&dir, &aside).unwrap();
                std::fs::write(&dir, b"not a directory").unwrap();
            }),
            "not a directory",
        ),
        (
            "reset (wiped and initialised again)",
            Box::new(|| {
                std::fs::rename(&dir, &aside).unwrap();
                std::fs::create_dir(&dir).unwrap();
                init_witness(etcdutl, "w", &c.witness_url);
            }),
            "not the witness this cluster is bound to",
        ),
    ];
    for (kind, break_it, says) in kinds {
        break_it();
        for i in [0, 1] {
            wait(&c, i, Duration::from_secs(15), kind, || {
                c.http_get(i, "/health")
                    .is_some_and(|(code, body)| code == 503 && body.contains(says))
            });
            assert_eq!(c.metric(i, "etcd_witness_healthy"), Some(0.0), "{kind}");
            let errors = rt.block_on(status_errors(&c.members[i].url()));
            assert!(
                errors.iter().any(|e| e.contains(says)),
                "{kind}: {errors:?}"
            );
        }
        assert!(
            c.log(l).contains("witness probe failed"),
            "{kind}: a WARN line"
        );
        // Put the witness back: healthy again.
        if dir.is_dir() {
            std::fs::remove_dir_all(&dir).unwrap();
        } else if dir.exists() {
            std::fs::remove_file(&dir).unwrap();
        }
        std::fs::rename(&aside, &dir).unwrap();
        for i in [0, 1] {
            wait(&c, i, Duration::from_secs(15), "healthy again", || {
                healthy(i)
            });
        }
    }
}

/// etcd-node started alone as member `n1` of `n1,n2,w=url` on `data_dir`: its output once it
/// exits, or None if it is still running after `secs` (then it is killed).
fn start_alone(url: &str, data_dir: &Path, secs: u64) -> Option<String> {
    let (node, _) = bins();
    let port = |p: u16| format!("http://127.0.0.1:{p}");
    let (client, peer) = (free_port(), free_port());
    let mut child = Command::new(node)
        .args(["--name", "n1"])
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--listen-client-urls", &port(client)])
        .args(["--advertise-client-urls", &port(client)])
        .args(["--listen-peer-urls", &port(peer)])
        .args(["--initial-advertise-peer-urls", &port(peer)])
        .args([
            "--initial-cluster",
            &format!("n1={},n2=http://127.0.0.1:1,w={url}", port(peer)),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(secs) {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            return Some(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn a_start_that_fails_on_the_witness_writes_nothing_and_the_corrected_flag_wins() {
    let (_, etcdutl) = bins();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("n1.etcd");
    // A path that does not exist, then an uninitialised witness: refused, nothing written.
    let missing = mount_url(&tmp.path().join("no-such-share"));
    let out = start_alone(&missing, &data, 20).expect("refused at once");
    assert!(
        out.contains("does not exist") && out.contains("nothing was written"),
        "{out}"
    );
    let good_dir = tmp.path().join("share");
    std::fs::create_dir(&good_dir).unwrap();
    let good = mount_url(&good_dir);
    let out = start_alone(&good, &data, 20).expect("refused at once");
    assert!(
        out.contains("not initialised") && out.contains("etcdutl witness init"),
        "{out}"
    );
    // Initialised: the same data directory starts with the corrected flag, and binds that
    // witness (member n1 alone wins with the witness's vote).
    init_witness(etcdutl, "w", &good);
    assert!(start_alone(&good, &data, 8).is_none(), "it runs now");
    let status = Command::new(etcdutl)
        .args([
            "witness",
            "status",
            "--advertise-peer-url",
            &good,
            "-w",
            "json",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("\"cluster_id\": \"") && !text.contains("\"cluster_id\": \"\""),
        "the corrected witness is the one in use: {text}"
    );
}

/// A member that is behind, alone with the witness, is refused its vote and says which member
/// to start (finding 5.4). The last resort, `--force-new-cluster`, is refused on it too (the
/// witness's record shows writes it lacks); on the up-to-date member, with the witness lost, it
/// makes that member the only voter with every acknowledged write, even when the forced start
/// crashes between its steps and is run again.
#[test]
fn a_member_behind_is_refused_and_named_and_force_new_cluster_keeps_every_write() {
    let (node, etcdutl) = bins();
    let mut c = Cluster::start(node, etcdutl, &["--witness-probe-interval", "1s"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let l = c.wait_leader(LEADER_WAIT);
    let f = 1 - l;
    wait(&c, l, LEADER_WAIT, "the witness leaves R", || {
        c.metric(l, "etcd_witness_in_replication_set") == Some(0.0)
    });
    c.kill(f);
    let lep = c.members[l].url();
    let mut acked = Vec::new();
    for i in 0..20 {
        let (k, v) = (format!("k{i:02}"), format!("v{i}"));
        assert!(
            rt.block_on(put(&lep, &k, &v)),
            "put {k} with the follower down"
        );
        acked.push((k, v));
    }
    c.kill(l);
    // Alone, the follower cannot be elected: the witness refuses its vote (its log lacks what
    // the witness acknowledged), and it says so, naming the member to start (finding 5.4).
    c.start_member(f);
    let fep = c.members[f].url();
    let other = format!("member {}", c.members[l].name);
    wait(
        &c,
        f,
        LEADER_WAIT,
        "Status names the member to start",
        || {
            rt.block_on(status_errors(&fep))
                .iter()
                .any(|e| e.contains("refused this member's") && e.contains(&other))
        },
    );
    let (code, body) = c.http_get(f, "/health").expect("/health");
    assert!(code == 503 && body.contains(&other), "{code} {body}");
    let log = c.log(f);
    assert!(
        log.contains("WARN") && log.contains("refused this member's") && log.contains(&other),
        "{log}"
    );
    c.stop(f);
    // The follower lacks those writes and the witness's record says so: refused, unchanged.
    c.start_member_with(f, &["--force-new-cluster"], &[]);
    c.wait_exited(f, "the forced start of the member behind did not end");
    c.stop(f);
    let log = c.log(f);
    assert!(
        log.contains("--force-new-cluster refused") && log.contains("nothing was changed"),
        "{log}"
    );
    // The witness is lost too; the leader, up to date, is forced into a cluster of its own.
    // The forced start crashes twice, at each step between its durable changes; each time the
    // next forced start carries on from where the last one stopped.
    wipe(&witness_dir(&c));
    for point in ["force-before-snapshot", "force-before-hard-state"] {
        c.start_member_with(
            l,
            &["--force-new-cluster"],
            &[("ETCD_NODE_FAILPOINT", point)],
        );
        c.wait_exited(l, &format!("the failpoint {point} never fired"));
        c.stop(l);
        assert!(c.log(l).contains(point), "{}", c.log(l));
    }
    c.start_member_with(l, &["--force-new-cluster"], &[]);
    let have = rt.block_on(async {
        let started = Instant::now();
        loop {
            if let Some(mut cl) = client(&lep).await
                && cl.put("forced", "yes", None).await.is_ok()
                && let Ok(r) = cl.get("k", Some(GetOptions::new().with_prefix())).await
            {
                break r
                    .kvs()
                    .iter()
                    .map(|kv| {
                        (
                            kv.key_str().unwrap().to_string(),
                            kv.value_str().unwrap().to_string(),
                        )
                    })
                    .collect::<Vec<_>>();
            }
            assert!(
                started.elapsed() < LEADER_WAIT,
                "the forced member takes no writes"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    assert_eq!(
        have, acked,
        "the forced member holds every acknowledged write"
    );
    let members = rt.block_on(async {
        let mut cl = client(&lep).await.unwrap();
        cl.member_list().await.unwrap().members().len()
    });
    assert_eq!(members, 1, "only the forced member remains");
    // The forced snapshot is in place (a few bytes: the key space file is its data), and the
    // only snapshot file left.
    let snaps = snapshot_files(&c.data_dir(l));
    assert!(
        snaps.len() == 1 && snaps[0].1.starts_with(b"SNP2"),
        "snapshot files after the forced start: {:?}",
        snaps.iter().map(|(p, b)| (p, b.len())).collect::<Vec<_>>()
    );
    // Restarted without the flag, it is still a cluster of one with its data.
    c.stop(l);
    c.start_member(l);
    wait(&c, l, LEADER_WAIT, "the forced member restarts", || {
        rt.block_on(put(&lep, "again", "v"))
    });
}

/// Threads of process `pid` (from /proc).
fn threads(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// A witness share that stops answering (packets dropped, not refused) leaves each operation on
/// it blocked for good (failpoint `witness-io-hang` blocks every use). With the other member
/// down, the member left keeps probing every second and asking the witness for its vote: it
/// must hold at most `WITNESS_IO_LIMIT` blocked operations, fail the others at once saying why,
/// and stop on SIGTERM (before: a blocked thread more every second, and no stop).
#[test]
fn a_hung_witness_share_costs_a_bounded_number_of_threads_and_sigterm_stops_the_member() {
    let (node, etcdutl) = bins();
    let mut c = Cluster::start(node, etcdutl, &["--witness-probe-interval", "1s"]);
    c.wait_leader(LEADER_WAIT);
    assert!(c.stop_within(0, Duration::from_secs(10)), "{}", c.log(0));
    c.kill(1);
    c.start_member_with(0, &[], &[("FAILPOINTS", "witness-io-hang=sleep(600000)")]);
    let pid = c.members[0].pid().expect("member 0 runs");
    let ep = c.members[0].url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // A writer that keeps trying (each put needs the witness: the other member is down).
    let writes = |seconds: u64| {
        rt.block_on(async {
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(seconds) {
                if let Some(mut cl) = client(&ep).await {
                    let _ = cl.put("hung", "v", None).await;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    writes(10);
    let settled = threads(pid);
    writes(20);
    let after = threads(pid);
    println!("threads: {settled} after 10 s of a hung witness, {after} 20 s later");
    let limit = etcd_node::server::witness_slot::WITNESS_IO_LIMIT;
    assert!(
        after <= settled + 2,
        "threads grew from {settled} to {after} in 20 s with the witness hung\n{}",
        c.log(0)
    );
    let log = c.log(0);
    assert!(
        log.contains(&format!(
            "{limit} operations on the witness storage have not returned"
        )),
        "{log}"
    );
    assert!(
        c.stop_within(0, Duration::from_secs(10)),
        "SIGTERM did not stop the member within 10 s\n{}",
        c.log(0)
    );
}
