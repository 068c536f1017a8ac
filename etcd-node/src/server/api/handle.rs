//! The handle every client service shares: the way into the Raft loop (`server::contract`),
//! this member's key space, and the helpers the services have in common (proposing a write,
//! waiting for a linearizable read's index, response headers).

use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Duration;

use etcd_client::proto::*;
use tokio::sync::{oneshot, watch as status_watch};
use tokio::time::Instant;
use tonic::{Request, Status};

use crate::errors::EtcdError;
use crate::mvcc::{Mvcc, Op, Proposal, Response as Applied, check, needs_space};
use crate::raft::NodeId;
use crate::server::contract::{Announced, ClientUrls, Input, Status as NodeStatus};
use crate::server::metrics::Metrics;
use crate::server::watch_hub::WatchHub;
use crate::version::{ETCD_CLUSTER_VERSION, ETCD_VERSION};

/// How long Status reports a failed witness step (unless a later step succeeds).
pub(super) const WITNESS_ERROR_WINDOW: Duration = Duration::from_secs(30);

/// What every API handler shares.
#[derive(Debug, Clone)]
pub struct Api {
    /// This member has caught up since it started (`ready_gate`).
    pub ready: status_watch::Receiver<bool>,
    pub inputs: Sender<Input>,
    pub status: status_watch::Receiver<NodeStatus>,
    pub mvcc: Arc<Mvcc>,
    pub cluster_id: u64,
    pub member_id: NodeId,
    pub client_urls: ClientUrls,
    /// This member's name and client URLs.
    pub own: Announced,
    pub metrics: Arc<Metrics>,
    pub request_timeout: Duration,
    pub watches: WatchHub,
    /// The shortest TTL a lease is granted (a shorter request gets this).
    pub min_lease_ttl: i64,
    /// How often watchers that asked for it get a progress notification.
    pub watch_progress: Duration,
    /// `--quota-backend-bytes`: past it, writes are refused and NOSPACE is raised.
    pub quota_bytes: u64,
    /// `--election-timeout` (a require-leader watch ends after three of them without a leader).
    pub election_timeout: Duration,
    /// Where this member finds a blob witness's SAS token.
    pub credentials: crate::server::witness_slot::Credentials,
    /// `--max-request-bytes`: the largest write proposed (and watch response fragment).
    pub max_request_bytes: usize,
    /// Peers that refused this member's frames lately (Status shows them).
    pub peer_refusals: crate::server::peer::Refusals,
    /// `--experimental-max-learners`: `member add --learner` past it is refused.
    pub max_learners: usize,
    /// How this member calls other members' client URLs (the corruption check).
    pub client_dialer: crate::tls::Dialer,
}

/// Did the client ask for etcd's `WithRequireLeader` (metadata `hasleader: true`)?
pub fn requires_leader(metadata: &tonic::metadata::MetadataMap) -> bool {
    metadata.get("hasleader").is_some_and(|v| v == "true")
}

/// etcd's require-leader check, run before every client call: a call that asks for it fails
/// with `etcdserver: no leader` while this member knows no leader, serializable reads and the
/// opening of streams included (without it, a serializable read is served without a leader).
pub fn leader_check(
    status: status_watch::Receiver<NodeStatus>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |request| {
        if requires_leader(request.metadata()) && status.borrow().leader == 0 {
            return Err(EtcdError::NO_LEADER.into());
        }
        Ok(request)
    }
}

/// etcd's refusal of what a learner does not serve.
pub fn not_for_learner() -> Status {
    EtcdError::NOT_SUPPORTED_FOR_LEARNER.into()
}

/// The calls a learner serves, as etcd's: Status, and Range (only serializable: the Range
/// handler refuses the others), every other call and stream refused with etcd's error. A
/// learner holds no vote and may be far behind; a client balancing over the endpoints then
/// moves on to a voter.
pub async fn learner_gate(
    axum::extract::State(status): axum::extract::State<status_watch::Receiver<NodeStatus>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    const SERVED: [&str; 2] = ["/etcdserverpb.Maintenance/Status", "/etcdserverpb.KV/Range"];
    if status.borrow().is_learner && !SERVED.contains(&request.uri().path()) {
        return not_for_learner().into_http();
    }
    next.run(request).await
}

/// Holds a client API call until this member is ready (`bootstrap::announce_ready`: caught up
/// with the cluster after it starts), as etcd serves none before; a client that gives up
/// first (its deadline) cancels it. Status passes (it answers why the member is not ready
/// yet, `not_ready`), and the health endpoints are not behind it.
pub async fn ready_gate(
    axum::extract::State(mut ready): axum::extract::State<status_watch::Receiver<bool>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    const DIAGNOSIS: [&str; 3] = [
        "/etcdserverpb.Maintenance/Status",
        "/v3/maintenance/status",
        "/v3beta/maintenance/status",
    ];
    if !*ready.borrow()
        && !DIAGNOSIS.contains(&request.uri().path())
        && ready.wait_for(|r| *r).await.is_err()
    {
        return stopped().into_http();
    }
    next.run(request).await
}

/// Status before this member is ready: no revision it could report is safe to act on (it may
/// be replaying its log into an older key space), so it answers an error with what Status
/// would list (no leader, a refusing peer, the witness), for the operator who asks why.
pub fn not_ready(errors: &[String]) -> Status {
    let why = if errors.is_empty() {
        "it is catching up with the leader".to_string()
    } else {
        errors.join("; ")
    };
    Status::unavailable(format!(
        "etcdserver: this member is not ready yet (it serves clients once it has caught up with a leader): {why}"
    ))
}

pub(super) fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

/// A key-space failure as a client sees it: DATA_LOSS when the file is damaged (the message
/// names the file, the key and the recovery), INTERNAL otherwise. The corruption check of
/// another member reads DATA_LOSS as damage (corruption.rs).
impl From<crate::mvcc::StoreError> for Status {
    fn from(e: crate::mvcc::StoreError) -> Status {
        if e.damaged {
            Status::data_loss(e.to_string())
        } else {
            internal(e)
        }
    }
}

pub(super) fn timed_out() -> Status {
    EtcdError::TIMEOUT.into()
}

/// The Raft loop is gone: the server is stopping.
pub(super) fn stopped() -> Status {
    EtcdError::STOPPED.into()
}

impl Api {
    pub(super) fn header(&self, revision: i64) -> Option<PbResponseHeader> {
        Some(PbResponseHeader {
            cluster_id: self.cluster_id,
            member_id: self.member_id,
            revision,
            raft_term: self.status.borrow().term,
        })
    }

    /// A header at this member's newest revision.
    pub(super) fn current_header(&self) -> Option<PbResponseHeader> {
        let revision = self.mvcc.position().map_or(0, |p| p.revision);
        self.header(revision as i64)
    }

    /// Fails at once when there is no leader (etcd's "no leader", not a hang).
    pub(super) fn require_leader(&self) -> Result<(), Status> {
        if self.status.borrow().leader == 0 {
            return Err(EtcdError::NO_LEADER.into());
        }
        Ok(())
    }

    /// Waits until this member knows a leader, until `deadline` at most, as etcd holds a
    /// write while its member knows none: a write sent during an election is served after it
    /// instead of refused. Still none by then: `no leader` (the write never reached Raft, so a
    /// client may send it again).
    async fn leader_by(&self, deadline: Instant) -> Result<(), Status> {
        let mut status = self.status.clone();
        match tokio::time::timeout_at(deadline, status.wait_for(|s| s.leader != 0)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(stopped()),
            Err(_) => Err(EtcdError::NO_LEADER.into()),
        }
    }

    /// Hands the Raft loop `input` (built around the reply channel) and waits for its answer,
    /// at most the request timeout.
    pub(super) async fn ask<T>(
        &self,
        input: impl FnOnce(oneshot::Sender<Result<T, EtcdError>>) -> Input,
    ) -> Result<T, Status> {
        self.ask_by(Instant::now() + self.request_timeout, input)
            .await
    }

    /// [`Self::ask`], waiting until `deadline` at most.
    async fn ask_by<T>(
        &self,
        deadline: Instant,
        input: impl FnOnce(oneshot::Sender<Result<T, EtcdError>>) -> Input,
    ) -> Result<T, Status> {
        let (reply, rx) = oneshot::channel();
        self.inputs.send(input(reply)).map_err(|_| stopped())?;
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(r)) => Ok(r?),
            Ok(Err(_)) | Err(_) => Err(timed_out()),
        }
    }

    /// A client's write: handed to Raft once this member knows a leader, and answered when
    /// it is applied; the whole within the request timeout, as etcd's.
    pub(super) async fn propose(&self, op: Op) -> Result<Applied, Status> {
        check(&op)?;
        let deadline = Instant::now() + self.request_timeout;
        self.leader_by(deadline).await?;
        let space = needs_space(&op);
        let proposal = Proposal {
            id: 0,
            op: Some(op),
        };
        let size = prost::Message::encoded_len(&proposal);
        if size > self.max_request_bytes {
            return Err(EtcdError::REQUEST_TOO_LARGE.into());
        }
        // As etcd: a write that would take the file past the quota raises NOSPACE for this
        // member (through Raft, so every member then refuses such writes) and is refused.
        // (Twice the request: the record goes into the history and the live-key table.)
        if space && self.mvcc.db_size_at_commit() + 2 * size as u64 > self.quota_bytes {
            let raise = PbAlarmRequest {
                action: 1,
                member_id: self.member_id,
                alarm: 1,
            };
            let raised = self.mvcc.alarms().map_err(Status::from)?;
            let mine = |a: &PbAlarmMember| (a.member_id, a.alarm) == (raise.member_id, raise.alarm);
            if !raised.iter().any(mine)
                && let Err(e) = Box::pin(self.propose(Op::Alarm(raise))).await
            {
                tracing::warn!(error = %e, "could not raise the NOSPACE alarm");
            }
            tracing::warn!(
                quota = self.quota_bytes,
                size = self.mvcc.db_size(),
                "refused a write: the key space reached --quota-backend-bytes (NOSPACE raised)"
            );
            return Err(EtcdError::NO_SPACE.into());
        }
        let mut applied = self
            .ask_by(deadline, |reply| Input::Propose { proposal, reply })
            .await?;
        let h = applied.header_mut();
        *h = self.header(h.as_ref().map_or(0, |h| h.revision));
        Ok(applied)
    }

    /// Waits until this member has applied everything committed before the call: after it,
    /// a local read is linearizable.
    pub async fn barrier(&self) -> Result<(), Status> {
        self.require_leader()?;
        let (reply, rx) = oneshot::channel();
        self.inputs
            .send(Input::Read { reply })
            .map_err(|_| stopped())?;
        let wait = async {
            let index = rx.await.map_err(|_| timed_out())??;
            let mut status = self.status.clone();
            status
                .wait_for(|s| s.applied >= index)
                .await
                .map_err(|_| stopped())?;
            Ok::<_, Status>(())
        };
        tokio::time::timeout(self.request_timeout, wait)
            .await
            .map_err(|_| timed_out())?
    }

    pub fn metrics_text(&self) -> String {
        self.metrics.render(
            &self.status.borrow(),
            self.mvcc.db_size(),
            self.mvcc.cluster_params().as_ref(),
        )
    }
}

/// `/version`, as etcd serves it (`etcdserver`, `etcdcluster`: the etcd API), with etcd-node's
/// own: this member's release and peer protocol, the cluster's release (the lowest regular
/// member's) and the cluster features on, once the leader recorded them.
pub fn version_json(api: &Api) -> serde_json::Value {
    let params = api.mvcc.cluster_params();
    serde_json::json!({
        "etcdserver": ETCD_VERSION,
        "etcdcluster": if params.is_some() { ETCD_CLUSTER_VERSION } else { "not_decided" },
        "etcdnode": crate::version::BINARY,
        "etcdnodecluster": params.as_ref().map_or("not_decided", |p| p.version.as_str()),
        "peerprotocol": crate::version::own_protocol(),
        "features": params.map(|p| p.features.into_iter().collect::<Vec<_>>()).unwrap_or_default(),
    })
}

pub(super) fn not_yet(what: &str) -> Status {
    Status::unimplemented(format!(
        "etcd-node does not support {what} yet (docs/operations.md lists what is supported)"
    ))
}
