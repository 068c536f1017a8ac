//! End to end, the two-datacenter topology (docs/two-datacenters.md): member a in site A,
//! member b in site B, the witness on an sshfs share served from site W (or a blob on
//! Azurite), each in a network namespace of its own, TLS on every URL, a WAN delay on the peer link. Clients in each site
//! write through their own site's member all along. Each failure is checked for: at most one
//! side acknowledging writes while the sites cannot talk, every acknowledged write on both
//! members once healed, `endpoint hashkv` agreeing at the end; and the time from the fault to
//! the first acknowledged write sent after it is printed (`TWO-SITE` lines; the table in
//! docs/two-datacenters.md comes from them). Needs root for `ip netns` (CI runs as root).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use e2e_tests::cluster::{etcdctl, two_hashes_agree};
use e2e_tests::two_sites::{TwoSites, WitnessKind};
use etcd_client::{Client, GetOptions};
use etcd_node::tls::{Dialer, Policy, RECHECK, Side};

/// The WAN's delay each way on the peer link (a 30 ms round trip).
const ONE_WAY: Duration = Duration::from_millis(15);
/// How long after a fault the cluster may take to settle before "one side only" is checked
/// (two election timeouts).
const SETTLE: Duration = Duration::from_secs(2);

/// A write that was acknowledged.
#[derive(Debug, Clone)]
struct Ack {
    site: usize,
    key: String,
    sent: Instant,
}

/// Clients in both sites: each writes through its own site's member, one put at a time.
struct Load {
    acks: Arc<Mutex<Vec<Ack>>>,
    errors: Arc<Mutex<[String; 2]>>,
    stop: Arc<AtomicBool>,
    runtime: tokio::runtime::Runtime,
}

fn dialer(sites: &TwoSites) -> Dialer {
    let side = Side {
        name: "client",
        trusted_ca_file: Some(sites.pki.join("ca.crt")),
        cert_file: Some(sites.pki.join("root.crt")),
        key_file: Some(sites.pki.join("root.key")),
        ..Side::default()
    };
    Dialer::new(&side, &Policy::default(), RECHECK).expect("a client dialer")
}

async fn client(dialer: &Dialer, url: &str) -> Option<Client> {
    let endpoint = tonic::transport::Endpoint::from_shared(url.to_string())
        .ok()?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(3));
    let channel = dialer.connect(endpoint).await.ok()?;
    Client::from_channel(etcd_client::Channel::Tonic(channel), None)
        .await
        .ok()
}

impl Load {
    fn start(sites: &TwoSites) -> Load {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let acks = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new([String::new(), String::new()]));
        let stop = Arc::new(AtomicBool::new(false));
        for (site, m) in sites.members.iter().enumerate() {
            let (acks, errors, stop) = (acks.clone(), errors.clone(), stop.clone());
            let (dialer, url) = (dialer(sites), m.client_url());
            runtime.spawn(async move {
                let mut n = 0u64;
                let mut c: Option<Client> = None;
                while !stop.load(Ordering::Relaxed) {
                    if c.is_none() {
                        c = client(&dialer, &url).await;
                    }
                    let Some(cl) = c.as_mut() else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    n += 1;
                    let key = format!("{site}/{n:08}");
                    let sent = Instant::now();
                    match cl.put(key.clone(), "v", None).await {
                        Ok(_) => acks.lock().unwrap().push(Ack { site, key, sent }),
                        Err(e) => {
                            errors.lock().unwrap()[site] = e.to_string();
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            });
        }
        Load {
            acks,
            errors,
            stop,
            runtime,
        }
    }

    fn acks(&self) -> Vec<Ack> {
        self.acks.lock().unwrap().clone()
    }

    /// Time from `fault` to the first acknowledged write sent after it (and its site),
    /// waiting up to `limit`.
    fn recovery(&self, fault: Instant, limit: Duration) -> Option<(Duration, usize)> {
        while fault.elapsed() < limit {
            let first = self
                .acks()
                .iter()
                .filter(|a| a.sent >= fault)
                .min_by_key(|a| a.sent)
                .map(|a| (a.sent - fault, a.site));
            if first.is_some() {
                return first;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The sites that had writes acknowledged that were sent in `[from, to)`.
    fn sites_acking(&self, from: Instant, to: Instant) -> Vec<usize> {
        let mut sites: Vec<usize> = self
            .acks()
            .iter()
            .filter(|a| a.sent >= from && a.sent < to)
            .map(|a| a.site)
            .collect();
        sites.sort_unstable();
        sites.dedup();
        sites
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Every key on member `i`, read locally (serializable); None while it does not answer.
fn keys_on(sites: &TwoSites, load: &Load, i: usize) -> Option<std::collections::HashSet<String>> {
    let dialer = dialer(sites);
    let url = sites.members[i].client_url();
    load.runtime.block_on(async {
        let mut c = client(&dialer, &url).await?;
        let opts = GetOptions::new()
            .with_all_keys()
            .with_keys_only()
            .with_serializable();
        let r = c.get("", Some(opts)).await.ok()?;
        Some(
            r.kvs()
                .iter()
                .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                .collect(),
        )
    })
}

/// Waits until both members hold every acknowledged write; panics naming what is missing.
fn all_acked_on_both(sites: &TwoSites, load: &Load, what: &str) {
    let started = Instant::now();
    loop {
        let acked = load.acks();
        let missing: Vec<(usize, String)> = (0..2)
            .flat_map(|i| {
                let held = keys_on(sites, load, i).unwrap_or_default();
                acked
                    .iter()
                    .filter(|a| !held.contains(&a.key))
                    .map(|a| (i, a.key.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what}: acknowledged writes missing after healing (member, key): {:?}...\nlogs:\n{}\n{}",
            &missing[..missing.len().min(10)],
            sites.log(0),
            sites.log(1)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn report(fault: &str, recovery: Option<(Duration, usize)>, load: &Load) {
    let acks = load.acks();
    println!(
        "TWO-SITE fault=\"{fault}\" first_ack_after_ms={} in_site={} acked_total={} acked_a={} acked_b={} lost=0",
        recovery.map_or("none".into(), |(d, _)| d.as_millis().to_string()),
        recovery.map_or("-", |(_, s)| ["A", "B"][s]),
        acks.len(),
        acks.iter().filter(|a| a.site == 0).count(),
        acks.iter().filter(|a| a.site == 1).count(),
    );
}

fn etcdctl_ok(sites: &TwoSites, args: &[&str]) -> String {
    let endpoints: Vec<String> = sites.members.iter().map(|m| m.client_url()).collect();
    let tls = sites.etcdctl_tls();
    let all: Vec<&str> = tls
        .iter()
        .map(String::as_str)
        .chain(args.iter().copied())
        .collect();
    let out = etcdctl(&endpoints, &all, None);
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until one member can take a write (any leader).
fn wait_writable(sites: &TwoSites, limit: Duration) {
    let started = Instant::now();
    let endpoints: Vec<String> = sites.members.iter().map(|m| m.client_url()).collect();
    let tls = sites.etcdctl_tls();
    loop {
        let mut args: Vec<&str> = tls.iter().map(String::as_str).collect();
        args.extend(["--command-timeout=2s", "put", "ready", "1"]);
        if etcdctl(&endpoints, &args, None).status.success() {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "no writes within {limit:?}:\n{}\n{}",
            sites.log(0),
            sites.log(1)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Makes member `i` the leader (etcdctl move-leader), so that each failure starts from the
/// same roles: the failing site's member leading (the longer case).
fn make_leader(sites: &TwoSites, i: usize) {
    let status = etcdctl_ok(sites, &["endpoint", "status", "-w", "json"]);
    let v: serde_json::Value = serde_json::from_str(&status).expect("status json");
    let entries = v.as_array().expect("a list");
    let of = |url: &str| {
        entries
            .iter()
            .find(|e| e["Endpoint"].as_str() == Some(url))
            .map(|e| {
                (
                    e["Status"]["header"]["member_id"].as_u64().unwrap_or(0),
                    e["Status"]["leader"].as_u64().unwrap_or(0),
                )
            })
    };
    let urls: Vec<String> = sites.members.iter().map(|m| m.client_url()).collect();
    let (Some((target, leader)), Some((other, _))) = (of(&urls[i]), of(&urls[1 - i])) else {
        panic!("no status for both members: {status}");
    };
    if leader == target {
        wait_both_in_r(sites, i);
        return;
    }
    assert_eq!(leader, other, "a leader that is neither member: {status}");
    let tls = sites.etcdctl_tls();
    let mut args: Vec<&str> = tls.iter().map(String::as_str).collect();
    let id = format!("{target:x}");
    args.extend(["move-leader", &id]);
    let out = etcdctl(&urls[1 - i..2 - i], &args, None);
    assert!(
        out.status.success(),
        "move-leader: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_both_in_r(sites, i);
}

/// Waits until leader `i` replicates to both members again (the witness out of its replication
/// set): right after a healing the witness may still be in R, pinned, and a fault then finds the
/// leader going on alone through the witness's shortcut (safe: the other member cannot be
/// elected), not the case a fault means to test. CI met it once after "WAN cut, both reach
/// the witness".
fn wait_both_in_r(sites: &TwoSites, i: usize) {
    let started = Instant::now();
    while sites.metric(i, "etcd_witness_in_replication_set") != Some(0.0) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the leader kept the witness in its replication set for 30 s:\n{}",
            sites.log(i)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn two_sites_survive_each_failure_with_the_witness_on_a_share() {
    each_failure(WitnessKind::Sshfs);
}

#[test]
fn two_sites_survive_each_failure_with_the_witness_in_a_blob() {
    each_failure(WitnessKind::Azurite);
}

fn each_failure(kind: WitnessKind) {
    let (node, etcdutl) = (
        Path::new(env!("CARGO_BIN_EXE_etcd-node")),
        Path::new(env!("CARGO_BIN_EXE_etcdutl")),
    );
    let mut sites = TwoSites::start(node, etcdutl, ONE_WAY, kind);
    println!("TWO-SITE witness={kind:?}");
    wait_writable(&sites, Duration::from_secs(30));
    let load = Load::start(&sites);
    std::thread::sleep(Duration::from_secs(2));
    let limit = Duration::from_secs(30);

    // 1. Site A lost (its member leading): the member killed and the site cut off.
    make_leader(&sites, 0);
    let fault = Instant::now();
    sites.kill(0);
    sites.set_site_up(0, false);
    let recovered = load.recovery(fault, limit);
    report("site A lost", recovered, &load);
    assert!(
        recovered.is_some(),
        "site B never took writes:\n{}\n{}",
        sites.log(0),
        sites.log(1)
    );
    std::thread::sleep(Duration::from_secs(1));
    sites.set_site_up(0, true);
    sites.start_member(0);
    all_acked_on_both(&sites, &load, "after site A returned");

    // 2. The WAN between A and B cut (A leading); both reach the witness.
    make_leader(&sites, 0);
    let fault = Instant::now();
    sites.cut_wan(true);
    let recovered = load.recovery(fault, limit);
    std::thread::sleep(SETTLE + Duration::from_secs(2));
    let acking = load.sites_acking(fault + SETTLE, Instant::now());
    report("WAN cut, both sites reach the witness", recovered, &load);
    assert!(recovered.is_some(), "no side took writes");
    assert_eq!(
        acking.len(),
        1,
        "one side only acknowledges while cut: {acking:?}"
    );
    sites.cut_wan(false);
    all_acked_on_both(&sites, &load, "after the WAN healed");

    // 3. The WAN cut (A leading), and only B reaches the witness.
    make_leader(&sites, 0);
    let fault = Instant::now();
    sites.cut_wan(true);
    sites.cut_witness(0, true);
    let recovered = load.recovery(fault, limit);
    std::thread::sleep(SETTLE + Duration::from_secs(2));
    let acking = load.sites_acking(fault + SETTLE, Instant::now());
    report("WAN cut, only B reaches the witness", recovered, &load);
    assert_eq!(acking, [1], "site B alone acknowledges");
    sites.cut_witness(0, false);
    sites.cut_wan(false);
    all_acked_on_both(&sites, &load, "after the WAN and A's witness link healed");

    // 4. The witness site lost while both members run: no effect... (its connections reset
    // and refused: an sshfs mount whose server vanished silently, with the link down, left
    // a request unanswered for good, and every later access waited behind it even after the
    // server returned; docs/two-datacenters.md)
    let fault = Instant::now();
    sites.cut_witness(0, true);
    sites.cut_witness(1, true);
    let recovered = load.recovery(fault, limit);
    std::thread::sleep(Duration::from_secs(2));
    report("witness site lost, both members up", recovered, &load);
    assert_eq!(
        load.sites_acking(fault + Duration::from_secs(1), Instant::now()),
        [0, 1],
        "both sites go on writing"
    );
    // ...then a member lost too (the leader, b): no writes, clear errors...
    make_leader(&sites, 1);
    let leader_gone = Instant::now();
    sites.kill(1);
    std::thread::sleep(SETTLE + Duration::from_secs(3));
    let during = load.sites_acking(leader_gone + SETTLE, Instant::now());
    assert!(
        during.is_empty(),
        "writes acknowledged with one member and no witness: {during:?}"
    );
    let error = load.errors.lock().unwrap()[0].clone();
    println!("TWO-SITE error while unavailable (site A's client): {error}");
    assert!(
        error.contains("etcdserver") || error.contains("timed out") || error.contains("Timeout"),
        "an unclear error: {error}"
    );
    // ...until the witness returns.
    let back = Instant::now();
    sites.cut_witness(0, false);
    sites.cut_witness(1, false);
    let recovered = load.recovery(back, Duration::from_secs(60));
    report(
        "witness lost, then member b lost; the witness returns",
        recovered,
        &load,
    );
    assert!(
        recovered.is_some(),
        "member a did not resume with the witness:\n{}",
        sites.log(0)
    );
    sites.start_member(1);
    all_acked_on_both(&sites, &load, "after member b returned");

    // The end: both members hold the same key space.
    load.stop.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(1));
    all_acked_on_both(&sites, &load, "at the end");
    let started = Instant::now();
    loop {
        let out = etcdctl_ok(&sites, &["endpoint", "hashkv"]);
        if two_hashes_agree(&out) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "hashes differ:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("TWO-SITE acknowledged={} lost=0", load.acks().len());
    if std::env::var_os("TWO_SITES_LOGS").is_some() {
        println!("member a:\n{}\nmember b:\n{}", sites.log(0), sites.log(1));
    }
}
