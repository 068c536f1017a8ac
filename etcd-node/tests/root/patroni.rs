//! Patroni, the PostgreSQL high-availability manager, on etcd-node (needs root: PostgreSQL
//! runs as `postgres`).

use std::path::Path;

use e2e_tests::cluster::Cluster;

/// Patroni (Debian's 3.0.2) managing two PostgreSQL 15 servers on the two members, as on two
/// machines: `tests/python/patroni_check.py` bootstraps, switches over, then kills -9 the
/// primary's whole machine (Patroni, PostgreSQL and its etcd-node member); the other
/// PostgreSQL must be promoted with every synchronously committed row. Prints the timings
/// (docs/patroni.md). Needs root (PostgreSQL runs as `postgres`) and Debian's `patroni` and
/// `postgresql-15`, which scripts/test.sh installs.
#[test]
fn patroni_fails_over_two_postgresql_servers_and_loses_no_commit() {
    let c = Cluster::start(
        Path::new(env!("CARGO_BIN_EXE_etcd-node")),
        Path::new(env!("CARGO_BIN_EXE_etcdutl")),
        &[],
    );
    c.wait_leader(std::time::Duration::from_secs(30));
    let dir = tempfile::tempdir().unwrap();
    let ports: Vec<String> = (0..4).map(|_| e2e_tests::free_port().to_string()).collect();
    let script = e2e_tests::workspace_root().join("tests/python/patroni_check.py");
    let pid = c.members[1].pid().expect("member 1 runs").to_string();
    let out = std::process::Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(dir.path().join("patroni"))
        .args([c.members[0].url(), c.members[1].url(), pid])
        .env("PATRONI_PORTS", ports.join(" "))
        .output()
        .expect("run patroni_check.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    let logs = ["patroni0.log", "patroni1.log"]
        .map(|f| std::fs::read_to_string(dir.path().join("patroni").join(f)).unwrap_or_default());
    assert!(
        out.status.success() && stdout.contains("patroni check passed"),
        "{stdout}{}\n--- patroni0.log\n{}\n--- patroni1.log\n{}",
        String::from_utf8_lossy(&out.stderr),
        logs[0],
        logs[1]
    );
}
