//! etcdutl: offline tools for etcd-node. `etcdutl witness init|status`.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
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
}

#[derive(Subcommand, Debug)]
enum WitnessCommand {
    /// Initialise a new witness (writes its first state).
    Init {
        /// The witness member's name, as in --initial-cluster NAME=witness:...
        #[arg(long)]
        name: String,
        /// The witness's peer URL: witness:mount?path=<escaped path> or witness:azblob?uri=<escaped SAS URI>.
        #[arg(
            long = "advertise-peer-url",
            alias = "initial-advertise-url",
            value_name = "URL"
        )]
        advertise_peer_url: String,
        /// Replace an existing or corrupt witness (discards its term and vote; only while no node uses it).
        #[arg(long)]
        force: bool,
    },
    /// Show a witness's state.
    Status {
        /// The witness's peer URL.
        #[arg(
            long = "advertise-peer-url",
            alias = "initial-advertise-url",
            value_name = "URL"
        )]
        advertise_peer_url: String,
        /// Output format.
        #[arg(short = 'w', long = "write-out", value_enum, default_value_t = Format::Table)]
        write_out: Format,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Table,
    Json,
}

fn parse_url(s: &str) -> anyhow::Result<WitnessUrl> {
    WitnessUrl::parse(s).context("--advertise-peer-url")
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Witness(WitnessCommand::Init {
            name,
            advertise_peer_url,
            force,
        }) => {
            let url = parse_url(&advertise_peer_url)?;
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
        Command::Witness(WitnessCommand::Status {
            advertise_peer_url,
            write_out,
        }) => {
            let url = parse_url(&advertise_peer_url)?;
            let report = status(&url)
                .await
                .with_context(|| format!("etcdutl witness status {url}"))?;
            match write_out {
                Format::Table => print!("{}", report.table()),
                Format::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
        }
    }
    Ok(())
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
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
