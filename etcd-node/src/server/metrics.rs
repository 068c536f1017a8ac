//! Prometheus metrics, served at `/metrics` in the text format through the `prometheus` crate.
//! Names, types and buckets are etcd's where etcd has the metric (what etcd's dashboards and
//! alerts query: `etcd_disk_wal_fsync_duration_seconds_bucket`, ...); witness metrics are ours
//! (`etcd_witness_*`); `process_*` come from the crate's process collector; the gRPC ones
//! (`grpc_server_*`, as go-grpc-prometheus names them) are counted by [`grpc_layer`].
//! docs/operations.md lists them.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder, exponential_buckets,
};
use witness_core::client::Stepped;

use super::contract::Status;
use crate::raft::{NodeId, WitnessResponse};
use crate::version::ClusterParams;

const STEPS: [&str; 4] = ["append", "vote", "pre-vote", "read-term"];

/// etcd's buckets for disk latencies (1 ms to 8 s, doubling).
fn disk_buckets() -> Vec<f64> {
    exponential_buckets(0.001, 2.0, 14).expect("valid buckets")
}

/// Counters, gauges and histograms of one member, in its own registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    wal_fsync: Histogram,
    backend_commit: Histogram,
    loop_turn: Histogram,
    loop_longest: Gauge,
    peer_rtt: HistogramVec,
    has_leader: IntGauge,
    is_leader: IntGauge,
    leader_changes: IntCounter,
    term: IntGauge,
    commit_index: IntGauge,
    applied_index: IntGauge,
    committed: IntGauge,
    applied: IntGauge,
    pending: IntGauge,
    failed: IntCounter,
    db_size: IntGauge,
    witness_healthy: IntGauge,
    witness_last_ok: IntGauge,
    witness_subterm: IntGauge,
    witness_in_r: IntGauge,
    witness_steps: IntCounterVec,
    witness_latency: HistogramVec,
    witness_writes: IntCounter,
    witness_conflicts: IntCounter,
    witness_failures: IntCounter,
    snapshots_sent: IntCounter,
    snapshot_send_failures: IntCounter,
    snapshots_received: IntCounter,
    watch_catch_ups: IntCounter,
    grpc_started: IntCounterVec,
    grpc_handled: IntCounterVec,
    server_version: IntGaugeVec,
    cluster_version: IntGaugeVec,
    node_version: IntGaugeVec,
    node_cluster_version: IntGaugeVec,
    features: IntGaugeVec,
    /// The leader this member last saw (0: none), to count changes.
    last_leader: Mutex<NodeId>,
    /// Per peer: when the oldest heartbeat not answered yet left (the round-trip measure).
    heartbeats: Mutex<HashMap<NodeId, Instant>>,
    /// When the last witness step failed, why, and whether the witness lost its state (then
    /// reported until a step succeeds, however old); cleared by a step that succeeds.
    witness_error: Mutex<Option<(Instant, String, bool)>>,
    /// What the periodic probe of the witness last found.
    witness_probe: Mutex<Probe>,
    health: HealthMetrics,
}

/// etcd's counts of its HTTP health endpoints (`/health`, `/livez`, `/readyz`).
#[derive(Debug)]
struct HealthMetrics {
    success: IntCounter,
    failures: IntCounter,
    check: IntGaugeVec,
    checks: IntCounterVec,
}

impl HealthMetrics {
    fn new(r: &Registry) -> Self {
        HealthMetrics {
            success: counter(
                r,
                "etcd_server_health_success",
                "The total number of successful health checks",
            ),
            failures: counter(
                r,
                "etcd_server_health_failures",
                "The total number of failed health checks",
            ),
            check: gauges(
                r,
                "etcd_server_healthcheck",
                "The result of each kind of healthcheck.",
                &["type", "name"],
            ),
            checks: counters(
                r,
                "etcd_server_healthchecks_total",
                "The total number of each kind of healthcheck.",
                &["type", "name", "status"],
            ),
        }
    }
}

/// The witness probe's findings.
#[derive(Debug, Default)]
struct Probe {
    /// Wall-clock time of the last probe that found the witness well.
    last_ok: Option<SystemTime>,
    /// Why the last probe failed (None: it succeeded, or none ran yet).
    failing: Option<String>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers `c` in `r` (names are fixed and distinct: a failure is a bug here).
fn register<C: Collector + Clone + 'static>(r: &Registry, c: C) -> C {
    r.register(Box::new(c.clone()))
        .expect("distinct metric names");
    c
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    register(r, IntCounter::new(name, help).expect("valid metric"))
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    register(r, IntGauge::new(name, help).expect("valid metric"))
}

fn gauges(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    register(
        r,
        IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn counters(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    register(
        r,
        IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric"),
    )
}

fn histogram(r: &Registry, name: &str, help: &str, buckets: Vec<f64>) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    register(r, Histogram::with_opts(opts).expect("valid metric"))
}

fn histograms(
    r: &Registry,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: Vec<f64>,
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets);
    register(r, HistogramVec::new(opts, labels).expect("valid metric"))
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        #[cfg(target_os = "linux")]
        r.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("distinct metric names");
        let m = Metrics {
            wal_fsync: histogram(
                &r,
                "etcd_disk_wal_fsync_duration_seconds",
                "The latency distributions of fsync called by WAL.",
                disk_buckets(),
            ),
            backend_commit: histogram(
                &r,
                "etcd_disk_backend_commit_duration_seconds",
                "The latency distributions of commit called by backend (the applied batches held \
                 up to 5 ms, committed by the applier or the first reader; durable every 10,000 \
                 entries).",
                disk_buckets(),
            ),
            loop_turn: histogram(
                &r,
                "etcd_node_raft_loop_turn_duration_seconds",
                "How long a turn of the Raft loop took (persisting, sending, applying, a \
                 snapshot of the key space): the loop takes no message meanwhile.",
                exponential_buckets(0.0001, 2.0, 18).expect("valid buckets"),
            ),
            loop_longest: register(
                &r,
                Gauge::new(
                    "etcd_node_raft_loop_longest_turn_seconds",
                    "The longest turn of the Raft loop since this member started.",
                )
                .expect("valid metric"),
            ),
            peer_rtt: histograms(
                &r,
                "etcd_network_peer_round_trip_time_seconds",
                "Round-Trip-Time histogram between peers (measured by the leader, from a \
                 heartbeat to its answer).",
                &["To"],
                exponential_buckets(0.0001, 2.0, 16).expect("valid buckets"),
            ),
            has_leader: gauge(
                &r,
                "etcd_server_has_leader",
                "Whether or not a leader exists. 1 is existence, 0 is not.",
            ),
            is_leader: gauge(
                &r,
                "etcd_server_is_leader",
                "Whether or not this member is a leader. 1 if is, 0 otherwise.",
            ),
            leader_changes: counter(
                &r,
                "etcd_server_leader_changes_seen_total",
                "The number of leader changes seen.",
            ),
            term: gauge(&r, "etcd_server_term", "The Raft term."),
            commit_index: gauge(&r, "etcd_server_committed_index", "The Raft commit index."),
            applied_index: gauge(&r, "etcd_server_applied_index", "The Raft applied index."),
            committed: gauge(
                &r,
                "etcd_server_proposals_committed_total",
                "The total number of consensus proposals committed (the commit index).",
            ),
            applied: gauge(
                &r,
                "etcd_server_proposals_applied_total",
                "The total number of consensus proposals applied (the applied index).",
            ),
            pending: gauge(
                &r,
                "etcd_server_proposals_pending",
                "The current number of pending proposals to commit.",
            ),
            failed: counter(
                &r,
                "etcd_server_proposals_failed_total",
                "The total number of failed proposals seen (answered as not applied).",
            ),
            db_size: gauge(
                &r,
                "etcd_mvcc_db_total_size_in_bytes",
                "Total size of the underlying database physically allocated in bytes.",
            ),
            witness_healthy: gauge(
                &r,
                "etcd_witness_healthy",
                "1 while the last probe found the witness readable and the one this member is \
                 bound to (0: see /health and Status for why).",
            ),
            witness_last_ok: gauge(
                &r,
                "etcd_witness_last_probe_success_timestamp_seconds",
                "Unix time of the last probe that found the witness well (0: none yet).",
            ),
            witness_subterm: gauge(
                &r,
                "etcd_witness_subterm",
                "The leader's current subterm (0 on followers).",
            ),
            witness_in_r: gauge(
                &r,
                "etcd_witness_in_replication_set",
                "1 when the leader's replication set holds the witness (a regular member is \
                 down).",
            ),
            witness_steps: counters(
                &r,
                "etcd_witness_steps_total",
                "Witness steps by kind.",
                &["step"],
            ),
            witness_latency: histograms(
                &r,
                "etcd_witness_step_duration_seconds",
                "Witness step latency by kind.",
                &["step"],
                disk_buckets(),
            ),
            witness_writes: counter(
                &r,
                "etcd_witness_writes_total",
                "Witness steps that stored a new state.",
            ),
            witness_conflicts: counter(
                &r,
                "etcd_witness_cas_conflicts_total",
                "Compare-and-swap races lost (and retried).",
            ),
            witness_failures: counter(
                &r,
                "etcd_witness_step_failures_total",
                "Witness steps that failed (storage unreachable, corrupt, ...).",
            ),
            snapshots_sent: counter(
                &r,
                "etcd_network_snapshot_send_success",
                "Total number of successful snapshot sends.",
            ),
            snapshot_send_failures: counter(
                &r,
                "etcd_network_snapshot_send_failures",
                "Total number of snapshot send failures (the follower unreachable, paused, or \
                 gone).",
            ),
            snapshots_received: counter(
                &r,
                "etcd_network_snapshot_receive_success",
                "Total number of successful snapshot receives (installed).",
            ),
            watch_catch_ups: counter(
                &r,
                "etcd_watch_catch_ups_total",
                "Times a watch stream fell behind the live events and caught up from the \
                 history.",
            ),
            grpc_started: counters(
                &r,
                "grpc_server_started_total",
                "Total number of RPCs started on the server.",
                &["grpc_type", "grpc_service", "grpc_method"],
            ),
            grpc_handled: counters(
                &r,
                "grpc_server_handled_total",
                "Total number of RPCs completed on the server, regardless of success or failure.",
                &["grpc_type", "grpc_service", "grpc_method", "grpc_code"],
            ),
            server_version: gauges(
                &r,
                "etcd_server_version",
                "Which version of the etcd API is running. 1 for 'server_version' label with \
                 current version.",
                &["server_version"],
            ),
            cluster_version: gauges(
                &r,
                "etcd_cluster_version",
                "Which version of the etcd API the cluster serves. 1 for 'cluster_version' \
                 label with current cluster version (once the leader recorded it).",
                &["cluster_version"],
            ),
            node_version: gauges(
                &r,
                "etcd_node_version",
                "This member's etcd-node release and the peer protocol it speaks (1 on the \
                 labels).",
                &["version", "peer_protocol"],
            ),
            node_cluster_version: gauges(
                &r,
                "etcd_node_cluster_version",
                "The cluster's etcd-node version, the lowest of its regular members', as the \
                 leader recorded it (1 on the label; none before it is recorded).",
                &["cluster_version"],
            ),
            features: gauges(
                &r,
                "etcd_server_feature_enabled",
                "Whether a cluster feature is on: 1 once every regular member turns it on \
                 (--feature-gates) and the leader recorded it, 0 otherwise.",
                &["name", "stage"],
            ),
            health: HealthMetrics::new(&r),
            registry: r,
            last_leader: Mutex::new(0),
            heartbeats: Mutex::new(HashMap::new()),
            witness_error: Mutex::new(None),
            witness_probe: Mutex::new(Probe::default()),
        };
        for step in STEPS {
            m.witness_steps.with_label_values(&[step]);
            m.witness_latency.with_label_values(&[step]);
        }
        m
    }

    /// A `/health` answer.
    pub fn record_health(&self, healthy: bool) {
        match healthy {
            true => self.health.success.inc(),
            false => self.health.failures.inc(),
        }
    }

    /// One check of `/livez` or `/readyz` (`kind`), by etcd's name.
    pub fn record_health_check(&self, kind: &str, name: &str, ok: bool) {
        self.health
            .check
            .with_label_values(&[kind, name])
            .set(i64::from(ok));
        let status = if ok { "success" } else { "error" };
        self.health
            .checks
            .with_label_values(&[kind, name, status])
            .inc();
    }

    pub fn wal_fsync(&self, d: Duration) {
        self.wal_fsync.observe(d.as_secs_f64());
    }
    pub fn backend_commit(&self, d: Duration) {
        self.backend_commit.observe(d.as_secs_f64());
    }
    pub fn loop_turn(&self, d: Duration) {
        let secs = d.as_secs_f64();
        self.loop_turn.observe(secs);
        if secs > self.loop_longest.get() {
            self.loop_longest.set(secs);
        }
    }
    pub fn snapshot_sent(&self) {
        self.snapshots_sent.inc();
    }
    pub fn snapshot_send_failed(&self) {
        self.snapshot_send_failures.inc();
    }
    pub fn snapshot_received(&self) {
        self.snapshots_received.inc();
    }
    pub fn watch_caught_up(&self) {
        self.watch_catch_ups.inc();
    }

    /// The loop's view after a turn: leader changes, proposals waiting and failed so far.
    pub fn turned(&self, status: &Status, pending: usize, failed: u64) {
        let mut last = self.last_leader.lock().unwrap_or_else(|e| e.into_inner());
        if status.leader != 0 && status.leader != *last {
            self.leader_changes.inc();
        }
        *last = status.leader;
        self.pending.set(pending as i64);
        self.failed.inc_by(failed.saturating_sub(self.failed.get()));
    }

    /// A heartbeat left for `to` (the leader's): the round trip counts from the oldest one not
    /// answered yet.
    pub fn heartbeat_sent(&self, to: NodeId) {
        let mut h = self.heartbeats.lock().unwrap_or_else(|e| e.into_inner());
        h.entry(to).or_insert_with(Instant::now);
    }

    /// `from` answered a heartbeat.
    pub fn heartbeat_answered(&self, from: NodeId) {
        let sent = self
            .heartbeats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&from);
        if let Some(sent) = sent {
            self.peer_rtt
                .with_label_values(&[&format!("{from:x}")])
                .observe(sent.elapsed().as_secs_f64());
        }
    }

    pub fn witness_step(
        &self,
        name: &str,
        d: Duration,
        result: &witness_core::Result<Stepped<WitnessResponse>>,
    ) {
        let step = STEPS.iter().find(|s| **s == name).unwrap_or(&STEPS[0]);
        self.witness_steps.with_label_values(&[step]).inc();
        self.witness_latency
            .with_label_values(&[step])
            .observe(d.as_secs_f64());
        let error = match result {
            Ok(s) => {
                self.witness_writes.inc_by(u64::from(s.wrote));
                self.witness_conflicts.inc_by(u64::from(s.conflicts));
                None
            }
            Err(e) => {
                self.witness_failures.inc();
                Some((Instant::now(), e.to_string(), e.is_lost_state()))
            }
        };
        if let Ok(mut last) = self.witness_error.lock() {
            *last = error;
        }
    }

    /// A witness vote refused because this member's log is behind, or a step that could not
    /// start (the storage cannot be opened here): reported like a failed step (it clears when a
    /// later step succeeds).
    pub fn witness_unavailable(&self, why: String) {
        if let Ok(mut last) = self.witness_error.lock() {
            *last = Some((Instant::now(), why, false));
        }
    }

    /// Records what a probe of the witness found: why it failed, or `None` when it passed.
    /// Returns the previous failure, if any (the caller logs changes).
    pub fn witness_probed(&self, failed: Option<String>) -> Option<String> {
        let mut p = self.witness_probe.lock().unwrap_or_else(|e| e.into_inner());
        match failed {
            None => {
                p.last_ok = Some(SystemTime::now());
                p.failing.take()
            }
            Some(why) => p.failing.replace(why),
        }
    }

    /// The cluster's witness changed (added, removed, replaced): what was found about the old
    /// one no longer applies.
    pub fn witness_changed(&self) {
        if let Ok(mut last) = self.witness_error.lock() {
            *last = None;
        }
        if let Ok(mut p) = self.witness_probe.lock() {
            *p = Probe::default();
        }
    }

    /// What is wrong with the witness, if anything: the probe's failure, else a step that
    /// found the witness's state lost, else a step that failed within `recent`.
    pub fn witness_problem(&self, recent: Duration) -> Option<String> {
        if let Some(why) = self.witness_probe.lock().ok()?.failing.clone() {
            return Some(why);
        }
        let last = self.witness_error.lock().ok()?;
        let (at, why, lost) = last.as_ref()?;
        (*lost || at.elapsed() <= recent).then(|| why.clone())
    }

    pub fn set_leader_view(&self, view: Option<(u64, bool)>) {
        self.witness_subterm.set(view.map_or(0, |v| v.0) as i64);
        self.witness_in_r.set(i64::from(view.is_some_and(|v| v.1)));
    }

    /// The text exposition, with the gauges read from `status` and the key space's size.
    /// The page, with the cluster's parameters as recorded (None: not yet).
    pub fn render(&self, status: &Status, db_size: u64, params: Option<&ClusterParams>) -> String {
        self.versions(params);
        self.has_leader.set(i64::from(status.leader != 0));
        self.is_leader.set(i64::from(status.is_leader));
        self.term.set(status.term as i64);
        for (g, v) in [
            (&self.commit_index, status.commit),
            (&self.committed, status.commit),
            (&self.applied_index, status.applied),
            (&self.applied, status.applied),
        ] {
            g.set(v as i64);
        }
        self.db_size.set(db_size as i64);
        {
            let p = self.witness_probe.lock().unwrap_or_else(|e| e.into_inner());
            self.witness_healthy.set(i64::from(p.failing.is_none()));
            let last_ok = p
                .last_ok
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok());
            self.witness_last_ok
                .set(last_ok.map_or(0, |d| d.as_secs() as i64));
        }
        let mut out = Vec::new();
        match TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            Ok(()) => String::from_utf8_lossy(&out).into_owned(),
            Err(e) => format!("# metrics could not be encoded: {e}\n"),
        }
    }

    /// The version gauges: etcd's (the etcd API served), ours, and one per cluster feature.
    fn versions(&self, params: Option<&ClusterParams>) {
        use crate::version::{BINARY, ETCD_CLUSTER_VERSION, ETCD_VERSION, FEATURES, own_protocol};
        self.server_version
            .with_label_values(&[ETCD_VERSION])
            .set(1);
        let protocol = own_protocol().to_string();
        self.node_version
            .with_label_values(&[BINARY, protocol.as_str()])
            .set(1);
        self.cluster_version.reset();
        self.node_cluster_version.reset();
        if let Some(p) = params {
            self.cluster_version
                .with_label_values(&[ETCD_CLUSTER_VERSION])
                .set(1);
            self.node_cluster_version
                .with_label_values(&[p.version.as_str()])
                .set(1);
        }
        for f in FEATURES {
            let on = params.is_some_and(|p| p.features.contains(f.name));
            self.features
                .with_label_values(&[f.name, f.stage])
                .set(i64::from(on));
        }
    }

    /// A gRPC call to `path` (`/<service>/<method>`) started: what counts its end.
    fn grpc_started(self: &Arc<Self>, path: &str) -> Option<GrpcCall> {
        let (service, method) = path.strip_prefix('/')?.split_once('/')?;
        let kind = grpc_type(method);
        self.grpc_started
            .with_label_values(&[kind, service, method])
            .inc();
        Some(GrpcCall {
            metrics: self.clone(),
            labels: [kind.to_string(), service.to_string(), method.to_string()],
        })
    }
}

/// go-grpc-prometheus's `grpc_type` of etcd's methods.
fn grpc_type(method: &str) -> &'static str {
    match method {
        "Watch" | "LeaseKeepAlive" => "bidi_stream",
        "Snapshot" => "server_stream",
        _ => "unary",
    }
}

/// A gRPC call being answered: counted in `grpc_server_handled_total` once, with the status
/// its response ends with.
#[derive(Debug)]
struct GrpcCall {
    metrics: Arc<Metrics>,
    labels: [String; 3],
}

impl GrpcCall {
    fn handled(self, code: tonic::Code) {
        let [kind, service, method] = &self.labels;
        self.metrics
            .grpc_handled
            .with_label_values(&[kind, service, method, go_code_name(code)])
            .inc();
    }
}

/// A gRPC status code as Go names it (`grpc_code` values on etcd's dashboards).
fn go_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "Canceled",
        Unknown => "Unknown",
        InvalidArgument => "InvalidArgument",
        DeadlineExceeded => "DeadlineExceeded",
        NotFound => "NotFound",
        AlreadyExists => "AlreadyExists",
        PermissionDenied => "PermissionDenied",
        ResourceExhausted => "ResourceExhausted",
        FailedPrecondition => "FailedPrecondition",
        Aborted => "Aborted",
        OutOfRange => "OutOfRange",
        Unimplemented => "Unimplemented",
        Internal => "Internal",
        Unavailable => "Unavailable",
        DataLoss => "DataLoss",
        Unauthenticated => "Unauthenticated",
    }
}

/// The `grpc-status` of headers or trailers, if they carry one.
fn grpc_code(headers: &axum::http::HeaderMap) -> Option<tonic::Code> {
    let v = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    Some(tonic::Code::from_i32(v))
}

/// A response body that counts its call when its trailers pass (or as `Canceled` when the body
/// is dropped before them: the client went away).
struct Counted {
    inner: axum::body::Body,
    call: Option<GrpcCall>,
}

impl http_body::Body for Counted {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, axum::Error>>> {
        let frame = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &frame
            && let Some(trailers) = f.trailers_ref()
            && let Some(call) = self.call.take()
        {
            call.handled(grpc_code(trailers).unwrap_or(tonic::Code::Unknown));
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(call) = self.call.take() {
            call.handled(tonic::Code::Cancelled);
        }
    }
}

/// Counts the gRPC calls of a client listener (`grpc_server_started_total`,
/// `grpc_server_handled_total`), as an axum middleware around its gRPC routes.
pub async fn grpc_layer(
    axum::extract::State(metrics): axum::extract::State<Arc<Metrics>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let call = metrics.grpc_started(request.uri().path());
    let response = next.run(request).await;
    let Some(call) = call else {
        return response;
    };
    // An error before any message (trailers-only) carries its status in the headers.
    if let Some(code) = grpc_code(response.headers()) {
        call.handled(code);
        return response;
    }
    let (parts, body) = response.into_parts();
    let body = Counted {
        inner: body,
        call: Some(call),
    };
    axum::response::Response::from_parts(parts, axum::body::Body::new(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The page parses as Prometheus text (the real parser's check is in the e2e tests), its
    /// histograms have etcd's buckets, and the gRPC counters follow a call.
    #[test]
    fn histograms_have_etcds_buckets() {
        let m = Metrics::new();
        m.wal_fsync(Duration::from_micros(1500));
        m.heartbeat_sent(0xabc);
        m.heartbeat_answered(0xabc);
        let page = m.render(&Status::default(), 4096, None);
        assert!(page.contains("# TYPE etcd_disk_wal_fsync_duration_seconds histogram"));
        assert!(page.contains("etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.001\"} 0"));
        assert!(page.contains("etcd_disk_wal_fsync_duration_seconds_bucket{le=\"0.002\"} 1"));
        assert!(page.contains("etcd_disk_wal_fsync_duration_seconds_bucket{le=\"8.192\"} 1"));
        assert!(page.contains("etcd_network_peer_round_trip_time_seconds_count{To=\"abc\"} 1"));
        assert!(page.contains("etcd_mvcc_db_total_size_in_bytes 4096"));
        assert!(page.contains("etcd_witness_steps_total{step=\"pre-vote\"} 0"));
    }

    #[test]
    fn leader_changes_count_new_leaders_only() {
        let m = Metrics::new();
        let status = |leader| Status {
            leader,
            ..Status::default()
        };
        for leader in [1, 1, 0, 1, 2, 2] {
            m.turned(&status(leader), 3, 4);
        }
        // 1, then 1 again after a time without a leader, then 2.
        assert_eq!(m.leader_changes.get(), 3);
        assert_eq!((m.pending.get(), m.failed.get()), (3, 4));
    }
}
