//! etcd's flags and config-file keys that etcd-node does not honour, so that a real etcd
//! command line or YAML file starts unchanged: keys without an effect here are accepted and
//! named in one WARN line at start; keys whose absence would change how the cluster forms are
//! refused when set. The config file's `client-transport-security` and
//! `peer-transport-security` sections become the matching flags.

use serde_norway::{Mapping, Value};

use super::InvalidConfig;

/// Accepted and ignored: (name, whether the flag takes a value).
const NO_EFFECT: &[(&str, bool)] = &[
    ("max-snapshots", true),
    ("max-wals", true),
    ("cors", true),
    ("backend-bbolt-freelist-type", true),
    ("max-txn-ops", true),
    ("max-concurrent-streams", true),
    ("grpc-keepalive-min-time", true),
    ("grpc-keepalive-interval", true),
    ("grpc-keepalive-timeout", true),
    ("discovery-fallback", true),
    ("discovery-proxy", true),
    ("proxy", true),
    ("proxy-failure-wait", true),
    ("proxy-refresh-interval", true),
    ("proxy-dial-timeout", true),
    ("proxy-write-timeout", true),
    ("proxy-read-timeout", true),
    ("logger", true),
    ("log-outputs", true),
    ("log-format", true),
    ("log-package-levels", true),
    ("log-rotation-config-json", true),
    ("auth-token", true),
    ("auth-token-ttl", true),
    ("bcrypt-cost", true),
    ("metrics", true),
    ("host-whitelist", true),
    ("v2-deprecation", true),
    ("client-cert-file", true),
    ("client-key-file", true),
    ("peer-client-cert-file", true),
    ("peer-client-key-file", true),
    ("experimental-enable-v2v3", true),
    ("experimental-backend-bbolt-freelist-type", true),
    ("experimental-compaction-batch-limit", true),
    ("experimental-compaction-sleep-interval", true),
    ("experimental-warning-apply-duration", true),
    ("experimental-bootstrap-defrag-threshold-megabytes", true),
    ("experimental-distributed-tracing-address", true),
    ("experimental-distributed-tracing-service-name", true),
    ("experimental-distributed-tracing-instance-id", true),
    ("experimental-distributed-tracing-sampling-rate", true),
    ("experimental-downgrade-check-time", true),
    ("experimental-warning-unary-request-duration", true),
    ("experimental-snapshot-catchup-entries", true),
    ("experimental-wait-cluster-ready-timeout", true),
    ("experimental-memory-mlock", false),
    ("experimental-enable-lease-checkpoint", false),
    ("experimental-enable-lease-checkpoint-persist", false),
    ("experimental-initial-corrupt-check", false),
    ("experimental-enable-distributed-tracing", false),
    ("experimental-txn-mode-write-with-shared-buffer", false),
    ("experimental-stop-grpc-service-on-defrag", false),
    ("experimental-peer-skip-client-san-verification", false),
    // etcd 3.6's names of the experimental flags above (kubeadm 1.37 passes them), and its new
    // flags without an effect here
    ("bootstrap-defrag-threshold-megabytes", true),
    ("compact-hash-check-time", true),
    ("compaction-batch-limit", true),
    ("compaction-sleep-interval", true),
    ("distributed-tracing-address", true),
    ("distributed-tracing-instance-id", true),
    ("distributed-tracing-sampling-rate", true),
    ("distributed-tracing-service-name", true),
    ("downgrade-check-time", true),
    ("raft-read-timeout", true),
    ("raft-write-timeout", true),
    ("snapshot-catchup-entries", true),
    ("warning-apply-duration", true),
    ("warning-unary-request-duration", true),
    ("wait-cluster-ready-timeout", true),
    ("enable-distributed-tracing", false),
    ("memory-mlock", false),
    ("peer-skip-client-san-verification", false),
    ("initial-election-tick-advance", false),
    ("enable-v2", false),
    ("enable-pprof", false),
    ("enable-grpc-gateway", false),
    ("strict-reconfig-check", false),
    ("pre-vote", false),
    ("socket-reuse-port", false),
    ("socket-reuse-address", false),
    ("debug", false),
    ("unsafe-no-fsync", false),
    ("enable-log-rotation", false),
];

/// Refused when set: what an operator relying on them would get wrong, and what to do.
const REFUSED: &[(&str, &str)] = &[
    (
        "discovery",
        "etcd-node forms a cluster from --initial-cluster only; list the members there",
    ),
    (
        "discovery-srv",
        "etcd-node forms a cluster from --initial-cluster only; list the members there",
    ),
    (
        "discovery-srv-name",
        "etcd-node forms a cluster from --initial-cluster only; list the members there",
    ),
    (
        "discovery-endpoints",
        "etcd-node forms a cluster from --initial-cluster only; list the members there",
    ),
    (
        "discovery-token",
        "etcd-node forms a cluster from --initial-cluster only; list the members there",
    ),
    (
        "client-cert-allowed-hostname",
        "etcd-node does not check a client certificate's hostname: it would accept clients etcd refuses. Give clients certificates from a CA of their own (--trusted-ca-file with --client-cert-auth) and limit them with auth roles",
    ),
    (
        "client-cert-allowed-cn",
        "etcd-node does not check a client certificate's CommonName against an allowed one: it would accept clients etcd refuses. Give clients certificates from a CA of their own (--trusted-ca-file with --client-cert-auth) and limit them with auth roles",
    ),
    (
        "listen-client-http-urls",
        "etcd-node serves HTTP (/health, /metrics) on --listen-client-urls and --listen-metrics-urls; list the URLs there",
    ),
];

/// Keys a config file may give as numbers where etcd-node reads text.
const TEXT_KEYS: &[&str] = &["auto-compaction-retention"];

/// Keys that are a Go `time.Duration` in etcd's config: a number there is nanoseconds (etcd
/// writes `backend-batch-interval: 100000000` for 100 ms); text is a Go duration as on the
/// command line.
const DURATION_KEYS: &[&str] = &[
    "backend-batch-interval",
    "experimental-watch-progress-notify-interval",
    "experimental-corrupt-check-time",
    "watch-progress-notify-interval",
    "corrupt-check-time",
];

fn value_is_set(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::String(s) => !s.is_empty(),
        Value::Sequence(s) => !s.is_empty(),
        Value::Mapping(m) => !m.is_empty(),
        _ => true,
    }
}

fn refuse(key: &str, why: &str) -> InvalidConfig {
    InvalidConfig(format!("{key} is set, but {why}"))
}

/// Removes etcd's ignored flags from a command line (refusing the refused ones), and names
/// the ignored ones that were set there or in `ETCD_*` variables.
pub fn strip_args(args: Vec<String>) -> Result<(Vec<String>, Vec<String>), InvalidConfig> {
    let mut kept = Vec::with_capacity(args.len());
    let mut ignored = Vec::new();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            kept.push(arg);
            continue;
        };
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (flag.to_string(), None),
        };
        if let Some((_, why)) = REFUSED.iter().find(|(k, _)| *k == name) {
            let value = match inline {
                Some(v) => v,
                None => it.next().unwrap_or_default(),
            };
            if !value.is_empty() {
                return Err(refuse(&format!("--{name}"), why));
            }
            continue;
        }
        match NO_EFFECT.iter().find(|(k, _)| *k == name) {
            Some((_, takes_value)) => {
                if *takes_value && inline.is_none() {
                    it.next();
                }
                ignored.push(name);
            }
            None => kept.push(arg),
        }
    }
    for (name, _) in NO_EFFECT {
        let var = format!("ETCD_{}", name.to_uppercase().replace('-', "_"));
        if std::env::var_os(&var).is_some_and(|v| !v.is_empty()) {
            ignored.push(var);
        }
    }
    Ok((kept, ignored))
}

/// Turns an etcd YAML config into etcd-node's keys: sections flattened, ignored keys taken
/// out (and named), refused ones refused, empty values dropped (etcd's sample file leaves
/// many keys empty). Unknown keys stay, for the parser to refuse by name.
pub fn flatten_file(text: &str) -> Result<(Mapping, Vec<String>), InvalidConfig> {
    let doc: Value = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    let top = match doc {
        Value::Mapping(m) => m,
        Value::Null => Mapping::new(),
        _ => return Err("the file is not a mapping of etcd's keys".into()),
    };
    let mut out = Mapping::new();
    let mut ignored = Vec::new();
    for (k, v) in top {
        let key = k.as_str().ok_or("a key that is not text")?.to_string();
        let section = match key.as_str() {
            "client-transport-security" => Some(""),
            "peer-transport-security" => Some("peer-"),
            _ => None,
        };
        if let Some(prefix) = section {
            let Value::Mapping(fields) = v else {
                if value_is_set(&v) {
                    return Err(
                        format!("{key} must be a mapping (cert-file: ..., key-file: ...)").into(),
                    );
                }
                continue;
            };
            for (fk, fv) in fields {
                let field = fk.as_str().ok_or("a key that is not text")?.to_string();
                let name = format!("{key}.{field}");
                let flag = match (prefix, field.as_str()) {
                    (
                        _,
                        "cert-file" | "key-file" | "client-cert-auth" | "trusted-ca-file"
                        | "auto-tls",
                    ) => {
                        format!("{prefix}{field}")
                    }
                    ("", "crl-file") => "client-crl-file".into(),
                    ("peer-", "crl-file") => "peer-crl-file".into(),
                    ("peer-", "allowed-cn") => "peer-cert-allowed-cn".into(),
                    ("peer-", "allowed-hostname") => "peer-cert-allowed-hostname".into(),
                    (
                        _,
                        "client-cert-file" | "client-key-file" | "skip-client-san-verification",
                    ) => {
                        if value_is_set(&fv) {
                            ignored.push(name);
                        }
                        continue;
                    }
                    _ if !value_is_set(&fv) => continue,
                    _ => {
                        return Err(format!(
                            "{name}: not a key etcd-node knows (or honours); remove it"
                        )
                        .into());
                    }
                };
                let fv = match fv {
                    // (etcd 3.5 takes lists for the allowed names; one is what a member has)
                    Value::Sequence(mut s) if s.len() <= 1 => s.pop().unwrap_or(Value::Null),
                    Value::Sequence(_) => {
                        return Err(format!("{name}: give one name (etcd-node checks one)").into());
                    }
                    other => other,
                };
                if !matches!(fv, Value::Null) {
                    out.insert(Value::String(flag), fv);
                }
            }
            continue;
        }
        if let Some((_, why)) = REFUSED.iter().find(|(r, _)| *r == key) {
            if value_is_set(&v) {
                return Err(refuse(&key, why));
            }
            continue;
        }
        if NO_EFFECT.iter().any(|(n, _)| *n == key) {
            if value_is_set(&v) {
                ignored.push(key);
            }
            continue;
        }
        let v = match v {
            Value::Null => continue,
            Value::Sequence(items) if key == "cipher-suites" => Value::String(
                items
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            Value::Number(n) if TEXT_KEYS.contains(&key.as_str()) => Value::String(n.to_string()),
            Value::Number(n) if DURATION_KEYS.contains(&key.as_str()) => {
                Value::String(format!("{n}ns"))
            }
            other => other,
        };
        out.insert(Value::String(key), v);
    }
    Ok((out, ignored))
}
