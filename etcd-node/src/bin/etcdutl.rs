//! etcdutl: tools for etcd-node. `etcdutl witness init|status|add`, `etcdutl snapshot
//! restore|status|export`, `etcdutl cluster reconcile`, `etcdutl wal dump`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use etcd_node::config::ServerConfig;
use etcd_node::reconcile;
use etcd_node::server::restore::{RestoreOptions, restore};
use etcd_node::server::snapshot_file::{export_etcd, status as file_status};
use etcd_node::server::wal_dump;
use etcd_node::witness::{InitOptions, init, status};
use witness_core::WitnessUrl;

#[derive(Parser, Debug)]
#[command(name = "etcdutl", version, about = "Offline tools for etcd-node")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Manage a witness: a logless tie-breaker on shared storage.
    #[command(subcommand)]
    Witness(WitnessCommand),
    /// Restore, inspect or export a snapshot file saved with `etcdctl snapshot save` (from
    /// etcd-node or from etcd).
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Manage a running cluster's members.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Read a member's write-ahead log.
    #[command(subcommand)]
    Wal(WalCommand),
}

#[derive(Subcommand, Debug)]
enum WalCommand {
    /// Print what a member's WAL holds as JSON lines (changes nothing; safe while the member
    /// runs): a line about the WAL, then one per entry, each request also in etcd's own
    /// encoding (`etcd_data`: base64 of the `InternalRaftRequest` etcd would have logged).
    Dump {
        /// The member's data directory (the one with member/wal).
        #[arg(long = "data-dir")]
        data_dir: PathBuf,
        /// The member's --wal-dir, if it was started with one.
        #[arg(long = "wal-dir")]
        wal_dir: Option<PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Compare the cluster's members and witness with a desired list and print the next step
    /// (with --apply: take the steps, one membership change at a time, re-reading the cluster
    /// after each). Exit status: 0 the cluster is as desired, 2 waiting for something only the
    /// operator can do (start a member's process), 1 an error.
    Reconcile {
        /// Client URLs of the cluster's members, comma-separated.
        #[arg(long, default_value = "127.0.0.1:2379", value_delimiter = ',')]
        endpoints: Vec<String>,
        /// The desired members and witness (YAML or JSON): `members: [{name, peer-urls}]` and
        /// `witness: {name, url}`.
        #[arg(long)]
        desired: PathBuf,
        /// Take the steps (without it: print the first one only, change nothing).
        #[arg(long)]
        apply: bool,
        /// USER:PASSWORD of a root user, when authentication is enabled.
        #[arg(long)]
        user: Option<String>,
        /// How long a promotion waits for the learner to catch up.
        #[arg(long, default_value = "60s", value_parser = |s: &str| etcd_node::config::parse_go_duration("wait", s))]
        wait: std::time::Duration,
    },
}

#[derive(Subcommand, Debug)]
enum SnapshotCommand {
    /// Build a new member's data directory from a snapshot, for a new cluster whose members
    /// are given by --initial-cluster (run it once per regular member, with the same file and
    /// the same cluster flags).
    Restore {
        /// The snapshot file.
        file: PathBuf,
        /// This member's name.
        #[arg(long, default_value = "default")]
        name: String,
        /// The data directory to create (default <name>.etcd); it must not exist yet.
        #[arg(long = "data-dir")]
        data_dir: Option<PathBuf>,
        /// A dedicated WAL directory to create, given as --wal-dir to the restored member
        /// (default: in the data directory); it must not exist yet.
        #[arg(long = "wal-dir")]
        wal_dir: Option<PathBuf>,
        /// The new cluster: NAME=peer URL,... including the witness (NAME=witness:...).
        #[arg(long = "initial-cluster")]
        initial_cluster: Option<String>,
        /// The new cluster's token (member and cluster ids derive from it and the peer URLs).
        #[arg(long = "initial-cluster-token", default_value = "etcd-cluster")]
        initial_cluster_token: String,
        /// This member's peer URLs, as in --initial-cluster.
        #[arg(
            long = "initial-advertise-peer-urls",
            default_value = "http://localhost:2380"
        )]
        initial_advertise_peer_urls: String,
        /// Restore even if the file's SHA-256 does not match its contents.
        #[arg(long = "skip-hash-check")]
        skip_hash_check: bool,
        /// Raise the restored revision by this much (needs --mark-compacted), so clients that
        /// remember a newer revision of the lost cluster are not confused.
        #[arg(long = "bump-revision", default_value_t = 0)]
        bump_revision: u64,
        /// Compact everything before the restored revision: older reads and watches get
        /// "required revision has been compacted" and start over.
        #[arg(long = "mark-compacted")]
        mark_compacted: bool,
    },
    /// Write an etcd-node snapshot file as an etcd one (a bbolt database ending with its
    /// SHA-256), for etcd's own `snapshot restore`: the way back from etcd-node to etcd.
    Export {
        /// The etcd-node snapshot file (`etcdctl snapshot save` against etcd-node).
        file: PathBuf,
        /// The file format to write; `etcd` is the only one.
        #[arg(long, value_enum, default_value_t = ExportFormat::Etcd)]
        format: ExportFormat,
        /// The file to write; it must not exist.
        #[arg(long, short = 'o')]
        output: PathBuf,
        /// Export even if the file's SHA-256 does not match its contents.
        #[arg(long = "skip-hash-check")]
        skip_hash_check: bool,
    },
    /// Show what a snapshot file holds (etcd-node's or etcd's).
    Status {
        /// The snapshot file.
        file: PathBuf,
        /// Output format.
        #[arg(short = 'w', long = "write-out", value_enum, default_value_t = Format::Table)]
        write_out: Format,
    },
}

#[derive(Subcommand, Debug)]
enum WitnessCommand {
    /// Initialise a new witness (writes its first state).
    Init {
        /// The witness member's name, as in --initial-cluster NAME=witness:...
        #[arg(long)]
        name: String,
        #[command(flatten)]
        url: PeerUrl,
        /// Replace an existing or corrupt witness (discards its term and vote; only while no node uses it).
        #[arg(long)]
        force: bool,
    },
    /// Add an initialised witness to a running cluster (a configuration change, through a
    /// member's client URL). etcdctl 3.4 refuses a `witness:` URL in `member add` before sending
    /// it, so this does what `etcdctl member add NAME --peer-urls 'witness:...'` would.
    Add {
        /// Client URLs of the cluster's members (host:port or http://host:port), comma-separated.
        #[arg(long, default_value = "127.0.0.1:2379", value_delimiter = ',')]
        endpoints: Vec<String>,
        #[command(flatten)]
        url: PeerUrl,
        /// USER:PASSWORD of a root user, when authentication is enabled.
        #[arg(long)]
        user: Option<String>,
    },
    /// Show a witness's state.
    Status {
        #[command(flatten)]
        url: PeerUrl,
        /// Output format.
        #[arg(short = 'w', long = "write-out", value_enum, default_value_t = Format::Table)]
        write_out: Format,
    },
}

/// The witness a command works on.
#[derive(Args, Debug)]
struct PeerUrl {
    /// The witness's peer URL: witness:mount?path=<escaped path> or
    /// witness:azblob?uri=<escaped SAS URI>.
    #[arg(
        long = "advertise-peer-url",
        alias = "initial-advertise-url",
        value_name = "URL"
    )]
    advertise_peer_url: String,
}

impl PeerUrl {
    fn parse(&self) -> anyhow::Result<WitnessUrl> {
        WitnessUrl::parse(&self.advertise_peer_url).context("--advertise-peer-url")
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ExportFormat {
    /// etcd 3.4/3.5's snapshot file.
    Etcd,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Table,
    Json,
}

/// `etcdutl cluster reconcile`: prints each step and why; the exit status says where it stopped.
async fn reconcile_cluster(
    session: &reconcile::Session,
    desired: &reconcile::Desired,
    apply: bool,
    wait: std::time::Duration,
) -> anyhow::Result<ExitCode> {
    // (a bound: a cluster that keeps changing under the reconciler is not chased forever)
    for n in 1..=20 {
        let actual = reconcile::observe(session).await?;
        let (step, why) = reconcile::plan(desired, &actual);
        match &step {
            reconcile::Step::Converged => {
                println!("{step}: {why}");
                return Ok(ExitCode::SUCCESS);
            }
            reconcile::Step::Wait { .. } => {
                println!("{step} ({why})");
                return Ok(ExitCode::from(2));
            }
            _ if !apply => {
                println!("would: {step}\n  because {why}\n  (dry run: pass --apply to act)");
                return Ok(ExitCode::from(2));
            }
            _ => {
                println!("step {n}: {step}\n  because {why}");
                reconcile::apply(session, &step, &actual, wait)
                    .await
                    .with_context(|| format!("step {n}: {step}"))?;
            }
        }
    }
    anyhow::bail!("the cluster did not settle after 20 steps; run again to see its state")
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Wal(WalCommand::Dump { data_dir, wal_dir }) => {
            let stdout = std::io::stdout();
            wal_dump::dump(&data_dir, wal_dir.as_deref(), &mut stdout.lock())
                .with_context(|| format!("etcdutl wal dump --data-dir {}", data_dir.display()))?;
        }
        Command::Cluster(ClusterCommand::Reconcile {
            endpoints,
            desired,
            apply,
            user,
            wait,
        }) => {
            let text = std::fs::read_to_string(&desired)
                .with_context(|| format!("--desired {}", desired.display()))?;
            let want = reconcile::Desired::parse(&text, &desired.display().to_string())?;
            let user = match user {
                Some(u) => {
                    let (name, password) =
                        u.split_once(':').context("--user: write USER:PASSWORD")?;
                    Some((name.to_string(), password.to_string()))
                }
                None => None,
            };
            let session = reconcile::Session { endpoints, user };
            return reconcile_cluster(&session, &want, apply, wait).await;
        }
        Command::Witness(WitnessCommand::Init {
            name,
            url: peer,
            force,
        }) => {
            let url = peer.parse()?;
            let report = init(&InitOptions {
                name: name.clone(),
                url: url.clone(),
                force,
            })
            .await
            .with_context(|| format!("etcdutl witness init {url}"))?;
            if let Some(fs) = &report.fs {
                println!("file system: {} (statfs magic {:#x})", fs.fs_type, fs.magic);
            }
            for w in &report.warnings {
                eprintln!("warning: {w}");
            }
            let verb = if report.replaced {
                "replaced"
            } else {
                "initialised"
            };
            println!(
                "{verb} witness {name:?} at {url} (storage version {})",
                report.version
            );
        }
        Command::Witness(WitnessCommand::Add {
            endpoints,
            url: peer,
            user,
        }) => {
            let url = peer.parse()?;
            let mut opts = etcd_client::ConnectOptions::new()
                .with_connect_timeout(std::time::Duration::from_secs(5))
                .with_timeout(std::time::Duration::from_secs(30));
            if let Some(user) = user {
                let (name, password) = user
                    .split_once(':')
                    .context("--user: write USER:PASSWORD")?;
                opts = opts.with_user(name, password);
            }
            let client = etcd_client::Client::connect(&endpoints, Some(opts))
                .await
                .with_context(|| format!("connecting to {}", endpoints.join(",")))?;
            // (the cluster client sends the URL as given; `Client::member_add` would prefix
            // "http://" to it)
            let added = client
                .cluster_client()
                .member_add(vec![peer.advertise_peer_url], None)
                .await
                .map_err(reconcile::server_error)
                .with_context(|| format!("etcdutl witness add {url}"))?;
            let m = added.member().context("the answer names no member")?;
            println!(
                "added witness {:?} ({:x}) at {url} to the cluster ({:x})",
                m.name(),
                m.id(),
                added.header().map_or(0, |h| h.cluster_id())
            );
        }
        Command::Witness(WitnessCommand::Status {
            url: peer,
            write_out,
        }) => {
            let url = peer.parse()?;
            let report = status(&url)
                .await
                .with_context(|| format!("etcdutl witness status {url}"))?;
            match write_out {
                Format::Table => print!("{}", report.table()),
                Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
        }
        Command::Snapshot(SnapshotCommand::Restore {
            file,
            name,
            data_dir,
            wal_dir,
            initial_cluster,
            initial_cluster_token,
            initial_advertise_peer_urls,
            skip_hash_check,
            bump_revision,
            mark_compacted,
        }) => {
            // The cluster flags mean what they mean to etcd-node: check them the same way.
            let mut args = vec![
                "etcdutl snapshot restore".to_string(),
                format!("--name={name}"),
                format!("--initial-cluster-token={initial_cluster_token}"),
                format!("--initial-advertise-peer-urls={initial_advertise_peer_urls}"),
            ];
            args.extend(initial_cluster.map(|c| format!("--initial-cluster={c}")));
            args.extend(data_dir.map(|d| format!("--data-dir={}", d.display())));
            args.extend(wal_dir.map(|d| format!("--wal-dir={}", d.display())));
            let cfg = ServerConfig::from_args(args).map_err(anyhow::Error::msg)?;
            let opts = RestoreOptions {
                skip_hash_check,
                bump_revision,
                mark_compacted,
            };
            let r = restore(&cfg, &file, &opts)
                .await
                .with_context(|| format!("etcdutl snapshot restore {}", file.display()))?;
            if let Some(e) = r.imported {
                println!(
                    "read an etcd snapshot: revision {} (compacted {}), {} rows of history, {} \
                     leases, {} users, {} roles, auth {}",
                    e.revision,
                    e.compacted,
                    e.rows,
                    e.leases,
                    e.users,
                    e.roles,
                    if e.auth_enabled { "on" } else { "off" }
                );
            }
            println!(
                "restored member {name} ({:x}) of cluster {:x} into {}: revision {}, {} keys",
                r.member_id,
                r.cluster_id,
                r.data_dir.display(),
                r.summary.revision,
                r.summary.keys
            );
        }
        Command::Snapshot(SnapshotCommand::Export {
            file,
            format: ExportFormat::Etcd,
            output,
            skip_hash_check,
        }) => {
            let s = export_etcd(&file, &output, skip_hash_check)
                .with_context(|| format!("etcdutl snapshot export {}", file.display()))?;
            println!(
                "exported revision {} (compacted {}): {} rows of history, {} leases, {} users, \
                 {} roles, auth {} into {}",
                s.revision,
                s.compacted,
                s.rows,
                s.leases,
                s.users,
                s.roles,
                if s.auth_enabled { "on" } else { "off" },
                output.display()
            );
            println!(
                "restore it with etcd's own tool: `etcdctl snapshot restore {}` (etcd 3.4) or \
                 `etcdutl snapshot restore {}` (etcd 3.5), with the new cluster's flags",
                output.display(),
                output.display()
            );
        }
        Command::Snapshot(SnapshotCommand::Status { file, write_out }) => {
            let st = file_status(&file)
                .with_context(|| format!("etcdutl snapshot status {}", file.display()))?;
            let s = st.summary;
            match write_out {
                Format::Table => {
                    println!(
                        "HASH      REVISION  TOTAL KEYS  TOTAL SIZE  COMPACTED  VERSIONS  LEASES"
                    );
                    println!(
                        "{:08x}  {:<8}  {:<10}  {:<10}  {:<9}  {:<8}  {}",
                        st.hash, s.revision, s.keys, st.size, s.compacted, s.versions, s.leases
                    );
                }
                Format::Json => println!(
                    "{}",
                    serde_json::json!({
                        "hash": st.hash,
                        "revision": s.revision,
                        "totalKey": s.keys,
                        "totalSize": st.size,
                        "compactRevision": s.compacted,
                        "versions": s.versions,
                        "leases": s.leases,
                        "format": if st.etcd.is_some() { "etcd" } else { "etcd-node" },
                    })
                ),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ETCDUTL_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
