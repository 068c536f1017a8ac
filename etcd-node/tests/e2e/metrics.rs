//! End to end: `/metrics` as Prometheus and etcd's dashboards read it. The page of a running
//! member, after real `etcdctl` calls (one of them refused), goes through the Prometheus Python
//! client's own text parser (Debian's `python3-prometheus-client`), and the metrics operators
//! alert on have etcd's names, types and buckets.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use e2e_tests::cluster::{Cluster, etcdctl};

/// Parses `page` with the Prometheus client's parser: per sample, (family type, sample name,
/// labels as `k=v,...`) -> value. A page it rejects fails the test with its error.
fn parse(page: &str) -> BTreeMap<(String, String, String), f64> {
    const SCRIPT: &str = "
import sys
from prometheus_client.parser import text_string_to_metric_families
for f in text_string_to_metric_families(sys.stdin.read()):
    for s in f.samples:
        labels = ','.join(k + '=' + v for k, v in sorted(s.labels.items()))
        print(f.type, s.name, labels or '-', repr(float(s.value)))
";
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 (scripts/test.sh installs python3-prometheus-client)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused the page: {}\n{page}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let labels = if f[2] == "-" { "" } else { f[2] };
            let key = (f[0].to_string(), f[1].to_string(), labels.to_string());
            (key, f[3].parse().unwrap())
        })
        .collect()
}

#[test]
fn the_metrics_page_is_prometheus_text_with_etcds_types_and_buckets() {
    let c = Cluster::start(
        Path::new(env!("CARGO_BIN_EXE_etcd-node")),
        Path::new(env!("CARGO_BIN_EXE_etcdutl")),
        &[],
    );
    let l = c.wait_leader(Duration::from_secs(30));
    let ep = [c.members[l].url()];
    for i in 0..5 {
        etcdctl(&ep, &["put", &format!("k{i}"), "v"], None);
    }
    etcdctl(&ep, &["get", "k0"], None);
    // Refused: a revision in the future.
    let future = etcdctl(&ep, &["compact", "1000000"], None);
    assert!(!future.status.success());
    // The leader measures round trips from heartbeats (every 100 ms).
    std::thread::sleep(Duration::from_millis(500));
    let (code, page) = c.http_get(l, "/metrics").expect("/metrics");
    assert_eq!(code, 200);
    let samples = parse(&page);
    let value = |kind: &str, name: &str, labels: &str| {
        samples
            .get(&(kind.to_string(), name.to_string(), labels.to_string()))
            .copied()
            .unwrap_or_else(|| panic!("no {kind} sample {name}{{{labels}}} in:\n{page}"))
    };
    // Histograms with etcd's buckets: 1 ms to 8.192 s for the disk, 0.1 ms to 3.2768 s for
    // round trips.
    // (five puts: five fsyncs at least; the key space holds a batch until the next one comes 5
    // ms later or a reader needs it: a commit for every other put, and one for the get)
    for (name, least) in [
        ("etcd_disk_wal_fsync_duration_seconds", 5.0),
        ("etcd_disk_backend_commit_duration_seconds", 2.0),
    ] {
        let n = value("histogram", &format!("{name}_count"), "");
        assert!(n >= least, "{name}: {n} observations");
        value("histogram", &format!("{name}_bucket"), "le=0.001");
        value("histogram", &format!("{name}_bucket"), "le=8.192");
    }
    let peer = format!("To={:x}", member_id(&c, 1 - l));
    let rtt = "etcd_network_peer_round_trip_time_seconds";
    assert!(value("histogram", &format!("{rtt}_count"), &peer) >= 1.0);
    value(
        "histogram",
        &format!("{rtt}_bucket"),
        &format!("{peer},le=0.0001"),
    );
    assert_eq!(value("gauge", "etcd_server_has_leader", ""), 1.0);
    assert_eq!(value("gauge", "etcd_server_is_leader", ""), 1.0);
    assert!(value("counter", "etcd_server_leader_changes_seen_total", "") >= 1.0);
    assert!(value("gauge", "etcd_server_proposals_committed_total", "") >= 5.0);
    assert!(value("gauge", "etcd_server_proposals_applied_total", "") >= 5.0);
    value("gauge", "etcd_server_proposals_pending", "");
    value("counter", "etcd_server_proposals_failed_total", "");
    assert!(value("gauge", "etcd_mvcc_db_total_size_in_bytes", "") > 0.0);
    assert!(value("gauge", "process_resident_memory_bytes", "") > 0.0);
    let grpc = |method: &str, code: &str| {
        value(
            "counter",
            "grpc_server_handled_total",
            &format!(
                "grpc_code={code},grpc_method={method},grpc_service=etcdserverpb.KV,grpc_type=unary"
            ),
        )
    };
    assert!(grpc("Put", "OK") >= 5.0);
    assert!(grpc("Range", "OK") >= 1.0);
    assert_eq!(grpc("Compact", "OutOfRange"), 1.0);
    assert!(
        value(
            "counter",
            "grpc_server_started_total",
            "grpc_method=Put,grpc_service=etcdserverpb.KV,grpc_type=unary"
        ) >= 5.0
    );
    value("counter", "etcd_witness_steps_total", "step=vote");
    value(
        "histogram",
        "etcd_witness_step_duration_seconds_count",
        "step=vote",
    );
    println!("{} samples parsed", samples.len());
}

/// Member `i`'s id, as its Status names it.
fn member_id(c: &Cluster, i: usize) -> u64 {
    let out = etcdctl(
        &[c.members[i].url()],
        &["endpoint", "status", "-w", "json"],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(&text).expect("status as json");
    json[0]["Status"]["header"]["member_id"]
        .as_u64()
        .expect("member_id")
}
