//! End to end: two etcd-node processes and a witness (a directory, or a blob on Azurite),
//! driven by the real `etcdctl` (Debian's etcd-client 3.4) and the `etcd-client` Rust crate.
//! Members are killed with SIGKILL under load; every acknowledged write must survive.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use crate::{LEADER_WAIT, bins, contents, ok};
use e2e_tests::azurite::Azurite;
use e2e_tests::cluster::{
    Cluster, etcdctl, etcdctl_at, etcdctl_at_for, etcdctl_for, snapshot_files, two_hashes_agree,
};
use e2e_tests::free_port;
use e2e_tests::{eventually, within};
use etcd_client::{
    Client, EventType, GetOptions, WatchFilterType, WatchOptions, WatchResponse, WatchStream,
};
use witness_core::WitnessUrl;

fn cluster() -> Cluster {
    let (node, etcdutl) = bins();
    Cluster::start(node, etcdutl, &[])
}

/// etcdctl failed, saying `what`.
fn refused_with(out: Output, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains(what),
        "expected etcdctl to fail with {what:?}: {}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// A member stops on SIGTERM while clients hold streams open (a watch, a lease keep-alive):
/// a graceful stop that waited for every connection to close never ended (and a member whose
/// disk failed stopped serving but never exited, never saying why).
#[test]
fn a_member_stops_on_sigterm_with_streams_open() {
    let mut c = cluster();
    c.wait_leader(LEADER_WAIT);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let endpoint = c.members[0].url();
    let _open = rt.block_on(async {
        let mut client = Client::connect([endpoint], None).await.expect("connect");
        let mut watch = client.watch("k", None).await.expect("watch");
        client.put("k", "v", None).await.expect("put");
        watch
            .message()
            .await
            .expect("watch event")
            .expect("an event");
        let lease = client.lease_grant(60, None).await.expect("grant").id();
        let (mut keeper, mut answers) = client.lease_keep_alive(lease).await.expect("keep-alive");
        keeper.keep_alive().await.expect("keep-alive request");
        answers.message().await.expect("keep-alive answer");
        (client, watch, keeper, answers)
    });
    assert!(
        c.stop_within(0, Duration::from_secs(30)),
        "the member did not exit within 30 s of SIGTERM with streams open; its log:\n{}",
        c.log(0)
    );
}

/// A member whose WAL write fails as on a full disk (failpoint `wal-write-enospc`) stops: it
/// exits, with a client's watch stream open on it, saying which data directory failed and what
/// to do; started again on the same data directory (the disk "freed"), it catches up and holds
/// every write acknowledged meanwhile.
#[test]
fn a_member_whose_disk_fails_stops_says_why_and_comes_back() {
    disk_fails_stops_says_why_and_comes_back("wal-write-enospc", &[]);
}

/// The same when it is the key space's durable commit that fails (failpoint `kv-sync-enospc`,
/// one durable commit per batch): the entries it applied but could not make durable are in its
/// WAL, and applied again when it comes back.
#[test]
fn a_member_whose_key_space_cannot_be_made_durable_stops_and_comes_back() {
    disk_fails_stops_says_why_and_comes_back("kv-sync-enospc", &["--backend-batch-limit", "1"]);
}

/// An `EIO` from the WAL's fsync (failpoint `wal-fsync-eio`): the member stops without
/// retrying it, and its next start discards the batch whose fsync failed (it may be in the page
/// cache only) before catching up.
#[test]
fn a_member_whose_wal_fsync_fails_with_eio_discards_that_batch_and_comes_back() {
    let log = disk_fails_stops_says_why_and_comes_back("wal-fsync-eio", &[]);
    assert!(
        log.contains("discarded the WAL bytes a failed fsync left unsynced"),
        "the restarted member did not discard the unsynced batch:\n{log}"
    );
}

/// An `EIO` from the key space's durable commit (failpoint `kv-sync-eio`).
#[test]
fn a_member_whose_key_space_fsync_fails_with_eio_stops_and_comes_back() {
    disk_fails_stops_says_why_and_comes_back("kv-sync-eio", &["--backend-batch-limit", "1"]);
}

/// A member that crashes in a defragment after the copy of its key space was written and
/// before the copy's rename (failpoint `defrag-before-rename`) comes back on its old file with
/// every write, and removes the copy.
#[test]
fn a_member_that_crashes_defragmenting_comes_back_with_every_write() {
    defragment_fails_and_the_member_comes_back("defrag-before-rename", "aborting");
}

/// A new member that crashes creating its key-space file (failpoint `kv-create-before-rename`:
/// the file made and fsynced as `kv.redb.creating`, not yet renamed) starts again and serves
/// writes. Before the file was made aside, a member killed inside redb's creation of
/// `kv.redb` (a SIGTERM in its first moments) left a file without redb's magic number, and
/// every later start failed on it.
#[test]
fn a_new_member_that_crashes_creating_its_key_space_starts_again() {
    let (node, etcdutl) = bins();
    let mut c = Cluster::prepare(node, etcdutl, &[]);
    c.start_member_with(
        0,
        &[],
        &[("ETCD_NODE_FAILPOINT", "kv-create-before-rename")],
    );
    c.start_member(1);
    c.wait_exited(0, "member 0 did not reach the failpoint");
    let log = c.log(0);
    assert!(
        log.contains("failpoint kv-create-before-rename: aborting"),
        "{log}"
    );
    let member = c.data_dir(0).join("member");
    assert!(
        member.join("kv.redb.creating").exists(),
        "no file made aside"
    );
    assert!(
        !member.join("kv.redb").exists(),
        "kv.redb was made in place"
    );
    c.kill(0); // (reaps the exited process)
    c.start_member(0);
    c.wait_leader(LEADER_WAIT);
    ok(etcdctl(
        &[c.members[0].endpoint()],
        &["put", "k", "v"],
        None,
    ));
    let got = etcdctl(
        &[c.members[1].endpoint()],
        &["get", "k", "--print-value-only"],
        None,
    );
    assert_eq!(String::from_utf8_lossy(&got.stdout).trim(), "v", "{got:?}");
    assert!(!member.join("kv.redb.creating").exists());
    assert!(
        c.log(0)
            .contains("removed a key-space file whose creation a crash interrupted"),
        "{}",
        c.log(0)
    );
}

/// A key-space file that is not a database (the zeroed file a crash inside redb's creation of
/// it left before it was made aside) stops the member with advice that fits it. A member that
/// never wrote its WAL is told to remove its data directory, and doing so brings it up; a
/// member with a log is told not to remove the file alone, and its directory is left as it was.
#[test]
fn a_key_space_file_that_is_not_a_database_stops_the_member_with_what_to_do() {
    let (node, etcdutl) = bins();
    let mut c = Cluster::prepare(node, etcdutl, &[]);
    let kv = |c: &Cluster, i: usize| c.data_dir(i).join("member/kv.redb");
    // What the crash left before the file was made aside: the WAL's first segment, and a
    // zeroed `kv.redb` in place.
    c.start_member_with(
        0,
        &[],
        &[("ETCD_NODE_FAILPOINT", "kv-create-before-rename")],
    );
    c.wait_exited(0, "member 0 did not reach the failpoint");
    c.kill(0); // (reaps the exited process)
    std::fs::remove_file(c.data_dir(0).join("member/kv.redb.creating")).unwrap();
    std::fs::write(kv(&c, 0), vec![0u8; 1 << 20]).unwrap();
    c.start_member(0);
    c.wait_exited(0, "member 0 started on a file that is not a database");
    let log = c.log(0);
    let remove = format!("remove {}", c.data_dir(0).display());
    assert!(
        log.contains("magic number")
            && log.contains("nothing was ever written to this member's WAL")
            && log.contains(&remove),
        "{log}"
    );
    // Following that advice.
    c.kill(0); // (reaps the exited process)
    std::fs::remove_dir_all(c.data_dir(0)).unwrap();
    c.start_member(0);
    c.start_member(1);
    c.wait_leader(LEADER_WAIT);
    ok(etcdctl(
        &[c.members[0].endpoint()],
        &["put", "k", "v"],
        None,
    ));

    // A member with a log: the file and the WAL stay, and the advice is to replace it.
    c.stop(1);
    let len = std::fs::metadata(kv(&c, 1)).unwrap().len() as usize;
    std::fs::write(kv(&c, 1), vec![0u8; len]).unwrap();
    let wal_dir = c.data_dir(1).join("member/wal");
    let wal_before = contents(&wal_dir);
    c.start_member(1);
    c.wait_exited(1, "member 1 started on a file that is not a database");
    let log = c.log(1);
    assert!(
        log.contains("do not edit or remove the file alone")
            && log.contains("Replacing a member whose machine is gone")
            && !log.contains("nothing was ever written"),
        "{log}"
    );
    assert_eq!(std::fs::read(kv(&c, 1)).unwrap(), vec![0u8; len]);
    assert!(contents(&wal_dir) == wal_before, "the WAL changed");
    c.kill(1);
}

/// The fsync of the directory after the copy's rename fails (failpoint `defrag-sync-eio`): the
/// copy is the key space, and a power cut could undo its rename, so the member applies nothing
/// more and stops saying why; started again, it has every write.
#[test]
fn a_member_whose_fsync_after_a_defragment_fails_stops_and_comes_back() {
    let log = defragment_fails_and_the_member_comes_back("defrag-sync-eio", "Input/output error");
    assert!(
        log.contains("making the defragmented file's rename durable"),
        "{log}"
    );
}

/// Member 0 runs with the failpoint `failpoint` armed and is told to defragment, which fails;
/// writes go on through member 1, member 0 stops (its log says `says`), and started again it
/// holds every write: its log.
fn defragment_fails_and_the_member_comes_back(failpoint: &str, says: &str) -> String {
    let mut c = cluster();
    c.stop(0);
    c.start_member_with(0, &[], &[("ETCD_NODE_FAILPOINT", failpoint)]);
    c.wait_leader(LEADER_WAIT);
    let put = |eps: &[String], k: usize| {
        ok(etcdctl(eps, &["put", &format!("d/{k:02}"), "v"], None));
    };
    let eps = c.endpoints();
    (0..20).for_each(|k| put(&eps, k));
    let defrag = etcdctl(&[c.members[0].endpoint()], &["defrag"], None);
    assert!(!defrag.status.success(), "the defragment succeeded");
    // Member 0 stops now, and if it led, a write member 1 forwarded to it is answered "leader
    // changed" (not applied): a client tries such a write again.
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let second = c.members[1].url();
    for k in 20..40 {
        let key = format!("d/{k:02}");
        let acknowledged = rt.block_on(put_until(&second, &key, "v", Duration::from_secs(30)));
        assert!(
            acknowledged,
            "member 1 took no write of {key}:\n{}",
            c.log(1)
        );
    }
    eventually(Duration::from_secs(30), "member 0 stops", || c.exited(0));
    let log = c.log(0);
    assert!(
        log.contains(&format!("failpoint {failpoint}")) && log.contains(says),
        "{log}"
    );
    c.kill(0); // (reaps the exited process)
    c.start_member(0);
    let mut last = String::new();
    let back = within(Duration::from_secs(30), || {
        let args = ["get", "d/", "--prefix", "--keys-only", "--consistency=s"];
        let got = etcdctl(&[c.members[0].endpoint()], &args, None);
        last = format!("{got:?}");
        let stdout = String::from_utf8_lossy(&got.stdout);
        stdout.lines().filter(|l| l.starts_with("d/")).count() == 40
    });
    assert!(back, "member 0 lacks writes: {last}\n{}", c.log(0));
    assert!(!c.data_dir(0).join("member/kv.redb.defrag").exists());
    c.log(0)
}

/// Member 0 runs with `flags` and fails at the 60th hit of the storage-error failpoint
/// `failpoint` (its name ends with the error: `enospc` or `eio`), while a client writes through
/// member 1. Returns the member's log once it came back with every acknowledged write.
fn disk_fails_stops_says_why_and_comes_back(failpoint: &str, flags: &[&str]) -> String {
    let mut c = cluster();
    c.stop(0);
    let armed = format!("{failpoint}:60");
    c.start_member_with(0, flags, &[("ETCD_NODE_FAILPOINT", armed.as_str())]);
    c.wait_leader(LEADER_WAIT);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (first, second) = (c.members[0].url(), c.members[1].url());
    let _watch = rt.block_on(async {
        let mut client = Client::connect([first], None).await.expect("connect");
        let watch = client
            .watch("k/", Some(WatchOptions::new().with_prefix()))
            .await;
        (client, watch.expect("watch"))
    });
    let mut client = rt
        .block_on(Client::connect([second.as_str()], None))
        .expect("connect");
    let mut acknowledged = 0u32;
    let mut after_exit = 0;
    while after_exit < 50 {
        let key = format!("k/{acknowledged:05}");
        let put = rt.block_on(client.put(key.as_str(), "v", None));
        if put.is_ok() {
            acknowledged += 1;
        } else {
            std::thread::sleep(Duration::from_millis(100));
        }
        if c.exited(0) {
            after_exit += 1;
        }
        assert!(
            acknowledged < 5000,
            "the failpoint never stopped the member; its log:\n{}",
            c.log(0)
        );
    }
    let log = c.log(0);
    let error = if failpoint.ends_with("-eio") {
        "Input/output error"
    } else {
        "No space left on device"
    };
    for said in [
        format!("failpoint {failpoint}").as_str(),
        "storage failure in --data-dir",
        error,
        "start this member again on the same data directory",
    ] {
        assert!(log.contains(said), "the log does not say {said:?}:\n{log}");
    }
    c.kill(0); // (reaps the exited process)
    c.start_member(0);
    let started = Instant::now();
    loop {
        let count = rt.block_on(async {
            let mut client = Client::connect([c.members[0].url()], None).await.ok()?;
            let options = GetOptions::new()
                .with_prefix()
                .with_count_only()
                .with_serializable();
            Some(client.get("k/", Some(options)).await.ok()?.count())
        });
        if count == Some(i64::from(acknowledged)) {
            return c.log(0);
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the restarted member holds {count:?} of the {acknowledged} acknowledged keys; its \
             log:\n{}",
            c.log(0)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn etcdctl_speaks_to_two_nodes_and_a_witness() {
    let c = cluster();
    c.wait_leader(LEADER_WAIT);
    let all = c.endpoints();
    let second = [c.members[1].url()];
    assert_eq!(ok(etcdctl(&all, &["put", "foo", "bar"], None)), "OK\n");
    assert_eq!(ok(etcdctl(&second, &["get", "foo"], None)), "foo\nbar\n");
    let txn = "value(\"foo\") = \"bar\"\n\nput t yes\n\nput t no\n\n";
    let out = ok(etcdctl(&all, &["txn"], Some(txn)));
    assert!(out.starts_with("SUCCESS"), "{out}");
    assert_eq!(
        ok(etcdctl(&all, &["get", "t", "--print-value-only"], None)),
        "yes\n"
    );
    assert_eq!(ok(etcdctl(&all, &["del", "foo"], None)), "1\n");
    ok(etcdctl(&all, &["put", "foo", "again"], None));
    // Revisions: 2 foo, 3 t, 4 del foo, 5 foo again.
    assert_eq!(
        ok(etcdctl(&all, &["compact", "4"], None)),
        "compacted revision 4\n"
    );
    let old = etcdctl(&all, &["get", "foo", "--rev=3"], None);
    assert!(!old.status.success());
    assert!(
        String::from_utf8_lossy(&old.stderr)
            .contains("etcdserver: mvcc: required revision has been compacted"),
        "{}",
        String::from_utf8_lossy(&old.stderr)
    );
    let members = ok(etcdctl(&all, &["member", "list"], None));
    assert!(
        members.contains(&format!(", w, {}, , false", c.witness_url)),
        "the witness shows its witness: URL and no client URLs:\n{members}"
    );
    for m in &c.members {
        assert!(members.contains(&format!(", {}, ", m.name)), "{members}");
    }
    ok(etcdctl(&all, &["endpoint", "health"], None));
    let (code, body) = c.http_get(0, "/health").expect("GET /health");
    assert_eq!(
        (code, body.as_str()),
        (200, r#"{"health":"true","reason":""}"#)
    );
}

/// The commands that dial one endpoint at a time, given `http://` URLs and with `--cluster`
/// (which takes the members' client URLs from the member list): etcdctl 3.4 sends such a URL
/// as the HTTP/2 `:authority`, which h2 refused with RST_STREAM PROTOCOL_ERROR until the
/// patch in vendor/h2 (vendor/h2/PATCH.md).
#[test]
fn etcdctl_endpoint_commands_with_http_urls() {
    let c = cluster();
    c.wait_leader(LEADER_WAIT);
    let urls = c.endpoints();
    assert!(urls.iter().all(|u| u.starts_with("http://")), "{urls:?}");
    ok(etcdctl(&urls, &["put", "k", "v"], None));
    let first = [urls[0].clone()];
    for args in [
        &["endpoint", "status"][..],
        &["endpoint", "status", "--cluster", "-w", "table"],
        &["endpoint", "health", "--cluster"],
        &["endpoint", "hashkv", "--cluster"],
    ] {
        let out = etcdctl(&first, args, None);
        // (etcdctl 3.4 writes `endpoint health` to stderr)
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        let out = ok(out) + &err;
        for m in &c.members {
            let listed = args.contains(&"--cluster") || m.url() == urls[0];
            assert_eq!(out.contains(&m.url()), listed, "{args:?}:\n{out}");
        }
    }
    let status = ok(etcdctl(&urls, &["endpoint", "status"], None));
    assert_eq!(status.lines().count(), 2, "{status}");
    assert!(status.contains("3.5."), "{status}");
    let hashes = ok(etcdctl(&urls, &["endpoint", "hashkv"], None));
    assert!(two_hashes_agree(&hashes), "{hashes}");
}

/// Puts `key` through `endpoint`, retrying until `limit` passes; true once acknowledged.
async fn put_until(endpoint: &str, key: &str, value: &str, limit: Duration) -> bool {
    put_any(&[endpoint.to_string()], key, value, limit).await
}

/// Puts `key` through any of `endpoints` (trying them in turn), until `limit` passes.
async fn put_any(endpoints: &[String], key: &str, value: &str, limit: Duration) -> bool {
    let started = Instant::now();
    for ep in endpoints.iter().cycle() {
        if started.elapsed() >= limit {
            break;
        }
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(3));
        if let Ok(mut client) = Client::connect([ep.as_str()], Some(opts)).await
            && client.put(key, value, None).await.is_ok()
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Every key under `prefix` on `endpoint`, read locally (serializable); None while the member
/// does not answer.
async fn local_keys(endpoint: &str, prefix: &str) -> Option<Vec<(String, String)>> {
    let mut client = Client::connect([endpoint], None).await.ok()?;
    let opts = GetOptions::new().with_prefix().with_serializable();
    let resp = client.get(prefix, Some(opts)).await.ok()?;
    resp.kvs()
        .iter()
        .map(|kv| {
            Some((
                kv.key_str().ok()?.to_string(),
                kv.value_str().ok()?.to_string(),
            ))
        })
        .collect()
}

/// Waits until `endpoint` holds exactly `want` under `prefix`.
async fn wait_caught_up(endpoint: &str, prefix: &str, want: &[(String, String)]) {
    let started = Instant::now();
    loop {
        let have = tokio::time::timeout(Duration::from_secs(3), local_keys(endpoint, prefix)).await;
        if let Ok(Some(have)) = have
            && have == want
        {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{endpoint} did not catch up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Kill -9 the leader after half the writes; the survivor takes over with the witness's vote;
/// after the killed member restarts and catches up, both hold every acknowledged write.
fn leader_kill(mut c: Cluster) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let survivor = 1 - leader;
    let (lead_ep, surv_ep) = (c.members[leader].url(), c.members[survivor].url());
    let mut acked = Vec::new();
    for i in 0..100 {
        let (k, v) = (format!("k{i:04}"), format!("v{i}"));
        assert!(rt.block_on(put_until(&lead_ep, &k, &v, Duration::from_secs(10))));
        acked.push((k, v));
    }
    // Both members in R (the first election may have needed the witness's vote): the survivor
    // is entitled to the leadership. With the witness in R it would rightly stay leaderless.
    wait_witness_in_r(&c, leader, false);
    c.kill(leader);
    let killed_at = Instant::now();
    let mut failover = None;
    for i in 100..200 {
        let (k, v) = (format!("k{i:04}"), format!("v{i}"));
        assert!(
            rt.block_on(put_until(&surv_ep, &k, &v, Duration::from_secs(30))),
            "writes did not resume on the survivor; its log:\n{}",
            c.log(survivor)
        );
        failover.get_or_insert(killed_at.elapsed());
        acked.push((k, v));
    }
    eprintln!("failover (kill to first acknowledged write): {failover:?}");
    assert_eq!(c.wait_leader(LEADER_WAIT), survivor);
    // The fast path: a dead process's port refuses the survivor's dial, and the survivor
    // campaigns on that instead of waiting out its election timeout.
    let log = c.log(survivor);
    assert!(
        log.contains("a dial to the leader's peer port failed: campaigning"),
        "{log}"
    );
    let writes = c.metric(survivor, "etcd_witness_writes_total").unwrap();
    assert!(writes >= 1.0, "the survivor needed the witness: {writes}");
    c.start_member(leader);
    rt.block_on(wait_caught_up(&lead_ep, "k", &acked));
    rt.block_on(wait_caught_up(&surv_ep, "k", &acked));
}

/// A connection between the members that closes while both run (a middlebox that dropped it,
/// a reset after a partition heals) is dialled again, not taken for a death: the follower
/// does not campaign against its live leader, and the term stays. (Until 2026-11-28 the end
/// of the stream alone made the follower campaign.)
#[test]
fn a_peer_connection_that_closes_under_a_live_leader_costs_no_election() {
    let (node, etcdutl) = bins();
    let (dir, url) = e2e_tests::cluster::witness_dir();
    let c = Cluster::start_partitionable(dir, node, etcdutl, url, &[], Vec::new());
    let leader = c.wait_leader(LEADER_WAIT);
    let eps: Vec<String> = c.members.iter().map(|m| m.endpoint()).collect();
    let terms = || -> Vec<u64> {
        let out = ok(etcdctl(&eps, &["endpoint", "status", "-w", "json"], None));
        let v: serde_json::Value = serde_json::from_str(&out).expect("status as JSON");
        let all = v.as_array().expect("one status per endpoint");
        all.iter()
            .map(|e| {
                e["Status"]["raftTerm"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("a term: {out}"))
            })
            .collect()
    };
    ok(etcdctl(&eps, &["put", "r/0", "v"], None));
    let before = terms();
    for i in 1..=5 {
        c.reset_peer_connections();
        // (a connection that dies within 1 s of its dial counts as a failed dial: leave each
        // new one longer than that)
        std::thread::sleep(Duration::from_millis(1500));
        ok(etcdctl(&eps, &["put", &format!("r/{i}"), "v"], None));
    }
    let follower = 1 - leader;
    assert_eq!(
        terms(),
        before,
        "an election after a closed connection; the follower's log:\n{}",
        c.log(follower)
    );
    assert_eq!(c.wait_leader(LEADER_WAIT), leader);
}

#[test]
fn leader_killed_under_load_loses_no_acknowledged_write() {
    leader_kill(cluster());
}

/// The same behind TCP proxies (as behind a sidecar or a load balancer): the proxy accepts the
/// survivor's dial and then finds no leader behind it, and the stream dies at once; that counts
/// as a failed dial, and the survivor campaigns as fast as without the proxy.
#[test]
fn leader_killed_behind_proxies_is_found_dead_at_once() {
    let (node, etcdutl) = bins();
    let (dir, url) = e2e_tests::cluster::witness_dir();
    leader_kill(Cluster::start_partitionable(
        dir,
        node,
        etcdutl,
        url,
        &[],
        Vec::new(),
    ));
}

/// Two members whose witness is a blob on `azurite`.
fn azurite_cluster(azurite: &Azurite) -> Cluster {
    let url = azurite.witness_url("witness", "cluster-1");
    let (node, etcdutl) = bins();
    Cluster::start_with(tempfile::tempdir().unwrap(), node, etcdutl, url, &[])
}

#[test]
fn leader_killed_with_the_witness_on_azurite() {
    let azurite = Azurite::start();
    leader_kill(azurite_cluster(&azurite));
}

#[test]
fn follower_killed_costs_exactly_one_witness_write() {
    follower_kill(cluster());
}

#[test]
fn follower_killed_with_the_witness_on_azurite() {
    let azurite = Azurite::start();
    follower_kill(azurite_cluster(&azurite));
}

/// Waits (up to 30 s) until member `i` leads with the witness in R (`inside`) or out of it.
fn wait_witness_in_r(c: &Cluster, i: usize, inside: bool) {
    let started = Instant::now();
    let want = Some(f64::from(u8::from(inside)));
    while c.metric(i, "etcd_witness_in_replication_set") != want {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the witness did not {} R; log:\n{}",
            if inside { "enter" } else { "leave" },
            c.log(i)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A follower restarted while eight clients keep writing (the leader is never idle) re-enters
/// R, and no write fails while the server holds and then releases proposals for it. (Whether a
/// returning member could starve without the hold depends on timing here; the deterministic
/// check of that is scenario `12-reentry-under-load.txt`.)
#[test]
fn a_restarted_follower_rejoins_r_under_steady_writes() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let follower = 1 - leader;
    c.kill(follower);
    let ep = c.members[leader].url();
    assert!(rt.block_on(put_until(&ep, "first", "x", Duration::from_secs(30))));
    wait_witness_in_r(&c, leader, true);
    let (stop, acked) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (ep, stop, acked) = (ep.clone(), stop.clone(), acked.clone());
            rt.spawn(async move {
                let mut client = Client::connect([ep.as_str()], None).await.unwrap();
                let mut i = 0u64;
                while !stop.load(Relaxed) {
                    client
                        .put(format!("w{w}/{i}"), "x", None)
                        .await
                        .expect("a write failed while the follower rejoined");
                    acked.fetch_add(1, Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let at_restart = acked.load(Relaxed);
    let restarted = Instant::now();
    c.start_member(follower);
    wait_witness_in_r(&c, leader, false);
    let rejoined = restarted.elapsed();
    let at_rejoin = acked.load(Relaxed);
    stop.store(true, Relaxed);
    for w in writers {
        rt.block_on(w).unwrap();
    }
    eprintln!(
        "rejoined R {rejoined:?} after the restart; writes acknowledged: {at_restart} before \
         the restart, {at_rejoin} at the rejoin"
    );
    assert!(at_restart > 0, "the writers never wrote");
    assert!(
        at_rejoin > at_restart,
        "the writers stalled while the follower rejoined"
    );
}

/// Kill -9 the follower: the leader writes the witness exactly once (to take it into R), then
/// commits without it; once the follower is back and caught up the witness leaves R.
fn follower_kill(mut c: Cluster) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let follower = 1 - leader;
    let ep = c.members[leader].url();
    // The first election may have needed the witness's vote (one member started first); then
    // the witness stays in R until the follower has caught up. And the election's witness
    // vote, sent beside the follower's, may still be finishing (its write counted late, once
    // the storage answers; Azurite on a loaded machine is slow). Count once R is the two
    // members and no witness step is left running (the count stays put for a second).
    wait_witness_in_r(&c, leader, false);
    let writes = || c.metric(leader, "etcd_witness_writes_total").unwrap();
    let mut before = writes();
    for _ in 0..10 {
        std::thread::sleep(Duration::from_secs(1));
        let now = writes();
        if now == before {
            break;
        }
        before = now;
    }
    for i in 0..20 {
        assert!(rt.block_on(put_until(
            &ep,
            &format!("a{i}"),
            "x",
            Duration::from_secs(10)
        )));
    }
    assert_eq!(
        writes(),
        before,
        "no witness I/O while both members are up; leader's log:\n{}",
        c.log(leader)
    );
    let before = c.metric(leader, "etcd_witness_writes_total").unwrap();
    c.kill(follower);
    let mut acked = Vec::new();
    for i in 0..200 {
        let (k, v) = (format!("b{i:04}"), format!("v{i}"));
        assert!(rt.block_on(put_until(&ep, &k, &v, Duration::from_secs(30))));
        acked.push((k, v));
    }
    assert_eq!(
        c.metric(leader, "etcd_witness_writes_total").unwrap() - before,
        1.0,
        "exactly one witness write, then shortcut commits"
    );
    assert_eq!(
        c.metric(leader, "etcd_witness_in_replication_set"),
        Some(1.0)
    );
    c.start_member(follower);
    rt.block_on(wait_caught_up(&c.members[follower].url(), "b", &acked));
    // Back in R: the witness is out, and writes need it no more.
    wait_witness_in_r(&c, leader, false);
    let after_return = c.metric(leader, "etcd_witness_writes_total").unwrap();
    for i in 0..20 {
        assert!(rt.block_on(put_until(
            &ep,
            &format!("c{i}"),
            "x",
            Duration::from_secs(10)
        )));
    }
    assert_eq!(
        c.metric(leader, "etcd_witness_writes_total").unwrap(),
        after_return
    );
}

#[test]
fn both_members_killed_and_restarted_keep_their_data() {
    both_restart(cluster());
}

#[test]
fn both_members_restarted_with_the_witness_on_azurite() {
    let azurite = Azurite::start();
    both_restart(azurite_cluster(&azurite));
}

/// Kill -9 both members and start them again: every acknowledged write is there and the pair
/// elects a leader and takes writes again.
fn both_restart(mut c: Cluster) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let ep = c.members[leader].url();
    let mut acked = Vec::new();
    for i in 0..50 {
        let (k, v) = (format!("d{i:03}"), format!("v{i}"));
        assert!(rt.block_on(put_until(&ep, &k, &v, Duration::from_secs(10))));
        acked.push((k, v));
    }
    c.kill(0);
    c.kill(1);
    c.start_member(0);
    c.start_member(1);
    c.wait_leader(LEADER_WAIT);
    for m in 0..2 {
        rt.block_on(wait_caught_up(&c.members[m].url(), "d", &acked));
    }
    let any = c.members[0].url();
    assert!(rt.block_on(put_until(&any, "after", "restart", Duration::from_secs(30))));
}

/// `--backend-batch-limit` and `--backend-batch-interval` set when the key space is made
/// durable: killed after 60 writes, a member with a limit of 1 has none to apply again from its
/// WAL when it starts, one with etcd's default limit (10,000) and no interval (the default) has
/// them all, and one with an interval of 2 s, killed after 20 quick writes and 5 quiet seconds,
/// has none (the interval ran out with nothing more applied); a clean stop (SIGTERM) leaves
/// none either (closing the key space makes its pending commits durable).
#[test]
fn the_key_space_is_durable_every_backend_batch_limit_entries_or_interval() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    c.wait_leader(LEADER_WAIT);
    c.stop(0);
    c.start_member_with(0, &["--backend-batch-limit", "1"], &[]);
    let mut acked = Vec::new();
    // Writes keys `b<i>` for each i of `range`, then waits for both members to hold them all.
    let mut write = |c: &Cluster, range: std::ops::Range<usize>| {
        let eps = c.endpoints();
        for i in range {
            let (k, v) = (format!("b{i:03}"), format!("v{i}"));
            assert!(rt.block_on(put_any(&eps, &k, &v, Duration::from_secs(10))));
            acked.push((k, v));
        }
        for m in 0..2 {
            rt.block_on(wait_caught_up(&c.members[m].url(), "b", &acked));
        }
    };
    write(&c, 0..60);
    const OPENED: &str = "opened the key space";
    let opened = |c: &Cluster, i: usize| c.log(i).matches(OPENED).count();
    // Kills member `i` (or stops it cleanly: `clean`), starts it with `flags` and returns the
    // number its start logs in its "opened" line.
    let restart_with = |c: &mut Cluster, i: usize, flags: &[&str], clean: bool| -> u64 {
        let before = opened(c, i);
        if clean {
            assert!(c.stop_within(i, Duration::from_secs(30)), "no clean stop");
        } else {
            c.kill(i);
        }
        c.start_member_with(i, flags, &[]);
        let started = Instant::now();
        while opened(c, i) == before {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "no new {OPENED:?} line; log:\n{}",
                c.log(i)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let log = c.log(i);
        let line = log
            .lines()
            .rfind(|l| l.contains(OPENED))
            .unwrap_or_default();
        line.split_whitespace()
            .find_map(|w| w.strip_prefix("to_apply_again="))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no to_apply_again= in {line:?}"))
    };
    let interval = ["--backend-batch-interval", "2s"];
    assert_eq!(
        restart_with(&mut c, 0, &[], false),
        0,
        "limit 1: every batch was durable"
    );
    let default = restart_with(&mut c, 1, &interval, false);
    assert!(
        default >= 60,
        "etcd's default limit and no interval: the 60 writes are applied again ({default})"
    );
    // Member 1 now runs with an interval. 20 more writes (in well under its 2 s, so no batch
    // after them finds it run out), then 5 quiet seconds: the interval alone made them
    // durable, the limit being far off.
    c.wait_leader(LEADER_WAIT);
    write(&c, 60..80);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        restart_with(&mut c, 1, &[], false),
        0,
        "with an interval, a quiet member's key space is durable"
    );
    // Defaults again (the limit alone): 20 more writes, then a clean stop.
    c.wait_leader(LEADER_WAIT);
    write(&c, 80..100);
    assert_eq!(
        restart_with(&mut c, 1, &[], true),
        0,
        "a clean stop makes the key space durable"
    );
    c.wait_leader(LEADER_WAIT);
    write(&c, 100..100);
}

/// A write is answered when its batch is applied, before the durable commit that may follow the
/// batch: the fsync of the key space holds up only the writes that reach the applier while it
/// runs. Member 0 makes the key space durable after every batch (`--backend-batch-limit 1`),
/// and each of those commits sleeps `HOLD` first (a `sleep` action on failpoint
/// `kv-sync-enospc`). A write through it is then answered before its commit's `HOLD` is over
/// (an answer that waited for the commit could not be), and the write right behind it waits for
/// that commit.
#[test]
fn a_write_is_answered_before_the_key_space_is_made_durable() {
    const HOLD: Duration = Duration::from_secs(6);
    let mut c = cluster();
    c.wait_leader(LEADER_WAIT);
    c.stop(0);
    let hold = format!("kv-sync-enospc=sleep({})", HOLD.as_millis());
    c.start_member_with(
        0,
        &["--backend-batch-limit", "1"],
        &[("FAILPOINTS", hold.as_str())],
    );
    c.wait_leader(LEADER_WAIT);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let first = c.members[0].url();
    // Member 0 serves writes again (each batch since its start held it for HOLD); then a quiet
    // spell longer than HOLD, so no durable commit is under way when the measured writes start.
    // (clients with no timeout of their own: an answer may wait for a held commit)
    let mut client = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(120), async {
            loop {
                if let Ok(mut client) = Client::connect([first.as_str()], None).await
                    && client.put("ready", "1", None).await.is_ok()
                {
                    return client;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("member 0 took no write in 120 s; log:\n{}", c.log(0)))
    });
    std::thread::sleep(HOLD + Duration::from_secs(2));
    let started = Instant::now();
    rt.block_on(client.put("first", "1", None)).expect("put");
    let first_answered = started.elapsed();
    rt.block_on(client.put("second", "2", None)).expect("put");
    let second_answered = started.elapsed();
    assert!(
        first_answered < HOLD,
        "the write was answered after {first_answered:?}: it waited for the durable commit \
         that followed its batch (held {HOLD:?}); log:\n{}",
        c.log(0)
    );
    // (the check that the hold was in force: the next write queued behind that commit)
    assert!(
        second_answered >= HOLD - Duration::from_secs(1),
        "the second write was answered {second_answered:?} after the first was sent: the \
         durable commit was not held (is the failpoint gone?); log:\n{}",
        c.log(0)
    );
}

/// Every key under `prefix` on `endpoint` with (value, version, create and mod revision).
async fn local_records(endpoint: &str, prefix: &str) -> Vec<(String, String, i64, i64, i64)> {
    let mut client = Client::connect([endpoint], None).await.expect("connect");
    let opts = GetOptions::new().with_prefix().with_serializable();
    let resp = client.get(prefix, Some(opts)).await.expect("get");
    resp.kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_string(),
                kv.value_str().unwrap().to_string(),
                kv.version(),
                kv.create_revision(),
                kv.mod_revision(),
            )
        })
        .collect()
}

/// Aborts the leader at `failpoint` (its `n`-th hit) while clients write; the survivor takes
/// over; after the member restarts, both hold every acknowledged write exactly once. With the
/// default `--snapshot-count` the restarted member recovers by replaying its own log (a
/// snapshot from the leader would paper over a replay that applies entries twice).
fn crash_at(failpoint: &str, n: u32, snapshot_count: &str) {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    c.stop(leader);
    let spec = format!("{failpoint}:{n}");
    c.start_member_with(
        leader,
        &["--snapshot-count", snapshot_count],
        &[("ETCD_NODE_FAILPOINT", spec.as_str())],
    );
    let eps = c.endpoints();
    let mut acked = Vec::new();
    // At least 400 writes; more (up to 2,000) while the member has not reached the failpoint,
    // which a loaded machine can delay (it counts batches, and batches grow under load).
    let mut tried = 0;
    for i in 0..2000 {
        if i >= 400 && i % 20 == 0 && c.exited(leader) {
            break;
        }
        tried += 1;
        let (k, v) = (format!("f{i:04}"), format!("v{i}"));
        if rt.block_on(put_any(&eps, &k, &v, Duration::from_secs(10))) {
            acked.push((k, v));
        }
    }
    assert!(
        c.exited(leader),
        "the failpoint {spec} never fired; log:\n{}",
        c.log(leader)
    );
    c.kill(leader);
    c.start_member(leader);
    for m in 0..2 {
        rt.block_on(wait_caught_up(&c.members[m].url(), "f", &acked));
    }
    let a = rt.block_on(local_records(&c.members[0].url(), "f"));
    let b = rt.block_on(local_records(&c.members[1].url(), "f"));
    // A member that applied an entry twice after its restart would differ from the survivor in
    // versions and revisions. (A key may still have version 2: a put whose answer the crash
    // swallowed is retried by the client, as with etcd.)
    let differ = a.iter().zip(&b).find(|(x, y)| x != y);
    assert!(
        differ.is_none() && a.len() == b.len(),
        "the members differ (key, value, version, create, mod): first {differ:?}; {} and {} keys",
        a.len(),
        b.len()
    );
    let revision = |ep: String| {
        rt.block_on(async move {
            let mut client = Client::connect([ep.as_str()], None).await.expect("connect");
            let opts = GetOptions::new().with_serializable();
            let r = client.get("f", Some(opts)).await.expect("get");
            r.header().expect("header").revision()
        })
    };
    assert_eq!(
        revision(c.members[0].url()),
        revision(c.members[1].url()),
        "both members at the same revision"
    );
    assert!(
        acked.len() * 4 >= tried * 3,
        "the survivor kept accepting writes: {} of {tried} acknowledged",
        acked.len()
    );
}

#[test]
fn crash_at_apply_before_commit() {
    crash_at("apply-before-commit", 60, "100000");
}

#[test]
fn crash_at_apply_after_commit() {
    crash_at("apply-after-commit", 60, "100000");
}

#[test]
fn crash_at_snapshot_before_save() {
    crash_at("snapshot-before-save", 1, "100");
}

/// A snapshot of the key space is taken and saved by a thread of its own, off the Raft loop:
/// writes are acknowledged while one is being saved (held here 15 s by a failpoint). The loop
/// used to dump and save it in one of its turns, taking no message meanwhile: 0.65-0.93 s with
/// 200k revisions (docs/benchmarks.md), writes stalled behind it.
#[test]
fn writes_go_on_while_a_snapshot_is_saved() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    c.wait_leader(LEADER_WAIT);
    let held = [("FAILPOINTS", "snapshot-before-save=1*sleep(15000)")];
    for i in 0..2 {
        c.stop(i);
        c.start_member_with(i, &["--snapshot-count", "100"], &held);
    }
    c.wait_leader(LEADER_WAIT);
    let eps = c.endpoints();
    let saved = |c: &Cluster| {
        (0..2)
            .filter(|&i| c.log(i).contains("saved snapshot"))
            .count()
    };
    // 100 writes start a snapshot on each member, held; 50 more must not wait for it.
    for i in 0..150 {
        let (k, v) = (format!("s{i:03}"), format!("v{i}"));
        assert!(rt.block_on(put_any(&eps, &k, &v, Duration::from_secs(10))));
    }
    assert_eq!(
        saved(&c),
        0,
        "a snapshot was saved before the writes after it were acknowledged: they waited for it"
    );
    if !within(Duration::from_secs(60), || saved(&c) >= 2) {
        panic!(
            "the held snapshots were never saved; logs:\n{}\n{}",
            c.log(0),
            c.log(1)
        );
    }
    // Then the log is compacted, and the next snapshot (not held) follows.
    for i in 150..400 {
        let (k, v) = (format!("s{i:03}"), format!("v{i}"));
        assert!(rt.block_on(put_any(&eps, &k, &v, Duration::from_secs(10))));
    }
    let count = |log: String| log.matches("saved snapshot").count();
    assert!(count(c.log(0)) >= 2 && count(c.log(1)) >= 2);
}

/// Restarts a member with the environment `env` and makes it the leader (`move-leader` from
/// the other one); returns its index.
fn lead_with(c: &mut Cluster, env: &[(&str, &str)]) -> usize {
    let chosen = c.wait_leader(LEADER_WAIT);
    c.stop(chosen);
    c.wait_leader(LEADER_WAIT);
    c.start_member_with(chosen, &[], env);
    let hostport = |i: usize| c.members[i].url().trim_start_matches("http://").to_string();
    let all = vec![hostport(0), hostport(1)];
    let members = ok(etcdctl(&all, &["member", "list"], None));
    let id = members
        .lines()
        .find(|l| l.contains(&format!(", {}, ", c.members[chosen].name)))
        .and_then(|l| l.split(',').next())
        .unwrap_or_else(|| panic!("{} not in {members}", c.members[chosen].name))
        .to_string();
    if c.wait_leader(LEADER_WAIT) != chosen {
        ok(etcdctl(&all, &["move-leader", &id], None));
    }
    let leader = c.wait_leader(LEADER_WAIT);
    assert_eq!(leader, chosen);
    leader
}

/// Each member's Raft term, from `etcdctl endpoint status`.
fn terms(c: &Cluster) -> (u64, u64) {
    let term = |i: usize| -> u64 {
        let out = ok(etcdctl(
            &[c.members[i].url()],
            &["endpoint", "status", "-w", "json"],
            None,
        ));
        let status: serde_json::Value = serde_json::from_str(&out).expect("status JSON");
        status[0]["Status"]["raftTerm"]
            .as_u64()
            .unwrap_or_else(|| panic!("no raftTerm in {out}"))
    };
    (term(0), term(1))
}

/// Asserts that the terms are still `before` and `leader` leads: no election while `what`.
fn no_election(c: &Cluster, before: (u64, u64), leader: usize, what: &str) {
    assert_eq!(
        terms(c),
        before,
        "the term moved while {what}; logs:\n{}\n{}",
        c.log(0),
        c.log(1)
    );
    assert_eq!(c.wait_leader(LEADER_WAIT), leader, "the leader changed");
}

/// The peers' traffic runs on a thread of its own (`server::peer_thread`): client requests
/// that hold every worker of a member's client runtime (here the `range-stall` failpoint holds
/// each range 3 s on the leader, whose runtime has 2 workers, and 8 run at once: 12 s; a range
/// over a large key space holds its worker for seconds) delay that member's other clients, but
/// not Raft. The leader's heartbeats and appends go on, writes through the follower are
/// answered, and the follower does not campaign. When the peers shared the client runtime,
/// the leader went silent for those 12 s and the follower took over.
#[test]
fn raft_traffic_goes_on_while_client_requests_hold_every_worker() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = lead_with(
        &mut c,
        &[
            ("FAILPOINTS", "range-stall=sleep(3000)"),
            ("TOKIO_WORKER_THREADS", "2"),
        ],
    );
    let follower = 1 - leader;
    let before = terms(&c);
    let url = c.members[leader].url();
    let started = Instant::now();
    let ranges: Vec<_> = (0..8)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let out = etcdctl(
                    &[url],
                    &[
                        "get",
                        "--consistency=s",
                        "--dial-timeout=60s",
                        "--command-timeout=60s",
                        "x",
                    ],
                    None,
                );
                (out, started.elapsed())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    // (forwarded to the leader, answered by the follower once applied)
    let eps = [c.members[follower].url()];
    let mut longest = Duration::ZERO;
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(8) {
        let t = Instant::now();
        let (k, v) = (format!("r{i:03}"), format!("v{i}"));
        assert!(rt.block_on(put_any(&eps, &k, &v, Duration::from_secs(20))));
        longest = longest.max(t.elapsed());
        i += 1;
    }
    let slowest = ranges
        .into_iter()
        .map(|r| {
            let (out, took) = r.join().unwrap();
            ok(out);
            took
        })
        .max()
        .unwrap();
    assert!(
        slowest >= Duration::from_secs(9),
        "the ranges held every worker of the leader's client runtime (the slowest took {slowest:?})"
    );
    no_election(
        &c,
        before,
        leader,
        "client requests held the leader's workers",
    );
    assert!(
        longest < Duration::from_secs(1),
        "a write through the follower took {longest:?} ({i} writes)"
    );
}

/// A WAL fsync slower than the heartbeat interval (the `wal-fsync-stall` failpoint holds the
/// leader's 6th fsync after its start 600 ms, as a slow disk does) is logged, as etcd logs a
/// leader's late heartbeats, with where the turn's time went: the operator sees the WAL's disk
/// named, not just an election later. (A slow turn at the start, on a busy machine, may be
/// logged first; the stall is still logged, being more than twice as long.)
#[test]
fn a_slow_wal_fsync_is_logged_with_where_the_turn_went() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = lead_with(
        &mut c,
        &[("FAILPOINTS", "wal-fsync-stall=5*off->1*sleep(600)")],
    );
    let eps = [c.members[leader].url()];
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split_whitespace()
            .find_map(|f| f.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
    };
    let line = |log: String| {
        log.lines()
            .filter(|l| l.contains("a turn of the Raft loop took longer"))
            .find(|l| field(l, "wal_write_and_fsync_ms").is_some_and(|ms| ms >= 600))
            .map(str::to_string)
    };
    let started = Instant::now();
    let mut i = 0;
    while line(c.log(leader)).is_none() && started.elapsed() < Duration::from_secs(20) {
        assert!(rt.block_on(put_any(
            &eps,
            &format!("s{i}"),
            "v",
            Duration::from_secs(20)
        )));
        i += 1;
    }
    let line = line(c.log(leader)).unwrap_or_else(|| {
        panic!(
            "no slow turn logged after {i} writes; log:\n{}",
            c.log(leader)
        )
    });
    let field = |name: &str| field(&line, name).unwrap_or_else(|| panic!("no {name} in {line}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(field("took_ms") >= 600, "{line}");
    // (the stalled fsync sleeps: the turn was off the CPU nearly all the time)
    assert!(field("on_cpu_ms") < 300, "{line}");
    assert_eq!(field("heartbeat_interval_ms"), 100, "{line}");
    assert!(field("slow_turns") >= 1, "{line}");
    assert!(line.contains("A slow disk"), "{line}");
}

/// A worker count that cannot be (tokio would panic on it) stops the start, naming the
/// variable, before anything is touched.
#[test]
fn a_bad_client_worker_count_stops_the_start_naming_the_variable() {
    let (node, _) = bins();
    let dir = tempfile::tempdir().unwrap();
    for bad in ["0", "many"] {
        let out = std::process::Command::new(node)
            .env("TOKIO_WORKER_THREADS", bad)
            .arg("--data-dir")
            .arg(dir.path().join("m"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(
            stderr.contains("TOKIO_WORKER_THREADS") && !stderr.contains("panicked"),
            "{bad}: {stderr}"
        );
        assert!(
            !dir.path().join("m").exists(),
            "{bad}: the data directory was made"
        );
    }
}

/// The key space is applied by a thread of its own: a batch whose commit takes seconds (here a
/// failpoint holds the leader's 21st batch 4 s; a durable commit of a large key space takes a
/// few hundred milliseconds) delays the answers to the writes in it, but not the leader's Raft
/// loop: its heartbeats go on, so the follower does not campaign and the leader stays. When
/// the loop applied the batches itself, it stopped for those 4 s and the follower took over.
#[test]
fn the_raft_loop_goes_on_while_a_batch_is_applied() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = lead_with(
        &mut c,
        &[("FAILPOINTS", "apply-before-commit=20*off->1*sleep(4000)")],
    );
    let held = leader;
    // (to the leader: a follower answers once it applied the write itself)
    let eps = [c.members[leader].url()];
    let before = terms(&c);
    let started = Instant::now();
    for i in 0..60 {
        let (k, v) = (format!("a{i:03}"), format!("v{i}"));
        assert!(rt.block_on(put_any(&eps, &k, &v, Duration::from_secs(20))));
    }
    let took = started.elapsed();
    assert!(
        c.log(held).contains("applying a batch took too long"),
        "the leader held a batch (failpoint)"
    );
    assert!(
        took >= Duration::from_secs(4),
        "the writes waited for the held batch"
    );
    no_election(
        &c,
        before,
        leader,
        "a batch was held: the loop waited for it",
    );
    for i in 0..2 {
        println!(
            "member {i}: the loop's longest turn {:?} s",
            c.metric(i, "etcd_node_raft_loop_longest_turn_seconds")
        );
    }
}

/// A follower that is down while the leader snapshots and compacts its log (every 50 entries)
/// comes back behind the log: it receives the key space as a snapshot, then the entries after
/// it, and ends with records identical to the leader's. Each member then keeps one snapshot in
/// place: the dump is gone from both once the follower is past it.
#[test]
fn lagging_follower_catches_up_from_a_snapshot() {
    catch_up_from_a_snapshot(false);
}

/// As above, the follower crashing once it took the snapshot (received into its file, marked
/// in its log) but before its key space was restored from it: at its next start it restores
/// the key space from the snapshot's file, and ends as above.
#[test]
fn a_follower_that_crashes_installing_a_snapshot_restores_it_at_start() {
    catch_up_from_a_snapshot(true);
}

fn catch_up_from_a_snapshot(crash_on_install: bool) {
    let (node, etcdutl) = bins();
    let mut c = Cluster::start(node, etcdutl, &["--snapshot-count", "50"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let follower = 1 - leader;
    let ep = c.members[leader].url();
    let mut acked = Vec::new();
    let put = |acked: &mut Vec<(String, String)>, i: usize, round: usize| {
        let (k, v) = (format!("s{:03}", i), format!("v{i}-{round}"));
        assert!(rt.block_on(put_until(&ep, &k, &v, Duration::from_secs(10))));
        acked.retain(|(key, _)| *key != k);
        acked.push((k, v));
    };
    for i in 0..20 {
        put(&mut acked, i, 0);
    }
    c.kill(follower);
    // Overwrites and deletes too, so the snapshot carries versions and tombstones.
    for round in 1..4 {
        for i in 0..100 {
            put(&mut acked, i, round);
        }
    }
    let mut client = rt.block_on(Client::connect([ep.as_str()], None)).unwrap();
    rt.block_on(client.delete("s05", Some(etcd_client::DeleteOptions::new().with_prefix())))
        .unwrap();
    acked.retain(|(k, _)| !k.starts_with("s05"));
    acked.sort();
    let sent = c
        .metric(leader, "etcd_network_snapshot_send_success")
        .unwrap();
    if crash_on_install {
        c.start_member_with(
            follower,
            &[],
            &[("ETCD_NODE_FAILPOINT", "install-before-restore:1")],
        );
        c.wait_exited(follower, "the failpoint never fired");
        c.kill(follower);
    }
    c.start_member(follower);
    rt.block_on(wait_caught_up(&c.members[follower].url(), "s", &acked));
    // (with the crash, the failpoint firing says the snapshot came; the leader may not have
    // had the follower's answer before it died)
    if !crash_on_install {
        assert!(
            c.metric(leader, "etcd_network_snapshot_send_success")
                .unwrap()
                > sent,
            "the leader sent no snapshot"
        );
        assert!(
            c.metric(follower, "etcd_network_snapshot_receive_success")
                .unwrap()
                >= 1.0,
            "the follower installed no snapshot; its log:\n{}",
            c.log(follower)
        );
    }
    // The follower restored its key space from the dump and keeps no copy of it.
    let kept = snapshot_files(&c.data_dir(follower));
    assert!(
        kept.len() == 1 && kept[0].1.starts_with(b"SNP2"),
        "the follower's snapshot files are not one snapshot in place: {:?}",
        kept.iter().map(|(p, b)| (p, b.len())).collect::<Vec<_>>()
    );
    // Entries after the snapshot replicate as usual.
    put(&mut acked, 500, 0);
    acked.sort();
    rt.block_on(wait_caught_up(&c.members[follower].url(), "s", &acked));
    let a = rt.block_on(local_records(&c.members[leader].url(), "s"));
    let b = rt.block_on(local_records(&c.members[follower].url(), "s"));
    assert_eq!(a, b, "records (key, value, version, create, mod) differ");
    // The leader dumped its key space for the follower; with the follower past it, the dump
    // gives way to a snapshot in place instead of staying until the next --snapshot-count.
    let in_place = || {
        let kept = snapshot_files(&c.data_dir(leader));
        kept.len() == 1 && kept[0].1.starts_with(b"SNP2")
    };
    if !within(Duration::from_secs(20), in_place) {
        let kept = snapshot_files(&c.data_dir(leader));
        panic!(
            "the leader still keeps a dump: {:?}",
            kept.iter().map(|(p, b)| (p, b.len())).collect::<Vec<_>>()
        );
    }
}

/// `--snapshot-count`'s snapshots copy nothing: each is a file of a few bytes saying the key
/// space file is durable at its index (a snapshot in place), where it used to be a dump of
/// the whole key space beside it. The key space file is then the only copy of what the log
/// was compacted behind, so a member whose `kv.redb` is gone refuses to start, saying what
/// happened and what to do, and leaves its data directory as it was; once the file is put back
/// it starts and catches up.
#[test]
fn snapshot_count_snapshots_copy_nothing_and_a_lost_key_space_is_refused() {
    let (node, etcdutl) = bins();
    let mut c = Cluster::start(node, etcdutl, &["--snapshot-count", "50"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let follower = 1 - leader;
    let ep = c.members[leader].url();
    let padding = e2e_tests::incompressible(4096, 1);
    let mut acked = Vec::new();
    for i in 0..200 {
        let (k, v) = (format!("q{i:03}"), format!("{i}{padding}"));
        assert!(rt.block_on(put_until(&ep, &k, &v, Duration::from_secs(10))));
        acked.push((k, v));
    }
    rt.block_on(wait_caught_up(&c.members[follower].url(), "q", &acked));
    for i in [leader, follower] {
        // (the last 50 writes may not have reached a snapshot yet: the one before them has;
        // a snapshot just taken stands beside the one before it until that one is purged)
        within(Duration::from_secs(10), || {
            snapshot_files(&c.data_dir(i)).len() == 1
        });
        let files = snapshot_files(&c.data_dir(i));
        let sizes: Vec<_> = files.iter().map(|(p, b)| (p, b.len())).collect();
        assert_eq!(files.len(), 1, "one snapshot kept: {sizes:?}");
        let (name, bytes) = &files[0];
        assert_eq!(&bytes[..4], b"SNP2", "{name:?} is a snapshot in place");
        assert!(
            bytes.len() < 4096,
            "{name:?} holds {} bytes: a dump, not a snapshot in place",
            bytes.len()
        );
    }

    c.stop(follower);
    let kv = c.data_dir(follower).join("member/kv.redb");
    let aside = c.dir.path().join("kv.redb.aside");
    std::fs::rename(&kv, &aside).unwrap();
    c.start_member(follower);
    c.wait_exited(follower, "it started without its key space");
    let log = c.log(follower);
    assert!(
        log.contains("kv.redb") && log.contains("Replacing a member whose machine is gone"),
        "the refusal names the file and the way out; log:\n{log}"
    );
    assert!(
        !kv.exists(),
        "the refused start left a key space file behind"
    );
    c.kill(follower);

    std::fs::rename(&aside, &kv).unwrap();
    c.start_member(follower);
    let (k, v) = ("q999".to_string(), "after".to_string());
    assert!(rt.block_on(put_until(&ep, &k, &v, Duration::from_secs(10))));
    acked.push((k, v));
    rt.block_on(wait_caught_up(&c.members[follower].url(), "q", &acked));
    let a = rt.block_on(local_records(&c.members[leader].url(), "q"));
    let b = rt.block_on(local_records(&c.members[follower].url(), "q"));
    assert_eq!(a, b, "records (key, value, version, create, mod) differ");
}

/// A write a follower forwarded to a leader that then froze (SIGSTOP: a stalled VM, or a kill
/// the follower cannot tell apart) is answered "etcdserver: leader changed" as soon as the
/// follower, leading now with the witness's vote, applies its first entry: not left to the
/// request timeout (7 s with etcd's default timing), which is what a client without a timeout of
/// its own used to wait. The answer says the write was not applied, and it never is, even after
/// the old leader wakes with the forwarded write in its socket.
#[test]
fn a_write_forwarded_to_a_frozen_leader_is_answered_leader_changed() {
    let c = cluster();
    let leader = c.wait_leader(LEADER_WAIT);
    let follower = 1 - leader;
    let at_follower = [c.members[follower].url()];
    ok(etcdctl(&at_follower, &["put", "before", "1"], None));
    c.pause(leader);
    let started = Instant::now();
    let out = etcdctl(
        &at_follower,
        &["--command-timeout=30s", "put", "during", "1"],
        None,
    );
    let took = started.elapsed();
    c.resume(leader);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("etcdserver: leader changed"),
        "the forwarded write got, after {took:?}: {}{stderr}",
        String::from_utf8_lossy(&out.stdout)
    );
    println!("answered \"leader changed\" after {took:?}");
    ok(etcdctl(&at_follower, &["put", "after", "1"], None));
    c.wait_leader(LEADER_WAIT);
    for m in &c.members {
        let ep = [m.url()];
        // A linearizable read on each member: it has applied everything committed before.
        let keys = ok(etcdctl(&ep, &["get", "", "--prefix", "--keys-only"], None));
        let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(keys, ["after", "before"], "keys on {}", m.name);
    }
}

/// A follower paused (SIGSTOP, a stalled VM) while the leader took snapshots answers, once it
/// resumes, every Append it missed with a rejection. The leader used to send its snapshot again
/// for each one, each a copy of the key space queued for the same follower: with an 800 MB key
/// space it went from 1.7 GB to 17 GB in 15 s and was OOM-killed. Now at most one snapshot is
/// on its way at a time, and stale rejections do not ask for another. (Whether the follower
/// needs the snapshot at all depends on how many Appends were still queued for it.)
#[test]
fn a_follower_paused_while_the_leader_snapshots_gets_one_snapshot() {
    let (node, etcdutl) = bins();
    let c = Cluster::start(node, etcdutl, &["--snapshot-count", "20"]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let follower = 1 - leader;
    let ep = c.members[leader].url();
    let padding = e2e_tests::incompressible(16 * 1024, 1);
    let mut acked = Vec::new();
    // More writes than the leader sends a silent follower (256 Appends in flight).
    for i in 0..600 {
        let (k, v) = (format!("p{:03}", i % 40), format!("{i}{padding}"));
        assert!(rt.block_on(put_until(&ep, &k, &v, Duration::from_secs(10))));
        if i == 20 {
            c.pause(follower);
        }
        acked.retain(|(key, _)| *key != k);
        acked.push((k, v));
    }
    acked.sort();
    c.resume(follower);
    rt.block_on(wait_caught_up(&c.members[follower].url(), "p", &acked));
    let sent = c
        .metric(leader, "etcd_network_snapshot_send_success")
        .unwrap()
        + c.metric(leader, "etcd_network_snapshot_send_failures")
            .unwrap();
    assert!(
        sent <= 2.0,
        "the leader sent {sent} snapshots to one follower; its log:\n{}",
        c.log(leader)
    );
    let a = rt.block_on(local_records(&c.members[leader].url(), "p"));
    let b = rt.block_on(local_records(&c.members[follower].url(), "p"));
    assert_eq!(a, b, "records (key, value, version, create, mod) differ");
}

/// The id (hex) of the member named `name` in `etcdctl member list` output.
fn member_id(list: &str, name: &str) -> String {
    list.lines()
        .find(|l| l.split(", ").nth(2) == Some(name))
        .and_then(|l| l.split(", ").next())
        .unwrap_or_else(|| panic!("no member {name} in:\n{list}"))
        .to_string()
}

/// A member removed while it was frozen (SIGSTOP) never applies its own removal. Resumed, it
/// campaigns; its former peers refuse its messages as etcd's do, and it stops with a message
/// instead of campaigning in vain. Its data directory then refuses to start, saying why.
#[test]
fn a_member_removed_while_away_is_refused_and_stops() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let lead_ep = c.members[leader].url();
    let eps = vec![lead_ep.clone()];
    let (new, new_id) = add_third_voter(&mut c, &rt, &lead_ep);
    let away = if leader == 0 { 1 } else { 0 };
    // n3 sends only to the leader, so the other member never hears it announce itself: it
    // lists n3 by the name and client URL the leader recorded through Raft (as etcd's
    // members publish theirs).
    let (away_ep, n3_url) = (vec![c.members[away].url()], c.members[new].url());
    eventually(Duration::from_secs(30), "the follower lists n3", || {
        ok(etcdctl(&away_ep, &["member", "list"], None))
            .lines()
            .any(|l| l.starts_with(&new_id) && l.contains(", started, n3, ") && l.contains(&n3_url))
    });
    let away_id = member_id(
        &ok(etcdctl(&eps, &["member", "list"], None)),
        &c.members[away].name,
    );
    c.pause(away);
    ok(etcdctl(&eps, &["member", "remove", &away_id], None));
    for i in 1..20 {
        assert!(rt.block_on(put_until(
            &lead_ep,
            &format!("k{i}"),
            "v",
            Duration::from_secs(30)
        )));
    }
    c.resume(away);
    c.wait_exited(away, "the removed member kept running");
    let log = c.log(away);
    assert!(
        log.contains("the member has been permanently removed from the cluster")
            && log.contains("must not be used again"),
        "{log}"
    );
    // Started again on its data directory: refused at once, with the same words.
    c.kill(away); // (reaps the exited process)
    c.start_member(away);
    c.wait_exited(away, "it started again");
    let log = c.log(away);
    assert!(log.matches("must not be used again").count() >= 2, "{log}");
    // The cluster went on: n3 and the leader hold every write.
    assert!(rt.block_on(put_until(&lead_ep, "after", "v", Duration::from_secs(30))));
}

/// Registers a new member n3 as a learner through `eps` (`etcdctl member add --learner`), not
/// started: its index, its id and what etcdctl printed.
fn add_learner_n3(c: &mut Cluster, eps: &[String]) -> (usize, String, String) {
    let new = c.new_member("n3");
    let peer = format!("--peer-urls={}", c.members[new].peer_url());
    let added = ok(etcdctl(
        eps,
        &["member", "add", "n3", &peer, "--learner"],
        None,
    ));
    let new_id = added
        .split_whitespace()
        .nth(1)
        .expect("etcdctl printed the new member's id")
        .to_string();
    (new, new_id, added)
}

/// Adds a third regular member, n3, through the leader at `lead_ep` (as a learner, then
/// promoted), so that one can be removed (a witness needs two beside it). Its index and id.
fn add_third_voter(
    c: &mut Cluster,
    rt: &tokio::runtime::Runtime,
    lead_ep: &str,
) -> (usize, String) {
    let eps = vec![lead_ep.to_string()];
    let (new, new_id, _) = add_learner_n3(c, &eps);
    c.start_member(new);
    assert!(rt.block_on(put_until(lead_ep, "k0", "v0", Duration::from_secs(30))));
    eventually(Duration::from_secs(60), "n3 promotable", || {
        etcdctl(&eps, &["member", "promote", &new_id], None)
            .status
            .success()
    });
    (new, new_id)
}

/// The leader removed as etcd removes it, through a follower (as etcd's robustness suite's
/// MemberReplace does): it hands leadership over, the next leader removes it, it stops, and
/// the others keep every write.
#[test]
fn the_leader_is_removed_through_a_follower() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let lead_ep = c.members[leader].url();
    let (new, _) = add_third_voter(&mut c, &rt, &lead_ep);
    let mut acked = Vec::new();
    for i in 0..20 {
        let (k, v) = (format!("r{i:02}"), format!("v{i}"));
        assert!(rt.block_on(put_until(&lead_ep, &k, &v, Duration::from_secs(30))));
        acked.push((k, v));
    }
    let follower = [0, 1].into_iter().find(|&i| i != leader).unwrap();
    let via = vec![c.members[follower].url()];
    let lead_id = member_id(
        &ok(etcdctl(&via, &["member", "list"], None)),
        &c.members[leader].name,
    );
    ok(etcdctl(&via, &["member", "remove", &lead_id], None));
    c.wait_exited(leader, "the removed leader kept running");
    // (it stops on applying its removal, or on the others refusing it: either says so)
    let log = c.log(leader);
    assert!(
        log.contains("handing leadership over first") && log.contains("removed from the cluster"),
        "{log}"
    );
    let list = ok(etcdctl(&via, &["member", "list"], None));
    assert_eq!(
        list.lines().count(),
        3,
        "two members and the witness: {list}"
    );
    assert!(!list.contains(&lead_id), "{list}");
    for ep in [c.members[follower].url(), c.members[new].url()] {
        assert!(rt.block_on(put_until(&ep, "after", "v", Duration::from_secs(30))));
        rt.block_on(wait_caught_up(&ep, "r", &acked));
    }
}

/// Replacing a member whose machine is gone, as an etcd operator would: the follower dies for
/// good; `etcdctl member add --learner` registers a new machine, which starts with
/// `--initial-cluster-state existing`, receives the key space as a snapshot, is promoted, and
/// the dead member is removed. The cluster is two members and the witness again: when the old
/// leader is killed, the new member takes over with the witness's vote and holds every
/// acknowledged write.
#[test]
fn a_dead_member_is_replaced_through_the_membership_api() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let dead = 1 - leader;
    let lead_ep = c.members[leader].url();
    let mut acked = Vec::new();
    let put = |acked: &mut Vec<(String, String)>, ep: &str, i: usize| {
        let (k, v) = (format!("r{i:03}"), format!("v{i}"));
        assert!(rt.block_on(put_until(ep, &k, &v, Duration::from_secs(30))));
        acked.push((k, v));
    };
    for i in 0..30 {
        put(&mut acked, &lead_ep, i);
    }
    c.kill(dead);
    for i in 30..60 {
        put(&mut acked, &lead_ep, i);
    }
    let eps = vec![lead_ep.clone()];
    let dead_name = c.members[dead].name.clone();
    let dead_id = member_id(&ok(etcdctl(&eps, &["member", "list"], None)), &dead_name);

    let (new, new_id, added) = add_learner_n3(&mut c, &eps);
    assert!(
        added.contains("ETCD_INITIAL_CLUSTER_STATE=\"existing\""),
        "{added}"
    );
    // As etcd: a learner that holds none of the log yet is not promoted, and a second learner
    // is one past --experimental-max-learners (1).
    refused_with(
        etcdctl(&eps, &["member", "promote", &new_id], None),
        "etcdserver: can only promote a learner member which is in sync with leader",
    );
    let other_peer = format!("--peer-urls=http://127.0.0.1:{}", free_port());
    refused_with(
        etcdctl(
            &eps,
            &["member", "add", "n4", &other_peer, "--learner"],
            None,
        ),
        "etcdserver: too many learner members in cluster",
    );
    c.start_member(new);
    let new_ep = c.members[new].url();
    rt.block_on(wait_caught_up(&new_ep, "r", &acked));
    // The leader dropped from memory the entries both members held before the kill, and its
    // only snapshot is the bootstrap's: it took one for the learner (docs/raft.md, "The log in
    // memory is shorter than the log on disk").
    let lead_log = c.log(leader);
    assert!(
        lead_log.contains("taking a snapshot for it"),
        "no snapshot taken for the learner; leader's log:\n{lead_log}"
    );
    let list = ok(etcdctl(&eps, &["member", "list"], None));
    assert!(
        list.lines()
            .any(|l| l.starts_with(&new_id) && l.ends_with("true")),
        "n3 is a learner: {list}"
    );
    // A learner serves what etcd's learners serve: serializable reads and Status.
    let learner = [new_ep.clone()];
    assert_eq!(
        ok(etcdctl(&learner, &["get", "r000", "--consistency=s"], None)),
        "r000\nv0\n"
    );
    ok(etcdctl(&learner, &["endpoint", "status"], None));
    for args in [
        &["get", "r000"][..],
        &["put", "k", "v"],
        &["member", "list"],
    ] {
        refused_with(
            etcdctl(&learner, args, None),
            "etcdserver: rpc not supported for learner",
        );
    }
    // A learner does not vote: the promotion makes it one.
    ok(etcdctl(&eps, &["member", "promote", &new_id], None));
    // (once the new voter has applied its promotion, it serves writes)
    eventually(
        Duration::from_secs(20),
        "the promoted member serves a put",
        || etcdctl(&learner, &["put", "k", "v"], None).status.success(),
    );
    ok(etcdctl(&eps, &["member", "remove", &dead_id], None));
    let list = ok(etcdctl(&eps, &["member", "list"], None));
    assert_eq!(list.lines().count(), 3, "n1, n3 and the witness: {list}");
    assert!(!list.contains(&dead_id), "{list}");
    assert!(
        list.lines().any(|l| l.starts_with(&new_id)
            && l.contains(", started, n3, ")
            && l.ends_with("false")),
        "n3 is a started voter: {list}"
    );
    for i in 60..90 {
        put(&mut acked, &lead_ep, i);
    }
    // The old leader dies too: the new member leads with the witness's vote, nothing is lost.
    c.kill(leader);
    for i in 90..120 {
        put(&mut acked, &new_ep, i);
    }
    assert_eq!(c.wait_leader(LEADER_WAIT), new);
    rt.block_on(wait_caught_up(&new_ep, "r", &acked));
}

#[test]
fn joining_without_member_add_is_refused_with_the_fix() {
    let mut c = cluster();
    c.wait_leader(LEADER_WAIT);
    let new = c.new_member("n3");
    c.start_member(new);
    c.wait_exited(new, "n3 kept running");
    let log = c.log(new);
    assert!(
        log.contains("etcdctl member add n3 --peer-urls=http://127.0.0.1:"),
        "the error names the fix: {log}"
    );
}

/// The witness's share disappears (an unmounted NFS export) and then the follower dies: the
/// leader cannot commit without the witness, and Status says why, as etcd's Status reports
/// "no leader".
#[test]
fn status_reports_an_unreachable_witness() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let ep = c.members[leader].url();
    let errors = || {
        rt.block_on(async {
            let mut client = Client::connect([ep.as_str()], None).await.expect("connect");
            client.status().await.expect("status").errors().to_vec()
        })
    };
    assert_eq!(errors(), Vec::<String>::new());
    let share = c.dir.path().join("witness");
    std::fs::rename(&share, c.dir.path().join("witness.gone")).unwrap();
    c.kill(1 - leader);
    let started = Instant::now();
    loop {
        let errs = errors();
        if errs.iter().any(|e| e.contains("witness unavailable")) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Status never reported the witness: {errs:?}; log:\n{}",
            c.log(leader)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A write sent to a member that knows no leader waits for one, as etcd holds it, instead of
/// failing at once: a write sent during an election is then served after it. The witness's share
/// gone and the follower dead, the survivor leads no more. A put that finds no leader within the
/// request timeout (5 s + 2 election timeouts, past etcdctl's default 5 s: hence the longer
/// command timeout) gets `etcdserver: no leader` and was not applied; one sent before the share
/// comes back is answered once the survivor leads again.
#[test]
fn a_write_sent_without_a_leader_waits_for_one() {
    let mut c = cluster();
    let survivor = c.wait_leader(LEADER_WAIT);
    let share = c.dir.path().join("witness");
    let gone = c.dir.path().join("witness.gone");
    std::fs::rename(&share, &gone).unwrap();
    c.kill(1 - survivor);
    eventually(LEADER_WAIT, "the survivor knows no leader", || {
        c.metric(survivor, "etcd_server_has_leader") == Some(0.0)
    });
    let ep = vec![c.members[survivor].url()];
    refused_with(
        etcdctl(&ep, &["--command-timeout=30s", "put", "never", "v"], None),
        "etcdserver: no leader",
    );
    let put = {
        let ep = ep.clone();
        std::thread::spawn(move || etcdctl(&ep, &["--command-timeout=30s", "put", "k", "v"], None))
    };
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !put.is_finished(),
        "the put did not wait for a leader: {}",
        crate::text(&put.join().unwrap())
    );
    std::fs::rename(&gone, &share).unwrap();
    ok(put.join().unwrap());
    assert_eq!(
        ok(etcdctl(&ep, &["get", "k", "--print-value-only"], None)),
        "v\n"
    );
    assert_eq!(
        ok(etcdctl(&ep, &["get", "never"], None)),
        "",
        "the refused put was not applied"
    );
}

/// The kubelet's probes of an etcd static pod (kubeadm since 1.31: `/livez` and `/readyz`), as
/// etcd 3.6 answers them: plain `ok`, `?verbose` listing each check, `?exclude=`, one check at
/// its own path, 405 for other methods, 404 for an unknown check. Then the faults a probe must
/// tell apart: the witness's share gone (every etcd check still passes, so no kubelet restarts
/// or unreadies a member; `/readyz/witness` and `/health` say it), and then the follower killed
/// (the survivor cannot serve a linearizable read: not ready, but still live, and a
/// serializable `/health` as kubeadm's older liveness probe asks stays green).
#[test]
fn kubelet_probes_as_etcd_serves_them() {
    let mut c = cluster();
    let leader = c.wait_leader(LEADER_WAIT);
    ok(etcdctl(&c.endpoints(), &["put", "k", "v"], None));
    let get = |c: &Cluster, path: &str| c.http_get(leader, path).expect(path);
    assert_eq!(get(&c, "/livez"), (200, "ok\n".to_string()));
    assert_eq!(get(&c, "/readyz"), (200, "ok\n".to_string()));
    let (code, verbose) = get(&c, "/readyz?verbose");
    assert_eq!(code, 200);
    for check in [
        "data_corruption",
        "serializable_read",
        "linearizable_read",
        "non_learner",
    ] {
        assert!(verbose.contains(&format!("[+]{check} ok\n")), "{verbose}");
        assert_eq!(
            get(&c, &format!("/readyz/{check}")),
            (200, "ok\n".to_string())
        );
    }
    assert!(!verbose.contains("witness"), "{verbose}");
    assert!(verbose.ends_with("ok\n"), "{verbose}");
    let (_, excluded) = get(
        &c,
        "/readyz?verbose&exclude=linearizable_read&exclude=no_such",
    );
    assert!(!excluded.contains("linearizable_read"), "{excluded}");
    assert_eq!(
        get(&c, "/livez?verbose"),
        (200, "[+]serializable_read ok\nok\n".to_string())
    );
    assert_eq!(get(&c, "/readyz/witness"), (200, "ok\n".to_string()));
    assert_eq!(get(&c, "/livez/no_such_check").0, 404);
    assert_eq!(
        get(&c, "/no/such/path"),
        (404, "404 page not found\n".to_string())
    );
    // (while a gRPC call of a service not served still gets gRPC's UNIMPLEMENTED)
    let ep = c.members[leader].url();
    let unknown = tokio::runtime::Runtime::new().unwrap().block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(ep)
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.expect("ready");
        let path = tonic::codegen::http::uri::PathAndQuery::from_static("/no.such.Service/Call");
        let codec = tonic_prost::ProstCodec::<(), ()>::default();
        grpc.unary(tonic::Request::new(()), path, codec).await
    });
    match unknown {
        Err(s) => assert_eq!(s.code(), tonic::Code::Unimplemented, "{s:?}"),
        Ok(r) => panic!("an unknown gRPC service answered {r:?}"),
    }
    assert_eq!(
        c.http_post(leader, "/readyz"),
        Some((405, Some("GET".to_string())))
    );
    let ready = c.metric(
        leader,
        "etcd_server_healthcheck{name=\"linearizable_read\",type=\"readyz\"}",
    );
    assert_eq!(ready, Some(1.0));

    let share = c.dir.path().join("witness");
    std::fs::rename(&share, c.dir.path().join("witness.gone")).unwrap();
    let witness = c.wait_http(leader, "/readyz/witness", 503, Duration::from_secs(30));
    assert!(witness.starts_with("[-]witness failed: "), "{witness}");
    assert_eq!(
        get(&c, "/readyz"),
        (200, "ok\n".to_string()),
        "both members are up"
    );
    assert_eq!(get(&c, "/livez"), (200, "ok\n".to_string()));
    let (code, health) = get(&c, "/health");
    assert_eq!(code, 503);
    assert!(health.contains("WITNESS: "), "{health}");

    c.kill(1 - leader);
    let unready = c.wait_http(leader, "/readyz", 503, Duration::from_secs(60));
    assert!(
        unready.contains("[-]linearizable_read failed: "),
        "{unready}"
    );
    assert!(unready.contains("[+]serializable_read ok\n"), "{unready}");
    assert!(unready.contains("[+]data_corruption ok\n"), "{unready}");
    assert_eq!(get(&c, "/livez"), (200, "ok\n".to_string()), "still live");
    assert_eq!(
        get(&c, "/health?exclude=NOSPACE&serializable=true"),
        (200, r#"{"health":"true","reason":""}"#.to_string())
    );
    assert_eq!(get(&c, "/health").0, 503);
}

/// etcd's `WithRequireLeader` (kube-apiserver's watches use it): the other member dead and
/// the witness's share gone, the survivor has no leader. A require-leader watch on it then
/// ends with `no leader` (so the client moves to another member) and a require-leader
/// serializable read is refused, while a plain watch stays open and a plain serializable read
/// is served, as etcd. With the share back, the survivor leads again and serves both.
#[test]
fn require_leader_calls_fail_and_watches_end_without_a_leader() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let survivor = c.wait_leader(LEADER_WAIT);
    let ep = c.members[survivor].url();
    rt.block_on(async {
        let options = etcd_client::ConnectOptions::new().with_require_leader(true);
        let mut strict = Client::connect([ep.as_str()], Some(options)).await.unwrap();
        let mut plain = Client::connect([ep.as_str()], None).await.unwrap();
        strict.put("k", "v", None).await.unwrap();
        let mut strict_watch = strict.watch("k", None).await.unwrap();
        let mut plain_watch = plain.watch("k", None).await.unwrap();
        assert!(next(&mut strict_watch).await.created());
        assert!(next(&mut plain_watch).await.created());

        let share = c.dir.path().join("witness");
        std::fs::rename(&share, c.dir.path().join("witness.gone")).unwrap();
        c.kill(1 - survivor);
        let ended = tokio::time::timeout(Duration::from_secs(30), strict_watch.message())
            .await
            .expect("the require-leader watch still open 30 s after the leader was lost");
        let why = ended.expect_err("the watch ends with an error").to_string();
        assert!(why.contains("etcdserver: no leader"), "{why}");
        let serializable = || Some(GetOptions::new().with_serializable());
        let refused = strict
            .get("k", serializable())
            .await
            .unwrap_err()
            .to_string();
        assert!(refused.contains("etcdserver: no leader"), "{refused}");
        let got = plain.get("k", serializable()).await.unwrap();
        assert_eq!(got.kvs()[0].value(), b"v");
        assert!(
            tokio::time::timeout(Duration::from_secs(1), plain_watch.message())
                .await
                .is_err(),
            "the plain watch is still open and quiet"
        );

        std::fs::rename(c.dir.path().join("witness.gone"), &share).unwrap();
        let started = Instant::now();
        while strict.get("k", serializable()).await.is_err() {
            assert!(started.elapsed() < LEADER_WAIT, "no leader again");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut again = strict.watch("k", None).await.unwrap();
        assert!(next(&mut again).await.created());
    });
}

/// (type, key, value, mod revision, previous value) of each event of a watch response.
type Seen = (EventType, String, String, i64, Option<String>);

fn seen(r: &WatchResponse) -> Vec<Seen> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).to_string();
    r.events()
        .iter()
        .map(|e| {
            let kv = e.kv().expect("an event has a key-value");
            (
                e.event_type(),
                text(kv.key()),
                text(kv.value()),
                kv.mod_revision(),
                e.prev_kv().map(|p| text(p.value())),
            )
        })
        .collect()
}

/// The next response of `ws` (failing after 10 s).
async fn next(ws: &mut WatchStream) -> WatchResponse {
    tokio::time::timeout(Duration::from_secs(10), ws.message())
        .await
        .expect("no watch response within 10 s")
        .expect("watch stream failed")
        .expect("watch stream ended")
}

/// Real `etcdctl watch`: live events with previous values, and a replay with `--rev`.
#[test]
fn etcdctl_watches() {
    let c = cluster();
    c.wait_leader(LEADER_WAIT);
    let all = vec![c.members[0].url(), c.members[1].url()];
    ok(etcdctl(&all, &["put", "w/a", "1"], None)); // 2
    let live = {
        let all = all.clone();
        std::thread::spawn(move || etcdctl_for(4, &all, &["watch", "--prefix", "w/", "--prev-kv"]))
    };
    std::thread::sleep(Duration::from_millis(1500));
    ok(etcdctl(&all, &["put", "w/a", "2"], None)); // 3
    ok(etcdctl(&all, &["del", "w/a"], None)); // 4
    let live = live.join().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&live.stdout),
        "PUT\nw/a\n1\nw/a\n2\nDELETE\nw/a\n2\nw/a\n\n",
        "{}",
        String::from_utf8_lossy(&live.stderr)
    );
    let replay = etcdctl_for(2, &all, &["watch", "--rev", "2", "w/a"]);
    assert_eq!(
        String::from_utf8_lossy(&replay.stdout),
        "PUT\nw/a\n1\nPUT\nw/a\n2\nDELETE\nw/a\n\n"
    );
}

/// etcdctl 3.6 (built from etcd's Go module, as current Kubernetes ships it) against two members
/// and a witness: keys, a transaction, compaction, watch, leases, lock and elect, the member and
/// endpoint commands with `--cluster`, alarms, defragment, leader transfer and a snapshot.
#[test]
fn etcdctl_3_6_works_as_3_4_does() {
    let bin = e2e_tests::etcd::Release::v3_6().etcdctl;
    let c = cluster();
    c.wait_leader(LEADER_WAIT);
    let all = c.endpoints();
    let run = |args: &[&str], stdin: Option<&str>| ok(etcdctl_at(&bin, &all, args, stdin));
    assert_eq!(run(&["put", "foo", "bar"], None), "OK\n");
    assert_eq!(run(&["get", "foo"], None), "foo\nbar\n");
    let txn = "value(\"foo\") = \"bar\"\n\nput t yes\n\nput t no\n\n";
    assert!(run(&["txn"], Some(txn)).starts_with("SUCCESS"));
    assert_eq!(run(&["del", "foo"], None), "1\n");
    assert_eq!(run(&["compact", "3"], None), "compacted revision 3\n");
    let old = etcdctl_at(&bin, &all, &["get", "t", "--rev=2"], None);
    assert!(
        String::from_utf8_lossy(&old.stderr).contains("required revision has been compacted"),
        "{old:?}"
    );
    let live = {
        let (bin, all) = (bin.clone(), all.clone());
        std::thread::spawn(move || etcdctl_at_for(4, &bin, &all, &["watch", "w/", "--prefix"]))
    };
    std::thread::sleep(Duration::from_millis(1500));
    run(&["put", "w/a", "1"], None);
    let live = live.join().unwrap();
    assert_eq!(String::from_utf8_lossy(&live.stdout), "PUT\nw/a\n1\n");
    let lease = granted_lease(&run(&["lease", "grant", "100"], None));
    run(&["put", "--lease", &lease, "l/a", "1"], None);
    let ttl = run(&["lease", "timetolive", &lease, "--keys"], None);
    assert!(ttl.ends_with("attached keys([l/a])\n"), "{ttl}");
    assert_eq!(
        run(&["lease", "revoke", &lease], None),
        format!("lease {lease} revoked\n")
    );
    let locked = run(&["lock", "mutex", "echo", "held"], None);
    assert_eq!(locked.lines().last(), Some("held"), "{locked}");
    let elected = etcdctl_at_for(3, &bin, &all, &["elect", "leader-election", "me"]);
    assert!(
        String::from_utf8_lossy(&elected.stdout).starts_with("leader-election/"),
        "{elected:?}"
    );
    let members = run(&["member", "list", "-w", "table"], None);
    assert!(members.contains(&c.witness_url), "{members}");
    for args in [
        &["endpoint", "status", "--cluster"][..],
        &["endpoint", "health", "--cluster"],
        &["endpoint", "hashkv", "--cluster"],
    ] {
        let out = etcdctl_at(&bin, &all, args, None);
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {said}");
        for m in &c.members {
            assert!(said.contains(&m.url()), "{args:?}: {said}");
        }
    }
    assert_eq!(run(&["alarm", "list"], None), "");
    assert_eq!(
        run(&["defrag"], None)
            .matches("Finished defragmenting")
            .count(),
        2
    );
    let leader = c.wait_leader(LEADER_WAIT);
    let to = member_id(&run(&["member", "list"], None), &c.members[1 - leader].name);
    let moved = etcdctl_at(
        &bin,
        &[c.members[leader].url()],
        &["move-leader", &to],
        None,
    );
    assert!(
        String::from_utf8_lossy(&moved.stdout).contains("Leadership transferred"),
        "{moved:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.db");
    let one = [c.members[0].url()];
    let saved = etcdctl_at(
        &bin,
        &one,
        &["snapshot", "save", file.to_str().unwrap()],
        None,
    );
    assert!(saved.status.success(), "{saved:?}");
    let status = etcdutl(&["snapshot", "status", file.to_str().unwrap(), "-w", "json"]);
    assert!(status.status.success(), "{status:?}");
}

/// Watch through the `etcd-client` crate: replay from a past revision with previous values,
/// two watchers multiplexed on one stream (one filtering puts out), progress requests, cancel,
/// a compacted start revision, and a start at exactly the compacted revision.
#[test]
fn watch_replays_filters_multiplexes_and_reports_progress() {
    use EventType::{Delete, Put};
    let c = cluster();
    c.wait_leader(LEADER_WAIT);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut client = Client::connect([c.members[1].url()], None).await.unwrap();
        client.put("a", "1", None).await.unwrap(); // 2
        client.put("a", "2", None).await.unwrap(); // 3
        client.delete("a", None).await.unwrap(); // 4
        client.put("b", "1", None).await.unwrap(); // 5
        let all = || WatchOptions::new().with_all_keys();
        let mut ws = client
            .watch("", Some(all().with_start_revision(2).with_prev_key()))
            .await
            .unwrap();
        let created = next(&mut ws).await;
        assert!(created.created());
        let everything = created.watch_id();
        let mut replayed = Vec::new();
        while replayed.len() < 4 {
            let r = next(&mut ws).await;
            assert_eq!(r.watch_id(), everything);
            replayed.extend(seen(&r));
        }
        let s = |v: &str| Some(v.to_string());
        assert_eq!(
            replayed,
            [
                (Put, "a".into(), "1".into(), 2, None),
                (Put, "a".into(), "2".into(), 3, s("1")),
                (Delete, "a".into(), "".into(), 4, s("2")),
                (Put, "b".into(), "1".into(), 5, None),
            ]
        );
        // A second watcher on the same stream, deletions only.
        ws.watch("", Some(all().with_filters([WatchFilterType::NoPut])))
            .await
            .unwrap();
        let created = next(&mut ws).await;
        assert!(created.created());
        let deletions = created.watch_id();
        assert_ne!(deletions, everything);
        client.put("c", "1", None).await.unwrap(); // 6
        client.delete("c", None).await.unwrap(); // 7
        let (mut first, mut second) = (Vec::new(), Vec::new());
        while first.len() + second.len() < 3 {
            let r = next(&mut ws).await;
            if r.watch_id() == everything {
                first.extend(seen(&r));
            } else {
                assert_eq!(r.watch_id(), deletions);
                second.extend(seen(&r));
            }
        }
        assert_eq!(
            first,
            [
                (Put, "c".into(), "1".into(), 6, None),
                (Delete, "c".into(), "".into(), 7, s("1")),
            ]
        );
        assert_eq!(second, [(Delete, "c".into(), "".into(), 7, None)]);
        // Progress: every event up to the answer's revision was sent.
        ws.request_progress().await.unwrap();
        let p = next(&mut ws).await;
        assert!(p.events().is_empty() && !p.created() && !p.canceled());
        assert_eq!((p.watch_id(), p.header().unwrap().revision()), (-1, 7));
        ws.cancel(deletions).await.unwrap();
        let r = next(&mut ws).await;
        assert!(r.canceled());
        assert_eq!(r.watch_id(), deletions);
        // Compacted history: the watch is created, then cancelled with the compacted revision.
        client.compact(6, None).await.unwrap();
        let mut old = client
            .watch("", Some(all().with_start_revision(3)))
            .await
            .unwrap();
        assert!(next(&mut old).await.created());
        let r = next(&mut old).await;
        assert!(r.canceled());
        assert_eq!(r.compact_revision(), 6);
        // At exactly the compacted revision, the history still has everything.
        let mut at = client
            .watch("c", Some(WatchOptions::new().with_start_revision(6)))
            .await
            .unwrap();
        assert!(next(&mut at).await.created());
        let mut events = Vec::new();
        while events.len() < 2 {
            events.extend(seen(&next(&mut at).await));
        }
        assert_eq!(events[0].3, 6);
        assert_eq!(events[1].0, Delete);
    });
}

/// A watcher that does not read while 4,800 writes go by (more than the hub keeps) catches up
/// from the history: every event exactly once, in revision order; writes never waited for it.
#[test]
fn a_slow_watcher_catches_up_from_the_history() {
    let c = cluster();
    let leader = c.wait_leader(LEADER_WAIT);
    let ep = c.members[leader].url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut client = Client::connect([ep.as_str()], None).await.unwrap();
        let mut ws = client
            .watch("s/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        assert!(next(&mut ws).await.created());
        let writers: Vec<_> = (0..8)
            .map(|w| {
                let ep = ep.clone();
                tokio::spawn(async move {
                    let mut client = Client::connect([ep.as_str()], None).await.unwrap();
                    for i in 0..600 {
                        client
                            .put(format!("s/{w}/{i:03}"), "x".repeat(1000), None)
                            .await
                            .unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.await.unwrap();
        }
        let mut revisions = Vec::new();
        while revisions.len() < 4800 {
            let r = next(&mut ws).await;
            revisions.extend(seen(&r).into_iter().map(|e| e.3));
        }
        assert_eq!(revisions.len(), 4800);
        assert!(
            revisions.windows(2).all(|w| w[0] < w[1]),
            "events in revision order, none twice"
        );
    });
    let catch_ups = c.metric(leader, "etcd_watch_catch_ups_total").unwrap();
    assert!(catch_ups >= 1.0, "the watcher fell behind: {catch_ups}");
}

/// Watchers on both members while the leader is killed under writes: the survivor's watcher
/// sees exactly the events its history holds (none lost, none twice, in order), every
/// acknowledged write among them; what the killed member's watcher saw is a prefix of that.
#[test]
fn watchers_on_both_members_see_every_write_once_across_a_leader_kill() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let survivor = 1 - leader;
    let urls = [c.members[leader].url(), c.members[survivor].url()];
    let leader_events = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let collect = |url: String, count: std::sync::Arc<std::sync::atomic::AtomicUsize>| {
        rt.spawn(async move {
            let mut client = Client::connect([url.as_str()], None).await.unwrap();
            let mut ws = client
                .watch("k/", Some(WatchOptions::new().with_prefix()))
                .await
                .unwrap();
            let mut got = Vec::new();
            while let Ok(Ok(Some(r))) =
                tokio::time::timeout(Duration::from_secs(5), ws.message()).await
            {
                got.extend(seen(&r));
                count.store(got.len(), std::sync::atomic::Ordering::Relaxed);
            }
            got
        })
    };
    let (on_leader, on_survivor) = (
        collect(urls[0].clone(), leader_events.clone()),
        collect(urls[1].clone(), Default::default()),
    );
    std::thread::sleep(Duration::from_millis(300));
    let mut acked = Vec::new();
    for i in 0..100 {
        let k = format!("k/{i:03}");
        assert!(rt.block_on(put_until(&urls[0], &k, "v", Duration::from_secs(10))));
        acked.push(k);
    }
    // Events of acknowledged writes may still be on their way to the leader's watcher: give
    // them time to arrive before the kill (the prefix check below then covers all 100).
    let waiting = std::time::Instant::now();
    while leader_events.load(std::sync::atomic::Ordering::Relaxed) < 100
        && waiting.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    c.kill(leader);
    for i in 100..200 {
        let k = format!("k/{i:03}");
        assert!(rt.block_on(put_until(&urls[1], &k, "v", Duration::from_secs(30))));
        acked.push(k);
    }
    let on_survivor = rt.block_on(on_survivor).unwrap();
    let on_leader = rt.block_on(on_leader).unwrap();
    let history = rt.block_on(async {
        let mut client = Client::connect([urls[1].as_str()], None).await.unwrap();
        let mut ws = client
            .watch(
                "k/",
                Some(WatchOptions::new().with_prefix().with_start_revision(1)),
            )
            .await
            .unwrap();
        let mut got = Vec::new();
        while got.len() < on_survivor.len() {
            got.extend(seen(&next(&mut ws).await));
        }
        got
    });
    assert_eq!(on_survivor, history, "live events = the history, once each");
    let keys: std::collections::BTreeSet<&str> = on_survivor.iter().map(|e| e.1.as_str()).collect();
    assert!(acked.iter().all(|k| keys.contains(k.as_str())));
    assert!(
        on_leader.len() >= 100,
        "{} events before the kill",
        on_leader.len()
    );
    assert_eq!(on_leader, on_survivor[..on_leader.len()]);
}

/// The lease id in etcdctl's "lease 694d... granted with TTL(10s)".
fn granted_lease(out: &str) -> String {
    out.split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("no lease id in {out:?}"))
        .to_string()
}

/// Real `etcdctl lease ...` and `put --lease`: grant, attach, time-to-live with keys, list,
/// keep-alive, revoke (the keys go), and etcd's error for an unknown lease.
#[test]
fn etcdctl_leases() {
    let c = cluster();
    c.wait_leader(LEADER_WAIT);
    let all = vec![c.members[0].url(), c.members[1].url()];
    let out = ok(etcdctl(&all, &["lease", "grant", "100"], None));
    assert!(out.ends_with("granted with TTL(100s)\n"), "{out}");
    let id = granted_lease(&out);
    ok(etcdctl(&all, &["put", "--lease", &id, "l/a", "1"], None));
    ok(etcdctl(&all, &["put", "--lease", &id, "l/b", "2"], None));
    let ttl = ok(etcdctl(&all, &["lease", "timetolive", &id, "--keys"], None));
    assert!(
        ttl.starts_with(&format!("lease {id} granted with TTL(100s), remaining(")),
        "{ttl}"
    );
    assert!(ttl.ends_with("attached keys([l/a l/b])\n"), "{ttl}");
    assert!(ok(etcdctl(&all, &["lease", "list"], None)).contains(&id));
    let kept = ok(etcdctl(&all, &["lease", "keep-alive", "--once", &id], None));
    assert_eq!(kept, format!("lease {id} keepalived with TTL(100)\n"));
    let revoked = ok(etcdctl(&all, &["lease", "revoke", &id], None));
    assert_eq!(revoked, format!("lease {id} revoked\n"));
    assert_eq!(ok(etcdctl(&all, &["get", "--prefix", "l/"], None)), "");
    let gone = ok(etcdctl(&all, &["lease", "timetolive", &id], None));
    assert_eq!(gone, format!("lease {id} already expired\n"));
    let refused = etcdctl(&all, &["put", "--lease", &id, "l/c", "3"], None);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("etcdserver: requested lease not found"),
        "{refused:?}"
    );
}

/// A lease kept alive through the follower outlives its TTL; once the keep-alives stop, the
/// leader revokes it: its keys go in one revision (one watch response, one revision).
#[test]
fn an_expired_lease_deletes_its_keys_in_one_revision() {
    let c = cluster();
    let leader = c.wait_leader(LEADER_WAIT);
    let follower = c.members[1 - leader].url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut client = Client::connect([follower.as_str()], None).await.unwrap();
        let lease = client.lease_grant(2, None).await.unwrap().id();
        for k in ["e/a", "e/b", "e/c"] {
            let opts = etcd_client::PutOptions::new().with_lease(lease);
            client.put(k, "v", Some(opts)).await.unwrap();
        }
        let mut ws = client
            .watch("e/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        assert!(next(&mut ws).await.created());
        let (mut keeper, mut answers) = client.lease_keep_alive(lease).await.unwrap();
        for _ in 0..8 {
            keeper.keep_alive().await.unwrap();
            let a = answers.message().await.unwrap().unwrap();
            assert_eq!((a.id(), a.ttl()), (lease, 2));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let kept = client
            .get("e/", Some(GetOptions::new().with_prefix()))
            .await;
        assert_eq!(
            kept.unwrap().kvs().len(),
            3,
            "kept alive for 4 s with a 2 s TTL"
        );
        drop((keeper, answers));
        let expired = tokio::time::timeout(Duration::from_secs(10), ws.message())
            .await
            .expect("the lease did not expire")
            .unwrap()
            .unwrap();
        let events = seen(&expired);
        assert_eq!(events.len(), 3, "{events:?}");
        assert!(
            events
                .iter()
                .all(|e| e.0 == EventType::Delete && e.3 == events[0].3)
        );
        let left = client
            .get("e/", Some(GetOptions::new().with_prefix()))
            .await;
        assert!(left.unwrap().kvs().is_empty());
        let ttl = client.lease_time_to_live(lease, None).await.unwrap();
        assert_eq!(ttl.ttl(), -1);
        assert!(client.leases().await.unwrap().leases().is_empty());
    });
}

/// A lease survives the leader's death: the new leader gives it its whole TTL again, then
/// revokes it when it runs out; the killed member, restarted, agrees.
#[test]
fn a_lease_survives_a_leader_kill_and_then_expires() {
    let mut c = cluster();
    let leader = c.wait_leader(LEADER_WAIT);
    let survivor = 1 - leader;
    let (lead_ep, surv_ep) = (c.members[leader].url(), c.members[survivor].url());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let lease = rt.block_on(async {
        let mut client = Client::connect([lead_ep.as_str()], None).await.unwrap();
        let lease = client.lease_grant(6, None).await.unwrap().id();
        let opts = etcd_client::PutOptions::new().with_lease(lease);
        client.put("f/a", "v", Some(opts)).await.unwrap();
        lease
    });
    std::thread::sleep(Duration::from_secs(2));
    // The bounds below are lower bounds measured from before the kill, so a slow machine only
    // makes them easier to meet; without the refresh the lease would run out ~4 s after the kill.
    let killed = Instant::now();
    c.kill(leader);
    assert!(rt.block_on(put_until(&surv_ep, "f/after", "x", Duration::from_secs(30))));
    rt.block_on(async {
        let mut client = Client::connect([surv_ep.as_str()], None).await.unwrap();
        let ttl = client.lease_time_to_live(lease, None).await.unwrap();
        assert_eq!(ttl.granted_ttl(), 6);
        // Refreshed at promotion (after the kill) to 6 s plus a 1 s election timeout (reported
        // rounded down, as etcd does).
        let since = killed.elapsed().as_secs_f64();
        assert!(
            (ttl.ttl() + 1) as f64 >= 7.0 - since,
            "refreshed on the new leader: {} s left {since:.2} s after the kill",
            ttl.ttl()
        );
        let kv = client.get("f/a", None).await.unwrap();
        assert_eq!(kv.kvs().len(), 1);
        while !client.get("f/a", None).await.unwrap().kvs().is_empty() {
            assert!(killed.elapsed() < Duration::from_secs(30), "never expired");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let gone = killed.elapsed();
        assert!(
            gone >= Duration::from_secs(7),
            "expired early: {gone:?} after the kill"
        );
    });
    c.start_member(leader);
    let want = vec![("f/after".to_string(), "x".to_string())];
    rt.block_on(wait_caught_up(&lead_ep, "f/", &want));
}

/// Real `etcdctl move-leader` (refused for the witness, which never leads) and `endpoint
/// hashkv` (the same hash on both members).
#[test]
fn etcdctl_moves_the_leader_and_hashes_the_key_space() {
    let c = cluster();
    let leader = c.wait_leader(LEADER_WAIT);
    let other = 1 - leader;
    // etcdctl 3.4's per-endpoint commands want host:port endpoints (docs/operations.md).
    let hostport = |i: usize| c.members[i].url().trim_start_matches("http://").to_string();
    let all = vec![hostport(leader), hostport(other)];
    for i in 0..20 {
        ok(etcdctl(&all, &["put", &format!("h/{i}"), "v"], None));
    }
    let members = ok(etcdctl(&all, &["member", "list"], None));
    let id_of = |what: &str| {
        members
            .lines()
            .find(|l| l.contains(what))
            .and_then(|l| l.split(',').next())
            .unwrap_or_else(|| panic!("{what} not in {members}"))
            .to_string()
    };
    let witness = id_of("witness:");
    let refused = etcdctl(&all, &["move-leader", &witness], None);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("bad leader transferee"), "{why}");
    let target = id_of(&format!(", {}, ", c.members[other].name));
    let moved = ok(etcdctl(&all, &["move-leader", &target], None));
    assert!(moved.contains(&format!("to {target}")), "{moved}");
    assert_eq!(c.wait_leader(LEADER_WAIT), other);
    ok(etcdctl(&all, &["put", "h/after", "v"], None));
    let started = Instant::now();
    loop {
        let out = ok(etcdctl(&all, &["endpoint", "hashkv"], None));
        if two_hashes_agree(&out) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "hashes differ: {out}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// etcdutl's arguments that initialise the witness `w` at `url` over what it holds.
fn witness_init_forced(url: &str) -> [&str; 7] {
    [
        "witness",
        "init",
        "--force",
        "--name",
        "w",
        "--advertise-peer-url",
        url,
    ]
}

/// etcdutl's arguments that restore the snapshot `file` into member `i`'s data directory, for
/// a new cluster of `c`'s members made with the token `token`.
fn restore_args(c: &Cluster, i: usize, file: &str, token: &str) -> Vec<String> {
    let m = &c.members[i];
    let dir = c.data_dir(i);
    [
        "snapshot",
        "restore",
        file,
        "--name",
        &m.name,
        "--data-dir",
        dir.to_str().unwrap(),
        "--initial-cluster",
        c.initial_cluster(),
        "--initial-cluster-token",
        token,
        "--initial-advertise-peer-urls",
        &m.peer_url(),
    ]
    .map(String::from)
    .to_vec()
}

/// Runs this build's etcdutl with `args`.
fn etcdutl<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    etcdutl_of(bins().1, args)
}

/// Runs the etcdutl binary `bin` with `args`.
fn etcdutl_of<S: AsRef<std::ffi::OsStr>>(bin: &Path, args: &[S]) -> Output {
    std::process::Command::new(bin)
        .args(args)
        .output()
        .expect("run etcdutl")
}

/// Disaster recovery, as docs/operations.md tells it: `etcdctl snapshot save`, every member
/// lost, the old witness cleaned, `etcdutl snapshot restore` per member into a new cluster (new
/// token, so new ids; one member's WAL restored into a `--wal-dir`), then the restored cluster
/// holds exactly the snapshot and its fresh witness works (a member killed, writes go on).
#[test]
fn a_snapshot_restores_into_a_new_cluster_with_a_clean_witness() {
    let mut c = cluster();
    let leader = c.wait_leader(LEADER_WAIT);
    let eps: Vec<String> = c.members.iter().map(|m| m.endpoint()).collect();
    for i in 0..40 {
        ok(etcdctl(
            &eps,
            &["put", &format!("s/{i:02}"), &format!("v{i}")],
            None,
        ));
    }
    ok(etcdctl(&eps, &["del", "s/07"], None));
    let granted = ok(etcdctl(&eps, &["lease", "grant", "600"], None));
    let lease = granted
        .split_whitespace()
        .nth(1)
        .expect("lease id")
        .to_string();
    ok(etcdctl(
        &eps,
        &["put", "--lease", &lease, "s/leased", "x"],
        None,
    ));
    let file = c.dir.path().join("backup.db");
    let file_arg = file.to_str().unwrap();
    let saved = ok(etcdctl(
        &[c.members[leader].endpoint()],
        &["snapshot", "save", file_arg],
        None,
    ));
    assert!(saved.contains("Snapshot saved"), "{saved}");
    ok(etcdctl(&eps, &["put", "s/after", "lost"], None));
    let old_ids = ok(etcdctl(&eps, &["member", "list"], None));

    let status =
        String::from_utf8(etcdutl(&["snapshot", "status", file_arg, "-w", "json"]).stdout).unwrap();
    // 40 puts, a delete, a lease-attached put: revision 43; 39 + 1 live keys.
    assert!(
        status.contains("\"revision\":43") && status.contains("\"totalKey\":40"),
        "{status}"
    );

    c.stop(0);
    c.stop(1);
    for i in 0..2 {
        let dir = c.data_dir(i);
        std::fs::rename(&dir, dir.with_extension("lost")).unwrap();
    }
    let restore = |c: &Cluster, i: usize, extra: &[&str]| {
        let mut args = restore_args(c, i, file_arg, "restored");
        args.extend(extra.iter().map(|a| a.to_string()));
        etcdutl(&args)
    };
    // The old witness still holds the old cluster's term and log position: refused, nothing
    // written.
    let refused = restore(&c, 0, &[]);
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && why.contains("witness init --force"),
        "{why}"
    );
    assert!(!c.data_dir(0).exists());

    let clean_witness = |c: &Cluster| {
        let cleaned = etcdutl(&witness_init_forced(&c.witness_url));
        assert!(
            cleaned.status.success(),
            "{}",
            String::from_utf8_lossy(&cleaned.stderr)
        );
    };
    clean_witness(&c);
    // A copy with one value changed parses as a dump; its SHA-256 (checked while the restore
    // reads it) refuses it, nothing written, and the witness stays clean for the restores below.
    let damaged = c.dir.path().join("damaged.db");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes
        .windows(3)
        .position(|w| w == b"v39")
        .expect("a value in the dump");
    bytes[at] = b'w';
    std::fs::write(&damaged, &bytes).unwrap();
    let refused = etcdutl(&restore_args(&c, 0, damaged.to_str().unwrap(), "restored"));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && why.contains("SHA-256 does not match"),
        "{why}"
    );
    let dir = c.data_dir(0);
    let mut aside = dir.clone().into_os_string();
    aside.push(".restoring");
    assert!(!dir.exists() && !Path::new(&aside).exists());
    let restored = |out: std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // One member restored and started too early: with the witness's vote it leads alone, and
    // the witness is bound to the restored cluster.
    restored(restore(&c, 0, &[]));
    c.start_member(0);
    assert_eq!(c.wait_leader(LEADER_WAIT), 0);
    // A restore of another history (here: another --bump-revision) makes another cluster;
    // the same restore would reuse the started member's terms for another history: both are
    // refused, nothing written.
    for (extra, expected) in [
        (
            &["--bump-revision", "5", "--mark-compacted"][..],
            "another cluster's state",
        ),
        (&[], "already bound to this restored cluster"),
    ] {
        let refused = restore(&c, 1, extra);
        let why = String::from_utf8_lossy(&refused.stderr);
        assert!(!refused.status.success() && why.contains(expected), "{why}");
        assert!(!c.data_dir(1).exists());
    }
    // Start over, as the message says: stop it, discard its restored data, clean the witness,
    // restore every member, then start them.
    c.stop(0);
    std::fs::remove_dir_all(c.data_dir(0)).unwrap();
    clean_witness(&c);
    // One member's WAL in a directory of its own (`--wal-dir`, given to the restore and then
    // to the member); a restore never writes into a --wal-dir that holds something.
    let wal1 = c.dir.path().join("n1-restored-wal");
    let wal1_flag = ["--wal-dir", wal1.to_str().unwrap()];
    restored(restore(&c, 1, &wal1_flag));
    let wal1_segments = std::fs::read_dir(&wal1)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "wal")
        })
        .count();
    assert_eq!(wal1_segments, 1);
    assert!(!c.data_dir(1).join("member/wal").exists());
    let refused = restore(&c, 0, &wal1_flag);
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && why.contains("--wal-dir") && why.contains("already exists"),
        "{why}"
    );
    assert!(!c.data_dir(0).exists());
    restored(restore(&c, 0, &[]));
    c.start_member(0);
    c.start_member_with(1, &wal1_flag, &[]);
    c.wait_leader(LEADER_WAIT);

    let keys = ok(etcdctl(
        &eps,
        &["get", "s/", "--prefix", "--keys-only"],
        None,
    ));
    let keys: Vec<&str> = keys.lines().filter(|l| !l.is_empty()).collect();
    let mut want: Vec<String> = (0..40)
        .filter(|i| *i != 7)
        .map(|i| format!("s/{i:02}"))
        .collect();
    want.push("s/leased".into());
    assert_eq!(keys, want, "exactly the snapshot's keys");
    let leases = ok(etcdctl(&eps, &["lease", "list"], None));
    assert!(leases.contains(&lease), "{leases}");
    let new_ids = ok(etcdctl(&eps, &["member", "list"], None));
    assert_ne!(old_ids, new_ids, "a new token gives new member ids");
    assert_eq!(new_ids.lines().count(), 3, "{new_ids}");
    let hashes = ok(etcdctl(&eps, &["endpoint", "hashkv"], None));
    let hashes: Vec<&str> = hashes
        .lines()
        .map(|l| l.rsplit(", ").next().unwrap())
        .collect();
    assert!(hashes.len() == 2 && hashes[0] == hashes[1], "{hashes:?}");
    // The revision continues from the snapshot's.
    let put = ok(etcdctl(&eps, &["put", "s/new", "1", "-w", "json"], None));
    assert!(put.contains("\"revision\":44"), "{put}");

    // The fresh witness serves the new cluster: lose a member, writes go on.
    let leader = c.wait_leader(LEADER_WAIT);
    c.kill(1 - leader);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let url = c.members[leader].url();
    assert!(rt.block_on(put_until(
        &url,
        "s/with-witness",
        "y",
        Duration::from_secs(30)
    )));
}

/// `--quota-backend-bytes` as etcd: writes fill the file until one is refused with etcd's
/// error and NOSPACE is raised for the whole cluster (the other member refuses writes too);
/// reads and deletes still work; after compaction, `etcdctl defrag` on both members and
/// `etcdctl alarm disarm`, writes are accepted again.
#[test]
fn a_full_quota_raises_nospace_until_compact_defrag_and_disarm() {
    let (node, etcdutl) = bins();
    let c = Cluster::start(node, etcdutl, &["--quota-backend-bytes", "6000000"]);
    c.wait_leader(LEADER_WAIT);
    let eps: Vec<String> = c.members.iter().map(|m| m.endpoint()).collect();
    let first = std::slice::from_ref(&eps[0]);
    let second = std::slice::from_ref(&eps[1]);
    let value = e2e_tests::incompressible(100_000, 1);
    let mut refused = None;
    for i in 0..200 {
        let out = etcdctl(first, &["put", &format!("q/{}", i % 5), &value], None);
        if !out.status.success() {
            refused = Some((i, String::from_utf8_lossy(&out.stderr).to_string()));
            break;
        }
    }
    let (at, why) = refused.expect("200 puts of 100 kB never reached a 6 MB quota");
    assert!(at > 10, "refused too early, at put {at}: {why}");
    assert!(
        why.contains("etcdserver: mvcc: database space exceeded"),
        "{why}"
    );
    for ep in [first, second] {
        let alarms = ok(etcdctl(ep, &["alarm", "list"], None));
        assert!(alarms.contains("alarm:NOSPACE"), "{ep:?}: {alarms}");
        let out = etcdctl(ep, &["put", "q/more", "1"], None);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("database space exceeded"),
            "{ep:?} refuses writes"
        );
    }
    let status = ok(etcdctl(&eps, &["endpoint", "status"], None));
    assert!(status.contains("alarm:NOSPACE"), "{status}");
    // /health fails on the alarm unless told to leave it out, as etcd's; /readyz checks only
    // CORRUPT (a full quota still serves reads).
    let health = |path: &str| c.http_get(1, path).expect(path);
    assert_eq!(
        health("/health"),
        (
            503,
            "{\"health\":\"false\",\"reason\":\"ALARM NOSPACE\"}\n".to_string()
        )
    );
    assert_eq!(health("/health?exclude=NOSPACE").0, 200);
    assert_eq!(health("/readyz"), (200, "ok\n".to_string()));
    assert_eq!(
        ok(etcdctl(second, &["get", "q/1", "--print-value-only"], None)).len(),
        100_001
    );

    ok(etcdctl(first, &["del", "q/", "--prefix"], None));
    let put = etcdctl(first, &["put", "q/more", "1"], None);
    assert!(!put.status.success(), "still refused before disarm");
    let rev = ok(etcdctl(first, &["get", "q/", "-w", "json"], None));
    let rev = rev
        .split("\"revision\":")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .expect("a revision in the header")
        .to_string();
    ok(etcdctl(first, &["compact", &rev], None));
    let before = c.metric(0, "etcd_mvcc_db_total_size_in_bytes").unwrap();
    let defrag = ok(etcdctl(&eps, &["defrag"], None));
    assert_eq!(
        defrag.matches("Finished defragmenting").count(),
        2,
        "{defrag}"
    );
    let after = c.metric(0, "etcd_mvcc_db_total_size_in_bytes").unwrap();
    assert!(after < 6_000_000.0 && after < before, "{before} -> {after}");
    let disarmed = ok(etcdctl(first, &["alarm", "disarm"], None));
    assert!(disarmed.contains("alarm:NOSPACE"), "{disarmed}");
    assert_eq!(ok(etcdctl(second, &["alarm", "list"], None)), "");
    assert_eq!(ok(etcdctl(second, &["put", "q/more", "1"], None)), "OK\n");
}

/// How [`tamper`] changes a value.
#[derive(Clone, Copy, PartialEq)]
enum Tamper {
    /// As a bug would: the row's checksums agree with the new value.
    Diverge,
    /// As a bad disk would: the value changes, its checksum does not.
    Damage,
}

/// Changes `key`'s live value in a stopped member's key space behind Raft's back: the value
/// of its newest row (docs/formats.md, unchanged since format 4: `history` (key, revision) ->
/// the number of the value's row in `values`, then the rest of the record).
fn tamper(db_path: &Path, key: &[u8], value: &[u8], how: Tamper) {
    use redb::{ReadableTable, TableDefinition};
    let history: TableDefinition<(&[u8], u64), &[u8]> = TableDefinition::new("history");
    let values: TableDefinition<u64, &[u8]> = TableDefinition::new("values");
    let db = redb::Database::open(db_path).expect("open the member's kv.redb");
    let tx = db.begin_write().unwrap();
    {
        let rows = tx.open_table(history).unwrap();
        let (at, stored) = rows
            .range::<(&[u8], u64)>((key, 0)..=(key, u64::MAX))
            .unwrap()
            .next_back()
            .expect("the key has rows")
            .unwrap();
        let (row, rev) = (stored.value().to_vec(), at.value().1);
        drop((at, stored));
        let number = prost::encoding::decode_varint(&mut row.as_slice())
            .expect("the row starts with its value's number");
        assert_ne!(number, 0, "the key's newest row has a value");
        let mut values = tx.open_table(values).unwrap();
        let old = values.insert(number, value).unwrap();
        assert!(old.is_some(), "the value's row was there");
        if how == Tamper::Diverge {
            // Not damage: the row's checksums (docs/formats.md, its last 12 bytes: field 102
            // of the value, then field 101 of the key and the row) made to agree, so the member
            // reads the new value as its own.
            let mut rewritten = row[..row.len() - 12].to_vec();
            prost::encoding::fixed32::encode(102, &crc32c::crc32c(value), &mut rewritten);
            let check = crc32c::crc32c_append(crc32c::crc32c(key), &rewritten);
            prost::encoding::fixed32::encode(101, &check, &mut rewritten);
            drop(rows);
            tx.open_table(history)
                .unwrap()
                .insert((key, rev), rewritten.as_slice())
                .unwrap();
        }
    }
    tx.commit().unwrap();
}

/// The periodic corruption check: members that agree raise nothing; once one member's key
/// space is changed behind Raft's back, the leader finds the hashes differ at the same
/// revision, logs it and raises CORRUPT, and every write is refused as by etcd. Auth is on
/// meanwhile: the members' own HashKV requests carry the token they sign for themselves.
#[test]
fn the_leader_raises_corrupt_when_a_members_key_space_diverges() {
    corrupt_check_raises(
        Tamper::Diverge,
        "the key spaces differ at the same revision",
    );
}

/// A bit flipped in a member's key space: its HashKV fails the row's checksum and answers
/// DATA_LOSS, and the leader raises CORRUPT for it as for a divergence (etcd's bbolt has no
/// row checksums to fail, so this has no etcd counterpart).
#[test]
fn the_leader_raises_corrupt_when_a_members_key_space_is_damaged() {
    corrupt_check_raises(Tamper::Damage, "the member's key space is damaged");
}

fn corrupt_check_raises(how: Tamper, logged: &str) {
    let (node, etcdutl) = bins();
    let mut c = Cluster::start(node, etcdutl, &["--experimental-corrupt-check-time", "1s"]);
    let leader = c.wait_leader(LEADER_WAIT);
    let follower = 1 - leader;
    let eps: Vec<String> = c.members.iter().map(|m| m.endpoint()).collect();
    for i in 0..10 {
        ok(etcdctl(&eps, &["put", &format!("c/{i}"), "v"], None));
    }
    let want: Vec<(String, String)> = (0..10).map(|i| (format!("c/{i}"), "v".into())).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(wait_caught_up(&c.members[follower].url(), "c/", &want));
    ok(etcdctl(&eps, &["user", "add", "root:pw"], None));
    ok(etcdctl(&eps, &["user", "grant-role", "root", "root"], None));
    ok(etcdctl(&eps, &["auth", "enable"], None));
    let root = |args: &[&str]| {
        let all: Vec<&str> = std::iter::once("--user=root:pw")
            .chain(args.iter().copied())
            .collect();
        etcdctl(&eps, &all, None)
    };
    // A few rounds of the check while the members agree.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(ok(root(&["alarm", "list"])), "", "no false alarm");

    c.stop(follower);
    tamper(
        &c.data_dir(follower).join("member/kv.redb"),
        b"c/3",
        b"tampered",
        how,
    );
    c.start_member(follower);
    let started = Instant::now();
    loop {
        let alarms = ok(root(&["alarm", "list"]));
        if alarms.contains("alarm:CORRUPT") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no CORRUPT alarm: {alarms:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let refused = root(&["put", "c/new", "x"]);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("etcdserver: corrupt cluster"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let log = c.log(c.wait_leader(LEADER_WAIT));
    assert!(log.contains(logged), "{log}");
    // Every member holds the alarm: not ready, as etcd's `data_corruption` check, but live (a
    // kubelet must not restart a member whose data an operator has to look at).
    for i in 0..2 {
        let body = c.wait_http(i, "/readyz", 503, Duration::from_secs(10));
        assert!(
            body.contains("[-]data_corruption failed: alarm activated: CORRUPT\n"),
            "member {i}: {body}"
        );
        assert_eq!(c.http_get(i, "/livez"), Some((200, "ok\n".to_string())));
    }
}

/// A bit flipped in one of the small tables of a stopped member's key space (its lease's row,
/// as a bad disk would leave it: key-space format 5, docs/formats.md): the member does not
/// start on it, and says which file and table are damaged and how to recover, instead of
/// serving a lease with a wrong TTL.
#[test]
fn a_member_refuses_to_start_on_a_damaged_lease_row() {
    let mut c = cluster();
    let leader = c.wait_leader(LEADER_WAIT);
    let follower = 1 - leader;
    let eps = c.endpoints();
    let lease = granted_lease(&ok(etcdctl(&eps, &["lease", "grant", "600"], None)));
    ok(etcdctl(&eps, &["put", "--lease", &lease, "l/k", "v"], None));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let want = [("l/k".to_string(), "v".to_string())];
    rt.block_on(wait_caught_up(&c.members[follower].url(), "l/", &want));
    c.stop(follower);
    {
        use redb::{ReadableTable, TableDefinition};
        // (`leases`: lease id -> TTL (8 bytes) and its checksum (4))
        let leases: TableDefinition<i64, &[u8]> = TableDefinition::new("leases");
        let path = c.data_dir(follower).join("member/kv.redb");
        let db = redb::Database::open(&path).expect("open the member's kv.redb");
        let tx = db.begin_write().unwrap();
        {
            let mut table = tx.open_table(leases).unwrap();
            let id = i64::from_str_radix(&lease, 16).unwrap();
            let mut row = table
                .get(id)
                .unwrap()
                .expect("the lease's row")
                .value()
                .to_vec();
            assert_eq!(row.len(), 12, "TTL and checksum");
            row[1] ^= 1;
            table.insert(id, row.as_slice()).unwrap();
        }
        tx.commit().unwrap();
    }
    c.start_member(follower);
    c.wait_exited(follower, "the member served a damaged lease row");
    let log = c.log(follower);
    assert!(
        log.contains("kv.redb")
            && log.contains("of table leases fails its checksum")
            && log.contains("replace this member"),
        "{log}"
    );
}

/// Auth with the real etcdctl, as etcd's guide runs it: root user and role, a user with a read
/// role on one prefix and a read-write role on another, `auth enable`; then requests without a
/// user, with a wrong password, outside the user's permissions, and admin requests by a
/// non-root user are refused with etcd's errors, on both members; the permitted ones work; a
/// watch outside the permissions is cancelled; `auth disable` opens the cluster again.
#[test]
fn etcdctl_auth_users_roles_and_permissions() {
    let c = cluster();
    c.wait_leader(LEADER_WAIT);
    let eps: Vec<String> = c.members.iter().map(|m| m.endpoint()).collect();
    let run = |user: Option<&str>, args: &[&str]| {
        let mut all: Vec<&str> = Vec::new();
        let flag;
        if let Some(u) = user {
            flag = format!("--user={u}");
            all.push(&flag);
        }
        all.extend_from_slice(args);
        etcdctl(&eps, &all, None)
    };
    let err = |out: Output| String::from_utf8_lossy(&out.stderr).to_string();
    ok(run(None, &["put", "a/1", "one"]));
    ok(run(None, &["user", "add", "root:rootpw"]));
    ok(run(None, &["user", "grant-role", "root", "root"]));
    ok(run(None, &["role", "add", "reader"]));
    ok(run(
        None,
        &[
            "role",
            "grant-permission",
            "reader",
            "read",
            "a/",
            "--prefix=true",
        ],
    ));
    ok(run(None, &["role", "add", "writer"]));
    ok(run(
        None,
        &[
            "role",
            "grant-permission",
            "writer",
            "readwrite",
            "b/",
            "--prefix=true",
        ],
    ));
    ok(run(None, &["user", "add", "alice:alicepw"]));
    ok(run(None, &["user", "grant-role", "alice", "reader"]));
    ok(run(None, &["user", "grant-role", "alice", "writer"]));
    let enabled = ok(run(None, &["auth", "enable"]));
    assert!(enabled.contains("Authentication Enabled"), "{enabled}");

    let anonymous = err(run(None, &["get", "a/1"]));
    assert!(
        anonymous.contains("etcdserver: user name is empty"),
        "{anonymous}"
    );
    let wrong = err(run(Some("alice:nope"), &["get", "a/1"]));
    assert!(
        wrong.contains("authentication failed, invalid user ID or password"),
        "{wrong}"
    );
    let alice = Some("alice:alicepw");
    assert_eq!(
        ok(run(alice, &["get", "a/1", "--print-value-only"])),
        "one\n"
    );
    let denied = err(run(alice, &["put", "a/1", "two"]));
    assert!(denied.contains("etcdserver: permission denied"), "{denied}");
    let denied = err(run(alice, &["get", "a", "--prefix"]));
    assert!(
        denied.contains("etcdserver: permission denied"),
        "a range wider than a/"
    );
    assert_eq!(ok(run(alice, &["put", "b/1", "mine"])), "OK\n");
    let txn = "value(\"a/1\") = \"one\"\n\nput b/2 yes\n\nput a/2 no\n\n";
    let denied = etcdctl(&eps, &["--user=alice:alicepw", "txn"], Some(txn));
    assert!(
        err(denied).contains("permission denied"),
        "a txn that may put a/2"
    );
    let admin = err(run(alice, &["user", "list"]));
    assert!(admin.contains("etcdserver: permission denied"), "{admin}");
    let root = Some("root:rootpw");
    // A lease holding a key alice may not write: she may not list its keys (CVE-2023-32082),
    // attach a key to it (that would let her revoke it) or revoke it; her own lease is hers.
    let lease_of = |out: String| out.split_whitespace().nth(1).expect("lease id").to_string();
    let roots = lease_of(ok(run(root, &["lease", "grant", "600"])));
    ok(run(root, &["put", "--lease", &roots, "c/secret", "s"]));
    let ttl = ok(run(alice, &["lease", "timetolive", &roots]));
    assert!(ttl.contains("remaining"), "{ttl}");
    for args in [
        &["lease", "timetolive", &roots, "--keys"][..],
        &["put", "--lease", &roots, "b/4", "x"],
        &["lease", "revoke", &roots],
    ] {
        let denied = err(run(alice, args));
        assert!(denied.contains("permission denied"), "{args:?}: {denied}");
    }
    let hers = lease_of(ok(run(alice, &["lease", "grant", "600"])));
    ok(run(alice, &["put", "--lease", &hers, "b/5", "x"]));
    let keys = ok(run(alice, &["lease", "timetolive", &hers, "--keys"]));
    assert!(keys.contains("b/5"), "{keys}");
    assert_eq!(
        ok(run(root, &["get", "c/secret", "--print-value-only"])),
        "s\n"
    );
    let users = ok(run(root, &["user", "list"]));
    assert_eq!(users, "alice\nroot\n");
    let role = ok(run(root, &["role", "get", "reader"]));
    assert!(role.contains("[a/, a0)"), "{role}");
    for m in &c.members {
        let one = [m.endpoint()];
        let got = etcdctl(
            &one,
            &["--user=alice:alicepw", "get", "b/1", "--print-value-only"],
            None,
        );
        assert_eq!(ok(got), "mine\n", "member {}", m.name);
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let options = etcd_client::ConnectOptions::new().with_user("alice", "alicepw");
        let mut client = Client::connect([c.members[1].url()], Some(options))
            .await
            .unwrap();
        let mut stream = client.watch("c/", None).await.unwrap();
        let first = stream.message().await.unwrap().unwrap();
        assert!(first.canceled(), "{first:?}");
        assert!(
            first.cancel_reason().contains("permission denied"),
            "{first:?}"
        );
        let mut stream = client
            .watch("b/", Some(WatchOptions::new().with_prefix()))
            .await
            .unwrap();
        assert!(!stream.message().await.unwrap().unwrap().canceled());
        client.put("b/3", "x", None).await.unwrap();
        let events = stream.message().await.unwrap().unwrap();
        assert_eq!(events.events()[0].kv().unwrap().key(), b"b/3");
    });

    let denied = err(run(alice, &["auth", "disable"]));
    assert!(denied.contains("permission denied"), "{denied}");
    ok(run(root, &["auth", "disable"]));
    assert_eq!(ok(run(None, &["put", "a/1", "open"])), "OK\n");
}

/// Retries `op` (a kube-apiserver request) until it succeeds, for at most 30 s: through a
/// leader kill some attempts fail, and some of those were applied anyway.
async fn retried<T, F, Fut>(what: &str, client: &Client, mut op: F) -> T
where
    F: FnMut(Client) -> Fut,
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let started = Instant::now();
    loop {
        match op(client.clone()).await {
            Ok(t) => return t,
            Err(e) => assert!(
                started.elapsed() < Duration::from_secs(30),
                "{what} kept failing: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What one kube-apiserver-shaped client does to the store (`k8s.io/apiserver`'s etcd3 store,
/// request by request): creates with `mod_revision == 0`, GuaranteedUpdate and Delete as
/// Txns comparing the `mod_revision` they read (the else branch reads the key back), events
/// attached to a lease, and the compactor's Txn on `compact_rev_key` followed by Compact.
struct Apiserver {
    client: Client,
    lease: i64,
    /// The pods as they must end up.
    want: std::collections::BTreeMap<String, String>,
    compact_version: i64,
}

impl Apiserver {
    async fn txn(&self, what: &str, txn: etcd_client::Txn) -> etcd_client::TxnResponse {
        retried(what, &self.client, |mut c| {
            let t = txn.clone();
            async move { c.txn(t).await }
        })
        .await
    }

    async fn get(&self, what: &str, key: &str) -> etcd_client::GetResponse {
        retried(what, &self.client, |mut c| {
            let k = key.to_string();
            async move { c.get(k, None).await }
        })
        .await
    }

    async fn create(&mut self, key: &str, value: &str, lease: bool) {
        use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
        let opts = lease.then(|| PutOptions::new().with_lease(self.lease));
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, value, opts)])
            .or_else([TxnOp::get(key, None)]);
        let r = self.txn("create", txn).await;
        if !r.succeeded() {
            // An earlier attempt was applied though its answer was lost.
            let got = self.client.get(key, None).await.unwrap();
            assert_eq!(
                got.kvs()[0].value(),
                value.as_bytes(),
                "{key} exists already"
            );
        }
        if !lease {
            self.want.insert(key.into(), value.into());
        }
    }

    /// GuaranteedUpdate: read, then write only if nothing changed since the read.
    async fn update(&mut self, key: &str, value: &str) {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        loop {
            let current = self.get("read for update", key).await;
            let kv = &current.kvs()[0];
            if kv.value() == value.as_bytes() {
                break; // (applied by an attempt whose answer was lost: nothing to change)
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key,
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([TxnOp::put(key, value, None)])
                .or_else([TxnOp::get(key, None)]);
            if self.txn("update", txn).await.succeeded() {
                break;
            }
        }
        self.want.insert(key.into(), value.into());
    }

    async fn delete(&mut self, key: &str) {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        loop {
            let current = self.get("read for delete", key).await;
            let Some(kv) = current.kvs().first() else {
                break; // (deleted by an attempt whose answer was lost)
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    key,
                    CompareOp::Equal,
                    kv.mod_revision(),
                )])
                .and_then([TxnOp::delete(key, None)])
                .or_else([TxnOp::get(key, None)]);
            if self.txn("delete", txn).await.succeeded() {
                break;
            }
        }
        self.want.remove(key);
    }

    /// The compactor: whoever wins the Txn on `compact_rev_key` compacts.
    async fn compact(&mut self) {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        let now = self.get("revision", "compact_rev_key").await;
        let rev = now.header().unwrap().revision();
        let txn = Txn::new()
            .when([Compare::version(
                "compact_rev_key",
                CompareOp::Equal,
                self.compact_version,
            )])
            .and_then([TxnOp::put("compact_rev_key", rev.to_string(), None)])
            .or_else([TxnOp::get("compact_rev_key", None)]);
        let r = self.txn("compaction txn", txn).await;
        self.compact_version += 1;
        if r.succeeded() {
            retried("compact", &self.client, |mut c| async move {
                c.compact(rev - 5, None).await
            })
            .await;
        }
    }

    /// A paged list at one revision, as a LIST with `limit`: every page at the first page's
    /// revision. Returns (revision, pods).
    async fn paged_list(&mut self, limit: i64) -> (i64, Vec<(String, String)>) {
        let (mut key, end) = (b"/registry/pods/".to_vec(), b"/registry/pods0".to_vec());
        let (mut revision, mut out) = (0, Vec::new());
        loop {
            let opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(limit)
                .with_revision(revision);
            let page = retried("list page", &self.client, |mut c| {
                let (k, o) = (key.clone(), opts.clone());
                async move { c.get(k, Some(o)).await }
            })
            .await;
            if revision == 0 {
                revision = page.header().unwrap().revision();
            }
            for kv in page.kvs() {
                out.push((kv.key_str().unwrap().into(), kv.value_str().unwrap().into()));
            }
            if !page.more() {
                return (revision, out);
            }
            key = [page.kvs().last().unwrap().key(), b"\0"].concat();
        }
    }
}

/// What the watch cache saw: (revision, type, key, value) per event, and the progress
/// notifications' revisions with how many events had arrived before each.
#[derive(Debug, Default)]
struct CacheView {
    events: Vec<(i64, EventType, String, String)>,
    progress: Vec<(i64, usize)>,
}

/// A kube-apiserver-shaped workload through a leader kill: creates, updates, deletes, lease-
/// attached events and compactions as kube's store issues them, while a watch cache on the
/// surviving member watches `/registry/` with prev_kv and progress notifications. Then a paged
/// LIST at one revision, a progress request whose answer must mean "every event up to here was
/// sent" (kube's consistent reads from the cache rely on it), and the events' lease revoked.
#[test]
fn a_kube_apiserver_shaped_workload_survives_a_leader_kill() {
    let mut c = cluster();
    let leader = c.wait_leader(LEADER_WAIT);
    let survivor = c.members[1 - leader].url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(CacheView::default()));
    let (mut api, mut progress) = rt.block_on(async {
        let mut client = Client::connect(c.endpoints(), None).await.unwrap();
        let lease = client.lease_grant(3600, None).await.unwrap().id();
        let start = client.get("compact_rev_key", None).await.unwrap();
        let start = start.header().unwrap().revision();
        let mut cache = Client::connect([survivor.as_str()], None).await.unwrap();
        let opts = WatchOptions::new()
            .with_prefix()
            .with_prev_key()
            .with_progress_notify()
            .with_start_revision(start + 1);
        let (progress, mut stream) = cache.watch("/registry/", Some(opts)).await.unwrap().split();
        let sink = seen.clone();
        tokio::spawn(async move {
            while let Ok(Some(r)) = stream.message().await {
                let mut s = sink.lock().unwrap();
                if r.events().is_empty() && !r.created() && !r.canceled() {
                    let n = s.events.len();
                    s.progress.push((r.header().unwrap().revision(), n));
                }
                for e in r.events() {
                    let kv = e.kv().unwrap();
                    let v = kv.value_str().unwrap().to_string();
                    let k = kv.key_str().unwrap().to_string();
                    s.events.push((kv.mod_revision(), e.event_type(), k, v));
                }
            }
        });
        let api = Apiserver {
            client,
            lease,
            want: Default::default(),
            compact_version: 0,
        };
        (api, progress)
    });

    let workload = |api: &mut Apiserver, from: usize, to: usize| {
        rt.block_on(async {
            for i in from..to {
                api.create(&format!("/registry/pods/p{i:03}"), "created", false)
                    .await;
                api.create(&format!("/registry/events/e{i:03}"), "event", true)
                    .await;
                if i % 3 == 2 {
                    api.update(&format!("/registry/pods/p{:03}", i - 1), "updated")
                        .await;
                }
                if i % 5 == 4 {
                    api.delete(&format!("/registry/pods/p{:03}", i - 2)).await;
                }
                if i % 20 == 19 {
                    api.compact().await;
                }
            }
        })
    };
    workload(&mut api, 0, 60);
    c.kill(leader);
    workload(&mut api, 60, 120);

    rt.block_on(async {
        // A paged LIST: every page at one revision, together exactly the pods.
        let (revision, pods) = api.paged_list(7).await;
        let want: Vec<(String, String)> = api.want.clone().into_iter().collect();
        assert_eq!(pods, want, "paged list at revision {revision}");

        // A progress request: its revision promises every event up to it was already sent.
        let now = api.get("revision", "compact_rev_key").await;
        let now = now.header().unwrap().revision();
        progress.request_progress().await.unwrap();
        let started = Instant::now();
        let (at, count) = loop {
            let last = seen.lock().unwrap().progress.last().copied();
            if let Some((at, count)) = last.filter(|(at, _)| *at >= now) {
                break (at, count);
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "no progress at {now}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let before = seen.lock().unwrap().events[..count].to_vec();
        assert!(before.iter().all(|e| e.0 <= at));
        let mut state = std::collections::BTreeMap::new();
        let mut last_rev = 0;
        for (rev, kind, key, value) in &before {
            assert!(
                *rev > last_rev,
                "events in revision order, once each: {rev} after {last_rev}"
            );
            last_rev = *rev;
            if key.starts_with("/registry/pods/") {
                match kind {
                    EventType::Put => state.insert(key.clone(), value.clone()),
                    EventType::Delete => state.remove(key),
                };
            }
        }
        assert_eq!(
            state, api.want,
            "the events up to the progress revision replay to the pods"
        );

        // The events' lease ends: all of them deleted in one revision, seen by the cache.
        let before_revoke = seen.lock().unwrap().events.len();
        let lease = api.lease;
        retried("revoke", &api.client, |mut c| async move {
            c.lease_revoke(lease).await
        })
        .await;
        let started = Instant::now();
        loop {
            let deletes: Vec<i64> = seen.lock().unwrap().events[before_revoke..]
                .iter()
                .filter(|e| e.1 == EventType::Delete && e.2.starts_with("/registry/events/"))
                .map(|e| e.0)
                .collect();
            if deletes.len() == 120 {
                assert!(deletes.iter().all(|r| *r == deletes[0]), "one revision");
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "lease-attached deletes missing"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// A real Python etcd v3 client from PyPI (`etcd3`, pinned in tests/python/requirements.txt)
/// against both members: `tests/python/client_check.py` (KV, a mod_revision Txn, leases,
/// etcd3's lock, live and replayed watches, Status/Hash/HashKV, MemberList with the witness,
/// compaction errors). The same script passes against Debian's etcd 3.4.
#[test]
fn a_python_etcd3_client_works_against_the_cluster() {
    let python = e2e_tests::python::python_with_client();
    let c = cluster();
    c.wait_leader(LEADER_WAIT);
    let script = e2e_tests::workspace_root().join("tests/python/client_check.py");
    for order in [[0, 1], [1, 0]] {
        let out = std::process::Command::new(&python)
            .arg(&script)
            .arg("--expect-witness")
            .args(order.map(|i| c.members[i].endpoint()))
            .output()
            .expect("run client_check.py");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(" 0 failed"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A cluster with a leader, and beside it a fresh one-member etcd 3.6 to judge it (kept running
/// while the returned value lives; its data in a directory of its own) with its client URL.
fn cluster_and_a_judge() -> (Cluster, (tempfile::TempDir, e2e_tests::etcd::Etcd), String) {
    let c = cluster();
    let dir = tempfile::tempdir().unwrap();
    let mut etcd =
        e2e_tests::etcd::Etcd::new(&e2e_tests::etcd::Release::v3_6(), dir.path(), "judge");
    etcd.start();
    c.wait_leader(LEADER_WAIT);
    let url = format!("http://{}", etcd.endpoint());
    (c, (dir, etcd), url)
}

/// etcd's JSON gateway, judged by etcd 3.6: `tests/python/gateway_check.py transcript` runs
/// etcd's documented curl examples and the error cases against a member and against a fresh
/// etcd 3.6, and the two transcripts (ids, terms and tokens normalised) must be equal. Then
/// OpenStack's etcd3gw works against each member.
#[test]
fn the_json_gateway_answers_as_etcd_3_6_does_and_etcd3gw_works() {
    let python = e2e_tests::python::python_with_client();
    let (c, _etcd, judge) = cluster_and_a_judge();
    let script = e2e_tests::workspace_root().join("tests/python/gateway_check.py");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&python)
            .arg(&script)
            .args(args)
            .output()
            .expect("run gateway_check.py");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "gateway_check.py {args:?}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let ours = run(&["transcript", &c.members[0].url()]);
    let theirs = run(&["transcript", &judge]);
    if ours != theirs {
        let at = ours
            .lines()
            .zip(theirs.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        let around = |t: &str| {
            t.lines()
                .skip(at.saturating_sub(15))
                .take(30)
                .collect::<Vec<_>>()
                .join("\n")
        };
        panic!(
            "the gateway's transcript differs from etcd 3.6's at line {at}:\n--- etcd-node\n{}\n--- etcd 3.6\n{}",
            around(&ours),
            around(&theirs)
        );
    }
    for m in &c.members {
        let out = run(&["etcd3gw", &m.url()]);
        assert!(out.contains(" 0 failed"), "{out}");
    }
}

/// etcd's Lock and Election services, judged by etcd 3.6's own Go clients
/// (`tests/go/etcd36/lockelection`: the v3lock and v3election clients, and the client-side
/// Mutex and Election that must exclude the services' holders): the same tests pass against
/// etcd 3.6 and against both members of a cluster.
#[test]
fn etcd_3_6_go_clients_lock_and_elect_as_on_etcd() {
    let (c, _etcd, judge) = cluster_and_a_judge();
    let module = e2e_tests::workspace_root().join("tests/go/etcd36");
    for endpoints in [judge, c.endpoints().join(",")] {
        let out = std::process::Command::new("go")
            .args(["test", "-count=1", "./lockelection/"])
            .current_dir(&module)
            .env("ETCD_ENDPOINTS", &endpoints)
            .output()
            .expect("run `go test` (Go 1.26 on PATH)");
        assert!(
            out.status.success(),
            "go test ./lockelection/ against {endpoints}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Fault-campaign finding 5.1: while a member is paused (SIGSTOP), clients cancel requests on
/// their deadlines; when it resumes, those cancellations arrive at once. They must not make the
/// server tear the connection down (GOAWAY ENHANCE_YOUR_CALM "too_many_resets"): requests
/// still waiting on that connection are answered.
#[test]
fn a_paused_member_answers_the_requests_still_waiting_after_a_burst_of_cancellations() {
    let c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    c.wait_leader(LEADER_WAIT);
    let ep = c.members[0].url();
    let serializable = || Some(GetOptions::new().with_serializable());
    rt.block_on(async {
        // One client, one HTTP/2 connection, shared by every request below.
        let mut client = Client::connect([ep.as_str()], None).await.unwrap();
        client.put("paused", "v", None).await.unwrap();
        c.pause(0);
        let mut cancelled = Vec::new();
        for _ in 0..200 {
            let mut cl = client.clone();
            cancelled.push(tokio::spawn(async move {
                tokio::time::timeout(Duration::from_millis(100), cl.get("paused", serializable()))
                    .await
                    .is_err()
            }));
        }
        for t in cancelled {
            assert!(t.await.unwrap(), "answered while the member was stopped");
        }
        let mut waiting = Vec::new();
        for _ in 0..20 {
            let mut cl = client.clone();
            waiting.push(tokio::spawn(async move {
                cl.get("paused", serializable())
                    .await
                    .map(|r| r.kvs().len())
                    .map_err(|e| e.to_string())
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        c.resume(0);
        for t in waiting {
            assert_eq!(
                t.await.unwrap(),
                Ok(1),
                "a waiting request failed after the pause"
            );
        }
    });
}

/// Fault-campaign finding 5.5: a request over the size limit gets etcd's answer,
/// RESOURCE_EXHAUSTED "grpc: received message larger than max (N vs. M)".
#[test]
fn an_oversized_request_is_resource_exhausted_as_etcd_answers() {
    let c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    c.wait_leader(LEADER_WAIT);
    let ep = c.members[0].url();
    let status = rt.block_on(async {
        let mut client = Client::connect([ep.as_str()], None).await.unwrap();
        match client.put("big", vec![b'x'; 3 << 20], None).await {
            Err(etcd_client::Error::GRpcStatus(s)) => s,
            other => panic!("a 3 MiB put: {other:?}"),
        }
    });
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .starts_with("grpc: received message larger than max ("),
        "{status:?}"
    );
}

/// Member `i`'s `/version` page, parsed (null while the member does not answer).
fn version_page(c: &Cluster, i: usize) -> serde_json::Value {
    let Some((code, body)) = c.http_get(i, "/version") else {
        return serde_json::Value::Null;
    };
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("/version is JSON")
}

/// Waits up to 30 s until every running member's `/version` satisfies `ok`.
fn wait_versions(c: &Cluster, what: &str, ok: impl Fn(&serde_json::Value) -> bool) {
    let started = Instant::now();
    loop {
        let pages: Vec<_> = (0..c.members.len())
            .filter(|&i| c.members[i].is_running())
            .map(|i| version_page(c, i))
            .collect();
        if pages.iter().all(&ok) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what}: /version pages {pages:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

const GATE: &str = "SnapshotCompression";

/// Is the cluster feature on, as `/version` reports it?
fn feature_on(v: &serde_json::Value) -> bool {
    v["features"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f == GATE))
}

/// A cluster feature is on only once every regular member turns it on: one member with
/// `--feature-gates SnapshotCompression=true` leaves it off (in `/version` and in
/// `etcd_server_feature_enabled`); once the second turns it on too, the leader records it and
/// snapshots then travel compressed, and arrive whole.
#[test]
fn a_cluster_feature_stays_off_until_every_member_turns_it_on() {
    let (node, etcdutl) = bins();
    let mut c = Cluster::start(node, etcdutl, &["--snapshot-count", "50"]);
    c.wait_leader(LEADER_WAIT);
    let here = env!("CARGO_PKG_VERSION");
    wait_versions(&c, "the cluster version is decided", |v| {
        v["etcdnodecluster"] == here && v["etcdcluster"] == "3.5.0" && !feature_on(v)
    });
    let gate = format!("{GATE}=true");
    c.stop(0);
    c.start_member_with(0, &["--feature-gates", &gate], &[]);
    c.wait_leader(LEADER_WAIT);
    // Several rounds of the leader's decision, with member 0's gate announced.
    std::thread::sleep(Duration::from_secs(4));
    wait_versions(&c, "one member's gate leaves it off", |v| !feature_on(v));
    let metric = format!("etcd_server_feature_enabled{{name=\"{GATE}\",stage=\"Alpha\"}}");
    assert_eq!(c.metric(0, &metric), Some(0.0));
    c.stop(1);
    c.start_member_with(1, &["--feature-gates", &gate], &[]);
    wait_versions(&c, "on once both turn it on", feature_on);
    assert_eq!(c.metric(1, &metric), Some(1.0));
    // The behaviour it gates: a lagging member gets a compressed snapshot, and the same data.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let follower = 1 - leader;
    let ep = c.members[leader].url();
    c.stop(follower);
    let mut acked = Vec::new();
    for i in 0..150 {
        let (k, v) = (
            format!("g{:03}", i % 60),
            format!("v{i}-{}", "z".repeat(500)),
        );
        assert!(rt.block_on(put_until(&ep, &k, &v, Duration::from_secs(10))));
        acked.retain(|(key, _)| *key != k);
        acked.push((k, v));
    }
    acked.sort();
    c.start_member_with(follower, &["--feature-gates", &gate], &[]);
    rt.block_on(wait_caught_up(&c.members[follower].url(), "g", &acked));
    let log = c.log(leader);
    assert!(
        log.lines()
            .any(|l| l.contains("sent a snapshot") && l.contains("compressed=true")),
        "no compressed snapshot sent; leader's log:\n{log}"
    );
    let a = rt.block_on(local_records(&ep, "g"));
    let b = rt.block_on(local_records(&c.members[follower].url(), "g"));
    assert_eq!(a, b, "records (key, value, version, create, mod) differ");
}

/// A member that announces a peer protocol the others do not speak (the failpoint
/// `peer-protocol`) is refused with a message naming both versions; in a new cluster it stops
/// instead of serving, saying so; restarted with a release the others speak, on the same data
/// directory, it joins. Restarted with that protocol once the cluster holds data, it keeps
/// running, retrying; it cannot become ready, so its Status answers an error that says why
/// (the refusal), and its other calls wait.
#[test]
fn a_new_cluster_with_mixed_peer_protocols_does_not_start() {
    let (node, etcdutl) = bins();
    let mut c = Cluster::prepare(node, etcdutl, &[]);
    c.start_member_with(1, &[], &[("FAILPOINTS", "peer-protocol=return(9)")]);
    c.start_member(0);
    c.wait_exited(1, "the member of another protocol kept running");
    let log = c.log(1);
    assert!(
        log.contains("must speak a common peer protocol")
            && log.contains("peer protocol not spoken")
            && log.contains("speaks peer protocol 9"),
        "{log}"
    );
    c.kill(1);
    // Member 0 may stop too, on member 1's refusal of its frames, and may do so after member 1
    // did: start it over either way (checking whether it has exited yet raced with its exit,
    // and left it stopped for the rest of the test).
    c.kill(0);
    c.start_member(0);
    c.start_member(1);
    c.wait_leader(LEADER_WAIT);
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(rt.block_on(put_any(&c.endpoints(), "k", "v", Duration::from_secs(30))));
    // In a running cluster the same member waits instead, retrying, and says why in Status.
    c.stop(1);
    c.start_member_with(1, &[], &[("FAILPOINTS", "peer-protocol=return(9)")]);
    let ep = c.members[1].url();
    let started = Instant::now();
    loop {
        let errors = rt.block_on(async {
            let mut client = Client::connect([ep.as_str()], None).await.ok()?;
            let answer = tokio::time::timeout(Duration::from_secs(5), client.status()).await;
            Some(match answer.ok()? {
                Ok(s) => format!("answered as if ready: {:?}", s.errors()),
                Err(e) => e.to_string(),
            })
        });
        if errors.as_ref().is_some_and(|e| {
            e.contains("this member is not ready yet") && e.contains("peer protocol not spoken")
        }) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "Status errors: {errors:?}; log:\n{}",
            c.log(1)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !c.exited(1),
        "a member of a running cluster stopped:\n{}",
        c.log(1)
    );
    // Restarted with a release the others speak, it catches up.
    c.stop(1);
    c.start_member(1);
    let want = [("k".to_string(), "v".to_string())];
    rt.block_on(wait_caught_up(&ep, "k", &want));
}

/// The previous release's binaries, which `scripts/build-previous.sh` builds once from a pinned
/// commit of this repository (scripts/test.sh runs it first). Never built from here: a test
/// running beside a build could start a half-written binary. Fails with the command to run.
fn previous_release() -> (std::path::PathBuf, std::path::PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("bash")
        .args(["scripts/build-previous.sh", "--where"])
        .current_dir(&root)
        .output()
        .expect("run scripts/build-previous.sh --where");
    assert!(
        out.status.success(),
        "scripts/build-previous.sh --where failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = root.join(String::from_utf8_lossy(&out.stdout).trim());
    let (node, etcdutl) = (dir.join("etcd-node"), dir.join("etcdutl"));
    assert!(
        node.is_file() && etcdutl.is_file(),
        "the previous release is not built ({} is missing): run `bash scripts/build-previous.sh` \
         (scripts/test.sh does) and run this test again",
        dir.display()
    );
    (node, etcdutl)
}

/// A rolling upgrade from the previous release, one member at a time, under steady writes:
/// every acknowledged write is on both members afterwards; while the members' releases differ
/// the cluster's version is the older one and a feature both new members turn on stays off;
/// it turns on once the last member is upgraded. Prints the writes that failed and the
/// longest pause between two acknowledged writes (measured, not asserted).
#[test]
fn a_rolling_upgrade_from_the_previous_release_keeps_every_write() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (old_node, old_etcdutl) = previous_release();
    let (node, _) = bins();
    let mut c = Cluster::start(&old_node, &old_etcdutl, &[]);
    c.wait_leader(LEADER_WAIT);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (stop, eps) = (stop.clone(), c.endpoints());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let (mut acked, mut failed, mut longest) = (Vec::new(), 0u32, Duration::ZERO);
            let mut last = Instant::now();
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let (k, v) = (format!("u{i:06}"), format!("v{i}"));
                if rt.block_on(put_any(&eps, &k, &v, Duration::from_secs(10))) {
                    acked.push((k, v));
                    longest = longest.max(last.elapsed());
                    last = Instant::now();
                } else {
                    failed += 1;
                }
                i += 1;
            }
            (acked, failed, longest)
        })
    };
    let gate = format!("{GATE}=true");
    let here = env!("CARGO_PKG_VERSION");
    std::thread::sleep(Duration::from_secs(2));
    c.set_binary(node);
    c.stop(0);
    c.start_member_with(0, &["--feature-gates", &gate], &[]);
    // Mixed: the cluster's version, once the upgraded member leads (an older leader decides
    // nothing), is the older release's, and the feature stays off.
    let all = c.endpoints();
    let id0 = member_id(
        &ok(etcdctl(&all, &["member", "list"], None)),
        &c.members[0].name,
    );
    let started = Instant::now();
    while c.metric(0, "etcd_server_is_leader") != Some(1.0) {
        let _ = etcdctl(&all, &["move-leader", &id0], None);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the upgraded member never took the lead"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let started = Instant::now();
    while version_page(&c, 0)["etcdnodecluster"] != "0.1.0" {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the mixed cluster's version: {}",
            version_page(&c, 0)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    assert!(!feature_on(&version_page(&c, 0)), "{}", version_page(&c, 0));
    c.stop(1);
    c.start_member_with(1, &["--feature-gates", &gate], &[]);
    wait_versions(&c, "the upgraded cluster", |v| {
        v["etcdnodecluster"] == here && feature_on(v)
    });
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let (acked, failed, longest) = writer.join().unwrap();
    eprintln!(
        "rolling upgrade: {} writes acknowledged, {failed} failed, longest pause between \
         acknowledged writes {longest:?}",
        acked.len()
    );
    assert!(
        acked.len() > 20,
        "too few writes went through: {}",
        acked.len()
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    for i in 0..2 {
        let started = Instant::now();
        loop {
            let have: std::collections::HashMap<String, String> = rt
                .block_on(local_keys(&c.members[i].url(), "u"))
                .unwrap_or_default()
                .into_iter()
                .collect();
            let missing = acked.iter().filter(|(k, v)| have.get(k) != Some(v)).count();
            if missing == 0 {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "member {i} lacks {missing} acknowledged writes; its log:\n{}",
                c.log(i)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Going back across a key-space format change as docs/operations.md says ("Upgrades and going
/// back"). First the natural mistake: the previous release started on this release's data
/// directory does not start, and this release then still serves every value from it. Then the
/// way back: a snapshot saved from this release, restored by the previous release's etcdutl
/// into new data directories with the witness cleaned, gives the previous release every value
/// whole. Among them are values this release stores compressed (a third of them: JSON that LZ4
/// shrinks far more than the eighth it asks), which a snapshot must carry as they were written.
#[test]
fn going_back_to_the_previous_release_through_a_snapshot_keeps_every_value() {
    let (old_node, old_etcdutl) = previous_release();
    let (node, _) = bins();
    let mut c = cluster();
    let leader = c.wait_leader(LEADER_WAIT);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut want: Vec<(String, String)> = (0..30u64)
        .map(|i| {
            let value = match i % 3 {
                0 => format!(
                    r#"{{"kind":"ConfigMap","metadata":{{"name":"cm-{i}"}},"data":{{"a":"{}"}}}}"#,
                    "x".repeat(300)
                ),
                1 => e2e_tests::incompressible(300, i),
                _ => format!("v{i}"),
            };
            (format!("b/{i:02}"), value)
        })
        .collect();
    want.sort();
    let at = c.members[leader].url();
    for (k, v) in &want {
        let put = rt.block_on(put_until(&at, k, v, Duration::from_secs(10)));
        assert!(put, "the put of {k} was not acknowledged");
    }
    let file = c.dir.path().join("back.db");
    let file_arg = file.to_str().unwrap();
    let leader_ep = [c.members[leader].endpoint()];
    ok(etcdctl(&leader_ep, &["snapshot", "save", file_arg], None));
    c.stop(0);
    c.stop(1);

    c.set_binary(&old_node);
    c.start_member(0);
    c.wait_exited(
        0,
        "the previous release started on this release's key-space file",
    );
    let log = c.log(0);
    eprintln!(
        "the previous release: {}",
        log.lines().last().unwrap_or_default()
    );
    c.kill(0); // (reaps it)
    c.set_binary(node);
    c.start_member(0);
    c.start_member(1);
    c.wait_leader(LEADER_WAIT);
    for m in &c.members {
        rt.block_on(wait_caught_up(&m.url(), "b/", &want));
    }
    c.stop(0);
    c.stop(1);

    ok(etcdutl_of(
        &old_etcdutl,
        &witness_init_forced(&c.witness_url),
    ));
    for i in 0..2 {
        let dir = c.data_dir(i);
        std::fs::rename(&dir, dir.with_extension("newer")).unwrap();
        ok(etcdutl_of(
            &old_etcdutl,
            &restore_args(&c, i, file_arg, "back"),
        ));
    }
    c.set_binary(&old_node);
    c.start_member(0);
    c.start_member(1);
    c.wait_leader(LEADER_WAIT);
    for m in &c.members {
        rt.block_on(wait_caught_up(&m.url(), "b/", &want));
    }
}

/// `etcdctl member update` gives a member new peer URLs, as etcd's: the member, restarted
/// listening on the new URL, is reached there and catches up; the member list shows it. The
/// witness and a URL another member has are refused with messages.
#[test]
fn member_update_moves_a_members_peer_url() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let follower = 1 - leader;
    let eps = vec![c.members[leader].url()];
    let list = ok(etcdctl(&eps, &["member", "list"], None));
    let id = member_id(&list, &c.members[follower].name);
    let witness_id = list
        .lines()
        .find(|l| l.contains("witness:"))
        .and_then(|l| l.split(", ").next())
        .unwrap()
        .to_string();
    refused_with(
        etcdctl(
            &eps,
            &[
                "member",
                "update",
                &witness_id,
                "--peer-urls=http://127.0.0.1:1",
            ],
            None,
        ),
        "is the witness",
    );
    let taken = format!("--peer-urls={}", c.members[leader].peer_url());
    refused_with(
        etcdctl(&eps, &["member", "update", &id, &taken], None),
        "Peer URLs already exists",
    );
    c.stop(follower);
    let url = c.move_peer_port(follower);
    ok(etcdctl(
        &eps,
        &["member", "update", &id, &format!("--peer-urls={url}")],
        None,
    ));
    let mut acked = Vec::new();
    for i in 0..20 {
        let (k, v) = (format!("m{i:02}"), format!("v{i}"));
        assert!(rt.block_on(put_until(&eps[0], &k, &v, Duration::from_secs(10))));
        acked.push((k, v));
    }
    c.start_member(follower);
    rt.block_on(wait_caught_up(&c.members[follower].url(), "m", &acked));
    let list = ok(etcdctl(&eps, &["member", "list"], None));
    assert!(list.contains(&url), "{list}");
}

/// Runs `etcdutl cluster reconcile` against `endpoints` with `desired` (YAML written to a
/// file in `dir`): its exit status and what it printed.
fn reconcile(dir: &Path, endpoints: &[String], desired: &str, apply: bool) -> (i32, String) {
    let file = dir.join("desired.yaml");
    std::fs::write(&file, desired).unwrap();
    let mut args = vec![
        "cluster".to_string(),
        "reconcile".into(),
        format!("--endpoints={}", endpoints.join(",")),
        format!("--desired={}", file.display()),
    ];
    if apply {
        args.push("--apply".into());
    }
    let out = std::process::Command::new(bins().1)
        .args(&args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("etcdutl {}:\n{text}", args.join(" "));
    (out.status.code().unwrap_or(-1), text)
}

/// The desired file for `members` (name, peer URL) and the witness at `witness`.
fn desired_yaml(members: &[(&str, String)], witness: &str) -> String {
    let mut y = String::from("members:\n");
    for (name, url) in members {
        y += &format!("  - name: {name}\n    peer-urls: [\"{url}\"]\n");
    }
    y + &format!("witness:\n  name: w\n  url: \"{witness}\"\n")
}

/// The member list as (name, first peer URL, learner?) rows, sorted.
fn member_rows(endpoints: &[String]) -> Vec<String> {
    let list = ok(etcdctl(endpoints, &["member", "list", "-w", "json"], None));
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    let mut rows: Vec<String> = v["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{} {} {}",
                m["name"].as_str().unwrap_or(""),
                m["peerURLs"][0].as_str().unwrap_or(""),
                m["isLearner"].as_bool().unwrap_or(false)
            )
        })
        .collect();
    rows.sort();
    rows
}

/// `etcdutl cluster reconcile`: a healthy cluster as desired is left untouched (dry run and
/// --apply); the witness is moved to a new, empty location (initialised by the reconciler);
/// a dead member is replaced in the witness-safe order (the replacement added as a learner, the
/// reconciler waiting, exit 2, until the operator starts it, then promoted, and only then the
/// dead member removed); an extra member is removed. Writes go on and the new member holds them.
#[test]
fn the_reconciler_moves_the_witness_replaces_a_dead_member_and_removes_an_extra_one() {
    let mut c = cluster();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = c.wait_leader(LEADER_WAIT);
    let dead = 1 - leader;
    let dir = c.dir.path().to_path_buf();
    let lead_eps = vec![c.members[leader].url()];
    let peer = |c: &Cluster, i: usize| (c.members[i].name.clone(), c.members[i].peer_url());
    let (n_lead, u_lead) = peer(&c, leader);
    let (n_dead, u_dead) = peer(&c, dead);
    let as_is = desired_yaml(
        &[(n_lead.as_str(), u_lead.clone()), (n_dead.as_str(), u_dead)],
        &c.witness_url,
    );
    let before = member_rows(&lead_eps);
    for apply in [false, true] {
        let (code, out) = reconcile(&dir, &c.endpoints(), &as_is, apply);
        assert_eq!(code, 0, "{out}");
        assert!(out.contains("nothing to do"), "{out}");
    }
    assert_eq!(
        member_rows(&lead_eps),
        before,
        "a healthy cluster was changed"
    );

    // The witness moves to an empty directory.
    let w2_dir = dir.join("witness2");
    std::fs::create_dir_all(&w2_dir).unwrap();
    let w2 = WitnessUrl::mount(&w2_dir).unwrap().to_url_string();
    let (n_dead, u_dead) = peer(&c, dead);
    let moved = desired_yaml(
        &[(n_lead.as_str(), u_lead.clone()), (n_dead.as_str(), u_dead)],
        &w2,
    );
    let (code, out) = reconcile(&dir, &c.endpoints(), &moved, false);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("would: member remove") && out.contains("the witness"),
        "{out}"
    );
    assert_eq!(
        member_rows(&lead_eps),
        before,
        "a dry run changed the cluster"
    );
    let (code, out) = reconcile(&dir, &c.endpoints(), &moved, true);
    assert_eq!(code, 0, "{out}");
    let rows = member_rows(&lead_eps);
    assert!(rows.iter().any(|r| r.contains("witness2")), "{rows:?}");
    assert!(rt.block_on(put_until(&lead_eps[0], "r1", "v", Duration::from_secs(30))));

    // A member dies for good; its replacement n2 is listed instead.
    c.kill(dead);
    let n2 = c.new_member("n9");
    let u2 = c.members[n2].peer_url();
    let replaced = desired_yaml(
        &[(n_lead.as_str(), u_lead.clone()), ("n9", u2.clone())],
        &w2,
    );
    let (code, out) = reconcile(&dir, &lead_eps, &replaced, true);
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("member add n9 --learner") && out.contains("wait: learner n9"),
        "{out}"
    );
    let rows = member_rows(&lead_eps);
    assert!(
        rows.iter().any(|r| r.starts_with(&format!("{n_dead} "))),
        "the dead member was removed before its replacement voted: {rows:?}"
    );
    c.start_member(n2);
    // (run again, as a periodic job would, until n2 has started and announced itself)
    let started = Instant::now();
    let out = loop {
        let (code, out) = reconcile(&dir, &lead_eps, &replaced, true);
        if code == 0 {
            break out;
        }
        assert!(
            code == 2 && out.contains("wait: learner n9") && !out.contains("step"),
            "{out}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{out}\nn9's log:\n{}",
            c.log(n2)
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let promoted = out.find("member promote").expect("a promotion");
    let removed = out
        .find(&format!("({n_dead})"))
        .expect("the dead member removed");
    assert!(promoted < removed, "removed before the promotion: {out}");
    assert!(rt.block_on(put_until(&lead_eps[0], "r2", "v", Duration::from_secs(30))));

    // An extra member (a learner someone added and started) is removed.
    let n3 = c.new_member("n8");
    let u3 = format!("--peer-urls={}", c.members[n3].peer_url());
    ok(etcdctl(
        &lead_eps,
        &["member", "add", "n8", &u3, "--learner"],
        None,
    ));
    c.start_member(n3);
    let started = Instant::now();
    while !member_rows(&lead_eps).iter().any(|r| r.starts_with("n8 ")) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "n8 never announced itself"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, out) = reconcile(&dir, &lead_eps, &replaced, true);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("(n8)"), "{out}");
    let rows = member_rows(&lead_eps);
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(
        rows.iter()
            .any(|r| r.starts_with("n9 ") && r.ends_with("false")),
        "{rows:?}"
    );
    let want = [
        ("r1".to_string(), "v".to_string()),
        ("r2".to_string(), "v".to_string()),
    ];
    rt.block_on(wait_caught_up(&c.members[n2].url(), "r", &want));
}
