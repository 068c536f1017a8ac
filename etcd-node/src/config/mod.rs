//! etcd-compatible configuration: etcd's flag names and defaults, the matching `ETCD_*`
//! environment variables, and `--config-file` (YAML with etcd's keys; when given, flags and
//! environment variables are ignored, as etcd does). [`ServerConfig::from_args`] parses and
//! validates; every error names the flag (or key) and the fix.
//!
//! A member of `--initial-cluster` whose peer URL has the `witness:` scheme is the witness: at
//! most one, never this node, never in a `--listen-*` flag, and only beside at least two regular
//! members.

mod etcd_keys;
mod ids;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Deserialize;
use witness_core::WitnessUrl;

use crate::tls;

/// Applied entries between two durable commits of the key space by default (bounds replay after
/// a crash; `--backend-batch-limit` sets it). Fewer take less disk under random writes, since
/// redb keeps every page a durable commit names until the next one, but each durable commit
/// stalls the applier for its fsync (docs/runs/benchmarks-2026-11-22-to-27.md, "Durable key-space commits").
pub const SYNC_EVERY: u64 = 10_000;

/// When the applier makes the key space durable: once `every` entries or `interval` (if any)
/// have gone by since it last did, whichever comes first. No interval by default: etcd's 100 ms
/// makes the file about 13% smaller under random puts and doubles their p99 at 16 clients
/// (docs/runs/benchmarks-2026-11-22-to-27.md, "Durable key-space commits").
#[derive(Debug, Clone, Copy)]
pub struct SyncPolicy {
    pub every: u64,
    pub interval: Option<Duration>,
}

pub use etcd_keys::strip_args as strip_etcd_args;
pub use ids::{cluster_id, member_id};

/// etcd's flags (the subset etcd-node understands), with etcd's defaults.
#[derive(Parser, Debug, Clone, Deserialize)]
#[command(
    name = "etcd-node",
    version = crate::version::LONG_VERSION,
    about = "An etcd-compatible node whose Raft is extended with a witness on shared storage",
    // A flag given twice takes its last value, as Go's flag package (etcd's) does; etcd's own
    // test framework passes --snapshot-count and --initial-cluster-token twice.
    args_override_self = true
)]
#[serde(rename_all = "kebab-case", default, deny_unknown_fields)]
pub struct Flags {
    /// Human-readable name for this member.
    #[arg(long, env = "ETCD_NAME", default_value = "default")]
    pub name: String,
    /// Path to the data directory [default: <name>.etcd].
    #[arg(long, env = "ETCD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Path to a dedicated WAL directory, for a disk of the WAL's own [default:
    /// <data-dir>/member/wal]. Give the same one at every start: a member whose data directory
    /// has a snapshot but whose WAL directory has no WAL refuses to start.
    #[arg(long, env = "ETCD_WAL_DIR")]
    pub wal_dir: Option<PathBuf>,
    /// URLs to listen on for client traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_CLIENT_URLS",
        default_value = "http://localhost:2379"
    )]
    pub listen_client_urls: String,
    /// This member's client URLs to advertise to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_ADVERTISE_CLIENT_URLS",
        default_value = "http://localhost:2379"
    )]
    pub advertise_client_urls: String,
    /// URLs to listen on for peer traffic.
    #[arg(
        long,
        env = "ETCD_LISTEN_PEER_URLS",
        default_value = "http://localhost:2380"
    )]
    pub listen_peer_urls: String,
    /// This member's peer URLs to advertise to the rest of the cluster.
    #[arg(
        long,
        env = "ETCD_INITIAL_ADVERTISE_PEER_URLS",
        default_value = "http://localhost:2380"
    )]
    pub initial_advertise_peer_urls: String,
    /// Initial cluster configuration for bootstrapping: name=peer-url,... A `witness:` peer URL
    /// makes that member the witness [default: <name>=<initial-advertise-peer-urls>].
    #[arg(long, env = "ETCD_INITIAL_CLUSTER")]
    pub initial_cluster: Option<String>,
    /// Initial cluster state: new or existing.
    #[arg(long, env = "ETCD_INITIAL_CLUSTER_STATE", default_value = "new")]
    pub initial_cluster_state: String,
    /// Initial cluster token, which makes member and cluster ids unique per cluster.
    #[arg(
        long,
        env = "ETCD_INITIAL_CLUSTER_TOKEN",
        default_value = "etcd-cluster"
    )]
    pub initial_cluster_token: String,
    /// Time (in milliseconds) of a heartbeat interval.
    #[arg(long, env = "ETCD_HEARTBEAT_INTERVAL", default_value_t = 100)]
    pub heartbeat_interval: u64,
    /// Time (in milliseconds) for an election to time out.
    #[arg(long, env = "ETCD_ELECTION_TIMEOUT", default_value_t = 1000)]
    pub election_timeout: u64,
    /// Number of committed transactions to trigger a snapshot to disk.
    #[arg(long, env = "ETCD_SNAPSHOT_COUNT", default_value_t = 100_000)]
    pub snapshot_count: u64,
    /// Raise an alarm when the backend size exceeds this many bytes (0: the 2 GiB default).
    #[arg(long, env = "ETCD_QUOTA_BACKEND_BYTES", default_value_t = 0)]
    pub quota_backend_bytes: u64,
    /// Memory for the key space's page cache, in bytes (not etcd's: reads past it go to the
    /// file, through the kernel's page cache).
    #[arg(long, env = "ETCD_BACKEND_CACHE_BYTES", default_value_t = crate::mvcc::DEFAULT_CACHE_BYTES as u64)]
    pub backend_cache_bytes: u64,
    /// Entries applied between two durable commits of the key space (0: 10,000). Fewer make
    /// the file smaller under random writes and cost puts and their p99 (docs/operations.md).
    #[arg(long, env = "ETCD_BACKEND_BATCH_LIMIT", default_value_t = 0)]
    pub backend_batch_limit: u64,
    /// The longest time an applied entry waits for a durable commit of the key space (a Go
    /// duration; 0: none, only --backend-batch-limit; etcd's default is 100ms, which here costs
    /// the puts' p99 for a smaller file: docs/operations.md).
    #[arg(long, env = "ETCD_BACKEND_BATCH_INTERVAL", default_value = "0")]
    pub backend_batch_interval: String,
    /// How often a watcher that asked for progress notifications gets one (a Go duration).
    /// (`--watch-progress-notify-interval` is etcd 3.6's name, which kubeadm passes.)
    #[arg(
        long,
        alias = "watch-progress-notify-interval",
        env = "ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL",
        default_value = "10m"
    )]
    #[serde(alias = "watch-progress-notify-interval")]
    pub experimental_watch_progress_notify_interval: String,
    /// How often the leader compares its key space's hash with the other members' (a Go
    /// duration; 0s turns the check off; etcd's default is off).
    /// (`--corrupt-check-time`: etcd 3.6's name.)
    #[arg(
        long,
        alias = "corrupt-check-time",
        env = "ETCD_EXPERIMENTAL_CORRUPT_CHECK_TIME",
        default_value = "5m"
    )]
    #[serde(alias = "corrupt-check-time")]
    pub experimental_corrupt_check_time: String,
    /// How often each member reads its witness to check that it is there, readable and the one
    /// the cluster is bound to (a Go duration; 0s turns the probe off). A read, never a write.
    #[arg(long, env = "ETCD_WITNESS_PROBE_INTERVAL", default_value = "10s")]
    pub witness_probe_interval: String,
    /// A file holding the SAS token of a blob witness (the query string, or the whole blob SAS
    /// URI). Read at every use, so a rotated token is picked up without a restart. The member
    /// list stores the witness's URL with its signature redacted: each member needs the token
    /// here (or in its own --initial-cluster).
    #[arg(long, env = "ETCD_WITNESS_SAS_FILE")]
    pub witness_sas_file: Option<PathBuf>,
    /// Restart this member as the only voter of its cluster (same ids, no witness), keeping its
    /// data: the last resort when the other member is gone for good. Refused when this member
    /// is provably behind. Remove the flag before the next restart.
    #[arg(long, env = "ETCD_FORCE_NEW_CLUSTER", action = clap::ArgAction::SetTrue)]
    pub force_new_cluster: bool,
    /// Log level: debug, info, warn or error.
    #[arg(long, env = "ETCD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Additional URLs to serve /metrics and /health on.
    #[arg(long, env = "ETCD_LISTEN_METRICS_URLS", default_value = "")]
    pub listen_metrics_urls: String,
    /// Path to the client server TLS certificate file.
    #[arg(long, env = "ETCD_CERT_FILE")]
    pub cert_file: Option<PathBuf>,
    /// Path to the client server TLS key file.
    #[arg(long, env = "ETCD_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// Enable client certificate authentication (clients must present a certificate signed by
    /// --trusted-ca-file).
    #[arg(long, env = "ETCD_CLIENT_CERT_AUTH", action = clap::ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub client_cert_auth: bool,
    /// Path to the client certificate revocation list file.
    #[arg(long, env = "ETCD_CLIENT_CRL_FILE")]
    pub client_crl_file: Option<PathBuf>,
    /// Path to the client server TLS trusted CA certificate file.
    #[arg(long, env = "ETCD_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,
    /// Client TLS using generated certificates (kept in <data-dir>/fixtures/client).
    #[arg(long, env = "ETCD_AUTO_TLS", action = clap::ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub auto_tls: bool,
    /// Path to the peer server TLS certificate file (also presented to peers as this member's
    /// client certificate).
    #[arg(long, env = "ETCD_PEER_CERT_FILE")]
    pub peer_cert_file: Option<PathBuf>,
    /// Path to the peer server TLS key file.
    #[arg(long, env = "ETCD_PEER_KEY_FILE")]
    pub peer_key_file: Option<PathBuf>,
    /// Enable peer client certificate authentication.
    #[arg(long, env = "ETCD_PEER_CLIENT_CERT_AUTH", action = clap::ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub peer_client_cert_auth: bool,
    /// Path to the peer certificate revocation list file.
    #[arg(long, env = "ETCD_PEER_CRL_FILE")]
    pub peer_crl_file: Option<PathBuf>,
    /// Path to the peer server TLS trusted CA file.
    #[arg(long, env = "ETCD_PEER_TRUSTED_CA_FILE")]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// Peer TLS using generated certificates (kept in <data-dir>/fixtures/peer).
    #[arg(long, env = "ETCD_PEER_AUTO_TLS", action = clap::ArgAction::Set, default_value_t = false, num_args = 0..=1, default_missing_value = "true")]
    pub peer_auto_tls: bool,
    /// Allowed CommonName for inter-peer authentication.
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_CN")]
    pub peer_cert_allowed_cn: Option<String>,
    /// Allowed TLS hostname (a DNS name in the certificate) for inter-peer authentication.
    #[arg(long, env = "ETCD_PEER_CERT_ALLOWED_HOSTNAME")]
    pub peer_cert_allowed_hostname: Option<String>,
    /// Comma-separated list of supported TLS 1.2 cipher suites between client/server and
    /// peers (empty: rustls's defaults). TLS 1.3's suites are not configurable, as in etcd.
    #[arg(long, env = "ETCD_CIPHER_SUITES", default_value = "")]
    pub cipher_suites: String,
    /// Minimum TLS version supported by etcd-node: TLS1.2 or TLS1.3.
    #[arg(long, env = "ETCD_TLS_MIN_VERSION", default_value = "TLS1.2")]
    pub tls_min_version: String,
    /// Maximum TLS version supported by etcd-node: TLS1.2 or TLS1.3 (empty: the newest).
    #[arg(long, env = "ETCD_TLS_MAX_VERSION", default_value = "")]
    pub tls_max_version: String,
    /// The validity period of the client and peer certificates made by --auto-tls and
    /// --peer-auto-tls, in years.
    #[arg(long, env = "ETCD_SELF_SIGNED_CERT_VALIDITY", default_value_t = 1)]
    pub self_signed_cert_validity: u32,
    /// Cluster features to turn on, as Name=true,Other=false: a feature is used once every
    /// regular member turns it on (etcd-node/src/version.rs lists them).
    #[arg(long, env = "ETCD_FEATURE_GATES", default_value = "")]
    pub feature_gates: String,
    /// The most learners the cluster may have at once (`member add --learner` past it is
    /// refused). (`--max-learners`: etcd 3.6's name.)
    #[arg(
        long,
        alias = "max-learners",
        env = "ETCD_EXPERIMENTAL_MAX_LEARNERS",
        default_value_t = 1
    )]
    #[serde(alias = "max-learners")]
    pub experimental_max_learners: usize,
    /// Reject requests larger than this many bytes (etcd's default: 1.5 MiB).
    #[arg(long, env = "ETCD_MAX_REQUEST_BYTES", default_value_t = 1536 * 1024)]
    pub max_request_bytes: u64,
    /// Interpret --auto-compaction-retention as a time ("periodic") or a number of revisions
    /// ("revision").
    #[arg(long, env = "ETCD_AUTO_COMPACTION_MODE", default_value = "periodic")]
    pub auto_compaction_mode: String,
    /// Auto compaction retention: for "periodic" a Go duration or a number of hours, for
    /// "revision" a number of revisions; 0 turns auto compaction off.
    #[arg(long, env = "ETCD_AUTO_COMPACTION_RETENTION", default_value = "0")]
    pub auto_compaction_retention: String,
    /// Read the configuration from this YAML file (etcd's keys); flags and environment
    /// variables are then ignored.
    #[arg(long, env = "ETCD_CONFIG_FILE")]
    #[serde(skip)]
    pub config_file: Option<PathBuf>,
}

impl Default for Flags {
    fn default() -> Self {
        Flags::parse_from(["etcd-node"])
    }
}

/// A refused configuration: the message names the flag (or the file) and what to write
/// instead. It stops a member at start, or refuses an etcdutl argument; no client sees it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidConfig(pub String);

impl From<String> for InvalidConfig {
    fn from(message: String) -> Self {
        InvalidConfig(message)
    }
}

impl From<tls::TlsError> for InvalidConfig {
    fn from(e: tls::TlsError) -> Self {
        InvalidConfig(e.to_string())
    }
}

impl From<&str> for InvalidConfig {
    fn from(message: &str) -> Self {
        InvalidConfig(message.to_string())
    }
}

/// A `http://host:port` or `https://host:port` URL as given, with the address it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpUrl {
    /// The URL as written (what member ids hash, as etcd's do).
    pub text: String,
    pub host: String,
    pub port: u16,
    /// `https://`: TLS.
    pub tls: bool,
}

impl HttpUrl {
    pub fn parse(flag: &str, s: &str) -> Result<Self, InvalidConfig> {
        let bad = |why: &str| format!("--{flag}: {s:?} {why}");
        let parsed = url::Url::parse(s)
            .map_err(|e| bad(&format!("is not a URL ({e}); write http://host:port")))?;
        let tls = match parsed.scheme() {
            "http" => false,
            "https" => true,
            "unix" | "unixs" => {
                return Err(bad(
                    "is a unix socket, which etcd-node does not serve; use http:// or https://",
                )
                .into());
            }
            _ => return Err(bad("must be an http://host:port or https://host:port URL").into()),
        };
        let host = parsed
            .host_str()
            .ok_or_else(|| bad("has no host; write http://host:port"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = parsed
            .port()
            .ok_or_else(|| bad("has no port; write http://host:port"))?;
        if !matches!(parsed.path(), "" | "/") || parsed.query().is_some() {
            return Err(bad("must not have a path or query; write http://host:port").into());
        }
        Ok(HttpUrl {
            text: s.to_string(),
            host,
            port,
            tls,
        })
    }

    /// The socket addresses to bind or dial.
    pub fn socket_addrs(&self) -> Result<Vec<SocketAddr>, InvalidConfig> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map(Iterator::collect)
            .map_err(|e| InvalidConfig(format!("cannot resolve {}: {e}", self.text)))
    }
}

/// A member's peer address: HTTP URLs for a regular member, a witness URL for the witness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerUrls {
    Regular(Vec<HttpUrl>),
    Witness(WitnessUrl),
}

/// A member of `--initial-cluster`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitialMember {
    pub name: String,
    pub id: u64,
    pub peer: PeerUrls,
    /// The peer URL strings as written (what the id hashes).
    pub peer_texts: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClusterState {
    New,
    Existing,
}

/// A validated server configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    pub member_id: u64,
    pub cluster_id: u64,
    pub data_dir: PathBuf,
    /// The WAL's directory (`--wal-dir`, or `<data-dir>/member/wal`).
    pub wal_dir: PathBuf,
    pub listen_client_urls: Vec<HttpUrl>,
    pub advertise_client_urls: Vec<HttpUrl>,
    pub listen_peer_urls: Vec<HttpUrl>,
    pub initial_advertise_peer_urls: Vec<HttpUrl>,
    pub initial_cluster: Vec<InitialMember>,
    pub initial_cluster_state: ClusterState,
    pub initial_cluster_token: String,
    pub heartbeat_interval: Duration,
    pub election_timeout: Duration,
    pub snapshot_count: u64,
    pub quota_backend_bytes: u64,
    pub backend_cache_bytes: usize,
    /// When the key space is made durable: every `--backend-batch-limit` entries or
    /// `--backend-batch-interval`, whichever comes first.
    pub backend_sync: SyncPolicy,
    pub log_level: String,
    pub listen_metrics_urls: Vec<HttpUrl>,
    pub watch_progress_notify_interval: Duration,
    /// How often the leader runs the corruption check (None: never).
    pub corrupt_check: Option<Duration>,
    /// How often the member probes its witness (None: never).
    pub witness_probe: Option<Duration>,
    /// Where a blob witness's SAS token is (see `--witness-sas-file`).
    pub witness_sas_file: Option<PathBuf>,
    pub force_new_cluster: bool,
    /// TLS on the client listeners (and for this member's calls to other members' client URLs).
    pub client_tls: tls::Side,
    /// TLS on the peer listeners and links.
    pub peer_tls: tls::Side,
    pub tls_policy: tls::Policy,
    /// Years the auto-TLS certificates are valid.
    pub self_signed_cert_validity: u32,
    pub max_request_bytes: usize,
    /// `--experimental-max-learners`.
    pub max_learners: usize,
    /// The cluster features `--feature-gates` turns on.
    pub feature_gates: std::collections::BTreeSet<String>,
    pub auto_compaction: Option<AutoCompaction>,
    /// etcd flags or keys that were set but have no effect here (named in a WARN at start).
    pub ignored: Vec<String>,
}

/// `--auto-compaction-mode` with its `--auto-compaction-retention`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoCompaction {
    /// Keep this much history.
    Periodic(Duration),
    /// Keep this many revisions.
    Revision(u64),
}

fn parse_auto_compaction(
    mode: &str,
    retention: &str,
) -> Result<Option<AutoCompaction>, InvalidConfig> {
    let retention = retention.trim();
    let off = retention.is_empty() || retention.parse::<f64>().is_ok_and(|n| n == 0.0);
    match mode {
        "periodic" | "revision" if off => Ok(None),
        "periodic" => {
            // (etcd: a bare number is hours)
            let d = match retention.parse::<f64>() {
                Ok(hours) => Duration::try_from_secs_f64(hours * 3600.0).map_err(|_| {
                    format!("--auto-compaction-retention: {retention:?} is not a number of hours")
                })?,
                Err(_) => parse_go_duration("auto-compaction-retention", retention)?,
            };
            Ok(Some(AutoCompaction::Periodic(d)))
        }
        "revision" => retention
            .parse::<u64>()
            .map(|n| Some(AutoCompaction::Revision(n)))
            .map_err(|_| {
                InvalidConfig(format!(
                    "--auto-compaction-retention: {retention:?} is not a number of revisions (--auto-compaction-mode revision)"
                ))
            }),
        other => Err(format!(
            "--auto-compaction-mode: {other:?} is neither \"periodic\" nor \"revision\""
        ).into()),
    }
}

/// The variable that sets how many worker threads serve the client API (tokio's own name for
/// it: docs/operations.md, after the flags; docs/architecture.md, "Threads").
pub const CLIENT_WORKERS_VAR: &str = "TOKIO_WORKER_THREADS";

/// The client API's worker threads asked for in `value` (the content of
/// [`CLIENT_WORKERS_VAR`], if set): a whole number from 1 to 1024. Unset: one per core.
pub fn client_workers(value: Option<&str>) -> Result<Option<usize>, InvalidConfig> {
    let Some(v) = value else {
        return Ok(None);
    };
    match v.trim().parse::<usize>() {
        Ok(n @ 1..=1024) => Ok(Some(n)),
        _ => Err(format!(
            "{CLIENT_WORKERS_VAR}={v:?}: expected the number of threads that serve clients, \
             from 1 to 1024; unset it for one per core"
        )
        .into()),
    }
}

/// A Go duration (`10m`, `1m30s`, `500ms`, `2h`): what etcd's duration flags take.
pub fn parse_go_duration(flag: &str, s: &str) -> Result<Duration, InvalidConfig> {
    let bad =
        || format!("--{flag}: {s:?} is not a duration; write it as Go does, e.g. 10m, 30s, 500ms");
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad().into());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        let n: f64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad().into()),
        };
        total += Duration::try_from_secs_f64(n * seconds).map_err(|_| bad())?;
        rest = &rest[unit_len..];
    }
    Ok(total)
}

/// The largest --max-request-bytes (etcd warns above 10 MiB; a request is held in memory
/// several times over, and a Raft entry this large slows every member).
pub const MAX_REQUEST_BYTES_LIMIT: usize = 64 * 1024 * 1024;

/// etcd's default backend quota.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 * 1024 * 1024 * 1024;

fn url_list(flag: &str, s: &str) -> Result<Vec<HttpUrl>, InvalidConfig> {
    let urls: Vec<HttpUrl> = s
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(|u| {
            if WitnessUrl::is_witness(u) {
                Err(format!(
                    "--{flag}: {u:?} is a witness URL; a witness is storage, not a listener: name it only in --initial-cluster"
                ).into())
            } else {
                HttpUrl::parse(flag, u)
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(urls)
}

fn parse_initial_cluster(s: &str, token: &str) -> Result<Vec<InitialMember>, InvalidConfig> {
    let mut members: Vec<InitialMember> = Vec::new();
    for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, url) = item.split_once('=').ok_or_else(|| {
            format!("--initial-cluster: {item:?} is not name=url; write e.g. infra0=http://10.0.1.10:2380")
        })?;
        let (name, url) = (name.trim(), url.trim());
        if name.is_empty() {
            return Err(format!("--initial-cluster: {item:?} has an empty member name").into());
        }
        let peer = if WitnessUrl::is_witness(url) {
            let w = WitnessUrl::parse(url)
                .map_err(|e| format!("--initial-cluster: member {name:?}: {e}"))?;
            PeerUrls::Witness(w)
        } else {
            PeerUrls::Regular(vec![HttpUrl::parse("initial-cluster", url)?])
        };
        match (members.iter_mut().find(|m| m.name == name), peer) {
            (Some(m), PeerUrls::Regular(mut new)) if matches!(m.peer, PeerUrls::Regular(_)) => {
                if let PeerUrls::Regular(urls) = &mut m.peer {
                    urls.append(&mut new);
                }
                m.peer_texts.push(url.to_string());
            }
            (Some(_), _) => {
                return Err(format!(
                    "--initial-cluster: member {name:?} has a witness URL and another URL; a witness has exactly one URL"
                ).into());
            }
            (None, peer) => members.push(InitialMember {
                name: name.to_string(),
                id: 0,
                // A witness's SAS signature stays in this member's flags: the member list (and
                // the id, which hashes these) gets the redacted URL.
                peer_texts: vec![match peer {
                    PeerUrls::Witness(_) => WitnessUrl::member_list_form(url),
                    PeerUrls::Regular(_) => url.to_string(),
                }],
                peer,
            }),
        }
    }
    for m in &mut members {
        m.id = match &m.peer {
            // (the storage it names, whatever SAS token this member was given)
            PeerUrls::Witness(_) => member_id(&[WitnessUrl::identity(&m.peer_texts[0])], token),
            PeerUrls::Regular(_) => member_id(&m.peer_texts, token),
        };
    }
    Ok(members)
}

impl ServerConfig {
    /// Parses the command line (and environment, or the config file) and validates it.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Self, InvalidConfig> {
        let (args, ignored) = strip_etcd_args(args.into_iter().collect())?;
        let flags = Flags::try_parse_from(args).map_err(|e| e.to_string())?;
        Self::from_flags(flags, ignored)
    }

    /// The configuration the flags give (or their `--config-file`); `ignored`: the etcd flags
    /// [`strip_etcd_args`] took out.
    pub fn from_flags(flags: Flags, ignored: Vec<String>) -> Result<Self, InvalidConfig> {
        match &flags.config_file {
            Some(path) => Self::from_file(path),
            None => Self::validate(flags).map(|c| c.also_ignored(ignored)),
        }
    }

    /// Reads a YAML config file with etcd's keys.
    pub fn from_file(path: &std::path::Path) -> Result<Self, InvalidConfig> {
        let bad = |e: &dyn std::fmt::Display| format!("--config-file {}: {e}", path.display());
        let text = std::fs::read_to_string(path).map_err(|e| bad(&e))?;
        let (keys, ignored) = etcd_keys::flatten_file(&text).map_err(|e| bad(&e))?;
        let flags: Flags =
            serde_norway::from_value(serde_norway::Value::Mapping(keys)).map_err(|e| bad(&e))?;
        Self::validate(flags).map(|c| c.also_ignored(ignored))
    }

    /// Adds etcd's keys without an effect that were found before validation.
    fn also_ignored(mut self, mut ignored: Vec<String>) -> Self {
        ignored.append(&mut self.ignored);
        ServerConfig { ignored, ..self }
    }

    /// Checks a set of flags; the error names the flag and the fix.
    pub fn validate(f: Flags) -> Result<Self, InvalidConfig> {
        if f.name.trim().is_empty() {
            return Err("--name must not be empty".into());
        }
        let initial_cluster_state = match f.initial_cluster_state.as_str() {
            "new" => ClusterState::New,
            "existing" => ClusterState::Existing,
            other => {
                return Err(format!(
                    "--initial-cluster-state: {other:?} is neither \"new\" nor \"existing\""
                )
                .into());
            }
        };
        if !matches!(f.log_level.as_str(), "debug" | "info" | "warn" | "error") {
            return Err(format!(
                "--log-level: {:?} is not one of debug, info, warn, error",
                f.log_level
            )
            .into());
        }
        if f.heartbeat_interval == 0 {
            return Err("--heartbeat-interval must be at least 1 (milliseconds)".into());
        }
        if f.election_timeout < 5 * f.heartbeat_interval {
            return Err(format!(
                "--election-timeout ({} ms) must be at least 5 times --heartbeat-interval ({} ms)",
                f.election_timeout, f.heartbeat_interval
            )
            .into());
        }
        if f.snapshot_count == 0 {
            return Err("--snapshot-count must be at least 1".into());
        }
        let watch_progress_notify_interval = parse_go_duration(
            "experimental-watch-progress-notify-interval",
            &f.experimental_watch_progress_notify_interval,
        )?;
        if watch_progress_notify_interval.is_zero() {
            return Err("--experimental-watch-progress-notify-interval must be above 0".into());
        }
        let corrupt_check = parse_go_duration(
            "experimental-corrupt-check-time",
            &f.experimental_corrupt_check_time,
        )?;
        let witness_probe = parse_go_duration("witness-probe-interval", &f.witness_probe_interval)?;
        let backend_sync = SyncPolicy {
            every: match f.backend_batch_limit {
                0 => SYNC_EVERY,
                n => n,
            },
            // (Go takes a bare 0 as a duration)
            interval: match f.backend_batch_interval.trim() {
                "0" => None,
                s => Some(parse_go_duration("backend-batch-interval", s)?).filter(|d| !d.is_zero()),
            },
        };
        let listen_client_urls = url_list("listen-client-urls", &f.listen_client_urls)?;
        let advertise_client_urls = url_list("advertise-client-urls", &f.advertise_client_urls)?;
        let listen_peer_urls = url_list("listen-peer-urls", &f.listen_peer_urls)?;
        let initial_advertise_peer_urls = url_list(
            "initial-advertise-peer-urls",
            &f.initial_advertise_peer_urls,
        )?;
        let listen_metrics_urls = url_list("listen-metrics-urls", &f.listen_metrics_urls)?;
        let (client_tls, peer_tls) = tls_sides(&f)?;
        for (flag, urls, side) in [
            ("listen-client-urls", &listen_client_urls, &client_tls),
            ("listen-metrics-urls", &listen_metrics_urls, &client_tls),
            ("listen-peer-urls", &listen_peer_urls, &peer_tls),
        ] {
            if let Some(u) = urls.iter().find(|u| u.tls)
                && !side.serves_tls()
            {
                let p = side.prefix;
                return Err(format!(
                    "--{flag}: {} is https://, which needs --{p}cert-file and --{p}key-file (or --{p}auto-tls)",
                    u.text
                ).into());
            }
        }
        let cipher_suites: Vec<String> = f
            .cipher_suites
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(String::from)
            .collect();
        let tls_policy = tls::Policy::new(&cipher_suites, &f.tls_min_version, &f.tls_max_version)?;
        let auto_compaction =
            parse_auto_compaction(&f.auto_compaction_mode, &f.auto_compaction_retention)?;
        if f.max_request_bytes == 0 {
            return Err("--max-request-bytes must be above 0 (etcd's default: 1572864)".into());
        }
        let max_request_bytes = usize::try_from(f.max_request_bytes)
            .ok()
            .filter(|n| *n <= MAX_REQUEST_BYTES_LIMIT)
            .ok_or_else(|| {
                format!("--max-request-bytes must be at most {MAX_REQUEST_BYTES_LIMIT}")
            })?;
        for (flag, urls) in [
            ("listen-client-urls", &listen_client_urls),
            ("listen-peer-urls", &listen_peer_urls),
            ("initial-advertise-peer-urls", &initial_advertise_peer_urls),
        ] {
            if urls.is_empty() {
                return Err(format!("--{flag} needs at least one http://host:port URL").into());
            }
        }
        let (members, member_id, ids) =
            initial_members(&f, &initial_advertise_peer_urls, &peer_tls)?;
        let (feature_gates, etcd_gates) = crate::version::parse_gates(&f.feature_gates)
            .map_err(|e| InvalidConfig(e.to_string()))?;
        let data_dir = f
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("{}.etcd", f.name)));
        let wal_dir = crate::storage::wal_dir(&data_dir, f.wal_dir.as_deref())?;
        Ok(ServerConfig {
            member_id,
            cluster_id: cluster_id(&ids),
            data_dir,
            wal_dir,
            name: f.name,
            listen_client_urls,
            advertise_client_urls,
            listen_peer_urls,
            initial_advertise_peer_urls,
            initial_cluster: members,
            initial_cluster_state,
            initial_cluster_token: f.initial_cluster_token,
            heartbeat_interval: Duration::from_millis(f.heartbeat_interval),
            election_timeout: Duration::from_millis(f.election_timeout),
            snapshot_count: f.snapshot_count,
            quota_backend_bytes: if f.quota_backend_bytes == 0 {
                DEFAULT_QUOTA_BYTES
            } else {
                f.quota_backend_bytes
            },
            backend_cache_bytes: usize::try_from(f.backend_cache_bytes).unwrap_or(usize::MAX),
            backend_sync,
            log_level: f.log_level,
            listen_metrics_urls,
            watch_progress_notify_interval,
            corrupt_check: (!corrupt_check.is_zero()).then_some(corrupt_check),
            witness_probe: (!witness_probe.is_zero()).then_some(witness_probe),
            witness_sas_file: f.witness_sas_file.clone(),
            force_new_cluster: f.force_new_cluster,
            client_tls,
            peer_tls,
            tls_policy,
            self_signed_cert_validity: f.self_signed_cert_validity,
            max_request_bytes,
            max_learners: f.experimental_max_learners,
            feature_gates,
            auto_compaction,
            ignored: etcd_gates
                .into_iter()
                .map(|g| format!("feature-gates {g}"))
                .collect(),
        })
    }

    /// The witness member, if the cluster has one.
    pub fn witness(&self) -> Option<(&InitialMember, &WitnessUrl)> {
        self.initial_cluster.iter().find_map(|m| match &m.peer {
            PeerUrls::Witness(w) => Some((m, w)),
            PeerUrls::Regular(_) => None,
        })
    }
}

/// The client and the peer side's TLS settings from their flags, each checked.
fn tls_sides(f: &Flags) -> Result<(tls::Side, tls::Side), InvalidConfig> {
    let client_tls = tls::Side {
        name: "client",
        prefix: "",
        cert_file: f.cert_file.clone(),
        key_file: f.key_file.clone(),
        trusted_ca_file: f.trusted_ca_file.clone(),
        crl_file: f.client_crl_file.clone(),
        client_cert_auth: f.client_cert_auth,
        auto_tls: f.auto_tls,
        allowed_cn: None,
        allowed_hostname: None,
    };
    let peer_tls = tls::Side {
        name: "peer",
        prefix: "peer-",
        cert_file: f.peer_cert_file.clone(),
        key_file: f.peer_key_file.clone(),
        trusted_ca_file: f.peer_trusted_ca_file.clone(),
        crl_file: f.peer_crl_file.clone(),
        client_cert_auth: f.peer_client_cert_auth,
        auto_tls: f.peer_auto_tls,
        allowed_cn: f.peer_cert_allowed_cn.clone(),
        allowed_hostname: f.peer_cert_allowed_hostname.clone(),
    };
    client_tls.check()?;
    peer_tls.check()?;
    Ok((client_tls, peer_tls))
}

/// `--initial-cluster` (or this member alone, from `--initial-advertise-peer-urls`), checked
/// against `--name`, the advertised peer URLs and the peer TLS settings: the members, this
/// member's id, and every member's id in order.
fn initial_members(
    f: &Flags,
    initial_advertise_peer_urls: &[HttpUrl],
    peer_tls: &tls::Side,
) -> Result<(Vec<InitialMember>, u64, Vec<u64>), InvalidConfig> {
    let initial = f.initial_cluster.clone().unwrap_or_else(|| {
        initial_advertise_peer_urls
            .iter()
            .map(|u| format!("{}={}", f.name, u.text))
            .collect::<Vec<_>>()
            .join(",")
    });
    let members = parse_initial_cluster(&initial, &f.initial_cluster_token)?;
    let me = members.iter().find(|m| m.name == f.name).ok_or_else(|| {
        format!(
            "--initial-cluster has no member named {:?} (--name); add {}=<its peer URL>",
            f.name, f.name
        )
    })?;
    let PeerUrls::Regular(my_urls) = &me.peer else {
        return Err(format!(
            "--name {:?} is the witness in --initial-cluster; the witness runs inside the regular members, not as a process: give this node a regular member's name",
            f.name
        ).into());
    };
    let mut mine: Vec<&str> = my_urls.iter().map(|u| u.text.as_str()).collect();
    let mut advertised: Vec<&str> = initial_advertise_peer_urls
        .iter()
        .map(|u| u.text.as_str())
        .collect();
    mine.sort_unstable();
    advertised.sort_unstable();
    if mine != advertised {
        return Err(format!(
            "--initial-cluster has {:?}={mine:?} but --initial-advertise-peer-urls is {advertised:?}; they must match",
            f.name
        ).into());
    }
    let witnesses: Vec<&InitialMember> = members
        .iter()
        .filter(|m| matches!(m.peer, PeerUrls::Witness(_)))
        .collect();
    let regular = members.len() - witnesses.len();
    if witnesses.len() > 1 {
        return Err(format!(
            "--initial-cluster names {} witnesses ({}); a cluster has at most one",
            witnesses.len(),
            witnesses
                .iter()
                .map(|w| w.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )
        .into());
    }
    if !witnesses.is_empty() && regular < 2 {
        return Err("--initial-cluster: a witness needs at least two regular members beside it (with one, it could never acknowledge anything)".into());
    }
    let https_peer = members.iter().find(|m| {
        m.name != f.name && matches!(&m.peer, PeerUrls::Regular(u) if u.iter().any(|u| u.tls))
    });
    if let Some(m) = https_peer
        && peer_tls.trusted_ca_file.is_none()
        && !peer_tls.auto_tls
    {
        return Err(format!(
            "--initial-cluster: member {:?} has an https:// peer URL; give --peer-trusted-ca-file (the CA that signed the members' certificates) to verify it, or --peer-auto-tls",
            m.name
        ).into());
    }
    let mut ids: Vec<u64> = members.iter().map(|m| m.id).collect();
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Err("--initial-cluster: two members have the same peer URLs".into());
    }
    let member_id = me.id;
    Ok((members, member_id, ids))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_worker_count_is_a_number_from_1_to_1024() {
        assert_eq!(client_workers(None), Ok(None));
        assert_eq!(client_workers(Some("1")), Ok(Some(1)));
        assert_eq!(client_workers(Some(" 4 ")), Ok(Some(4)));
        for bad in ["0", "-1", "two", "", "1025"] {
            let e = client_workers(Some(bad)).unwrap_err().0;
            assert!(
                e.contains("TOKIO_WORKER_THREADS") && e.contains("from 1 to 1024"),
                "{bad:?}: {e}"
            );
        }
    }

    fn parse(args: &[&str]) -> Result<ServerConfig, InvalidConfig> {
        ServerConfig::from_args(
            std::iter::once("etcd-node")
                .chain(args.iter().copied())
                .map(String::from),
        )
    }

    const SEED: &[&str] = &[
        "--name",
        "infra0",
        "--initial-advertise-peer-urls",
        "http://10.0.1.10:2380",
        "--listen-peer-urls",
        "http://10.0.1.10:2380",
        "--listen-client-urls",
        "http://10.0.1.10:2379,http://127.0.0.1:2379",
        "--advertise-client-urls",
        "http://10.0.1.10:2379",
        "--initial-cluster-token",
        "etcd-cluster-1",
        "--initial-cluster",
        "infra0=http://10.0.1.10:2380,infra1=http://10.0.1.11:2380,infra2=witness:mount?path=%2Fvar%2Fwitness",
        "--initial-cluster-state",
        "new",
    ];

    #[test]
    fn a_flag_given_twice_takes_its_last_value_as_in_etcd() {
        let mut args = SEED.to_vec();
        args.extend(["--snapshot-count=50", "--snapshot-count=1000"]);
        assert_eq!(parse(&args).unwrap().snapshot_count, 1000);
    }

    #[test]
    fn the_seed_command_parses_with_a_witness_member() {
        let c = parse(SEED).unwrap();
        assert_eq!(c.name, "infra0");
        assert_eq!(c.data_dir, PathBuf::from("infra0.etcd"));
        assert_eq!(c.listen_client_urls.len(), 2);
        assert_eq!(c.initial_cluster.len(), 3);
        let (w, url) = c.witness().expect("a witness");
        assert_eq!(w.name, "infra2");
        assert_eq!(url.kind(), "mount");
        assert_eq!(
            w.id,
            member_id(
                &["witness:mount?path=%2Fvar%2Fwitness".into()],
                "etcd-cluster-1"
            )
        );
        assert_eq!(c.initial_cluster_state, ClusterState::New);
    }

    #[test]
    fn no_flags_is_etcds_single_member_on_localhost() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.name, "default");
        assert_eq!(c.data_dir, PathBuf::from("default.etcd"));
        assert_eq!(c.listen_client_urls[0].text, "http://localhost:2379");
        assert_eq!(c.initial_cluster.len(), 1);
        assert_eq!(format!("{:x}", c.member_id), "8e9e05c52164694d");
        assert!(c.witness().is_none());
    }

    #[test]
    fn backend_batch_limit_is_etcds_flag_with_etcds_default() {
        let limit = |value: &str| {
            let args = with("--backend-batch-limit", value);
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            parse(&refs)
        };
        let default = SYNC_EVERY;
        assert_eq!(parse(SEED).unwrap().backend_sync.every, default);
        let c = limit("1000").unwrap();
        assert_eq!(c.backend_sync.every, 1000);
        assert!(
            !c.ignored.iter().any(|k| k == "backend-batch-limit"),
            "honoured, not ignored: {:?}",
            c.ignored
        );
        assert_eq!(limit("0").unwrap().backend_sync.every, default, "etcd's 0");
        let e = limit("many").unwrap_err().0;
        assert!(e.contains("--backend-batch-limit"), "{e}");
    }

    #[test]
    fn backend_batch_interval_is_etcds_flag_off_by_default() {
        let interval = |value: &str| {
            let args = with("--backend-batch-interval", value);
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            parse(&refs).map(|c| (c.backend_sync.interval, c.ignored))
        };
        assert_eq!(parse(SEED).unwrap().backend_sync.interval, None);
        let (set, ignored) = interval("25ms").unwrap();
        assert_eq!(set, Some(Duration::from_millis(25)));
        assert!(
            !ignored.iter().any(|k| k == "backend-batch-interval"),
            "honoured, not ignored: {ignored:?}"
        );
        assert_eq!(interval("0").unwrap().0, None);
        assert_eq!(interval("0s").unwrap().0, None);
        let e = interval("100").unwrap_err().0;
        assert!(
            e.contains("--backend-batch-interval") && e.contains("500ms"),
            "{e}"
        );
    }

    fn with(replace: &str, value: &str) -> Vec<String> {
        let mut args: Vec<String> = SEED.iter().map(|s| s.to_string()).collect();
        match args.iter().position(|a| a == replace) {
            Some(i) => args[i + 1] = value.to_string(),
            None => args.extend([replace.to_string(), value.to_string()]),
        }
        args
    }

    fn err(args: Vec<String>) -> String {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        parse(&refs).unwrap_err().0
    }

    #[test]
    fn bad_combinations_name_the_flag() {
        let cases = [
            (
                "--initial-cluster",
                "infra0=http://10.0.1.10:2380,w1=witness:mount?path=%2Fa,w2=witness:mount?path=%2Fb,infra1=http://10.0.1.11:2380",
                "at most one",
            ),
            (
                "--initial-cluster",
                "infra0=http://10.0.1.10:2380,infra2=witness:mount?path=%2Fvar%2Fw",
                "at least two regular",
            ),
            (
                "--initial-cluster",
                "infra1=http://10.0.1.11:2380,infra0=witness:mount?path=%2Fw,infra3=http://10.0.1.12:2380",
                "is the witness",
            ),
            (
                "--initial-cluster",
                "infra1=http://10.0.1.11:2380",
                "no member named \"infra0\"",
            ),
            (
                "--initial-cluster",
                "infra0=http://10.0.1.10:2380,infra2=witness:nfs?path=x,infra1=http://10.0.1.11:2380",
                "--initial-cluster: member \"infra2\"",
            ),
            ("--initial-cluster", "infra0", "not name=url"),
            (
                "--listen-peer-urls",
                "witness:mount?path=%2Fvar%2Fwitness",
                "--listen-peer-urls",
            ),
            (
                "--listen-client-urls",
                "https://10.0.1.10:2379",
                "--cert-file",
            ),
            ("--listen-client-urls", "unixs://x:1", "unix socket"),
            ("--listen-client-urls", "http://10.0.1.10", "no port"),
            (
                "--initial-advertise-peer-urls",
                "http://10.0.1.99:2380",
                "must match",
            ),
            ("--initial-cluster-state", "old", "--initial-cluster-state"),
            ("--election-timeout", "200", "--election-timeout"),
            (
                "--experimental-watch-progress-notify-interval",
                "10 minutes",
                "write it as Go does",
            ),
            (
                "--experimental-watch-progress-notify-interval",
                "0s",
                "must be above 0",
            ),
        ];
        for (flag, value, expect) in cases {
            let e = err(with(flag, value));
            assert!(e.contains(expect), "{flag} {value}: {e}");
        }
    }

    #[test]
    fn etcds_flags_without_an_effect_are_accepted_and_named() {
        let mut args: Vec<&str> = SEED.to_vec();
        args.extend([
            "--logger=zap",
            "--enable-v2",
            "--log-outputs",
            "stderr",
            "--experimental-initial-corrupt-check=true",
            "--snapshot-count=10000",
        ]);
        let c = parse(&args).unwrap();
        for key in [
            "logger",
            "enable-v2",
            "log-outputs",
            "experimental-initial-corrupt-check",
        ] {
            assert!(c.ignored.iter().any(|k| k == key), "{key}: {:?}", c.ignored);
        }
        assert_eq!(
            c.snapshot_count, 10_000,
            "the flag after them is still read"
        );
        let e = err(with("--discovery", "https://discovery.etcd.io/x"));
        assert!(
            e.contains("--discovery") && e.contains("--initial-cluster"),
            "{e}"
        );
    }

    /// The command line kubeadm writes into etcd's static pod (one member), as it is.
    #[test]
    fn kubeadms_etcd_command_line_parses() {
        let pki = "/etc/kubernetes/pki/etcd";
        let args = [
            "--advertise-client-urls=https://10.0.0.1:2379".to_string(),
            format!("--cert-file={pki}/server.crt"),
            "--client-cert-auth=true".into(),
            "--data-dir=/var/lib/etcd".into(),
            "--experimental-initial-corrupt-check=true".into(),
            "--experimental-watch-progress-notify-interval=5s".into(),
            "--initial-advertise-peer-urls=https://10.0.0.1:2380".into(),
            "--initial-cluster=node1=https://10.0.0.1:2380".into(),
            format!("--key-file={pki}/server.key"),
            "--listen-client-urls=https://127.0.0.1:2379,https://10.0.0.1:2379".into(),
            "--listen-metrics-urls=http://127.0.0.1:2381".into(),
            "--listen-peer-urls=https://10.0.0.1:2380".into(),
            "--name=node1".into(),
            format!("--peer-cert-file={pki}/peer.crt"),
            "--peer-client-cert-auth=true".into(),
            format!("--peer-key-file={pki}/peer.key"),
            format!("--peer-trusted-ca-file={pki}/ca.crt"),
            "--snapshot-count=10000".into(),
            format!("--trusted-ca-file={pki}/ca.crt"),
        ];
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let c = parse(&refs).unwrap();
        assert!(c.client_tls.client_cert_auth && c.peer_tls.client_cert_auth);
        assert!(c.listen_client_urls.iter().all(|u| u.tls));
        assert!(!c.listen_metrics_urls[0].tls);
        assert_eq!(c.ignored, ["experimental-initial-corrupt-check"]);
        assert_eq!(c.watch_progress_notify_interval, Duration::from_secs(5));
    }

    #[test]
    fn tls_and_compaction_flags_are_checked() {
        let tls_peer = "infra0=https://10.0.1.10:2380,infra1=https://10.0.1.11:2380,infra2=witness:mount?path=%2Fw";
        let mut peer = with("--initial-cluster", tls_peer);
        let mut set = |flag: &str| {
            let i = peer.iter().position(|a| a == flag).unwrap();
            peer[i + 1] = "https://10.0.1.10:2380".into();
            peer.clone()
        };
        let e = err(set("--initial-advertise-peer-urls"));
        assert!(e.contains("--peer-trusted-ca-file"), "{e}");
        let e = err(set("--listen-peer-urls"));
        assert!(e.contains("--peer-cert-file"), "{e}");
        peer.push("--peer-auto-tls".into());
        let refs: Vec<&str> = peer.iter().map(String::as_str).collect();
        let c = parse(&refs).unwrap();
        assert!(c.listen_peer_urls[0].tls && c.peer_tls.auto_tls);
        for (flag, value, expect) in [
            ("--client-cert-auth", "true", "needs --trusted-ca-file"),
            ("--cert-file", "/x.crt", "--cert-file needs --key-file"),
            ("--tls-min-version", "TLS1.0", "--tls-min-version"),
            ("--cipher-suites", "RC4", "--cipher-suites"),
            ("--auto-compaction-mode", "hourly", "--auto-compaction-mode"),
            ("--max-request-bytes", "0", "--max-request-bytes"),
            (
                "--listen-client-urls",
                "https://10.0.1.10:2379",
                "--cert-file",
            ),
        ] {
            let e = err(with(flag, value));
            assert!(e.contains(expect), "{flag} {value}: {e}");
        }
        let mut revision = with("--auto-compaction-mode", "revision");
        revision.extend(["--auto-compaction-retention".into(), "1h".into()]);
        assert!(err(revision).contains("number of revisions"));
        let c = parse(&[SEED, &["--auto-compaction-retention", "1"]].concat()).unwrap();
        assert_eq!(
            c.auto_compaction,
            Some(AutoCompaction::Periodic(Duration::from_secs(3600))),
            "a bare number is hours, as in etcd"
        );
    }

    #[test]
    fn go_durations() {
        let d = |s| parse_go_duration("f", s);
        assert_eq!(d("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(d("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(d("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(d("1.5h"), Ok(Duration::from_secs(5400)));
        for bad in ["", "10", "m", "10x", "-1s", "1e400s"] {
            assert!(d(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn config_file_uses_etcds_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("etcd.yaml");
        std::fs::write(
            &path,
            "name: infra1\ninitial-advertise-peer-urls: http://10.0.1.11:2380\nlisten-peer-urls: http://10.0.1.11:2380\ninitial-cluster: infra0=http://10.0.1.10:2380,infra1=http://10.0.1.11:2380,infra2=witness:mount?path=%2Fvar%2Fwitness\ninitial-cluster-token: etcd-cluster-1\nheartbeat-interval: 50\nelection-timeout: 500\n",
        )
        .unwrap();
        let c = parse(&["--config-file", path.to_str().unwrap(), "--name", "ignored"]).unwrap();
        assert_eq!(c.name, "infra1");
        assert_eq!(c.heartbeat_interval, Duration::from_millis(50));
        let seed = parse(SEED).unwrap();
        assert_eq!(
            c.cluster_id, seed.cluster_id,
            "same members and token, same cluster id"
        );
        std::fs::write(&path, "name: x\nlisten-client-urlz: http://a:1\n").unwrap();
        let e = parse(&["--config-file", path.to_str().unwrap()])
            .unwrap_err()
            .0;
        assert!(e.contains("listen-client-urlz"), "{e}");
        // A narrowing key etcd-node does not honour is refused, not ignored.
        std::fs::write(
            &path,
            "name: x\nclient-transport-security:\n  allowed-cn: admin\n",
        )
        .unwrap();
        let e = parse(&["--config-file", path.to_str().unwrap()])
            .unwrap_err()
            .0;
        assert!(e.contains("client-transport-security.allowed-cn"), "{e}");
        std::fs::write(
            &path,
            "name: x\npeer-transport-security:\n  auto-tls: true\n  allowed-cn: [etcd-peer]\n  client-cert-auth: true\n  trusted-ca-file: /ca.crt\nlogger: zap\nauto-compaction-retention: 2\nbackend-batch-interval: 100000000\nexperimental-corrupt-check-time: 1m\n",
        )
        .unwrap();
        let c = parse(&["--config-file", path.to_str().unwrap()]).unwrap();
        assert_eq!(c.peer_tls.allowed_cn.as_deref(), Some("etcd-peer"));
        assert!(c.peer_tls.auto_tls && c.peer_tls.client_cert_auth);
        assert_eq!(c.ignored, ["logger"]);
        assert_eq!(
            c.auto_compaction,
            Some(AutoCompaction::Periodic(Duration::from_secs(7200)))
        );
        // (etcd writes a duration as nanoseconds; text is a Go duration)
        assert_eq!(c.backend_sync.interval, Some(Duration::from_millis(100)));
        assert_eq!(c.corrupt_check, Some(Duration::from_secs(60)));
    }
}
