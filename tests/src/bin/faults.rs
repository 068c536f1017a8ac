//! The fault campaign against real etcd-node processes (e2e_tests::faults): `bash
//! scripts/faults.sh [--runs N] [--seed S]`. Exits non-zero with the failing seed and its replay
//! command on the first lost write, linearizability violation or divergence.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use e2e_tests::faults::{DiskKind, Family, Options, WitnessKind, campaign};

#[derive(Parser, Debug)]
#[command(about = "Fault runs against a local two-member cluster with a witness directory")]
struct Args {
    /// Fault runs (one fault each).
    #[arg(long, default_value_t = 20)]
    runs: u64,
    /// Seed of the first run (run i uses seed + i).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Keys per run.
    #[arg(long, default_value_t = 64)]
    keys: u64,
    /// Where the witness lives: a local directory, an sshfs share with 30 s caches (each
    /// member its own mount; needs root), or an Azurite blob.
    #[arg(long, value_enum, default_value_t = WitnessKind::Dir)]
    witness: WitnessKind,
    /// Put each member's data directory on a tmpfs of its own and add full disks to the
    /// faults (needs root).
    #[arg(long, conflicts_with = "power_cut")]
    full_disk: bool,
    /// Put each member's data directory and the witness's directory on a power-cut file
    /// system of its own (a FUSE layer that loses what was not fsynced) and add power cuts to
    /// the faults (needs /dev/fuse and root).
    #[arg(long)]
    power_cut: bool,
    /// The faults to choose from, comma-separated (default: all that apply).
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Option<Vec<Family>>,
    /// Where etcd-node and etcdutl are (default: next to this binary).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    let dir = a.bin_dir.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from))
            .unwrap_or_default()
    });
    let options = Options {
        runs: a.runs,
        seed: a.seed,
        clients: a.clients,
        keys: a.keys,
        witness: a.witness,
        disks: if a.power_cut {
            DiskKind::PowerCut
        } else if a.full_disk {
            DiskKind::Tmpfs
        } else {
            DiskKind::Plain
        },
        families: a.faults,
    };
    let started = std::time::Instant::now();
    match campaign(&dir.join("etcd-node"), &dir.join("etcdutl"), &options) {
        Ok(report) => {
            print!("{}", report.summary());
            println!("in {:.0} s", started.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("FAILED {e}");
            ExitCode::FAILURE
        }
    }
}
