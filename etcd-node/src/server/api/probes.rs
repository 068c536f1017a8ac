//! The HTTP health endpoints, as etcd 3.5.11+ and 3.6 serve them on the client and metrics
//! URLs: `/health` (JSON, etcd's `exclude=` and `serializable=true`), and `/livez` and `/readyz`
//! (plain text, Kubernetes' healthz format), which kubeadm (since 1.31), RKE2 and others use as
//! the kubelet's liveness and readiness probes of an etcd static pod.
//!
//! `/livez` runs `serializable_read`; `/readyz` runs `data_corruption`, `serializable_read`,
//! `linearizable_read` and `non_learner`, each also at `/livez/<check>` or `/readyz/<check>`.
//! `?exclude=<check>` leaves a check out of the root path, `?verbose` lists every check on
//! success (a failure always does), any method but GET gets 405.
//!
//! What the witness adds: `/readyz/witness`, failing while the witness is unreadable, lost or
//! refusing this member. It is served only at its own path, never in `/readyz`: the cluster
//! keeps serving while both members are up without a witness, and a probe (or a load balancer
//! routing by readiness) that turned both members away for it would take the whole cluster out
//! of service for a fault that costs nothing until a member fails. `/livez` does not depend on
//! the leader or the witness at all: a kubelet restarting a member that lost its peer or its
//! witness would only make things worse.

use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use etcd_client::AlarmType;
use etcd_client::proto::PbRangeRequest;

use super::handle::{Api, WITNESS_ERROR_WINDOW};

/// One check of `/livez` or `/readyz`, by etcd's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    DataCorruption,
    SerializableRead,
    LinearizableRead,
    NonLearner,
    /// etcd-node's own: at `/readyz/witness` only.
    Witness,
}

impl Check {
    fn name(self) -> &'static str {
        match self {
            Check::DataCorruption => "data_corruption",
            Check::SerializableRead => "serializable_read",
            Check::LinearizableRead => "linearizable_read",
            Check::NonLearner => "non_learner",
            Check::Witness => "witness",
        }
    }
}

/// A probe path: which checks its root runs, and which it serves one by one.
#[derive(Debug, Clone, Copy)]
struct Probe {
    kind: &'static str,
    root: &'static [Check],
    single: &'static [Check],
}

const LIVEZ: Probe = Probe {
    kind: "livez",
    root: &[Check::SerializableRead],
    single: &[Check::SerializableRead],
};

const READYZ: Probe = Probe {
    kind: "readyz",
    root: &[
        Check::DataCorruption,
        Check::SerializableRead,
        Check::LinearizableRead,
        Check::NonLearner,
    ],
    single: &[
        Check::DataCorruption,
        Check::SerializableRead,
        Check::LinearizableRead,
        Check::NonLearner,
        Check::Witness,
    ],
};

/// The query parameters the endpoints read, as Go's `URL.Query()` sees them.
#[derive(Debug, Default)]
struct Query {
    exclude: Vec<String>,
    verbose: bool,
    serializable: bool,
}

impl Query {
    fn of(request: &Request) -> Query {
        let mut q = Query::default();
        let mut serializable = None;
        let raw = request.uri().query().unwrap_or_default();
        for (k, v) in url::form_urlencoded::parse(raw.as_bytes()) {
            match &*k {
                "exclude" if !v.is_empty() => q.exclude.push(v.into_owned()),
                "verbose" => q.verbose = true,
                // (Go's Query().Get: the first value counts)
                "serializable" => _ = serializable.get_or_insert(v == "true"),
                _ => {}
            }
        }
        q.serializable = serializable.unwrap_or(false);
        q
    }
}

/// Why a check failed, in etcd's words where etcd has them.
#[derive(Debug, thiserror::Error)]
enum CheckFailed {
    #[error(transparent)]
    Store(#[from] crate::mvcc::StoreError),
    /// The read was refused (the key space answered an error).
    #[error(transparent)]
    Refused(#[from] crate::errors::EtcdError),
    /// No linearizable read: the leader could not be reached, or confirm it leads.
    #[error("{}", .0.message())]
    Barrier(tonic::Status),
    #[error("alarm activated: CORRUPT")]
    Corrupt,
    #[error("not supported for learner")]
    Learner,
    /// What the metrics say of the witness.
    #[error("{0}")]
    Witness(String),
}

impl Api {
    /// A read of this member's key space, as etcd's probes make it (one key, keys only).
    fn local_read(&self) -> Result<(), CheckFailed> {
        let req = PbRangeRequest {
            key: b"health".to_vec(),
            keys_only: true,
            limit: 1,
            serializable: true,
            ..Default::default()
        };
        self.mvcc.range(&req)??;
        Ok(())
    }

    fn active_alarms(&self) -> Result<Vec<i32>, crate::mvcc::StoreError> {
        let alarms = self.mvcc.alarms()?;
        Ok(alarms.into_iter().map(|a| a.alarm).collect())
    }

    async fn run(&self, check: Check) -> Result<(), CheckFailed> {
        match check {
            Check::DataCorruption => {
                match self.active_alarms()?.contains(&(AlarmType::Corrupt as i32)) {
                    true => Err(CheckFailed::Corrupt),
                    false => Ok(()),
                }
            }
            Check::SerializableRead => self.local_read(),
            Check::LinearizableRead => {
                self.barrier().await.map_err(CheckFailed::Barrier)?;
                self.local_read()
            }
            Check::NonLearner => match self.status.borrow().is_learner {
                true => Err(CheckFailed::Learner),
                false => Ok(()),
            },
            Check::Witness => match self.metrics.witness_problem(WITNESS_ERROR_WINDOW) {
                Some(why) => Err(CheckFailed::Witness(why)),
                None => Ok(()),
            },
        }
    }

    /// Runs `checks` in order: whether all passed, and a line per check in etcd's words.
    async fn run_checks(&self, kind: &str, checks: &[Check]) -> (bool, String) {
        let mut ok = true;
        let mut lines = String::new();
        for &check in checks {
            let result = self.run(check).await;
            self.metrics
                .record_health_check(kind, check.name(), result.is_ok());
            match result {
                Ok(()) => lines.push_str(&format!("[+]{} ok\n", check.name())),
                Err(why) => {
                    ok = false;
                    lines.push_str(&format!("[-]{} failed: {why}\n", check.name()));
                }
            }
        }
        (ok, lines)
    }

    /// `/health`, as etcd's: an alarm not excluded with `?exclude=NOSPACE` (or `CORRUPT`) fails
    /// it, then no leader, then a read that fails; `?serializable=true` reads this member's key
    /// space without the leader (what a liveness probe should ask). etcd-node adds the witness:
    /// a linearizable check also fails while the witness is unreadable or lost, because the
    /// cluster has lost its tie-breaker, which it needs as soon as a member fails.
    async fn health_json(&self, q: &Query) -> (bool, String) {
        match self.active_alarms() {
            Err(e) => return (false, e.to_string()),
            Ok(alarms) => {
                // (etcd's names, as Status lists them)
                let named = |a: i32| AlarmType::try_from(a).map_or("UNKNOWN", |t| t.as_str_name());
                let raised = alarms
                    .into_iter()
                    .map(named)
                    .find(|name| !q.exclude.iter().any(|e| e == name));
                if let Some(name) = raised {
                    return (false, format!("ALARM {name}"));
                }
            }
        }
        if q.serializable {
            return match self.local_read() {
                Ok(()) => (true, String::new()),
                Err(why) => (false, format!("RANGE ERROR:{why}")),
            };
        }
        let witness = self.metrics.witness_problem(WITNESS_ERROR_WINDOW);
        if self.status.borrow().leader == 0 {
            // etcd's reason, then why the witness cannot help (e.g. it refused this member's
            // vote: which member must come back).
            let reason = match witness {
                Some(why) => format!("RAFT NO LEADER; WITNESS: {why}"),
                None => "RAFT NO LEADER".into(),
            };
            return (false, reason);
        }
        if let Some(why) = witness {
            return (false, format!("WITNESS: {why}"));
        }
        match self.barrier().await {
            Ok(()) => (true, String::new()),
            Err(s) => (false, format!("RANGE ERROR:{}", s.message())),
        }
    }
}

/// Go's `http.Error` and the healthz success page: plain text, never sniffed.
fn text(code: StatusCode, body: String) -> Response {
    let mut r = (code, body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    r
}

fn method_not_allowed() -> Response {
    let mut r = text(
        StatusCode::METHOD_NOT_ALLOWED,
        "Method Not Allowed\n".into(),
    );
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET"));
    r
}

/// Answers a probe path: `checks` run, then etcd's page (an error page lists every check).
async fn answer(api: &Api, kind: &str, checks: &[Check], q: &Query) -> Response {
    let (ok, lines) = api.run_checks(kind, checks).await;
    if !ok {
        tracing::warn!(probe = kind, reason = %lines.trim_end(), "health probe failed");
        return text(StatusCode::SERVICE_UNAVAILABLE, format!("{lines}\n"));
    }
    let body = if q.verbose {
        format!("{lines}ok\n")
    } else {
        "ok\n".to_string()
    };
    text(StatusCode::OK, body)
}

async fn probe_root(api: Api, probe: Probe, request: Request) -> Response {
    if request.method() != Method::GET {
        return method_not_allowed();
    }
    let q = Query::of(&request);
    let unknown: Vec<&String> = q
        .exclude
        .iter()
        .filter(|e| !probe.root.iter().any(|c| c.name() == e.as_str()))
        .collect();
    if !unknown.is_empty() {
        // As etcd: excluding a check that does not exist does not fail the request.
        tracing::warn!(
            probe = probe.kind,
            ?unknown,
            "some health checks cannot be excluded"
        );
    }
    let checks: Vec<Check> = probe
        .root
        .iter()
        .copied()
        .filter(|c| !q.exclude.iter().any(|e| e == c.name()))
        .collect();
    answer(&api, probe.kind, &checks, &q).await
}

async fn probe_one(api: Api, probe: Probe, check: Check, request: Request) -> Response {
    if request.method() != Method::GET {
        return method_not_allowed();
    }
    answer(&api, probe.kind, &[check], &Query::of(&request)).await
}

async fn health(api: Api, request: Request) -> Response {
    if request.method() != Method::GET {
        return method_not_allowed();
    }
    let (healthy, reason) = api.health_json(&Query::of(&request)).await;
    api.metrics.record_health(healthy);
    let body = serde_json::json!({ "health": healthy.to_string(), "reason": reason }).to_string();
    if !healthy {
        tracing::warn!(output = %body, "/health error");
        // etcd answers a failure through http.Error: the JSON as plain text, a newline after.
        return text(StatusCode::SERVICE_UNAVAILABLE, format!("{body}\n"));
    }
    (StatusCode::OK, body).into_response()
}

/// Adds `/health`, `/livez`, `/readyz` and their sub-paths to a router.
pub fn routes(router: axum::Router, api: &Api) -> axum::Router {
    let a = api.clone();
    let mut router = router.route("/health", any(move |r: Request| health(a.clone(), r)));
    for probe in [LIVEZ, READYZ] {
        let a = api.clone();
        router = router.route(
            &format!("/{}", probe.kind),
            any(move |r: Request| probe_root(a.clone(), probe, r)),
        );
        for &check in probe.single {
            let a = api.clone();
            router = router.route(
                &format!("/{}/{}", probe.kind, check.name()),
                any(move |r: Request| probe_one(a.clone(), probe, check, r)),
            );
        }
    }
    router
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(uri: &str) -> Query {
        let request = Request::builder()
            .uri(uri)
            .body(axum::body::Body::empty())
            .expect("a request");
        Query::of(&request)
    }

    #[test]
    fn queries_are_read_as_go_reads_them() {
        let q = query("/readyz?verbose&exclude=non_learner&exclude=&exclude=serializable_read");
        assert!(q.verbose && !q.serializable);
        assert_eq!(q.exclude, ["non_learner", "serializable_read"]);
        // (the first value of a repeated parameter counts, as Go's Query().Get)
        assert!(!query("/health?serializable=false&serializable=true").serializable);
        assert!(query("/health?exclude=NOSPACE&serializable=true").serializable);
        assert!(!query("/health?serializable=1").serializable);
        let none = query("/livez");
        assert!(!none.verbose && none.exclude.is_empty());
    }
}
