//! End to end, the witness changed at run time (issue 13, part 2): real etcd-node processes,
//! the real `etcdutl` and `etcdctl`, a writer that never stops.
//! - refusals first: an uninitialised location, a second witness, a location already used;
//! - the witness moved (remove, then add a freshly initialised one), from a directory to an
//!   Azurite blob to another directory, while a client writes without pause: no write fails;
//!   the longest write pause is printed;
//! - the old location is never written after it left;
//! - the new witness is really used: with the follower killed, the leader commits through it;
//! - removing the witness while the follower is down is refused (it would leave no quorum);
//! - a blob witness's SAS signature is in no member list, snapshot or log; an expiring SAS
//!   shows in `/health`, and a new one in `--witness-sas-file` is used without a restart.

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::{LEADER_WAIT, bins, contents, mount_url, text};
use e2e_tests::azurite::{Azurite, account_sas, account_sas_until, utc_in};
use e2e_tests::cluster::{Cluster, etcdctl, init_witness};
use e2e_tests::eventually;
use etcd_client::{Client, ConnectOptions};

/// `etcdutl witness add` against the cluster.
fn witness_add(etcdutl: &Path, c: &Cluster, url: &str) -> Output {
    Command::new(etcdutl)
        .args(["witness", "add", "--endpoints", &c.endpoints().join(",")])
        .args(["--advertise-peer-url", url])
        .output()
        .expect("run etcdutl")
}

/// The witness member's id (hex) in `etcdctl member list`, if any.
fn witness_id(c: &Cluster) -> Option<String> {
    let out = etcdctl(&c.endpoints(), &["member", "list"], None);
    assert!(out.status.success(), "member list: {}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.contains("witness:"))
        .map(|l| l.split(',').next().unwrap().trim().to_string())
}

/// What a writer saw: writes acknowledged, writes failed (with why), the longest time one
/// write took.
#[derive(Debug, Default)]
struct Writes {
    acked: u64,
    failed: Vec<String>,
    longest: Duration,
}

/// Writes `key-N` one after another through `endpoints` until `stop`: each write may take up
/// to 30 s (the client's own retries included), so a write that fails really failed.
async fn write_until(endpoints: Vec<String>, stop: Arc<AtomicBool>) -> Writes {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(30));
    let mut client = Client::connect(&endpoints, Some(opts))
        .await
        .expect("writer connects");
    let mut w = Writes::default();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        match client.put(format!("key-{i}"), format!("v{i}"), None).await {
            Ok(_) => w.acked += 1,
            Err(e) => w.failed.push(format!("key-{i}: {e}")),
        }
        w.longest = w.longest.max(started.elapsed());
        i += 1;
    }
    w
}

#[test]
fn the_witness_is_moved_at_runtime_under_writes_and_no_write_fails() {
    let (node, etcdutl) = bins();
    // The witness moves from a directory to an Azurite blob to another directory. The blob's
    // SAS token is in each member's --witness-sas-file (the member list holds no secret).
    let azurite = Azurite::start();
    let sas_dir = tempfile::tempdir().unwrap();
    let sas_file = sas_dir.path().join("witness.sas");
    std::fs::write(&sas_file, account_sas()).unwrap();
    let mut c = Cluster::start(
        node,
        etcdutl,
        &[
            "--witness-probe-interval",
            "1s",
            "--witness-sas-file",
            sas_file.to_str().unwrap(),
        ],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    c.wait_leader(LEADER_WAIT);
    let old_id = witness_id(&c).expect("the bootstrap witness is listed");
    let old_dir = c.dir.path().join("witness");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = rt.spawn(write_until(c.endpoints(), stop.clone()));

    // Refused, with what to run: a location nobody initialised...
    let new_url = azurite.witness_url("witness", "moved");
    let blob = || azurite.get_blob("witness", "moved");
    let out = etcdctl(&c.endpoints(), &["member", "remove", &old_id], None);
    assert!(
        out.status.success(),
        "remove the old witness: {}",
        text(&out)
    );
    let removed_at = contents(&old_dir);
    let out = witness_add(etcdutl, &c, &new_url);
    assert!(!out.status.success());
    assert!(
        text(&out).contains("not initialised") && text(&out).contains("etcdutl witness init"),
        "{}",
        text(&out)
    );
    // ...and a location another cluster (here: this one, before) has used.
    let out = witness_add(etcdutl, &c, &c.witness_url);
    assert!(
        !out.status.success() && text(&out).contains("already used"),
        "{}",
        text(&out)
    );
    // A fresh location is added.
    init_witness(etcdutl, "w2", &new_url);
    let out = witness_add(etcdutl, &c, &new_url);
    assert!(out.status.success(), "add the new witness: {}", text(&out));
    assert!(text(&out).contains("\"w2\""), "{}", text(&out));
    let new_id = witness_id(&c).expect("the new witness is listed");
    assert_ne!(new_id, old_id);
    // A second witness is refused, naming the first and the command that removes it.
    let third_dir = c.dir.path().join("witness-3");
    std::fs::create_dir_all(&third_dir).unwrap();
    let third_url = mount_url(&third_dir);
    init_witness(etcdutl, "w3", &third_url);
    let out = witness_add(etcdutl, &c, &third_url);
    assert!(
        !out.status.success()
            && text(&out).contains("already has a witness")
            && text(&out).contains(&format!("etcdctl member remove {new_id}")),
        "{}",
        text(&out)
    );
    // The blob is in use: every member probes it successfully with its own token.
    eventually(
        Duration::from_secs(60),
        "both members probe the blob",
        || (0..2).all(|i| c.http_get(i, "/health").map(|r| r.0) == Some(200)),
    );
    // Moved once more, to the third location, still under writes.
    let out = etcdctl(&c.endpoints(), &["member", "remove", &new_id], None);
    assert!(out.status.success(), "remove: {}", text(&out));
    let second_removed_at = blob();
    let out = witness_add(etcdutl, &c, &third_url);
    assert!(out.status.success(), "add: {}", text(&out));
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let writes = rt.block_on(writer).unwrap();
    println!(
        "writes during four witness changes (directory -> blob -> directory): {} acknowledged, {} failed, longest write {:?}",
        writes.acked,
        writes.failed.len(),
        writes.longest
    );
    assert!(
        writes.failed.is_empty(),
        "failed writes: {:?}",
        writes.failed
    );
    assert!(writes.acked > 0);

    // The third witness is the one in use: with the follower gone, the leader commits through
    // it, and it records this cluster.
    let l = c.wait_leader(LEADER_WAIT);
    c.kill(1 - l);
    let lep = c.members[l].endpoint();
    for i in 0..5 {
        let out = etcdctl(
            std::slice::from_ref(&lep),
            &["put", &format!("after-{i}"), "v"],
            None,
        );
        assert!(
            out.status.success(),
            "put with the follower down: {}",
            text(&out)
        );
    }
    let status = Command::new(etcdutl)
        .args([
            "witness",
            "status",
            "--advertise-peer-url",
            &third_url,
            "-w",
            "json",
        ])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        status["last_log_index"].as_u64() > Some(0) && status["cluster_id"] != "",
        "the new witness acknowledged this cluster's writes: {status}"
    );
    // Removing it now would leave {leader, dead follower}: refused, naming the member.
    let out = etcdctl(
        std::slice::from_ref(&lep),
        &["member", "remove", &witness_id(&c).unwrap()],
        None,
    );
    assert!(
        !out.status.success() && text(&out).contains("no quorum"),
        "{}",
        text(&out)
    );
    // Neither former location was written after it left.
    assert!(
        contents(&old_dir) == removed_at,
        "the first witness was written after it left"
    );
    assert!(
        blob() == second_removed_at,
        "the second witness was written after it left"
    );
}

/// The SAS signature of a blob witness never leaves the members (member list, snapshot, logs),
/// a SAS that expires shows in `/health` within a probe interval, and a new token written to
/// `--witness-sas-file` is used without a restart.
#[test]
fn the_sas_signature_stays_on_the_members_and_is_rotated_without_a_restart() {
    let (node, etcdutl) = bins();
    let azurite = Azurite::start();
    let url = azurite.witness_url("witness", "rotated");
    let dir = tempfile::tempdir().unwrap();
    // Each member reads its token from this file; the first one expires soon.
    let sas_file = dir.path().join("witness.sas");
    let short = account_sas_until(&utc_in(Duration::from_secs(20)));
    std::fs::write(&sas_file, &short).unwrap();
    let sas_flag = sas_file.to_str().unwrap().to_string();
    let mut c = Cluster::start_with(
        dir,
        node,
        etcdutl,
        url.clone(),
        &[
            "--witness-probe-interval",
            "1s",
            "--witness-sas-file",
            &sas_flag,
        ],
    );
    let l = c.wait_leader(LEADER_WAIT);
    let healthy = |c: &Cluster, i: usize| c.http_get(i, "/health").map(|r| r.0) == Some(200);
    eventually(Duration::from_secs(60), "both members healthy", || {
        healthy(&c, 0) && healthy(&c, 1)
    });
    // Every form the two signatures take: raw, escaped in the SAS, escaped again in the URL.
    let mut secrets = Vec::new();
    for sas in [short.as_str(), account_sas().as_str()] {
        let sig = sas.split("sig=").nth(1).unwrap().to_string();
        let raw = percent_encoding::percent_decode_str(&sig)
            .decode_utf8()
            .unwrap()
            .to_string();
        let twice = percent_encoding::utf8_percent_encode(&sig, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
        secrets.extend([raw, sig, twice]);
    }
    let leaks = |what: &str, text: &[u8]| {
        for s in &secrets {
            assert!(
                !text.windows(s.len()).any(|w| w == s.as_bytes()),
                "{what} holds the SAS signature {s}"
            );
        }
    };
    let out = etcdctl(&c.endpoints(), &["member", "list", "-w", "json"], None);
    assert!(out.status.success(), "{}", text(&out));
    leaks("member list", &out.stdout);
    assert!(text(&out).contains("REDACTED"), "{}", text(&out));
    let snap = c.dir.path().join("snap.db");
    let out = etcdctl(
        &[c.members[l].endpoint()],
        &["snapshot", "save", snap.to_str().unwrap()],
        None,
    );
    assert!(out.status.success(), "{}", text(&out));
    leaks("a snapshot", &std::fs::read(&snap).unwrap());

    // The token expires: the probe says so on both members, with what to do.
    eventually(
        Duration::from_secs(60),
        "the expired SAS shows in /health",
        || {
            (0..2).all(|i| {
                c.http_get(i, "/health")
                    .is_some_and(|(code, body)| code == 503 && body.contains("permission denied"))
            })
        },
    );
    // A new token in the file: both members are well again, no restart.
    std::fs::write(&sas_file, account_sas()).unwrap();
    eventually(
        Duration::from_secs(60),
        "healthy again after the rotation",
        || healthy(&c, 0) && healthy(&c, 1),
    );
    // And the witness is usable with it: the follower dies, the leader commits through it.
    let l = c.wait_leader(LEADER_WAIT);
    c.kill(1 - l);
    let out = etcdctl(
        &[c.members[l].endpoint()],
        &["put", "after-rotation", "v"],
        None,
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(c.metric(l, "etcd_witness_writes_total") >= Some(1.0));
    for i in 0..2 {
        leaks(&format!("member {i}'s log"), c.log(i).as_bytes());
    }
}

/// Two clusters add the same freshly initialised witness location: the first `member add`
/// claims it (binds the record to its cluster by compare-and-swap) before proposing, so the
/// second is refused at once, naming the cluster that holds it, and nothing changes there.
/// The first cluster can remove and add it again while it is unused, and then uses it: with
/// its follower killed, its writes go on with the witness's vote.
#[test]
fn a_witness_location_is_claimed_at_add_time_and_a_second_cluster_is_refused() {
    let (node, etcdutl) = bins();
    let mut a = Cluster::start(node, etcdutl, &[]);
    let b = Cluster::start(node, etcdutl, &[]);
    a.wait_leader(LEADER_WAIT);
    b.wait_leader(LEADER_WAIT);
    for c in [&a, &b] {
        let id = witness_id(c).expect("the bootstrap witness is listed");
        let out = etcdctl(&c.endpoints(), &["member", "remove", &id], None);
        assert!(out.status.success(), "remove the witness: {}", text(&out));
    }
    let shared = tempfile::tempdir().unwrap();
    let url = mount_url(shared.path());
    init_witness(etcdutl, "shared", &url);

    let out = witness_add(etcdutl, &a, &url);
    assert!(out.status.success(), "cluster a adds it: {}", text(&out));
    let claimed = contents(shared.path());
    let out = witness_add(etcdutl, &b, &url);
    assert!(
        !out.status.success() && text(&out).contains("claimed by another cluster"),
        "cluster b must be refused at once: {}",
        text(&out)
    );
    assert_eq!(witness_id(&b), None, "cluster b lists no witness");
    assert_eq!(
        contents(shared.path()),
        claimed,
        "the refusal wrote nothing"
    );

    // Claimed and not used yet: cluster a may take it out and add it back.
    let id = witness_id(&a).expect("cluster a lists the witness");
    let out = etcdctl(&a.endpoints(), &["member", "remove", &id], None);
    assert!(out.status.success(), "remove it: {}", text(&out));
    let out = witness_add(etcdutl, &a, &url);
    assert!(out.status.success(), "add it back: {}", text(&out));

    // It is cluster a's witness: the follower killed, writes go on.
    let leader = a.wait_leader(LEADER_WAIT);
    a.kill(1 - leader);
    let ep = vec![a.members[leader].url()];
    eventually(
        Duration::from_secs(30),
        "a write with the witness's acknowledgement",
        || {
            etcdctl(&ep, &["put", "after", "kill"], None)
                .status
                .success()
        },
    );
}
