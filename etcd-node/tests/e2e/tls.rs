//! End to end, TLS: two members with TLS on every client and peer URL and client
//! certificates required on both, driven by the real `etcdctl` 3.4 (and curl for `/health`);
//! certificate identities with auth on; a member whose certificate another CA signed is
//! refused, then admitted once its certificate files are replaced (no restart); and a real
//! etcd YAML config file (TLS sections, auto-TLS, auto compaction, keys without an effect).
//! Certificates are made at run time (`e2e_tests::pki`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::{LEADER_WAIT, bins, ok_all, text};
use e2e_tests::cluster::{Cluster, etcdctl, two_hashes_agree};
use e2e_tests::pki::Ca;
use e2e_tests::within;

/// etcdctl's TLS flags for the certificate `<pki>/<name>.crt`.
fn as_user(pki: &Path, name: &str) -> Vec<String> {
    let f = |s: String| pki.join(s).to_string_lossy().into_owned();
    vec![
        format!("--cacert={}", f("ca.crt".into())),
        format!("--cert={}", f(format!("{name}.crt"))),
        format!("--key={}", f(format!("{name}.key"))),
    ]
}

fn run(c: &Cluster, tls: &[String], args: &[&str]) -> Output {
    let all: Vec<&str> = tls
        .iter()
        .map(String::as_str)
        .chain(args.iter().copied())
        .collect();
    etcdctl(&c.endpoints(), &all, None)
}

/// A TLS cluster in a fresh directory whose CA signed n1's and n2's certificates (and the
/// client certificates `users` name).
fn tls_cluster(users: &[&str]) -> (tempfile::TempDir, PathBuf, Ca, Cluster) {
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = dir.path().join("pki");
    let ca = Ca::new("test CA");
    for name in ["n1", "n2"] {
        ca.write(&pki, name, "etcd-member", &["127.0.0.1", "localhost"]);
    }
    for user in users {
        ca.write(&pki, user, user, &[]);
    }
    let (node, etcdutl) = bins();
    let c = Cluster::start_tls(node, etcdutl, &pki, &[]);
    (dir, pki, ca, c)
}

#[test]
fn etcdctl_works_over_tls_with_client_certificates() {
    let (_dir, pki, _ca, c) = tls_cluster(&["root", "alice"]);
    c.wait_leader(LEADER_WAIT);
    let urls = c.endpoints();
    assert!(urls.iter().all(|u| u.starts_with("https://")), "{urls:?}");
    let root = as_user(&pki, "root");
    ok_all(run(&c, &root, &["put", "k", "v"]));
    assert!(ok_all(run(&c, &root, &["get", "k"])).contains("v"));
    // Every member-to-member call (replication, the commands that ask each member) over TLS.
    for args in [
        &["endpoint", "status", "--cluster", "-w", "table"][..],
        &["endpoint", "health", "--cluster"],
        &["endpoint", "hashkv", "--cluster"],
        &["member", "list"],
    ] {
        let out = ok_all(run(&c, &root, args));
        for m in &c.members {
            assert!(out.contains(&m.url()), "{args:?}:\n{out}");
        }
    }
    let hashes = ok_all(run(&c, &root, &["endpoint", "hashkv"]));
    assert!(two_hashes_agree(&hashes), "{hashes}");
    // The maintenance commands that dial each member (defrag --cluster), stream a snapshot,
    // or move the leader, over TLS.
    let defrag = ok_all(run(&c, &root, &["defrag", "--cluster"]));
    assert_eq!(
        defrag.matches("Finished defragmenting").count(),
        2,
        "{defrag}"
    );
    let snapshot = pki.join("backup.db");
    let mut save: Vec<&str> = root.iter().map(String::as_str).collect();
    save.extend(["snapshot", "save", snapshot.to_str().expect("utf-8 path")]);
    ok_all(etcdctl(&urls[..1], &save, None));
    assert!(
        std::fs::metadata(&snapshot)
            .expect("the snapshot file")
            .len()
            > 0
    );
    let status = ok_all(run(&c, &root, &["endpoint", "status", "-w", "json"]));
    let follower = follower_id(&status).expect("a follower's member id");
    let moved = ok_all(run(&c, &root, &["move-leader", &follower]));
    assert!(moved.contains("Leadership transferred"), "{moved}");
    // /health on the same TLS listener (HTTP/1.1 for curl).
    let (code, body) = c.http_get(0, "/health").expect("/health over https");
    assert_eq!(code, 200, "{body}");

    // No client certificate, or plain text to a TLS port: refused.
    let ca_only = vec![root[0].clone()];
    assert!(
        !run(&c, &ca_only, &["--dial-timeout=2s", "get", "k"])
            .status
            .success()
    );
    let plain: Vec<String> = urls
        .iter()
        .map(|u| u.replace("https://", "http://"))
        .collect();
    assert!(
        !etcdctl(
            &plain,
            &["--dial-timeout=2s", "--command-timeout=3s", "get", "k"],
            None
        )
        .status
        .success()
    );

    // With auth on, the certificate's CommonName is the user (no password).
    ok_all(run(&c, &root, &["user", "add", "root:rootpw"]));
    ok_all(run(&c, &root, &["user", "grant-role", "root", "root"]));
    ok_all(run(&c, &root, &["auth", "enable"]));
    ok_all(run(&c, &root, &["put", "k", "by-root"]));
    let alice = as_user(&pki, "alice");
    let denied = run(&c, &alice, &["put", "a/1", "x"]);
    assert!(
        !denied.status.success(),
        "a certificate naming no user may do nothing"
    );
    assert!(
        text(&denied).contains("permission denied"),
        "{}",
        text(&denied)
    );
    ok_all(run(&c, &root, &["user", "add", "alice:alicepw"]));
    ok_all(run(&c, &root, &["role", "add", "a-writer"]));
    ok_all(run(
        &c,
        &root,
        &[
            "role",
            "grant-permission",
            "a-writer",
            "readwrite",
            "a/",
            "--prefix=true",
        ],
    ));
    ok_all(run(&c, &root, &["user", "grant-role", "alice", "a-writer"]));
    ok_all(run(&c, &alice, &["put", "a/1", "x"]));
    assert!(
        !run(&c, &alice, &["put", "k", "x"]).status.success(),
        "outside alice's role"
    );
    // A password still wins over the certificate, as in etcd (alice's certificate, root's name).
    let mut alice_as_root = alice.clone();
    alice_as_root.push("--user=root:rootpw".into());
    ok_all(run(&c, &alice_as_root, &["put", "k", "by-root-password"]));

    // The JSON gateway on the same TLS port: the certificate's name is the user there too.
    // (base64: "YS8y" is a/2, "aw==" k, "eA==" x)
    let put_a2 = r#"{"key":"YS8y","value":"eA=="}"#;
    let (code, body) = gateway(&c, &pki, "alice", "/v3/kv/put", put_a2);
    assert_eq!(code, 200, "{body}");
    let (code, body) = gateway(
        &c,
        &pki,
        "alice",
        "/v3/kv/put",
        r#"{"key":"aw==","value":"eA=="}"#,
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("etcdserver: permission denied"), "{body}");
    let (code, body) = gateway(&c, &pki, "root", "/v3/kv/range", r#"{"key":"YS8y"}"#);
    assert!(
        code == 200 && body.contains(r#""value":"eA==""#),
        "{code} {body}"
    );
}

/// curl's POST of `body` to the gateway's `call` on member 0, with `user`'s certificate: the
/// HTTP status and the body.
fn gateway(c: &Cluster, pki: &Path, user: &str, call: &str, body: &str) -> (u16, String) {
    let out = std::process::Command::new("curl")
        .args(["-s", "-w", "\n%{http_code}", "--cacert"])
        .arg(pki.join("ca.crt"))
        .arg("--cert")
        .arg(pki.join(format!("{user}.crt")))
        .arg("--key")
        .arg(pki.join(format!("{user}.key")))
        .args(["-X", "POST", "-d", body])
        .arg(format!("{}{call}", c.members[0].url()))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// The member id (hex) of a member that is not the leader, from `endpoint status -w json`.
fn follower_id(json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    v.as_array()?.iter().find_map(|e| {
        let header = &e["Status"]["header"];
        let member = header["member_id"].as_u64()?;
        (e["Status"]["leader"].as_u64()? != member).then(|| format!("{member:x}"))
    })
}

#[test]
fn a_peer_certificate_from_another_ca_is_refused_until_replaced() {
    let (_dir, pki, ca, mut c) = tls_cluster(&["root"]);
    let leader = c.wait_leader(LEADER_WAIT);
    let other = 1 - leader;
    let root = as_user(&pki, "root");
    ok_all(run(&c, &root, &["put", "before", "1"]));
    // The other member comes back with a certificate the cluster's CA did not sign (its own
    // CA file still the cluster's, so it is the leader that must refuse it).
    c.stop(other);
    let name = c.members[other].name.clone();
    let (cert, key) = Ca::new("another CA").issue("etcd-member", &["127.0.0.1", "localhost"]);
    std::fs::write(pki.join(format!("{name}.crt")), cert).unwrap();
    std::fs::write(pki.join(format!("{name}.key")), key).unwrap();
    c.start_member(other);
    assert!(
        within(Duration::from_secs(20), || {
            c.log(leader).contains("refused a TLS connection")
        }),
        "the leader did not log the refused peer:\n{}",
        c.log(leader)
    );
    let log = c.log(leader);
    let line = log
        .lines()
        .find(|l| l.contains("refused a TLS connection"))
        .unwrap();
    assert!(
        line.contains("side=\"peer\"") || line.contains("side=peer"),
        "{line}"
    );
    assert!(
        line.to_lowercase().contains("certificate"),
        "says why: {line}"
    );
    // The leader goes on with the witness; the refused member has not caught up.
    ok_all(run(&c, &root, &["put", "during", "2"]));
    // A certificate from the right CA, written over the files while the member runs: picked up
    // at its next connection, without a restart.
    ca.write(&pki, &name, "etcd-member", &["127.0.0.1", "localhost"]);
    let endpoint = vec![c.members[other].url()];
    let mut args: Vec<String> = root.clone();
    args.extend(["--consistency=s", "get", "during", "--print-value-only"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert!(
        within(Duration::from_secs(30), || {
            let out = etcdctl(&endpoint, &args, None);
            out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "2"
        }),
        "the member did not catch up after its certificate was replaced:\n{}",
        c.log(other)
    );
}

/// etcd's own YAML (keys etcd-node ignores, TLS sections, auto-TLS, auto compaction,
/// max-request-bytes) starts a member; a one-member cluster suffices.
#[test]
fn a_real_etcd_config_file_starts_with_a_warning_for_ignored_keys() {
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (e2e_tests::free_port(), e2e_tests::free_port());
    let yaml = format!(
        "name: solo\n\
         data-dir: {data}\n\
         wal-dir:\n\
         snapshot-count: 10000\n\
         heartbeat-interval: 100\n\
         election-timeout: 1000\n\
         quota-backend-bytes: 0\n\
         listen-peer-urls: http://127.0.0.1:{peer}\n\
         listen-client-urls: https://127.0.0.1:{client}\n\
         max-snapshots: 5\n\
         max-wals: 5\n\
         cors:\n\
         initial-advertise-peer-urls: http://127.0.0.1:{peer}\n\
         advertise-client-urls: https://127.0.0.1:{client}\n\
         discovery:\n\
         discovery-fallback: 'proxy'\n\
         initial-cluster: solo=http://127.0.0.1:{peer}\n\
         initial-cluster-token: 'etcd-cluster'\n\
         initial-cluster-state: 'new'\n\
         strict-reconfig-check: false\n\
         enable-v2: true\n\
         enable-pprof: true\n\
         proxy: 'off'\n\
         client-transport-security:\n\
         \x20 cert-file:\n\
         \x20 key-file:\n\
         \x20 client-cert-auth: false\n\
         \x20 trusted-ca-file:\n\
         \x20 auto-tls: true\n\
         peer-transport-security:\n\
         \x20 auto-tls: false\n\
         log-level: info\n\
         logger: zap\n\
         log-outputs: [stderr]\n\
         force-new-cluster: false\n\
         auto-compaction-mode: periodic\n\
         auto-compaction-retention: \"1s\"\n\
         max-request-bytes: 10000\n\
         cipher-suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]\n\
         tls-min-version: 'TLS1.2'\n",
        data = dir.path().join("solo.etcd").display()
    );
    let file = dir.path().join("etcd.conf.yml");
    std::fs::write(&file, yaml).unwrap();
    let log_path = dir.path().join("solo.log");
    let child = Command::new(bins().0)
        .arg("--config-file")
        .arg(&file)
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _member = Stop(child);
    let endpoint = vec![format!("https://127.0.0.1:{client}")];
    let insecure = ["--insecure-transport=false", "--insecure-skip-tls-verify"];
    let put = |k: &str, v: &str| {
        let mut args = insecure.to_vec();
        args.extend(["put", k, v]);
        etcdctl(&endpoint, &args, None)
    };
    assert!(
        within(Duration::from_secs(20), || put("k", "1").status.success()),
        "the member did not serve:\n{}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    let warning = log
        .lines()
        .find(|l| l.contains("have no effect"))
        .unwrap_or_else(|| panic!("no warning naming the ignored keys:\n{log}"));
    for key in [
        "max-snapshots",
        "max-wals",
        "enable-v2",
        "enable-pprof",
        "logger",
        "log-outputs",
        "proxy",
    ] {
        assert!(warning.contains(key), "{key} not named: {warning}");
    }
    for unset in ["strict-reconfig-check", "wal-dir", "cors"] {
        assert!(!warning.contains(unset), "{unset} was not set: {warning}");
    }
    // An empty wal-dir (etcd's default) keeps the WAL in the data directory.
    assert!(dir.path().join("solo.etcd/member/wal").is_dir());
    // The certificate auto-TLS made is in the data directory.
    assert!(
        dir.path()
            .join("solo.etcd/fixtures/client/cert.pem")
            .exists()
    );
    // --max-request-bytes: a put past it is refused with etcd's error.
    let big = "x".repeat(20_000);
    let refused = put("big", &big);
    assert!(!refused.status.success());
    assert!(
        text(&refused).contains("request is too large"),
        "{}",
        text(&refused)
    );
    // Auto compaction (periodic, 1 s): the first revision is compacted away in a few seconds.
    put("k", "2");
    let compacted = within(Duration::from_secs(20), || {
        put("k", "3");
        let mut args = insecure.to_vec();
        args.extend(["get", "k", "--rev=1"]);
        text(&etcdctl(&endpoint, &args, None)).contains("compacted")
    });
    assert!(
        compacted,
        "revision 1 was never compacted:\n{}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
}
