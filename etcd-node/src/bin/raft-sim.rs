//! raft-sim: run the deterministic simulator over a range of seeds.
//!
//! `cargo run --release -p etcd-node --bin raft-sim -- --seeds 1000 --start 0 --regular 2 --witness`

use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use etcd_node::sim::{RandomRun, run_seed};

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
        ..RandomRun::new(a.regular, a.witness)
    };
    let started = Instant::now();
    let (mut ticks, mut commits, mut witness_writes) = (0u64, 0u64, 0u64);
    for seed in a.start..a.start + a.seeds {
        match run_seed(seed, &run) {
            Ok(stats) => {
                ticks += stats.ticks;
                commits += stats.committed;
                witness_writes += stats.witness_writes;
            }
            Err(e) => {
                eprintln!("FAILED {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{} seeds passed ({run:?}) in {secs:.1} s: {ticks} ticks ({:.0} ticks/s), {commits} entries applied, {witness_writes} witness writes",
        a.seeds,
        ticks as f64 / secs
    );
    ExitCode::SUCCESS
}
