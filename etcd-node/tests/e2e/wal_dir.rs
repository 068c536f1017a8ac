//! `--wal-dir`: the WAL in a directory of its own (etcd's remedy for a slow data disk), what a
//! member does when it is started without the directory it last ran with, and the operator's
//! way of moving a WAL there, run as the refusal tells it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{LEADER_WAIT, bins, ok, text};
use e2e_tests::cluster::{Cluster, etcdctl};
use e2e_tests::{eventually, free_port};

/// The WAL segments in `dir` (none if it does not exist).
fn segments(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| {
        d.filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".wal"))
        })
        .count()
    })
}

/// What member `i` logged since its log was `from` bytes long.
fn logged_since(c: &Cluster, i: usize, from: usize) -> String {
    c.log(i).get(from..).unwrap_or_default().to_string()
}

/// Starts member `i` with `extra`, which must make it stop at once: what it logged.
fn refused_start(c: &mut Cluster, i: usize, extra: &[&str], what: &str) -> String {
    let from = c.log(i).len();
    c.start_member_with(i, extra, &[]);
    c.wait_exited(i, what);
    c.kill(i); // (reaps the exited process)
    logged_since(c, i, from)
}

/// `key`'s value as member `i` alone holds it (a serializable read).
fn local_value(c: &Cluster, i: usize, key: &str) -> String {
    ok(etcdctl(
        &[c.members[i].endpoint()],
        &["get", key, "--consistency=s", "--print-value-only"],
        None,
    ))
    .trim()
    .to_string()
}

/// Runs a second process as member `i` on `data_dir` with `flags`, on ports of its own, and
/// checks that it stops at once saying `says`.
fn refused_beside(c: &Cluster, i: usize, data_dir: &Path, flags: &[&str], says: &str) {
    let (client, peer) = (free_port(), free_port());
    let client_url = format!("http://127.0.0.1:{client}");
    let second = Command::new(bins().0)
        .args(["--name", &c.members[i].name])
        .args(["--data-dir", data_dir.to_str().unwrap()])
        .args(flags)
        .args(["--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
        .args(["--initial-advertise-peer-urls", &c.members[i].peer_url()])
        .args(["--initial-cluster", c.initial_cluster()])
        .output()
        .unwrap();
    assert!(
        !second.status.success() && text(&second).contains(says),
        "{}",
        text(&second)
    );
}

fn put_all(c: &Cluster, prefix: &str, n: usize) {
    let eps = c.endpoints();
    for k in 0..n {
        ok(etcdctl(
            &eps,
            &["put", &format!("{prefix}{k:02}"), &format!("v{k}")],
            None,
        ));
    }
}

/// A member given `--wal-dir` writes its log there and nowhere else; `etcdutl wal dump` reads
/// it with the same flag. Started again without the flag it refuses, changing nothing, since
/// it would have forgotten its log and its vote; a second member on the same WAL directory is
/// refused while the first runs; started with its flag again it has every write. With its
/// data directory moved aside, the WAL is not taken for a new member's.
#[test]
fn a_member_keeps_its_log_in_wal_dir_and_refuses_to_start_without_it() {
    let (node, etcdutl) = bins();
    let mut c = Cluster::prepare(node, etcdutl, &[]);
    let wal: PathBuf = c.dir.path().join("n0-wal");
    let wal_flag = ["--wal-dir", wal.to_str().unwrap()];
    c.start_member_with(0, &wal_flag, &[]);
    c.start_member(1);
    c.wait_leader(LEADER_WAIT);
    put_all(&c, "w/", 30);
    let default_wal = c.data_dir(0).join("member/wal");
    assert!(segments(&wal) >= 1, "no WAL in --wal-dir {}", wal.display());
    assert!(!default_wal.exists(), "a WAL in the data directory too");
    assert!(segments(&c.data_dir(1).join("member/wal")) >= 1);

    let dump = |extra: &[&str]| {
        let data = c.data_dir(0);
        Command::new(etcdutl)
            .args(["wal", "dump", "--data-dir", data.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    let dumped = ok(dump(&wal_flag));
    assert!(dumped.matches("\"op\":\"put\"").count() >= 30, "{dumped}");
    let without = dump(&[]);
    assert!(
        !without.status.success() && text(&without).contains("holds no WAL"),
        "{}",
        text(&without)
    );

    // A second process given the same --wal-dir (its own data directory and ports).
    let other = c.dir.path().join("other.etcd");
    let mut flags = wal_flag.to_vec();
    flags.extend(["--initial-cluster-state", "existing"]);
    refused_beside(&c, 0, &other, &flags, "a member is already running on it");
    // And one on n1's data directory (its WAL in member/wal) with a --wal-dir: told n1 runs
    // there, not how to move its WAL.
    let another = c.dir.path().join("another-wal");
    let flags = ["--wal-dir", another.to_str().unwrap()];
    let running = "a member is already running on this data directory";
    refused_beside(&c, 1, &c.data_dir(1), &flags, running);
    // And one on n0's data directory with another --wal-dir that holds a WAL (a copy of n0's):
    // that passes the WAL's lock, and is stopped by the data directory's.
    let copy = c.dir.path().join("n0-wal-copy");
    let copied = Command::new("cp")
        .args(["-a", wal.to_str().unwrap(), copy.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(copied.status.success(), "{}", text(&copied));
    let flags = ["--wal-dir", copy.to_str().unwrap()];
    refused_beside(&c, 0, &c.data_dir(0), &flags, running);

    c.stop(0);
    let before: Vec<_> = std::fs::read_dir(&wal)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    let log = refused_start(&mut c, 0, &[], "started without its --wal-dir");
    assert!(
        log.contains("holds no WAL: the member's log and vote are somewhere else")
            && log.contains("Start it with the --wal-dir it last ran with"),
        "{log}"
    );
    assert!(!default_wal.exists(), "the refused start created a WAL");
    let after: Vec<_> = std::fs::read_dir(&wal)
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    assert_eq!(before, after, "the refused start changed the WAL");

    c.start_member_with(0, &wal_flag, &[]);
    c.wait_leader(LEADER_WAIT);
    put_all(&c, "x/", 5);
    eventually(Duration::from_secs(30), "n0 has every write", || {
        local_value(&c, 0, "w/29") == "v29" && local_value(&c, 0, "x/04") == "v4"
    });
    assert!(!default_wal.exists());

    // Its data directory moved aside (as when the member is replaced), the --wal-dir kept: the
    // old log is not taken for a new member's.
    c.stop(0);
    let data = c.data_dir(0);
    std::fs::rename(&data, data.with_extension("aside")).unwrap();
    let log = refused_start(
        &mut c,
        0,
        &wal_flag,
        "started on a WAL whose data directory is gone",
    );
    assert!(
        log.contains("holds a member's log, but") && log.contains("move"),
        "{log}"
    );
    assert!(
        !data.exists(),
        "the refused start created the data directory"
    );
}

/// A running member is given a `--wal-dir` for the first time. The start refuses and says how
/// to move the WAL; doing exactly that (its `cp` command, run as printed) and starting again is
/// refused once more, because the old copy is still there, and that refusal says to remove it.
/// Started without the flag once more and written to, the two WALs differ, and the refusal says
/// which to keep; once the other is out of the way and the move redone, the member starts with
/// every acknowledged write.
#[test]
fn a_wal_moved_into_wal_dir_as_the_refusal_says_keeps_every_write() {
    let (node, etcdutl) = bins();
    let mut c = Cluster::start(node, etcdutl, &[]);
    c.wait_leader(LEADER_WAIT);
    put_all(&c, "m/", 30);
    let wal = c.dir.path().join("fast-disk/n1-wal");
    let wal_flag = ["--wal-dir", wal.to_str().unwrap()];
    let default_wal = c.data_dir(1).join("member/wal");
    c.stop(1);

    let log = refused_start(&mut c, 1, &wal_flag, "started with a new --wal-dir");
    assert!(log.contains("To move the WAL there"), "{log}");
    let command = log
        .split('`')
        .nth(1)
        .filter(|cmd| cmd.starts_with("mkdir -p "))
        .unwrap_or_else(|| panic!("no cp command in {log}"))
        .replace("\\\"", "\"");
    assert!(!wal.exists(), "the refused start created --wal-dir");
    let copied = Command::new("sh").args(["-c", &command]).output().unwrap();
    assert!(copied.status.success(), "{command}: {}", text(&copied));
    assert!(segments(&wal) >= 1);

    let log = refused_start(&mut c, 1, &wal_flag, "started with two WALs");
    assert!(
        log.contains("this member has two logs")
            && log.contains(&format!("remove {}", default_wal.display())),
        "{log}"
    );

    // Started once more without --wal-dir before the old WAL was removed, and written to: the
    // two WALs differ, and the refusal says to keep the one `etcdutl wal dump` shows further on.
    c.start_member(1);
    c.wait_leader(LEADER_WAIT);
    put_all(&c, "d/", 5);
    eventually(Duration::from_secs(30), "n1 has the new writes", || {
        local_value(&c, 1, "d/04") == "v4"
    });
    c.stop(1);
    let log = refused_start(&mut c, 1, &wal_flag, "started with two differing WALs");
    assert!(
        log.contains("this member has two logs")
            && log.contains("they differ")
            && log.contains("etcdutl wal dump"),
        "{log}"
    );
    let puts = |dir: &Path| {
        let data = c.data_dir(1);
        let dumped = ok(Command::new(bins().1)
            .args(["wal", "dump", "--data-dir", data.to_str().unwrap()])
            .args(["--wal-dir", dir.to_str().unwrap()])
            .output()
            .unwrap());
        dumped.matches("\"op\":\"put\"").count()
    };
    assert!(
        puts(&default_wal) > puts(&wal),
        "member/wal is not further on"
    );
    // So the copy in --wal-dir goes out of the way, and the WAL is moved again.
    std::fs::rename(&wal, wal.with_extension("old")).unwrap();
    let copied = Command::new("sh").args(["-c", &command]).output().unwrap();
    assert!(copied.status.success(), "{command}: {}", text(&copied));
    std::fs::remove_dir_all(&default_wal).unwrap();

    c.start_member_with(1, &wal_flag, &[]);
    c.wait_leader(LEADER_WAIT);
    put_all(&c, "n/", 5);
    eventually(Duration::from_secs(30), "n1 has every write", || {
        local_value(&c, 1, "m/29") == "v29"
            && local_value(&c, 1, "d/04") == "v4"
            && local_value(&c, 1, "n/04") == "v4"
    });
    assert!(!default_wal.exists());
}
