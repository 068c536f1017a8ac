//! etcd-bench: a load generator for any etcd v3 endpoint (etcd-node or etcd), shaped like etcd's
//! `tools/benchmark`: `put`, `range`, `mixed` (puts and linearizable gets of the same keys),
//! `txn-put`, `watch-fanout` (events per second delivered to
//! many watchers of one key), `lease-churn` (leases granted, then expired by the server, per
//! second), plus `failover` (writes without pause and reports the longest gap between
//! acknowledged writes, for leader-kill measurements).
//!
//! ```text
//! etcd-bench --endpoints 127.0.0.1:2379 --conns 1 --clients 16 put --total 10000 --val-size 256
//! etcd-bench --clients 64 range foo --consistency s --total 20000
//! etcd-bench --clients 16 mixed --total 40000 --read-percent 50 --key-space-size 100000
//! etcd-bench --conns 10 watch-fanout --watchers 1000 --puts 200
//! etcd-bench --clients 16 lease-churn --total 5000
//! etcd-bench failover --duration 20
//! etcd-bench --gateway --clients 16 put --total 10000 --val-size 256
//! ```

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use etcd_client::{
    Client, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Parser, Debug, Clone)]
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
    /// The CA that verifies https:// endpoints (etcdctl's --cacert).
    #[arg(long)]
    cacert: Option<std::path::PathBuf>,
    /// A client certificate for https:// endpoints (etcdctl's --cert; with --key).
    #[arg(long)]
    cert: Option<std::path::PathBuf>,
    /// The client certificate's key (etcdctl's --key).
    #[arg(long)]
    key: Option<std::path::PathBuf>,
    /// `put` and `range` through etcd's JSON gateway (plain http:// endpoints; each client its
    /// own connection, spread over the endpoints).
    #[arg(long)]
    gateway: bool,
    #[command(subcommand)]
    op: Op,
}

/// What the writing benchmarks write.
#[derive(Args, Debug, Clone)]
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
    /// What the values hold.
    #[arg(long, value_enum, default_value_t = Values::Random)]
    values: Values,
}

/// What a benchmark's values hold (every request writes the same value, as etcd's `benchmark`
/// tool does).
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum Values {
    /// Random bytes, as etcd's `benchmark` tool writes: nothing to compress.
    Random,
    /// JSON text like a Kubernetes object's (a ConfigMap with labels and managed fields),
    /// repeated to the size asked: what compresses.
    Object,
}

/// The text `Values::Object` repeats.
const OBJECT: &str = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"config-4711","namespace":"default","uid":"3f2a8c71-2b5c-4c1d-9e7f-0a6b3c9d1e42","resourceVersion":"184467","creationTimestamp":"2026-12-02T10:15:31Z","labels":{"app.kubernetes.io/name":"edge-gateway","app.kubernetes.io/instance":"edge-gateway-7","app.kubernetes.io/component":"proxy","tier":"edge"},"managedFields":[{"manager":"kubectl-client-side-apply","operation":"Update","apiVersion":"v1","time":"2026-12-02T10:15:31Z","fieldsType":"FieldsV1","fieldsV1":{"f:data":{".":{},"f:config.yaml":{}},"f:metadata":{"f:labels":{".":{},"f:tier":{}}}}}]},"data":{"config.yaml":"listen: 0.0.0.0:8443
upstreams:
  - name: api
    url: https://10.0.4.17:6443
    timeout: 5s
"}}"#;

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
        match self.values {
            Values::Random => {
                let mut v = vec![0u8; self.val_size];
                StdRng::seed_from_u64(self.val_size as u64).fill(v.as_mut_slice());
                v
            }
            Values::Object => OBJECT.bytes().cycle().take(self.val_size).collect(),
        }
    }
}

#[derive(Subcommand, Debug, Clone)]
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
    /// Puts and linearizable gets of one key each, over the same keys, mixed at random
    /// (--read-percent of the requests are gets); reports the rate and latency of each kind.
    Mixed {
        #[command(flatten)]
        writes: Writes,
        #[arg(long, default_value_t = 50)]
        read_percent: u32,
    },
    /// Txns of --txn-ops puts each.
    TxnPut {
        #[command(flatten)]
        writes: Writes,
        #[arg(long, default_value_t = 1)]
        txn_ops: usize,
    },
    /// --watchers watchers of one key, spread over --conns streams; --clients writers put the
    /// key --puts times; reports the events per second delivered to all the watchers.
    WatchFanout {
        #[arg(long, default_value_t = 1000)]
        watchers: usize,
        #[arg(long, default_value_t = 200)]
        puts: u64,
    },
    /// Grants --total leases of --ttl seconds (each with a key), then waits until the server
    /// has expired them all; reports grants per second and expiries per second.
    LeaseChurn {
        #[arg(long, default_value_t = 5000)]
        total: u64,
        #[arg(long, default_value_t = 2)]
        ttl: i64,
    },
    /// Puts without pause for --duration seconds (each with a short timeout, retried on any
    /// endpoint) and reports the longest time between two acknowledged writes.
    Failover {
        #[arg(long, default_value_t = 20)]
        duration: u64,
        /// Also writes the time of every acknowledgement there (seconds since the Unix epoch,
        /// one a line, in order; the run's start and end count as two), to find the gap at a
        /// given moment (a kill's).
        #[arg(long)]
        acks: Option<std::path::PathBuf>,
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

/// A client of the endpoints: plain ones balanced by etcd-client, an https:// one (picked at
/// random) over etcd-node's TLS dialer with `--cacert`, `--cert` and `--key`.
async fn connect(cli: &Cli, timeout: Duration) -> anyhow::Result<Client> {
    let endpoints = &cli.endpoints;
    if !endpoints.iter().any(|e| e.starts_with("https://")) {
        let opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(timeout);
        return Ok(Client::connect(endpoints, Some(opts)).await?);
    }
    let side = etcd_node::tls::Side {
        name: "client",
        trusted_ca_file: cli.cacert.clone(),
        cert_file: cli.cert.clone(),
        key_file: cli.key.clone(),
        ..Default::default()
    };
    let dialer = etcd_node::tls::Dialer::new(
        &side,
        &etcd_node::tls::Policy::default(),
        etcd_node::tls::RECHECK,
    )
    .map_err(anyhow::Error::msg)?;
    let url = &endpoints[rand::random_range(0..endpoints.len())];
    let endpoint = tonic::transport::Endpoint::from_shared(url.clone())?
        .connect_timeout(Duration::from_secs(2))
        .timeout(timeout)
        .tcp_nodelay(true);
    let channel = dialer.connect(endpoint).await.map_err(anyhow::Error::msg)?;
    Ok(Client::from_channel(etcd_client::Channel::Tonic(channel), None).await?)
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let (total, name) = match &cli.op {
        Op::Put { writes } => (writes.total, "put"),
        Op::Range { total, .. } => (*total, "range"),
        Op::TxnPut { writes, .. } => (writes.total, "txn-put"),
        Op::Mixed { writes, .. } => (writes.total, "mixed"),
        Op::Failover { duration, acks } => {
            return failover(&cli, Duration::from_secs(*duration), acks.as_deref()).await;
        }
        Op::WatchFanout { watchers, puts } => {
            return watch_fanout(&cli, *watchers, *puts).await;
        }
        Op::LeaseChurn { total, ttl } => return lease_churn(&cli, *total, *ttl).await,
    };
    if cli.gateway {
        return over_gateway(cli, total, name).await;
    }
    let mut conns = Vec::new();
    for _ in 0..cli.conns {
        conns.push(connect(&cli, Duration::from_secs(10)).await?);
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
            // (writes, and reads of a mixed load)
            let mut hist = Histogram::<u64>::new(3).expect("histogram");
            let mut reads = Histogram::<u64>::new(3).expect("histogram");
            let mut rng = StdRng::seed_from_u64(c as u64);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return (hist, reads);
                }
                let t = Instant::now();
                let mut read = false;
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
                    Op::Mixed {
                        writes,
                        read_percent,
                    } => {
                        let k = writes.key(writes.key_number(i, &mut rng));
                        read = rng.random_range(0..100) < *read_percent;
                        if read {
                            client.get(k, None).await.is_ok()
                        } else {
                            client.put(k, writes.value(), None).await.is_ok()
                        }
                    }
                    Op::Failover { .. } | Op::WatchFanout { .. } | Op::LeaseChurn { .. } => {
                        return (hist, reads);
                    }
                };
                if ok {
                    let h = if read { &mut reads } else { &mut hist };
                    let _ = h.record(t.elapsed().as_micros() as u64);
                } else {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    let mut hist = Histogram::<u64>::new(3)?;
    let mut reads = Histogram::<u64>::new(3)?;
    while let Some(h) = tasks.join_next().await {
        let (w, r) = h?;
        hist.add(&w)?;
        reads.add(&r)?;
    }
    let took = started.elapsed();
    let errors = errors.load(Ordering::Relaxed);
    if let Op::Mixed { .. } = &*op {
        let mut all = hist.clone();
        all.add(&reads)?;
        report_mixed(
            [cli.clients, cli.conns],
            took,
            &all,
            [&hist, &reads],
            errors,
        );
    } else {
        report(
            name,
            &cli.endpoints,
            cli.clients,
            cli.conns,
            took,
            &hist,
            errors,
        );
    }
    Ok(())
}

/// A mixed load's RESULT line: every request, then the writes and the reads apart (their
/// rates over the whole run).
fn report_mixed(
    [clients, conns]: [usize; 2],
    took: Duration,
    all: &Histogram<u64>,
    [writes, reads]: [&Histogram<u64>; 2],
    errors: u64,
) {
    let rate = |h: &Histogram<u64>| h.len() as f64 / took.as_secs_f64();
    let p99 = |h: &Histogram<u64>| ms(h.value_at_quantile(0.99));
    println!(
        "RESULT op=mixed clients={} conns={} requests={} errors={errors} rps={:.1} p50_ms={:.3} \
         p99_ms={:.3} put_rps={:.1} put_p99_ms={:.3} range_rps={:.1} range_p99_ms={:.3}",
        clients,
        conns,
        all.len(),
        rate(all),
        ms(all.value_at_quantile(0.5)),
        p99(all),
        rate(writes),
        p99(writes),
        rate(reads),
        p99(reads),
    );
}

/// One HTTP/1.1 keep-alive connection to etcd's JSON gateway.
struct Gateway {
    io: tokio::io::BufReader<tokio::net::TcpStream>,
    host: String,
}

impl Gateway {
    async fn connect(endpoint: &str) -> anyhow::Result<Gateway> {
        if endpoint.starts_with("https://") {
            anyhow::bail!("--gateway takes plain http:// endpoints (got {endpoint})");
        }
        let host = endpoint.trim_start_matches("http://").to_string();
        let stream = tokio::net::TcpStream::connect(&host).await?;
        stream.set_nodelay(true)?;
        Ok(Gateway {
            io: tokio::io::BufReader::new(stream),
            host,
        })
    }

    /// POSTs `body` to `path`; the answer's body when it is 200 OK.
    async fn post(&mut self, path: &str, body: &[u8]) -> anyhow::Result<Vec<u8>> {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n",
            self.host,
            body.len()
        );
        let stream = self.io.get_mut();
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body).await?;
        let mut line = String::new();
        self.io.read_line(&mut line).await?;
        let status = line.split(' ').nth(1).unwrap_or("").to_string();
        let mut length = None;
        loop {
            line.clear();
            if self.io.read_line(&mut line).await? == 0 {
                anyhow::bail!("the gateway closed the connection");
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = Some(value.trim().parse::<usize>()?);
            }
        }
        let Some(length) = length else {
            anyhow::bail!("the gateway answered without a Content-Length");
        };
        let mut answer = vec![0; length];
        self.io.read_exact(&mut answer).await?;
        if status != "200" {
            anyhow::bail!("{status}: {}", String::from_utf8_lossy(&answer));
        }
        Ok(answer)
    }
}

/// The gateway path and JSON body of request `i`.
type RequestOf = dyn Fn(u64, &mut StdRng) -> (&'static str, Vec<u8>) + Send + Sync;

/// `put` and `range` through the JSON gateway: each client its own connection.
async fn over_gateway(cli: Cli, total: u64, name: &str) -> anyhow::Result<()> {
    use etcd_node::server::api::gateway::pb::etcdserverpb::{PutRequest, RangeRequest};
    let request: Arc<RequestOf> = match cli.op.clone() {
        Op::Put { writes } => Arc::new(move |i, rng| {
            let put = PutRequest {
                key: writes.key(writes.key_number(i, rng)),
                value: writes.value(),
                ..Default::default()
            };
            ("/v3/kv/put", serde_json::to_vec(&put).expect("JSON"))
        }),
        Op::Range {
            key,
            end,
            consistency,
            ..
        } => {
            let range = RangeRequest {
                key: key.into_bytes(),
                range_end: end.map(String::into_bytes).unwrap_or_default(),
                serializable: consistency == "s",
                ..Default::default()
            };
            let body = serde_json::to_vec(&range).expect("JSON");
            Arc::new(move |_, _| ("/v3/kv/range", body.clone()))
        }
        _ => anyhow::bail!("--gateway runs put and range only"),
    };
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..cli.clients {
        let endpoint = cli.endpoints[c % cli.endpoints.len()].clone();
        let (request, next, errors) = (request.clone(), next.clone(), errors.clone());
        tasks.spawn(async move {
            let mut hist = Histogram::<u64>::new(3).expect("histogram");
            let mut rng = StdRng::seed_from_u64(c as u64);
            let mut conn = Gateway::connect(&endpoint).await?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return Ok::<_, anyhow::Error>(hist);
                }
                let (path, body) = request(i, &mut rng);
                let t = Instant::now();
                match conn.post(path, &body).await {
                    Ok(_) => {
                        let _ = hist.record(t.elapsed().as_micros() as u64);
                    }
                    Err(_) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        conn = Gateway::connect(&endpoint).await?;
                    }
                }
            }
        });
    }
    let mut hist = Histogram::<u64>::new(3)?;
    while let Some(h) = tasks.join_next().await {
        hist.add(h??)?;
    }
    report(
        &format!("{name}-gateway"),
        &cli.endpoints,
        cli.clients,
        cli.clients,
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

/// Runs `per_client(client, i)` for i in 0..total over `clients` concurrent clients sharing
/// `conns` connections; returns how many succeeded.
async fn spread<F, Fut>(cli: &Cli, total: u64, per_client: F) -> anyhow::Result<u64>
where
    F: Fn(Client, u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let mut conns = Vec::new();
    for _ in 0..cli.conns {
        conns.push(connect(cli, Duration::from_secs(10)).await?);
    }
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..cli.clients {
        let (client, next, f) = (
            conns[c % conns.len()].clone(),
            next.clone(),
            per_client.clone(),
        );
        tasks.spawn(async move {
            let mut ok = 0;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return ok;
                }
                ok += u64::from(f(client.clone(), i).await);
            }
        });
    }
    let mut ok = 0;
    while let Some(n) = tasks.join_next().await {
        ok += n?;
    }
    Ok(ok)
}

async fn watch_fanout(cli: &Cli, watchers: usize, puts: u64) -> anyhow::Result<()> {
    let key = format!("fanout/{}", rand::random::<u32>());
    let received = Arc::new(AtomicU64::new(0));
    let want = watchers as u64 * puts;
    let (done_tx, mut done) = tokio::sync::watch::channel(());
    let mut streams = Vec::new();
    let per_stream = watchers.div_ceil(cli.conns);
    for s in 0..cli.conns {
        let n = per_stream.min(watchers.saturating_sub(s * per_stream));
        if n == 0 {
            break;
        }
        let mut client = connect(cli, Duration::from_secs(10)).await?;
        let mut ws = client.watch(key.as_bytes(), None).await?;
        for _ in 1..n {
            ws.watch(key.as_bytes(), None).await?;
        }
        let mut created = 0;
        while created < n {
            let r = ws
                .message()
                .await?
                .ok_or_else(|| anyhow::anyhow!("watch ended"))?;
            created += usize::from(r.created());
        }
        let (received, done_tx) = (received.clone(), done_tx.clone());
        streams.push(tokio::spawn(async move {
            while let Ok(Some(r)) = ws.message().await {
                let n = r.events().len() as u64;
                if received.fetch_add(n, Ordering::Relaxed) + n >= want {
                    let _ = done_tx.send(());
                }
            }
            drop(client);
        }));
    }
    let started = Instant::now();
    let value = vec![b'v'; 16];
    let k = key.clone();
    let written = spread(cli, puts, move |mut c, _| {
        let (key, value) = (k.clone(), value.clone());
        async move { c.put(key, value, None).await.is_ok() }
    })
    .await?;
    let wrote = started.elapsed();
    let _ = tokio::time::timeout(Duration::from_secs(60), done.changed()).await;
    let took = started.elapsed();
    let got = received.load(Ordering::Relaxed);
    streams.iter().for_each(|s| s.abort());
    println!(
        "RESULT op=watch-fanout watchers={watchers} streams={} puts={written} events={got}/{want} \
         events_per_sec={:.0} puts_per_sec={:.0} secs={:.3}",
        streams.len(),
        got as f64 / took.as_secs_f64(),
        written as f64 / wrote.as_secs_f64(),
        took.as_secs_f64()
    );
    Ok(())
}

async fn lease_churn(cli: &Cli, total: u64, ttl: i64) -> anyhow::Result<()> {
    let prefix = format!("churn/{}/", rand::random::<u32>());
    let mut client = connect(cli, Duration::from_secs(10)).await?;
    let mut ws = client
        .watch(prefix.as_bytes(), Some(WatchOptions::new().with_prefix()))
        .await?;
    ws.message().await?;
    let started = Instant::now();
    let p = prefix.clone();
    let granted = spread(cli, total, move |mut c, i| {
        let key = format!("{p}{i}");
        async move {
            let Ok(lease) = c.lease_grant(ttl, None).await else {
                return false;
            };
            let opts = PutOptions::new().with_lease(lease.id());
            c.put(key, "x", Some(opts)).await.is_ok()
        }
    })
    .await?;
    let grants_took = started.elapsed();
    let (mut expired, mut first) = (0u64, None);
    let deadline = Instant::now() + Duration::from_secs(ttl.unsigned_abs() * 3 + 120);
    while expired < granted && Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Ok(Some(r))) = tokio::time::timeout(left, ws.message()).await else {
            break;
        };
        let deletes = r
            .events()
            .iter()
            .filter(|e| e.event_type() == EventType::Delete)
            .count() as u64;
        if deletes > 0 {
            first.get_or_insert_with(Instant::now);
        }
        expired += deletes;
    }
    let expiring = first.map_or(Duration::ZERO, |f| f.elapsed());
    println!(
        "RESULT op=lease-churn leases={granted} grants_per_sec={:.0} expired={expired} \
         expiries_per_sec={:.0} expiry_window_secs={:.3}",
        granted as f64 / grants_took.as_secs_f64(),
        expired as f64 / expiring.as_secs_f64().max(0.001),
        expiring.as_secs_f64()
    );
    Ok(())
}

async fn failover(
    cli: &Cli,
    duration: Duration,
    acks_file: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    // --clients writers, each with its own connection and no timeout of its own on a put: the
    // longest gap between two acknowledged writes (of any writer) is what a leader kill costs.
    let started = Instant::now();
    let acks: Arc<std::sync::Mutex<Vec<Instant>>> = Arc::default();
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..cli.clients {
        let (cli, acks) = (cli.clone(), acks.clone());
        writers.spawn(async move {
            let mut client: Option<Client> = None;
            let mut i = 0u64;
            while started.elapsed() < duration {
                i += 1;
                if client.is_none() {
                    client = connect(&cli, Duration::from_millis(500)).await.ok();
                }
                let ok = match client.as_mut() {
                    Some(c) => c.put(format!("failover/{w}/{i}"), "x", None).await.is_ok(),
                    None => false,
                };
                if ok {
                    acks.lock().unwrap().push(Instant::now());
                } else {
                    client = None; // reconnect: the endpoint may be gone
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        });
    }
    while writers.join_next().await.is_some() {}
    let mut acks = std::mem::take(&mut *acks.lock().unwrap());
    let acked = acks.len();
    // The end counts as an acknowledgement: a put that hung from the kill until after the run's
    // duration (etcd's server answers a proposal its dead leader dropped only after its request
    // timeout) is a gap too, not a gap left out.
    acks.push(Instant::now());
    // (and the start: a run that acknowledged nothing reports its whole length)
    acks.push(started);
    acks.sort();
    let longest = acks
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default();
    if let Some(path) = acks_file {
        // (on the wall clock, to set beside a kill's time and the members' logs)
        let (now, wall) = (Instant::now(), std::time::SystemTime::now());
        let unix = wall.duration_since(std::time::UNIX_EPOCH)?;
        let lines: String = acks
            .iter()
            .map(|a| format!("{:.6}\n", (unix - (now - *a)).as_secs_f64()))
            .collect();
        std::fs::write(path, lines)?;
    }
    println!(
        "RESULT op=failover clients={} acked={} longest_gap_ms={:.0}",
        cli.clients,
        acked,
        longest.as_secs_f64() * 1000.0
    );
    Ok(())
}
