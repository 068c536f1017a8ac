//! Prometheus metrics (text format 0.0.4), served at `/metrics`. Names follow etcd's where
//! etcd has the metric; witness metrics are ours (`etcd_witness_*`, docs/operations.md).

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime};

use witness_core::client::Stepped;

use super::contract::Status;
use crate::raft::WitnessResponse;

const STEPS: [&str; 4] = ["append", "vote", "pre-vote", "read-term"];

#[derive(Debug, Default)]
struct Sum {
    count: AtomicU64,
    micros: AtomicU64,
}

impl Sum {
    fn add(&self, d: Duration) {
        self.count.fetch_add(1, Relaxed);
        self.micros.fetch_add(d.as_micros() as u64, Relaxed);
    }
}

/// Counters and gauges of one member.
#[derive(Debug, Default)]
pub struct Metrics {
    wal_fsync: Sum,
    backend_commit: Sum,
    applied: AtomicU64,
    witness_steps: [AtomicU64; 4],
    witness_latency: [Sum; 4],
    witness_writes: AtomicU64,
    witness_conflicts: AtomicU64,
    witness_failures: AtomicU64,
    /// When the last witness step failed, why, and whether the witness lost its state (then
    /// reported until a step succeeds, however old); cleared by a step that succeeds.
    witness_error: Mutex<Option<(Instant, String, bool)>>,
    /// What the periodic probe of the witness last found.
    witness_probe: Mutex<Probe>,
    snapshots_sent: AtomicU64,
    snapshot_send_failures: AtomicU64,
    snapshots_received: AtomicU64,
    watch_catch_ups: AtomicU64,
    /// (subterm, witness in the replication set) while leading.
    leader_view: Mutex<Option<(u64, bool)>>,
}

/// The witness probe's findings.
#[derive(Debug, Default)]
struct Probe {
    /// Wall-clock time of the last probe that found the witness well.
    last_ok: Option<SystemTime>,
    /// Why the last probe failed (None: it succeeded, or none ran yet).
    failing: Option<String>,
}

impl Metrics {
    pub fn wal_fsync(&self, d: Duration) {
        self.wal_fsync.add(d);
    }
    pub fn backend_commit(&self, d: Duration) {
        self.backend_commit.add(d);
    }
    pub fn applied(&self, n: u64) {
        self.applied.fetch_add(n, Relaxed);
    }
    pub fn snapshot_sent(&self) {
        self.snapshots_sent.fetch_add(1, Relaxed);
    }
    pub fn snapshot_send_failed(&self) {
        self.snapshot_send_failures.fetch_add(1, Relaxed);
    }
    pub fn snapshot_received(&self) {
        self.snapshots_received.fetch_add(1, Relaxed);
    }
    pub fn watch_caught_up(&self) {
        self.watch_catch_ups.fetch_add(1, Relaxed);
    }
    pub fn witness_step(
        &self,
        name: &str,
        d: Duration,
        result: &witness_core::Result<Stepped<WitnessResponse>>,
    ) {
        let i = STEPS.iter().position(|s| *s == name).unwrap_or(0);
        self.witness_steps[i].fetch_add(1, Relaxed);
        self.witness_latency[i].add(d);
        let error = match result {
            Ok(s) => {
                self.witness_writes.fetch_add(u64::from(s.wrote), Relaxed);
                self.witness_conflicts
                    .fetch_add(u64::from(s.conflicts), Relaxed);
                None
            }
            Err(e) => {
                self.witness_failures.fetch_add(1, Relaxed);
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

    /// Records what a probe of the witness found. Returns the previous failure, if any (the
    /// caller logs changes).
    pub fn witness_probed(&self, result: Result<(), String>) -> Option<String> {
        let mut p = self.witness_probe.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(()) => {
                p.last_ok = Some(SystemTime::now());
                p.failing.take()
            }
            Err(why) => p.failing.replace(why),
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
        if let Ok(mut v) = self.leader_view.lock() {
            *v = view;
        }
    }

    /// The text exposition.
    pub fn render(&self, status: &Status, db_size: u64) -> String {
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
            );
        };
        gauge(
            "etcd_server_has_leader",
            "Whether a leader exists (1) or not (0).",
            u64::from(status.leader != 0),
        );
        gauge(
            "etcd_server_is_leader",
            "Whether this member is the leader.",
            u64::from(status.is_leader),
        );
        gauge("etcd_server_term", "The Raft term.", status.term);
        gauge(
            "etcd_server_committed_index",
            "The Raft commit index.",
            status.commit,
        );
        gauge(
            "etcd_server_applied_index",
            "The Raft applied index.",
            status.applied,
        );
        let (probe_ok, last_ok) = self
            .witness_probe
            .lock()
            .map(|p| (p.failing.is_none(), p.last_ok))
            .unwrap_or((false, None));
        gauge(
            "etcd_witness_healthy",
            "1 while the last probe found the witness readable and the one this member is bound to \
             (0: see /health and Status for why).",
            u64::from(probe_ok),
        );
        gauge(
            "etcd_witness_last_probe_success_timestamp_seconds",
            "Unix time of the last probe that found the witness well (0: none yet).",
            last_ok
                .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_secs()),
        );
        gauge(
            "etcd_mvcc_db_total_size_in_bytes",
            "Size of the key-value database file.",
            db_size,
        );
        let view = self.leader_view.lock().ok().and_then(|v| *v);
        gauge(
            "etcd_witness_subterm",
            "The leader's current subterm (0 on followers).",
            view.map_or(0, |v| v.0),
        );
        gauge(
            "etcd_witness_in_replication_set",
            "1 when the leader's replication set holds the witness (a regular member is down).",
            u64::from(view.is_some_and(|v| v.1)),
        );
        let _ = writeln!(
            out,
            "# HELP etcd_server_proposals_applied_total Entries applied.\n\
             # TYPE etcd_server_proposals_applied_total counter\n\
             etcd_server_proposals_applied_total {}",
            self.applied.load(Relaxed)
        );
        let sum = |out: &mut String, name: &str, help: &str, labels: &str, s: &Sum| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} summary\n\
                 {name}_sum{labels} {}\n{name}_count{labels} {}",
                s.micros.load(Relaxed) as f64 / 1e6,
                s.count.load(Relaxed)
            );
        };
        sum(
            &mut out,
            "etcd_disk_wal_fsync_duration_seconds",
            "WAL batch write and fsync latency.",
            "",
            &self.wal_fsync,
        );
        sum(
            &mut out,
            "etcd_disk_backend_commit_duration_seconds",
            "Key-space commit latency of an applied batch (durable every 10,000 entries).",
            "",
            &self.backend_commit,
        );
        let _ = writeln!(
            out,
            "# HELP etcd_witness_steps_total Witness steps by kind.\n# TYPE etcd_witness_steps_total counter"
        );
        for (i, step) in STEPS.iter().enumerate() {
            let _ = writeln!(
                out,
                "etcd_witness_steps_total{{step=\"{step}\"}} {}",
                self.witness_steps[i].load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP etcd_witness_step_duration_seconds Witness step latency by kind.\n\
             # TYPE etcd_witness_step_duration_seconds summary"
        );
        for (i, step) in STEPS.iter().enumerate() {
            let s = &self.witness_latency[i];
            let _ = writeln!(
                out,
                "etcd_witness_step_duration_seconds_sum{{step=\"{step}\"}} {}\n\
                 etcd_witness_step_duration_seconds_count{{step=\"{step}\"}} {}",
                s.micros.load(Relaxed) as f64 / 1e6,
                s.count.load(Relaxed)
            );
        }
        for (name, help, v) in [
            (
                "etcd_witness_writes_total",
                "Witness steps that stored a new state.",
                &self.witness_writes,
            ),
            (
                "etcd_witness_cas_conflicts_total",
                "Compare-and-swap races lost (and retried).",
                &self.witness_conflicts,
            ),
            (
                "etcd_witness_step_failures_total",
                "Witness steps that failed (storage unreachable, corrupt, ...).",
                &self.witness_failures,
            ),
            (
                "etcd_network_snapshot_send_success",
                "Snapshots a follower behind the compacted log received whole.",
                &self.snapshots_sent,
            ),
            (
                "etcd_network_snapshot_send_failures",
                "Snapshots whose sending failed (the follower unreachable, paused, or gone).",
                &self.snapshot_send_failures,
            ),
            (
                "etcd_network_snapshot_receive_success",
                "Snapshots received from the leader and installed.",
                &self.snapshots_received,
            ),
            (
                "etcd_watch_catch_ups_total",
                "Times a watch stream fell behind the live events and caught up from the history.",
                &self.watch_catch_ups,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Relaxed)
            );
        }
        out
    }
}
