//! etcd-bench: a load generator for any etcd v3 endpoint (etcd-node or etcd), shaped like etcd's
//! `tools/benchmark`: `put`, `range`, `txn-put`, plus `failover` (writes without pause and
//! reports the longest gap between acknowledged writes, for leader-kill measurements).
//!
//! ```text
//! etcd-bench --endpoints 127.0.0.1:2379 --conns 1 --clients 16 put --total 10000 --val-size 256
//! etcd-bench --clients 64 range foo --consistency s --total 20000
//! etcd-bench failover --duration 20
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use etcd_client::{Client, ConnectOptions, GetOptions, Txn, TxnOp};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Parser, Debug)]
#[command(name = "etcd-bench", about = "Load generator for etcd v3 endpoints")]
struct Cli {
    /// Comma-separated host:port (or http://host:port) endpoints.
    #[arg(long, default_value = "127.0.0.1:2379", value_delimiter = ',')]
    endpoints: Vec<String>,
    /// gRPC connections, shared round-robin by the clients.
    #[arg(long, default_value_t = 1)]
    conns: usize,
    /// Concurrent clients (each waits for its request before the next).
    #[arg(long, default_value_t = 1)]
    clients: usize,
    #[command(subcommand)]
    op: Op,
}

/// What the writing benchmarks write.
#[derive(Args, Debug)]
struct Writes {
    #[arg(long, default_value_t = 10_000)]
    total: u64,
    #[arg(long, default_value_t = 8)]
    key_size: usize,
    #[arg(long, default_value_t = 8)]
    val_size: usize,
    /// Distinct keys written (1: every put hits the same key, as etcd's default).
    #[arg(long, default_value_t = 1)]
    key_space_size: u64,
    /// Keys in order (0, 1, 2, ... modulo the key space) instead of at random.
    #[arg(long)]
    sequential_keys: bool,
}

impl Writes {
    /// The key number of request `i`.
    fn key_number(&self, i: u64, rng: &mut StdRng) -> u64 {
        let space = self.key_space_size.max(1);
        if self.sequential_keys {
            i % space
        } else {
            rng.random_range(0..space)
        }
    }
    fn key(&self, n: u64) -> Vec<u8> {
        let size = self.key_size;
        let mut k = format!("{n:0size$}").into_bytes();
        k.truncate(size.max(1));
        k
    }
    fn value(&self) -> Vec<u8> {
        vec![b'v'; self.val_size]
    }
}

#[derive(Subcommand, Debug)]
enum Op {
    /// Puts keys.
    Put {
        #[command(flatten)]
        writes: Writes,
    },
    /// Reads KEY (or [KEY, END)).
    Range {
        key: String,
        end: Option<String>,
        #[arg(long, default_value_t = 10_000)]
        total: u64,
        /// l (linearizable) or s (serializable).
        #[arg(long, default_value = "l")]
        consistency: String,
    },
    /// Txns of --txn-ops puts each.
    TxnPut {
        #[command(flatten)]
        writes: Writes,
        #[arg(long, default_value_t = 1)]
        txn_ops: usize,
    },
    /// Puts without pause for --duration seconds (each with a short timeout, retried on any
    /// endpoint) and reports the longest time between two acknowledged writes.
    Failover {
        #[arg(long, default_value_t = 20)]
        duration: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.clients == 0 || cli.conns == 0 {
        eprintln!("etcd-bench: --clients and --conns must be at least 1");
        return ExitCode::from(2);
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("etcd-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("etcd-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn connect(endpoints: &[String], timeout: Duration) -> anyhow::Result<Client> {
    let opts = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(timeout);
    Ok(Client::connect(endpoints, Some(opts)).await?)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let (total, name) = match &cli.op {
        Op::Put { writes } => (writes.total, "put"),
        Op::Range { total, .. } => (*total, "range"),
        Op::TxnPut { writes, .. } => (writes.total, "txn-put"),
        Op::Failover { duration } => {
            return failover(&cli.endpoints, Duration::from_secs(*duration)).await;
        }
    };
    let mut conns = Vec::new();
    for _ in 0..cli.conns {
        conns.push(connect(&cli.endpoints, Duration::from_secs(10)).await?);
    }
    let op = Arc::new(cli.op);
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..cli.clients {
        let mut client = conns[c % conns.len()].clone();
        let (op, next, errors) = (op.clone(), next.clone(), errors.clone());
        tasks.spawn(async move {
            let mut hist = Histogram::<u64>::new(3).expect("histogram");
            let mut rng = StdRng::seed_from_u64(c as u64);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return hist;
                }
                let t = Instant::now();
                let ok = match &*op {
                    Op::Put { writes } => {
                        let k = writes.key_number(i, &mut rng);
                        client
                            .put(writes.key(k), writes.value(), None)
                            .await
                            .is_ok()
                    }
                    Op::Range {
                        key,
                        end,
                        consistency,
                        ..
                    } => {
                        let mut o = GetOptions::new();
                        if let Some(e) = end {
                            o = o.with_range(e.as_bytes());
                        }
                        if consistency == "s" {
                            o = o.with_serializable();
                        }
                        client.get(key.as_bytes(), Some(o)).await.is_ok()
                    }
                    Op::TxnPut { writes, txn_ops } => {
                        let base = writes.key_number(i, &mut rng);
                        let ops: Vec<TxnOp> = (0..*txn_ops as u64)
                            .map(|j| TxnOp::put(writes.key(base + j), writes.value(), None))
                            .collect();
                        client.txn(Txn::new().and_then(ops)).await.is_ok()
                    }
                    Op::Failover { .. } => return hist,
                };
                if ok {
                    let _ = hist.record(t.elapsed().as_micros() as u64);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    let mut hist = Histogram::<u64>::new(3)?;
    while let Some(h) = tasks.join_next().await {
        hist.add(h?)?;
    }
    report(
        name,
        &cli.endpoints,
        cli.clients,
        cli.conns,
        started.elapsed(),
        &hist,
        errors.load(Ordering::Relaxed),
    );
    Ok(())
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

fn report(
    name: &str,
    endpoints: &[String],
    clients: usize,
    conns: usize,
    took: Duration,
    h: &Histogram<u64>,
    errors: u64,
) {
    let rps = h.len() as f64 / took.as_secs_f64();
    println!("Summary ({name}, {clients} clients, {conns} conns, {endpoints:?}):");
    println!("  Total:\t{:.4} secs.", took.as_secs_f64());
    println!("  Slowest:\t{:.4} ms.", ms(h.max()));
    println!("  Fastest:\t{:.4} ms.", ms(h.min()));
    println!("  Average:\t{:.4} ms.", h.mean() / 1000.0);
    println!("  Stddev:\t{:.4} ms.", h.stdev() / 1000.0);
    println!("  Requests/sec:\t{rps:.1}");
    println!("  Errors:\t{errors}");
    println!("\nLatency distribution:");
    for p in [10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9] {
        println!("  {p}% in {:.4} ms.", ms(h.value_at_quantile(p / 100.0)));
    }
    println!("\nResponse time histogram (ms):");
    let (lo, hi) = (h.min().max(1), h.max().max(2));
    let step = ((hi as f64 / lo as f64).ln() / 9.0).exp();
    let mut edge = lo as f64;
    let mut below = 0;
    for _ in 0..10 {
        edge *= step;
        let upto = h.count_between(0, edge as u64);
        let n = upto - below;
        below = upto;
        let bar = "∎".repeat((40 * n / h.len().max(1)) as usize);
        println!("  {:>10.3} [{n}]\t|{bar}", ms(edge as u64));
    }
    println!(
        "RESULT op={name} clients={clients} conns={conns} requests={} errors={errors} rps={rps:.1} p50_ms={:.3} p99_ms={:.3}",
        h.len(),
        ms(h.value_at_quantile(0.5)),
        ms(h.value_at_quantile(0.99)),
    );
}

async fn failover(endpoints: &[String], duration: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last_ok: Option<Instant> = None;
    let mut longest = Duration::ZERO;
    let mut acked = 0u64;
    let mut client: Option<Client> = None;
    let mut i = 0u64;
    while started.elapsed() < duration {
        i += 1;
        if client.is_none() {
            client = connect(endpoints, Duration::from_millis(500)).await.ok();
        }
        let ok = match client.as_mut() {
            Some(c) => c.put(format!("failover/{i}"), "x", None).await.is_ok(),
            None => false,
        };
        if ok {
            let now = Instant::now();
            if let Some(prev) = last_ok {
                longest = longest.max(now - prev);
            }
            last_ok = Some(now);
            acked += 1;
        } else {
            client = None; // reconnect: the endpoint may be gone
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    println!(
        "RESULT op=failover acked={acked} longest_gap_ms={:.0}",
        longest.as_secs_f64() * 1000.0
    );
    Ok(())
}
