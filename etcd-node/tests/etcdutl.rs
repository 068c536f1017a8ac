//! `etcdutl witness init|status` as an operator runs them: real processes, real directories,
//! a real Azurite. Every failure must be a clear message, a non-zero exit and no change.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use e2e_tests::azurite::Azurite;
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};

fn etcdutl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_etcdutl"))
        .args(args)
        .output()
        .expect("run etcdutl")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
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

fn mount_url(dir: &Path) -> String {
    format!(
        "witness:mount?path={}",
        utf8_percent_encode(dir.to_str().unwrap(), NON_ALPHANUMERIC)
    )
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
