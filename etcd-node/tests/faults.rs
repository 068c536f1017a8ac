//! A short seeded slice of the fault campaign (scripts/faults.sh runs the long mode): real
//! etcd-node processes, one fault per run (SIGKILL and restart, SIGSTOP/SIGCONT, the witness's
//! directory gone), every key's history checked for linearizability and both members compared.

use std::path::Path;

use e2e_tests::faults::{Options, campaign};

#[test]
fn a_short_fault_campaign_loses_nothing() {
    let seed = std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let options = Options {
        runs: 3,
        seed,
        clients: 6,
        keys: 12,
    };
    println!(
        "fault campaign seeds {seed}..{} (FAULTS_SEED changes them)",
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
}
