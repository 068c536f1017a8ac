//! etcd-node: an etcd-compatible member whose Raft uses a witness on shared storage. Takes
//! etcd's flags (`etcd-node --help`), `ETCD_*` environment variables, or `--config-file`.

use std::process::ExitCode;

use clap::Parser;
use etcd_node::config::{Flags, ServerConfig, strip_etcd_args};

fn main() -> ExitCode {
    // (etcd's flags that have no effect here are taken out first, to be named in a warning)
    let (args, ignored) = match strip_etcd_args(std::env::args().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("etcd-node: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = match ServerConfig::from_flags(Flags::parse_from(args), ignored) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("etcd-node: {e}");
            return ExitCode::from(2);
        }
    };
    let level = match cfg.log_level.as_str() {
        "panic" | "fatal" => "error",
        l => l,
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if !cfg.ignored.is_empty() {
        tracing::warn!(
            keys = cfg.ignored.join(","),
            "these etcd flags or config keys have no effect in etcd-node (docs/operations.md)"
        );
    }
    if let Err(e) = etcd_node::failpoint::setup() {
        eprintln!("etcd-node: {e}");
        return ExitCode::from(2);
    }
    // (tokio reads the variable too, but panics on a bad value: checked here first)
    let workers = match etcd_node::config::client_workers(
        std::env::var(etcd_node::config::CLIENT_WORKERS_VAR)
            .ok()
            .as_deref(),
    ) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("etcd-node: {e}");
            return ExitCode::from(2);
        }
    };
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        builder.worker_threads(n);
    }
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("etcd-node: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(etcd_node::server::run(cfg, shutdown_signal()));
    // (a witness step blocked on an unreachable share must not hold the exit)
    runtime.shutdown_timeout(etcd_node::server::SHUTDOWN_GRACE);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("etcd-node: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return ctrl_c.await.unwrap_or(()),
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
