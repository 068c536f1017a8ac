//! raft-sim: run the deterministic simulator over a range of seeds.
//!
//! `cargo run --release -p etcd-node --bin raft-sim -- --seeds 1000 --start 0 --regular 2 --witness`

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use etcd_node::sim::{RandomRun, Stats, run_seed};

#[derive(Parser, Debug)]
#[command(about = "Deterministic simulation of the extended Raft with random faults")]
struct Args {
    /// How many seeds to run.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Regular voters.
    #[arg(long, default_value_t = 2)]
    regular: u64,
    /// Add a witness.
    #[arg(long)]
    witness: bool,
    /// Ticks of faults per seed.
    #[arg(long, default_value_t = 2000)]
    ticks: u64,
    /// Ticks allowed after healing for a leader to commit.
    #[arg(long, default_value_t = 2000)]
    liveness_ticks: u64,
    /// Turn check-quorum off (deposed leaders linger: reads on them are tested harder).
    #[arg(long)]
    no_check_quorum: bool,
    /// Never crash a node inside a Ready (the random sequence of runs recorded before that
    /// fault existed).
    #[arg(long)]
    no_crash_before_persist: bool,
    /// No held deliveries and no clock drift (the random sequence of runs recorded before
    /// those faults existed).
    #[arg(long)]
    no_timing_faults: bool,
    /// Witness loads always fresh (the random sequence of runs recorded before stale loads
    /// existed).
    #[arg(long)]
    no_stale_loads: bool,
}

fn main() -> ExitCode {
    let a = Args::parse();
    if let Err(e) =
        etcd_node::raft::Membership::new(1..=a.regular, a.witness.then_some(a.regular + 1))
    {
        eprintln!(
            "Error: --regular {}{}: {e}",
            a.regular,
            if a.witness { " --witness" } else { "" }
        );
        return ExitCode::FAILURE;
    }
    let run = RandomRun {
        ticks: a.ticks,
        liveness_ticks: a.liveness_ticks,
        check_quorum: !a.no_check_quorum,
        crash_before_persist: !a.no_crash_before_persist,
        timing: !a.no_timing_faults,
        stale_loads: !a.no_stale_loads,
        ..RandomRun::new(a.regular, a.witness)
    };
    let started = Instant::now();
    let mut total = Stats::default();
    for seed in a.start..a.start + a.seeds {
        match run_seed(seed, &run) {
            Ok(s) => {
                total.ticks += s.ticks;
                total.committed += s.committed;
                total.witness_writes += s.witness_writes;
                total.conf_changes += s.conf_changes;
                total.snapshots_installed += s.snapshots_installed;
                total.reads_served += s.reads_served;
                total.transfers += s.transfers;
                total.crashes += s.crashes;
                total.crashes_before_persist += s.crashes_before_persist;
                total.crashes_after_persist += s.crashes_after_persist;
                total.held += s.held;
                total.stale_answers += s.stale_answers;
                total.lost_replies += s.lost_replies;
                total.removed_stopped += s.removed_stopped;
                total.writes_refused += s.writes_refused;
            }
            Err(e) => {
                eprintln!("FAILED {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let t = &total;
    println!(
        "{} seeds passed ({run:?}) in {secs:.1} s: {} ticks ({:.0} ticks/s), {} entries applied, {} witness writes, {} configuration changes, {} snapshots installed, {} reads served, {} leader transfers, {} crashes ({} between early sends and the fsync, {} between the fsync and the rest of a Ready), {} deliveries held 10-60 ticks, {} witness answers from stale loads, {} witness writes with their reply lost, {} removed members stopped, {} client writes answered as not applied",
        a.seeds,
        t.ticks,
        t.ticks as f64 / secs,
        t.committed,
        t.witness_writes,
        t.conf_changes,
        t.snapshots_installed,
        t.reads_served,
        t.transfers,
        t.crashes,
        t.crashes_before_persist,
        t.crashes_after_persist,
        t.held,
        t.stale_answers,
        t.lost_replies,
        t.removed_stopped,
        t.writes_refused
    );
    ExitCode::SUCCESS
}
