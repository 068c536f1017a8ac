//! witness-bench: how fast witness steps are on each backend.
//!
//! Measures, per backend (a local directory; one directory through two sshfs mounts of a loopback
//! sshd; a blob on Azurite; the servers are started here):
//! - step latency (p50, p99, mean) of a writing step (AppendToWitness of a new subterm: load +
//!   rule + compare-and-swap) and of a read-only step (read-term for ReadIndex: one load);
//! - compare-and-swap throughput with 1 writer (uncontended) and with N writers racing on the
//!   same state, each with its own client (contended), with the conflicts they met.
//!
//! `cargo run --release -p e2e-tests --bin witness-bench -- --help`

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use e2e_tests::sshfs::{CACHED, COHERENT, SshServer};
use hdrhistogram::Histogram;
use witness_azblob::{AzBlobOptions, AzBlobStore};
use witness_core::conformance;
use witness_core::{AppendRequest, Caller, Witness, WitnessState, WitnessStore, WitnessUrl};
use witness_mount::{MountOptions, MountStore};

#[derive(Parser, Debug)]
#[command(about = "Witness step latency and compare-and-swap throughput per backend")]
struct Args {
    /// Which backends to measure.
    #[arg(long, value_enum, default_values_t = [Backend::Mount, Backend::Sshfs, Backend::Azurite])]
    backend: Vec<Backend>,
    /// Directory for the mount backend (a fresh subdirectory is made in it).
    #[arg(long, default_value = "target/witness-bench")]
    dir: PathBuf,
    /// Steps measured for each latency figure.
    #[arg(long, default_value_t = 1000)]
    steps: u64,
    /// Writer counts for the throughput runs (1 = uncontended).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4, 16])]
    writers: Vec<u64>,
    /// Compare-and-swaps each writer completes in a throughput run.
    #[arg(long, default_value_t = 200)]
    per_writer: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// A directory on the local disk.
    Mount,
    /// One directory through two sshfs mounts (loopback sshd); writers alternate mounts.
    Sshfs,
    /// A blob on Azurite.
    Azurite,
}

const CALLER: Caller = Caller {
    cluster_id: 0xc1,
    witness_id: 0x3,
    seen: witness_core::Seen::NOTHING,
};

type Opener = Box<dyn Fn() -> Arc<dyn WitnessStore>>;

fn ms(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

async fn latency(name: &str, open: &Opener, steps: u64) -> anyhow::Result<()> {
    let store = open();
    store
        .create(&WitnessState::new(0, "bench", "witness:bench").with_fresh_nonce())
        .await?;
    let w = Witness::new(store);
    let mut write = Histogram::<u64>::new(3)?;
    let mut read = Histogram::<u64>::new(3)?;
    for subterm in 1..=steps {
        let req = AppendRequest {
            caller: CALLER,
            term: 1,
            leader: 1,
            entry_term: 1,
            entry_subterm: subterm,
            index: subterm,
            replication_set: vec![1, 3],
            replication_set_outgoing: vec![],
        };
        let t = Instant::now();
        let s = w.append(&req).await?;
        write.record(t.elapsed().as_micros() as u64)?;
        anyhow::ensure!(s.wrote, "each append of a new subterm writes");
        let t = Instant::now();
        w.read_term(CALLER).await?;
        read.record(t.elapsed().as_micros() as u64)?;
    }
    for (what, h) in [("append (load+CAS)", &write), ("read-term (load)", &read)] {
        println!(
            "| {name} | {what} | {steps} | {:.3} | {:.3} | {:.3} |",
            ms(h, 0.5),
            ms(h, 0.99),
            h.mean() / 1000.0
        );
    }
    Ok(())
}

async fn throughput(
    name: &str,
    open: &Opener,
    writers: u64,
    per_writer: u64,
) -> anyhow::Result<()> {
    let store = open();
    // The location may hold an earlier run's state: count from where it is.
    store
        .create(&WitnessState::new(0, "bench", "witness:bench").with_fresh_nonce())
        .await?;
    let first = store.load().await?.context("state")?.state.term;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..writers {
        let w = Witness::with_policy(open(), conformance::patient());
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_writer {
                conformance::increment(&w).await?;
            }
            anyhow::Ok(w.counters().conflicts.load(Ordering::Relaxed))
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await??;
    }
    let elapsed = started.elapsed();
    let total = writers * per_writer;
    let done = store.load().await?.context("state")?.state.term - first;
    anyhow::ensure!(
        done == total,
        "lost updates: {done} increments stored, {total} acknowledged"
    );
    println!(
        "| {name} | {writers} | {total} | {:.0} | {conflicts} | {:.2} |",
        total as f64 / elapsed.as_secs_f64(),
        conflicts as f64 / total as f64
    );
    Ok(())
}

async fn measure(name: &str, open: Opener, args: &Args, table: bool) -> anyhow::Result<()> {
    if table {
        println!(
            "| backend | step | steps | p50 ms | p99 ms | mean ms |\n|---|---|---|---|---|---|"
        );
        latency(name, &open, args.steps).await
    } else {
        println!(
            "| backend | writers | CAS total | CAS/s | conflicts | conflicts per CAS |\n|---|---|---|---|---|---|"
        );
        for &w in &args.writers {
            throughput(name, &open, w, args.per_writer).await?;
        }
        Ok(())
    }
}

/// Opens clients of one witness directory, taking the given paths (mounts of it) in turn.
fn mount_opener(paths: Vec<PathBuf>) -> anyhow::Result<Opener> {
    for p in &paths {
        eprintln!(
            "mount backend at {} ({})",
            p.display(),
            witness_mount::fs_report(p)?.fs_type
        );
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    Ok(Box::new(move || {
        let p = &paths[next.fetch_add(1, Ordering::Relaxed) % paths.len()];
        Arc::new(MountStore::open(p, MountOptions::default()).expect("open mount dir"))
            as Arc<dyn WitnessStore>
    }))
}

fn blob_opener(url: &str) -> anyhow::Result<Opener> {
    let WitnessUrl::AzBlob { uri } = WitnessUrl::parse(url)? else {
        anyhow::bail!("not a blob URL: {url}");
    };
    Ok(Box::new(move || {
        Arc::new(AzBlobStore::open(&uri, AzBlobOptions::default()).expect("open blob"))
            as Arc<dyn WitnessStore>
    }))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.dir).with_context(|| format!("create {}", args.dir.display()))?;
    for backend in &args.backend {
        let azurite = match backend {
            Backend::Azurite => {
                Some(tokio::task::spawn_blocking(e2e_tests::azurite::Azurite::start).await?)
            }
            _ => None,
        };
        let ssh = match backend {
            Backend::Sshfs => Some(tokio::task::spawn_blocking(SshServer::start).await?),
            _ => None,
        };
        // A fresh location (directory or blob) for each measurement.
        for (run, table) in [true, false].into_iter().enumerate() {
            let dir = tempfile::tempdir_in(&args.dir)?;
            match backend {
                Backend::Mount => {
                    measure(
                        "mount (local disk)",
                        mount_opener(vec![dir.path().into()])?,
                        &args,
                        table,
                    )
                    .await?;
                }
                Backend::Sshfs => {
                    let server = ssh.as_ref().expect("sshd started");
                    let mounts = tokio::task::block_in_place(|| {
                        [
                            server.mount(dir.path(), COHERENT),
                            server.mount(dir.path(), CACHED),
                        ]
                    });
                    let paths = mounts.iter().map(|m| m.path().to_path_buf()).collect();
                    measure(
                        "mount (sshfs, loopback)",
                        mount_opener(paths)?,
                        &args,
                        table,
                    )
                    .await?;
                    tokio::task::block_in_place(|| drop(mounts));
                }
                Backend::Azurite => {
                    let az = azurite.as_ref().expect("Azurite started");
                    let url = tokio::task::block_in_place(|| {
                        az.witness_url("bench", &format!("run{run}"))
                    });
                    measure("azurite (loopback)", blob_opener(&url)?, &args, table).await?;
                }
            }
            println!();
        }
        // Servers stop (SIGTERM) when dropped.
        tokio::task::block_in_place(|| drop((azurite, ssh)));
    }
    Ok(())
}
