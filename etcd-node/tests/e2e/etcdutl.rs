//! `etcdutl witness init|status` and `etcdutl snapshot` (moving data in and out of etcd) as an
//! operator runs them: real processes, real directories,
//! a real Azurite. Every failure must be a clear message, a non-zero exit and no change.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use crate::{mount_url, text};
use e2e_tests::azurite::Azurite;
use e2e_tests::etcd::{Etcd, Release};

fn etcdutl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_etcdutl"))
        .args(args)
        .output()
        .expect("run etcdutl")
}

/// `etcdutl witness init --name NAME --advertise-peer-url URL [extra...]`
fn init(name: &str, url: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "witness",
        "init",
        "--name",
        name,
        "--advertise-peer-url",
        url,
    ];
    args.extend_from_slice(extra);
    etcdutl(&args)
}

fn status_json(url: &str) -> serde_json::Value {
    let o = etcdutl(&[
        "witness",
        "status",
        "--advertise-peer-url",
        url,
        "-w",
        "json",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).expect("status -w json prints JSON")
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn init_then_status_on_a_directory_with_the_seed_command_form() {
    let dir = tempfile::tempdir().unwrap();
    let url = mount_url(dir.path());
    let o = init("infra2", &url, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains("file system: "),
        "reports the file system type: {out}"
    );
    assert!(
        out.contains("warning:") && out.contains("not a network share"),
        "{out}"
    );
    let s = status_json(&url);
    assert_eq!(s["name"], "infra2");
    assert_eq!(s["term"], 0);
    assert_eq!(s["cluster_id"], "", "unbound until a cluster contacts it");
    let table = text(&etcdutl(&[
        "witness",
        "status",
        "--advertise-peer-url",
        &url,
    ]));
    for row in [
        "name",
        "member id",
        "cluster id",
        "term",
        "vote",
        "last log term",
        "last log subterm",
        "last log index",
        "replication set (last write)*",
        "generation",
        "storage version",
    ] {
        assert!(
            table.contains(&format!("| {row} ")),
            "table lacks {row}: {table}"
        );
    }
    // The replication set is the last write's, and the output says so (finding 5.6).
    assert!(table.contains("* the replication sets are those of the last witness write"));
    assert!(
        s["replication_set_note"]
            .as_str()
            .unwrap()
            .contains("last witness write")
    );
    assert_ne!(s["generation"], "0");
    // The alias from the issue works too.
    let o = etcdutl(&["witness", "status", "--initial-advertise-url", &url]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn init_refuses_to_overwrite_without_force_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let url = mount_url(dir.path());
    assert!(init("infra2", &url, &[]).status.success());
    let before = snapshot(dir.path());
    let o = init("other", &url, &[]);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("already initialised") && text(&o).contains("--force"),
        "{}",
        text(&o)
    );
    assert_eq!(
        snapshot(dir.path()),
        before,
        "a refused init changes nothing"
    );
    let o = init("other", &url, &["--force"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("replaced"), "{}", text(&o));
    assert_eq!(status_json(&url)["name"], "other");
}

#[test]
fn a_corrupt_record_is_reported_and_force_repairs_it() {
    let dir = tempfile::tempdir().unwrap();
    let url = mount_url(dir.path());
    assert!(init("w", &url, &[]).status.success());
    let file = dir.path().join(format!("{:020}.st", 0));
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.truncate(bytes.len() - 3);
    std::fs::write(&file, &bytes).unwrap();
    let o = etcdutl(&["witness", "status", "--advertise-peer-url", &url]);
    assert!(!o.status.success());
    let msg = text(&o);
    assert!(
        msg.contains("corrupt") && msg.contains("truncated") && msg.contains("replace"),
        "{msg}"
    );
    let o = init("w", &url, &[]);
    assert!(
        !o.status.success(),
        "init without --force must not touch a corrupt witness"
    );
    assert!(text(&o).contains("pass --force"), "{}", text(&o));
    assert_eq!(std::fs::read(&file).unwrap(), bytes);
    let o = init("w", &url, &["--force"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(status_json(&url)["name"], "w");
}

#[test]
fn malformed_input_is_a_clear_error_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "witness",
                "status",
                "--advertise-peer-url",
                "witness:mount?path=relative",
            ],
            "--advertise-peer-url",
        ),
        (
            &[
                "witness",
                "status",
                "--advertise-peer-url",
                "http://10.0.1.12:2380",
            ],
            "must start with `witness:`",
        ),
        (
            &[
                "witness",
                "init",
                "--name",
                "x",
                "--advertise-peer-url",
                "witness:nfs?path=%2Fa",
            ],
            "unknown witness kind",
        ),
        (
            &[
                "witness",
                "init",
                "--name",
                "",
                "--advertise-peer-url",
                "witness:mount?path=%2Ftmp",
            ],
            "--name must not be empty",
        ),
        (
            &[
                "witness",
                "init",
                "--advertise-peer-url",
                "witness:mount?path=%2Ftmp",
            ],
            "--name",
        ),
        (
            &[
                "witness",
                "status",
                "--advertise-peer-url",
                "witness:mount?path=%2Fdoes%2Fnot%2Fexist",
            ],
            "does not exist",
        ),
    ];
    for (args, needle) in cases {
        let o = etcdutl(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(text(&o).contains(needle), "{args:?}: {}", text(&o));
        assert!(!text(&o).contains("panicked"), "{args:?}: {}", text(&o));
    }
}

#[test]
fn a_directory_the_user_cannot_write_is_permission_denied() {
    // Root ignores permissions, so run etcdutl as `nobody` on a root-owned directory.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let url = mount_url(dir.path());
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_etcdutl"))
        .args([
            "witness",
            "init",
            "--name",
            "w",
            "--advertise-peer-url",
            &url,
        ])
        .output()
        .expect("run setpriv (util-linux)");
    assert!(!o.status.success());
    assert!(text(&o).contains("permission denied"), "{}", text(&o));
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing written"
    );
}

#[test]
fn init_and_status_on_azurite() {
    let az = Azurite::start();
    let url = az.witness_url("etcd", "infra2/witness");
    let o = init("infra2", &url, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    // The signature, as it appears raw and percent-escaped; neither may be shown anywhere.
    let sas = e2e_tests::azurite::account_sas();
    let escaped_sig = sas.split("sig=").nth(1).unwrap().to_string();
    let raw_sig = percent_encoding::percent_decode_str(&escaped_sig)
        .decode_utf8()
        .unwrap()
        .to_string();
    assert!(out.contains("REDACTED"), "{out}");
    let s = status_json(&url);
    assert_eq!(s["name"], "infra2");
    let shown = format!(
        "{out}{s}{}",
        text(&etcdutl(&[
            "witness",
            "status",
            "--advertise-peer-url",
            &url
        ]))
    );
    for sig in [&raw_sig, &escaped_sig] {
        assert!(
            !shown.contains(sig.as_str()),
            "the SAS signature leaked: {shown}"
        );
    }
    let o = init("infra2", &url, &[]);
    assert!(
        !o.status.success() && text(&o).contains("already initialised"),
        "{}",
        text(&o)
    );
}

/// Keys, values, revisions, versions and leases, as a client reads them.
type Kvs = Vec<(Vec<u8>, i64, i64, i64, Vec<u8>, i64)>;

/// Fails on the first difference of two reads of every key (not printing 100,000 keys).
/// (The revisions are the stores' current ones, whatever revision was read.)
fn same(got: &(i64, Kvs), want: &(i64, Kvs), what: &str) {
    if let Some(i) = (0..got.1.len().min(want.1.len())).find(|&i| got.1[i] != want.1[i]) {
        panic!(
            "{what}: key {i} differs: {:?} where {:?}",
            got.1[i], want.1[i]
        );
    }
    assert_eq!(got.1.len(), want.1.len(), "{what}: the number of keys");
}

async fn connect(endpoint: &str, user: Option<(&str, &str)>) -> etcd_client::Client {
    let opts = user.map(|(u, p)| etcd_client::ConnectOptions::new().with_user(u, p));
    etcd_client::Client::connect([endpoint], opts)
        .await
        .expect("connect")
}

/// Every key at `revision` (0: the newest) and the revision read, a page at a time.
async fn everything(c: &mut etcd_client::Client, revision: i64) -> (i64, Kvs) {
    let mut out = Vec::new();
    let mut from = vec![0u8];
    let mut read_at = revision;
    loop {
        let opts = etcd_client::GetOptions::new()
            .with_range(vec![0u8])
            .with_limit(5000)
            .with_revision(read_at);
        let r = c.get(from.clone(), Some(opts)).await.expect("range");
        // (read every page at the first page's revision)
        if read_at == 0 {
            read_at = r.header().expect("header").revision();
        }
        for kv in r.kvs() {
            out.push((
                kv.key().to_vec(),
                kv.create_revision(),
                kv.mod_revision(),
                kv.version(),
                kv.value().to_vec(),
                kv.lease(),
            ));
        }
        if !r.more() {
            return (read_at, out);
        }
        from = out.last().expect("a page").0.clone();
        from.push(0);
    }
}

/// What an etcd key space holds for the migration test: 100,000 keys written in txns of 100
/// (several keys per revision), leased keys, a compaction, then updates and deletes (history
/// after it), users and a role, auth on. Returns a revision between the compaction and the end.
async fn load(endpoint: &str) -> i64 {
    use etcd_client::{Permission, PutOptions, Txn, TxnOp};
    let value = "v".repeat(100);
    let mut writers = Vec::new();
    for w in 0..4 {
        let mut c = connect(endpoint, None).await;
        let value = value.clone();
        writers.push(tokio::spawn(async move {
            for t in (w..1000).step_by(4) {
                let ops: Vec<TxnOp> = (0..100)
                    .map(|i| TxnOp::put(format!("m/{:06}", t * 100 + i), value.as_str(), None))
                    .collect();
                c.txn(Txn::new().and_then(ops)).await.expect("txn");
            }
        }));
    }
    for w in writers {
        w.await.unwrap();
    }
    let mut c = connect(endpoint, None).await;
    for l in 0..20 {
        let lease = c.lease_grant(3600 + l, None).await.unwrap().id();
        let ops: Vec<TxnOp> = (0..50)
            .map(|j| {
                TxnOp::put(
                    format!("l/{l:02}/{j:02}"),
                    "leased",
                    Some(PutOptions::new().with_lease(lease)),
                )
            })
            .collect();
        c.txn(Txn::new().and_then(ops)).await.unwrap();
    }
    let compacted = c.put("mark", "compact here", None).await.unwrap();
    let compacted = compacted.header().unwrap().revision();
    c.compact(compacted, None).await.unwrap();
    for i in 0..1000 {
        c.put(format!("m/{:06}", i * 7), format!("updated {i}"), None)
            .await
            .unwrap();
    }
    let between = c.put("mark", "between", None).await.unwrap();
    let between = between.header().unwrap().revision();
    for i in 0..500 {
        c.delete(format!("m/{:06}", i * 13 + 1), None)
            .await
            .unwrap();
    }
    c.user_add("root", "rootpw", None).await.unwrap();
    c.user_grant_role("root", "root").await.unwrap();
    c.role_add("reader").await.unwrap();
    c.role_grant_permission("reader", Permission::read("m/").with_prefix())
        .await
        .unwrap();
    c.user_add("alice", "alicepw", None).await.unwrap();
    c.user_grant_role("alice", "reader").await.unwrap();
    c.auth_enable().await.unwrap();
    between
}

/// `etcdctl` of `release` as etcd's root user.
fn etcdctl(release: &Release, endpoint: &str, args: &[&str]) -> Output {
    let all: Vec<&str> = ["--endpoints", endpoint, "--user", "root:rootpw"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    release.etcdctl(&all)
}

/// Checks what a user sees of a migrated cluster at `endpoint`: alice reads under m/ and
/// nothing else, cannot write, her password is checked; every lease is there with its TTL and
/// its keys.
async fn users_and_leases_work(endpoint: &str) {
    let mut alice = connect(endpoint, Some(("alice", "alicepw"))).await;
    let got = alice.get("m/000002", None).await.expect("alice reads m/");
    assert_eq!(got.kvs().len(), 1);
    let denied = alice.put("m/000002", "x", None).await.unwrap_err();
    assert!(denied.to_string().contains("permission denied"), "{denied}");
    let denied = alice.get("l/00/00", None).await.unwrap_err();
    assert!(denied.to_string().contains("permission denied"), "{denied}");
    let wrong = etcd_client::Client::connect(
        [endpoint],
        Some(etcd_client::ConnectOptions::new().with_user("alice", "wrong")),
    )
    .await;
    assert!(wrong.is_err(), "a wrong password is refused");
    let mut root = connect(endpoint, Some(("root", "rootpw"))).await;
    let leases = root.leases().await.unwrap();
    assert_eq!(leases.leases().len(), 20);
    for l in leases.leases() {
        let ttl = root
            .lease_time_to_live(
                l.id(),
                Some(etcd_client::LeaseTimeToLiveOptions::new().with_keys()),
            )
            .await
            .unwrap();
        assert!((3600..3620).contains(&ttl.granted_ttl()), "{ttl:?}");
        assert_eq!(ttl.keys().len(), 50);
    }
}

/// Migration in and out of etcd, as docs/operations.md tells it, against Debian's etcd 3.4:
/// `etcdctl snapshot save` from etcd 3.4, `etcdutl snapshot restore` of that file into two
/// members and a witness, then back with `etcdutl snapshot export --format etcd` and etcd's
/// own `etcdctl snapshot restore`. Every key, version, revision (the history after the
/// compaction too), lease and user arrives each way.
#[test]
fn an_etcd_3_4_key_space_moves_to_etcd_node_and_back() {
    moves_to_etcd_node_and_back(&Release::debian_3_4());
}

/// The same with etcd 3.6 (its etcdctl saves, its etcdutl restores).
#[test]
fn an_etcd_3_6_key_space_moves_to_etcd_node_and_back() {
    moves_to_etcd_node_and_back(&Release::v3_6());
}

fn moves_to_etcd_node_and_back(release: &Release) {
    use std::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut etcd = Etcd::new(release, dir.path(), "e1");
    etcd.start();
    let loaded = Instant::now();
    let between = rt.block_on(load(&etcd.endpoint()));
    println!("loaded etcd in {:?}", loaded.elapsed());
    let (want, old) = rt.block_on(async {
        let mut root = connect(&etcd.endpoint(), Some(("root", "rootpw"))).await;
        (
            everything(&mut root, 0).await,
            everything(&mut root, between).await,
        )
    });
    assert_eq!(want.1.len(), 100_000 + 1000 + 1 - 500);

    // In: the downtime starts when the old cluster takes its last write.
    let down = Instant::now();
    let file = dir.path().join("etcd.snap");
    let o = etcdctl(
        release,
        &etcd.endpoint(),
        &["snapshot", "save", file.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", text(&o));
    let saved = down.elapsed();
    etcd.stop();
    let st = etcdutl(&["snapshot", "status", file.to_str().unwrap(), "-w", "json"]);
    let st: serde_json::Value =
        serde_json::from_slice(&st.stdout).unwrap_or_else(|_| panic!("{}", text(&st)));
    assert_eq!(
        (&st["format"], &st["revision"], &st["totalKey"]),
        (
            &"etcd".into(),
            &want.0.into(),
            &(want.1.len() as u64).into()
        ),
        "{st}"
    );
    let (node, util) = (
        Path::new(env!("CARGO_BIN_EXE_etcd-node")),
        Path::new(env!("CARGO_BIN_EXE_etcdutl")),
    );
    let mut c = e2e_tests::cluster::Cluster::prepare(node, util, &[]);
    // A copy that lost its end (its hash) is refused, as etcd refuses it, and nothing is made.
    let cut = dir.path().join("cut.snap");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() - 1]).unwrap();
    let o = etcdutl(&[
        "snapshot",
        "restore",
        cut.to_str().unwrap(),
        "--name",
        "n1",
        "--data-dir",
        c.data_dir(0).to_str().unwrap(),
        "--initial-cluster",
        c.initial_cluster(),
        "--initial-advertise-peer-urls",
        &c.members[0].peer_url(),
    ]);
    assert!(
        !o.status.success() && text(&o).contains("does not end with a SHA-256"),
        "{}",
        text(&o)
    );
    assert!(!c.data_dir(0).exists());
    for i in 0..2 {
        let m = &c.members[i];
        let o = etcdutl(&[
            "snapshot",
            "restore",
            file.to_str().unwrap(),
            "--name",
            &m.name,
            "--data-dir",
            c.data_dir(i).to_str().unwrap(),
            "--initial-cluster",
            c.initial_cluster(),
            "--initial-advertise-peer-urls",
            &m.peer_url(),
        ]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(
            text(&o).contains("read an etcd snapshot") && text(&o).contains("2 users, 1 roles"),
            "{}",
            text(&o)
        );
    }
    let restored = down.elapsed();
    c.start_member(0);
    c.start_member(1);
    let ours = c.members[0].url();
    let first_write = rt.block_on(async {
        let mut root = loop {
            match etcd_client::Client::connect(
                [ours.as_str()],
                Some(etcd_client::ConnectOptions::new().with_user("root", "rootpw")),
            )
            .await
            {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        };
        loop {
            match root.put("migrated", "yes", None).await {
                Ok(r) => break r.header().unwrap().revision(),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
            }
        }
    });
    println!(
        "etcd {} -> etcd-node, 100,000 keys: snapshot saved after {saved:?}, both members \
         restored after {restored:?}, first write accepted after {:?}",
        release.name,
        down.elapsed()
    );
    assert_eq!(first_write, want.0 + 1, "the revision goes on from etcd's");
    let (now, back_old) = rt.block_on(async {
        let mut root = connect(&ours, Some(("root", "rootpw"))).await;
        (
            everything(&mut root, first_write - 1).await,
            everything(&mut root, between).await,
        )
    });
    same(
        &now,
        &want,
        "etcd-node holds what etcd held, revisions and all",
    );
    same(&back_old, &old, "and the history after etcd's compaction");
    rt.block_on(users_and_leases_work(&ours));

    // Out: back to etcd with etcd's own restore.
    let file = dir.path().join("ours.snap");
    let o = etcdctl(
        release,
        &c.members[0].endpoint(),
        &["snapshot", "save", file.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", text(&o));
    let exported = dir.path().join("back.db");
    let o = etcdutl(&[
        "snapshot",
        "export",
        file.to_str().unwrap(),
        "--format",
        "etcd",
        "--output",
        exported.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let again = etcdutl(&[
        "snapshot",
        "export",
        file.to_str().unwrap(),
        "--output",
        exported.to_str().unwrap(),
    ]);
    assert!(
        !again.status.success() && text(&again).contains("already exists"),
        "{}",
        text(&again)
    );
    let want = rt.block_on(async {
        let mut root = connect(&ours, Some(("root", "rootpw"))).await;
        everything(&mut root, 0).await
    });
    drop(c);
    let mut back = Etcd::new(release, dir.path(), "b1");
    let o = release.restore(&exported, &back);
    assert!(o.status.success(), "etcd's restore: {}", text(&o));
    back.start();
    let (got, got_old) = rt.block_on(async {
        let mut root = connect(&back.endpoint(), Some(("root", "rootpw"))).await;
        (
            everything(&mut root, 0).await,
            everything(&mut root, between).await,
        )
    });
    assert_eq!(got.0, want.0, "etcd's revision goes on from etcd-node's");
    same(
        &got,
        &want,
        "etcd holds what etcd-node held, revisions and all",
    );
    same(&got_old, &old, "and the history");
    rt.block_on(users_and_leases_work(&back.endpoint()));
}
