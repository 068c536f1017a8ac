//! The deterministic simulator over many seeds, for each cluster shape. A failure prints the
//! seed and the single command that replays it. More seeds: `SIM_SEEDS=100000 cargo test --release -p
//! etcd-node --test protocol sim::`, or the `raft-sim` binary (docs/testing.md).

use etcd_node::sim::{RandomRun, run_seed};

fn seeds() -> u64 {
    std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000)
}

fn start() -> u64 {
    std::env::var("SIM_START")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn run_many(regular: u64, witness: bool, seeds: u64) {
    run_all(&RandomRun::new(regular, witness), seeds);
}

fn run_all(run: &RandomRun, seeds: u64) {
    let (mut ticks, mut writes, mut wipes, mut refusals) = (0, 0, 0, 0);
    for seed in start()..start() + seeds {
        match run_seed(seed, run) {
            Ok(stats) => {
                ticks += stats.ticks;
                writes += stats.witness_writes;
                wipes += stats.witness_wipes;
                refusals += stats.witness_refusals;
            }
            Err(e) => panic!("{e}"),
        }
    }
    println!(
        "{seeds} seeds of {run:?}: {ticks} ticks, {writes} witness writes, {wipes} witness \
         wipes, {refusals} steps refusing a wiped witness"
    );
}

#[test]
fn two_nodes_and_a_witness() {
    run_many(2, true, seeds() * 2);
}

#[test]
fn two_nodes_and_a_witness_without_check_quorum() {
    let run = RandomRun {
        check_quorum: false,
        ..RandomRun::new(2, true)
    };
    run_all(&run, seeds());
}

#[test]
fn three_nodes() {
    run_many(3, false, seeds());
}

#[test]
fn three_nodes_and_a_witness() {
    run_many(3, true, seeds() / 2);
}

#[test]
fn four_nodes_and_a_witness() {
    run_many(4, true, seeds() / 2);
}

#[test]
fn one_node_and_five_nodes() {
    run_many(1, false, seeds() / 5);
    run_many(5, false, seeds() / 5);
}

/// Seeds that once failed, with the shape they failed in; each stays a test. (Recorded before the
/// simulator ran the server's Ready order, reads and proposals: they no longer replay the
/// failing sequence exactly and stay as extra seeds; so do 8544 of 3 + witness and 682 of 3,
/// the removed-leader strandings fixed by the retiring rule.)
#[test]
fn regressions() {
    // A leader applied its own removal and stepped down before the others knew it was
    // committed: no leader could emerge (docs/raft.md, "Leader transfer").
    let removed_leader = RandomRun {
        crash_before_persist: false,
        timing: false,
        ..RandomRun::new(3, true)
    };
    run_seed(104772, &removed_leader).unwrap_or_else(|e| panic!("{e}"));
    // R changed twice within one simulation tick (a drifting clock): the catch-up check runs
    // after every Ready of a leader.
    run_seed(4925, &RandomRun::new(4, true)).unwrap_or_else(|e| panic!("{e}"));
    run_seed(8544, &RandomRun::new(3, true)).unwrap_or_else(|e| panic!("{e}"));
    run_seed(682, &RandomRun::new(3, false)).unwrap_or_else(|e| panic!("{e}"));
    // A removed follower's log grew after its removal (a leader that had not applied it kept
    // replicating): it must be able to campaign whenever its log holds uncommitted entries.
    let no_check_quorum = RandomRun {
        check_quorum: false,
        ..RandomRun::new(2, true)
    };
    run_seed(6945, &no_check_quorum).unwrap_or_else(|e| panic!("{e}"));
}
