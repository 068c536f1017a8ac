//! A short seeded slice of the fault campaign (scripts/faults.sh runs the long mode): real
//! etcd-node processes under puts, reads, compare-and-swaps, leases and a watcher on each
//! member, one fault per run; every key's history checked for linearizability, the watchers'
//! events against each other and the history, both members compared. One test per place the
//! witness lives, each with the faults that place adds.

use std::path::Path;

use e2e_tests::faults::{DiskKind, Family, Options, WitnessKind, campaign};

/// Runs `runs` fault runs from `FAULTS_SEED` (default 1) and checks the report.
fn slice(runs: u64, witness: WitnessKind, disks: DiskKind, families: Option<Vec<Family>>) {
    let seed = std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let options = Options {
        runs,
        seed,
        clients: 6,
        keys: 12,
        witness,
        disks,
        families,
    };
    println!(
        "fault campaign {options:?}: seeds {seed}..{} (FAULTS_SEED changes them)",
        seed + options.runs
    );
    let report = campaign(
        Path::new(env!("CARGO_BIN_EXE_etcd-node")),
        Path::new(env!("CARGO_BIN_EXE_etcdutl")),
        &options,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    print!("{}", report.summary());
    assert_eq!(report.runs, options.runs);
    assert!(report.acknowledged_writes > 0, "the workload wrote nothing");
    assert!(report.watch_events > 0, "the watchers saw nothing");
    assert!(report.lease_ops > 0, "no lease operation ran");
}

#[test]
fn a_short_fault_campaign_loses_nothing() {
    slice(3, WitnessKind::Dir, DiskKind::Plain, None);
}

#[test]
fn a_full_data_disk_loses_nothing() {
    // (Whether the member stops depends on whether it needs a new block meanwhile: its WAL
    // segment is preallocated. If it stops, the campaign requires the message naming the full
    // disk and starts it again once space is freed.)
    slice(
        1,
        WitnessKind::Dir,
        DiskKind::Tmpfs,
        Some(vec![Family::FullDisk]),
    );
}

#[test]
fn the_witness_on_an_sshfs_share_with_30s_caches_loses_nothing() {
    slice(
        2,
        WitnessKind::Sshfs,
        DiskKind::Plain,
        Some(vec![Family::WitnessGone, Family::Kill]),
    );
}

#[test]
fn azurite_stopped_and_started_again_loses_nothing() {
    slice(
        1,
        WitnessKind::Azurite,
        DiskKind::Plain,
        Some(vec![Family::WitnessGone]),
    );
}

/// One run of each power cut, each on a cluster of its own: the leader's site with the
/// witness's share, the follower's site, everything at once, the witness's server alone, and
/// cuts in a loop while a member recovers. Each cut drops what was not fsynced, directory
/// entries included (tests/src/powercut.rs).
#[test]
fn power_cuts_lose_nothing_acknowledged() {
    for family in [
        Family::PowerLeaderSite,
        Family::PowerFollowerSite,
        Family::PowerBoth,
        Family::PowerWitness,
        Family::PowerLoop,
    ] {
        slice(1, WitnessKind::Dir, DiskKind::PowerCut, Some(vec![family]));
    }
}

/// A data disk that fails with EIO (fsync, or writes too): the member stops naming the error and
/// comes back once the disk is healed, with nothing acknowledged lost, even when what the failed
/// fsyncs were to write is also gone from what it reads (a power cut of that disk).
#[test]
fn a_failing_data_disk_loses_nothing() {
    slice(
        2,
        WitnessKind::Dir,
        DiskKind::PowerCut,
        Some(vec![Family::DiskEio]),
    );
}
