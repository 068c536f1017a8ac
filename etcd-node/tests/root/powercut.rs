//! The power-cut file system (tests/src/powercut.rs) through real system calls: what the tests
//! of etcd-node rely on it to lose, and to keep.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use e2e_tests::cluster::{self, Cluster};
use e2e_tests::powercut::{Data, Disk, Entries};

fn write_synced(path: &Path, bytes: &[u8]) {
    let mut f = File::create(path).expect("create");
    f.write_all(bytes).expect("write");
    f.sync_all().expect("fsync");
}

fn sync_dir(dir: &Path) {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .expect("fsync the directory");
}

#[test]
fn the_power_cut_file_system_keeps_what_was_fsynced_and_nothing_else() {
    let at = tempfile::tempdir().expect("temp dir");
    let disk = Disk::mount(at.path()).unwrap_or_else(|e| panic!("{e}"));
    let root = disk.path();
    fs::create_dir(root.join("d")).expect("mkdir");
    sync_dir(root);
    // The etcd pattern: write a temporary file, fsync it, rename it, fsync the directory.
    write_synced(&root.join("d/kept.tmp"), b"kept");
    fs::rename(root.join("d/kept.tmp"), root.join("d/kept")).expect("rename");
    sync_dir(&root.join("d"));
    // Appended to after its fsync: the tail is lost.
    let mut log = OpenOptions::new()
        .append(true)
        .open(root.join("d/kept"))
        .expect("open to append");
    log.write_all(b" and lost").expect("append");
    drop(log);
    // Fsynced but never named durably: gone.
    write_synced(&root.join("d/unnamed"), b"data");
    // A hard link whose directory was not fsynced: gone, the original stays.
    fs::hard_link(root.join("d/kept"), root.join("d/link")).expect("link");
    assert_eq!(
        fs::read(root.join("d/link")).expect("read the link"),
        b"kept and lost"
    );

    let report = disk.power_off(Data::Lost, Entries::Lost, 1);
    assert!(
        fs::read_dir(root).is_err(),
        "a disk whose power is off answers nothing"
    );
    disk.power_on();
    let mut names: Vec<String> = fs::read_dir(root.join("d"))
        .expect("list")
        .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
        .collect();
    names.sort();
    assert_eq!(names, ["kept"], "{report:?}");
    assert_eq!(fs::read(root.join("d/kept")).expect("read"), b"kept");
    assert_eq!(report.nodes_gone, 1, "{report:?}");

    // Kept entries: a name survives, the unsynced data under it does not.
    fs::write(root.join("d/fresh"), vec![7u8; 100_000]).expect("write");
    disk.power_off(Data::Lost, Entries::Kept, 2);
    disk.power_on();
    assert_eq!(fs::metadata(root.join("d/fresh")).expect("stat").len(), 0);
}

/// A power cut soon after a member's first start left it nothing: its `member` directory had
/// never been made durable in the data directory, and it started again as a new member with an
/// empty log (found by the power-cut faults; `storage::sync_member_dir` fixed it).
#[test]
fn a_power_cut_after_a_members_first_start_keeps_its_data_directory() {
    let (dir, url) = cluster::witness_dir();
    let data = cluster::data_dir(dir.path(), "n2");
    fs::create_dir_all(&data).expect("the data directory");
    let disk = Disk::mount(&data).unwrap_or_else(|e| panic!("{e}"));
    let mut c = Cluster::start_with(
        dir,
        Path::new(env!("CARGO_BIN_EXE_etcd-node")),
        Path::new(env!("CARGO_BIN_EXE_etcdutl")),
        url,
        &[],
    );
    c.wait_leader(Duration::from_secs(30));
    let put = cluster::etcdctl(&c.endpoints(), &["put", "k", "v"], None);
    assert!(put.status.success(), "{put:?}");
    c.kill(1);
    let report = disk.power_off(Data::Lost, Entries::Lost, 1);
    disk.power_on();
    assert!(
        data.join("member/wal").is_dir() && data.join("member/kv.redb").is_file(),
        "the member's directory did not survive the cut: {report:?}"
    );
    c.start_member(1);
    c.wait_http(1, "/health", 200, Duration::from_secs(30));
    assert_eq!(
        c.log(1).matches("bootstrapped a new cluster").count(),
        1,
        "the member bootstrapped again after the cut:\n{}",
        c.log(1)
    );
    c.stop(0);
    c.stop(1);
    drop(disk);
}
