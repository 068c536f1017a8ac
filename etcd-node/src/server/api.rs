//! The etcd v3 client API (gRPC, etcd-client's server types): KV, Cluster.MemberList and
//! Maintenance.Status/Alarm; plus `/health` and `/metrics`. Writes go through Raft; linearizable
//! reads wait for a ReadIndex round, serializable ones read this member's key space at once.

use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Duration;

use etcd_client::proto::*;
use tokio::sync::{oneshot, watch};
use tonic::{Request, Response, Status};

use super::auth::{Need, leases_of, needs_of, token_of};
use super::metrics::Metrics;
use super::node::{Announced, ClientUrls, Input, Status as NodeStatus, no_leader};
use super::watches::WatchHub;
use crate::config::HttpUrl;
use crate::mvcc::{
    ApiError, MemberChange, Mvcc, Op, Proposal, Response as Applied, check, needs_space,
};
use crate::raft::NodeId;
use crate::storage::backup;
use witness_core::WitnessUrl;

/// etcd's default `--max-request-bytes`.
pub const MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// The size of the pieces a snapshot is streamed in (etcd's).
const SNAPSHOT_CHUNK: usize = 32 * 1024;
/// How long Status reports a failed witness step (unless a later step succeeds).
const WITNESS_ERROR_WINDOW: Duration = Duration::from_secs(30);
/// The version reported by Status: etcd clients check it (this API matches etcd 3.5's).
pub const VERSION: &str = "3.5.17";

/// What every API handler shares.
#[derive(Debug, Clone)]
pub struct Api {
    pub inputs: Sender<Input>,
    pub status: watch::Receiver<NodeStatus>,
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
    pub credentials: super::witness_slot::Credentials,
}

/// Did the client ask for etcd's `WithRequireLeader` (metadata `hasleader: true`)?
pub fn requires_leader(metadata: &tonic::metadata::MetadataMap) -> bool {
    metadata.get("hasleader").is_some_and(|v| v == "true")
}

/// etcd's require-leader check, run before every client call: a call that asks for it fails
/// with `etcdserver: no leader` while this member knows no leader, serializable reads and the
/// opening of streams included (without it, a serializable read is served without a leader).
pub fn leader_check(
    status: watch::Receiver<NodeStatus>,
) -> impl FnMut(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |request| {
        if requires_leader(request.metadata()) && status.borrow().leader == 0 {
            return Err(no_leader().into());
        }
        Ok(request)
    }
}

pub(super) fn internal(e: impl std::fmt::Display) -> Status {
    Status::internal(e.to_string())
}

fn timed_out() -> Status {
    Status::unavailable("etcdserver: request timed out")
}

/// The Raft loop is gone: the server is stopping.
pub(super) fn stopped() -> Status {
    Status::unavailable("etcdserver: server stopped")
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
            return Err(no_leader().into());
        }
        Ok(())
    }

    /// Hands the Raft loop `input` (built around the reply channel) and waits for its answer,
    /// at most the request timeout.
    pub(super) async fn ask<T>(
        &self,
        input: impl FnOnce(oneshot::Sender<Result<T, ApiError>>) -> Input,
    ) -> Result<T, Status> {
        let (reply, rx) = oneshot::channel();
        self.inputs.send(input(reply)).map_err(|_| stopped())?;
        match tokio::time::timeout(self.request_timeout, rx).await {
            Ok(Ok(r)) => Ok(r?),
            Ok(Err(_)) | Err(_) => Err(timed_out()),
        }
    }

    /// Proposes a KV write once the request's token allows it (auth).
    async fn propose_as(&self, token: Option<String>, op: Op) -> Result<Applied, Status> {
        self.authorize(token.as_deref(), &needs_of(&op))?;
        let leases = leases_of(&op);
        if !leases.is_empty() && self.mvcc.auth_enabled() {
            self.authorize_lease_keys(token.as_deref(), &leases, true)?;
        }
        self.propose(op).await
    }

    pub(super) async fn propose(&self, op: Op) -> Result<Applied, Status> {
        check(&op)?;
        self.require_leader()?;
        let space = needs_space(&op);
        let proposal = Proposal {
            id: 0,
            op: Some(op),
        };
        let size = prost::Message::encoded_len(&proposal);
        if size > MAX_REQUEST_BYTES {
            return Err(ApiError::invalid("etcdserver: request is too large").into());
        }
        // As etcd: a write that would take the file past the quota raises NOSPACE for this
        // member (through Raft, so every member then refuses such writes) and is refused.
        // (Twice the request: the record goes into the history and the live-key table.)
        if space && self.mvcc.db_size() + 2 * size as u64 > self.quota_bytes {
            let raise = PbAlarmRequest {
                action: 1,
                member_id: self.member_id,
                alarm: 1,
            };
            let raised = self.mvcc.alarms().map_err(internal)?;
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
            return Err(ApiError::no_space().into());
        }
        let mut applied = self.ask(|reply| Input::Propose { proposal, reply }).await?;
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

    /// `/health`: healthy when there is a leader, the witness (if any) is well, and a
    /// linearizable read succeeds. A witness that is unreadable or lost makes the member
    /// unhealthy although it serves: the cluster has lost its tie-breaker, which it needs as soon
    /// as a member fails.
    pub async fn health(&self) -> (bool, String) {
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
            Err(s) => (false, s.message().to_string()),
        }
    }

    pub fn metrics_text(&self) -> String {
        self.metrics
            .render(&self.status.borrow(), self.mvcc.db_size())
    }
}

#[tonic::async_trait]
impl PbKvService for Api {
    async fn range(
        &self,
        request: Request<PbRangeRequest>,
    ) -> Result<Response<PbRangeResponse>, Status> {
        let token = token_of(request.metadata());
        let req = request.into_inner();
        if !req.serializable {
            self.barrier().await?;
        }
        // After the barrier: a linearizable read sees every permission change committed
        // before it, revocations included.
        self.authorize(token.as_deref(), &[Need::Read(&req.key, &req.range_end)])?;
        let out = self.mvcc.range(&req).map_err(internal)??;
        Ok(Response::new(PbRangeResponse {
            header: self.header(out.revision as i64),
            kvs: out.kvs,
            more: out.more,
            count: out.count,
        }))
    }

    async fn put(&self, request: Request<PbPutRequest>) -> Result<Response<PbPutResponse>, Status> {
        let token = token_of(request.metadata());
        match self
            .propose_as(token, Op::Put(request.into_inner()))
            .await?
        {
            Applied::Put(r) => Ok(Response::new(r)),
            other => Err(internal(format!("unexpected result {other:?}"))),
        }
    }

    async fn delete_range(
        &self,
        request: Request<PbDeleteRequest>,
    ) -> Result<Response<PbDeleteResponse>, Status> {
        let token = token_of(request.metadata());
        match self
            .propose_as(token, Op::DeleteRange(request.into_inner()))
            .await?
        {
            Applied::DeleteRange(r) => Ok(Response::new(r)),
            other => Err(internal(format!("unexpected result {other:?}"))),
        }
    }

    async fn txn(&self, request: Request<PbTxnRequest>) -> Result<Response<PbTxnResponse>, Status> {
        let token = token_of(request.metadata());
        match self
            .propose_as(token, Op::Txn(request.into_inner()))
            .await?
        {
            Applied::Txn(r) => Ok(Response::new(r)),
            other => Err(internal(format!("unexpected result {other:?}"))),
        }
    }

    type RangeStreamStream =
        tokio_stream::wrappers::ReceiverStream<Result<PbRangeStreamResponse, Status>>;

    /// Added after etcd 3.5 (which answers it as unimplemented, as this does).
    async fn range_stream(
        &self,
        _: Request<PbRangeRequest>,
    ) -> Result<Response<Self::RangeStreamStream>, Status> {
        Err(not_yet("RangeStream"))
    }

    async fn compact(
        &self,
        request: Request<PbCompactionRequest>,
    ) -> Result<Response<PbCompactionResponse>, Status> {
        self.require_root(token_of(request.metadata()).as_deref())?;
        match self.propose(Op::Compaction(request.into_inner())).await? {
            Applied::Compaction(r) => Ok(Response::new(r)),
            other => Err(internal(format!("unexpected result {other:?}"))),
        }
    }
}

fn not_yet(what: &str) -> Status {
    Status::unimplemented(format!(
        "etcd-node does not support {what} yet (docs/operations.md lists what is supported)"
    ))
}

#[tonic::async_trait]
impl PbClusterService for Api {
    async fn member_add(
        &self,
        request: Request<PbMemberAddRequest>,
    ) -> Result<Response<PbMemberAddResponse>, Status> {
        self.require_root(token_of(request.metadata()).as_deref())?;
        let r = request.into_inner();
        if r.peer_ur_ls.is_empty() {
            return Err(bad_urls(
                "no peer URL given; write http://host:port, or a witness: URL for a witness",
            ));
        }
        let members = self.mvcc.members().map_err(internal)?;
        let mut r = r;
        let witness = match r.peer_ur_ls.as_slice() {
            [u] if WitnessUrl::is_witness(u) => Some(self.new_witness(u, &r, &members).await?),
            urls => {
                for u in urls {
                    if WitnessUrl::is_witness(u) {
                        return Err(Status::invalid_argument(
                            "etcdserver: a witness has exactly one peer URL, its witness: URL",
                        ));
                    }
                    HttpUrl::parse("peer-urls", u).map_err(|e| bad_urls(&e))?;
                }
                None
            }
        };
        if witness.is_some() {
            // The member list (replicated, in every snapshot) never holds a SAS signature: each
            // member takes the token from its own configuration (--witness-sas-file).
            r.peer_ur_ls = r
                .peer_ur_ls
                .iter()
                .map(|u| WitnessUrl::member_list_form(u))
                .collect();
        }
        if members
            .iter()
            .any(|m| m.peer_ur_ls.iter().any(|u| r.peer_ur_ls.contains(u)))
        {
            return Err(Status::failed_precondition(
                "etcdserver: Peer URLs already exists",
            ));
        }
        // As etcd: the id hashes the peer URLs and the time, so a re-added member gets a new one.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let hashed = match witness {
            // (the storage it names, not the SAS token it was given with)
            Some(_) => vec![WitnessUrl::identity(&r.peer_ur_ls[0])],
            None => r.peer_ur_ls.clone(),
        };
        let (name, generation) = witness.unwrap_or_default();
        let member = PbMember {
            id: crate::config::member_id(&hashed, &now.to_string()),
            name,
            peer_ur_ls: r.peer_ur_ls,
            client_ur_ls: Vec::new(),
            is_learner: r.is_learner,
        };
        if members.iter().any(|m| m.id == member.id) {
            return Err(Status::failed_precondition(
                "etcdserver: member ID already exist",
            ));
        }
        self.change_member(member.clone(), false, generation)
            .await?;
        Ok(Response::new(PbMemberAddResponse {
            header: self.header(self.revision()?),
            member: Some(member),
            members: self.member_views()?,
        }))
    }
    async fn member_remove(
        &self,
        request: Request<PbMemberRemoveRequest>,
    ) -> Result<Response<PbMemberRemoveResponse>, Status> {
        self.require_root(token_of(request.metadata()).as_deref())?;
        let member = self.member(request.get_ref().id)?;
        if member.id == self.status.borrow().leader {
            return Err(Status::failed_precondition(format!(
                "etcdserver: {:x} is the leader; etcd-node removes the leader only after it handed \
                 over: stop that member (the other takes over) and remove it then",
                member.id
            )));
        }
        self.change_member(member, true, 0).await?;
        Ok(Response::new(PbMemberRemoveResponse {
            header: self.header(self.revision()?),
            members: self.member_views()?,
        }))
    }
    async fn member_update(
        &self,
        _: Request<PbMemberUpdateRequest>,
    ) -> Result<Response<PbMemberUpdateResponse>, Status> {
        Err(not_yet("MemberUpdate"))
    }
    async fn member_promote(
        &self,
        request: Request<PbMemberPromoteRequest>,
    ) -> Result<Response<PbMemberPromoteResponse>, Status> {
        self.require_root(token_of(request.metadata()).as_deref())?;
        let mut member = self.member(request.get_ref().id)?;
        if !member.is_learner {
            return Err(Status::failed_precondition(
                "etcdserver: can only promote a learner member",
            ));
        }
        member.is_learner = false;
        self.change_member(member, false, 0).await?;
        Ok(Response::new(PbMemberPromoteResponse {
            header: self.header(self.revision()?),
            members: self.member_views()?,
        }))
    }
    async fn member_list(
        &self,
        request: Request<PbMemberListRequest>,
    ) -> Result<Response<PbMemberListResponse>, Status> {
        if request.get_ref().linearizable {
            self.barrier().await?;
        }
        Ok(Response::new(PbMemberListResponse {
            header: self.header(self.revision()?),
            members: self.member_views()?,
        }))
    }
}

/// How long `member add` of a witness waits for its storage to answer.
const WITNESS_READ_LIMIT: Duration = Duration::from_secs(15);

impl Api {
    /// Checks a witness that `member add` names before it is proposed: the cluster has no
    /// witness, and the location holds a freshly initialised record that no cluster used.
    /// Returns the witness's name (as `etcdutl witness init` recorded it) and its generation,
    /// which binds every member to this record.
    async fn new_witness(
        &self,
        url: &str,
        request: &PbMemberAddRequest,
        members: &[PbMember],
    ) -> Result<(String, u64), Status> {
        let parsed = WitnessUrl::parse(url)
            .map_err(|e| Status::invalid_argument(format!("etcdserver: {e}")))?;
        let shown = witness_core::url::redact(url);
        if request.is_learner {
            return Err(Status::invalid_argument(
                "etcdserver: a witness cannot be a learner (it stores no log); add it without --learner",
            ));
        }
        if let Some((w, _)) = super::node::witness_member(members) {
            return Err(Status::failed_precondition(format!(
                "etcdserver: the cluster already has a witness, {} ({:x}); a cluster has one witness. \
                 To move it, remove it first (`etcdctl member remove {:x}`), then add the new one \
                 (docs/operations.md, \"Moving or replacing the witness\")",
                w.name, w.id, w.id
            )));
        }
        let (location, loaded) = load_witness(&parsed).await?;
        let Some(loaded) = loaded else {
            return Err(Status::failed_precondition(format!(
                "etcdserver: the witness at {location} is not initialised; initialise it first: \
                 `etcdutl witness init --name NAME --advertise-peer-url '{shown}'` (with the \
                 real SAS token in place of REDACTED, for a blob), then add it again; nothing \
                 was changed"
            )));
        };
        let state = loaded.state;
        if state.cluster_id != 0 || state.member_id != 0 || state.term != 0 {
            return Err(Status::failed_precondition(format!(
                "etcdserver: the witness at {location} was already used (cluster {:x}, member {:x}, \
                 term {}); a witness location serves one cluster, once: initialise a new, empty \
                 location (another directory or blob) with `etcdutl witness init` and add that; \
                 nothing was changed",
                state.cluster_id, state.member_id, state.term
            )));
        }
        if state.generation == 0 {
            return Err(Status::failed_precondition(format!(
                "etcdserver: the witness at {location} has no identity (initialised by an older \
                 etcdutl) and holds no cluster's state; if no member of any other cluster was \
                 started with it, initialise it again with this version: `etcdutl witness init \
                 --force --name {} --advertise-peer-url '{shown}'` (with the real SAS token in \
                 place of REDACTED, for a blob); otherwise use a new location; nothing was \
                 changed",
                state.name
            )));
        }
        // Every member reaches the witness with its own token (the member list holds none): this
        // one must, or the cluster would gain a voter nobody can use.
        let own = WitnessUrl::parse(&WitnessUrl::member_list_form(url))
            .map_err(|e| Status::invalid_argument(format!("etcdserver: {e}")))
            .and_then(|stored| {
                self.credentials.resolve(&stored).map_err(|why| {
                    Status::failed_precondition(format!(
                        "etcdserver: this member cannot use the witness with its own \
                         configuration: {why}; give every member the SAS token first; nothing \
                         was changed"
                    ))
                })
            })?;
        if own.to_url_string() != parsed.to_url_string() {
            let (_, mine) = load_witness(&own).await?;
            if mine.map(|l| l.state.generation) != Some(state.generation) {
                return Err(Status::failed_precondition(format!(
                    "etcdserver: with this member's own SAS token (--witness-sas-file) the \
                     witness at {location} reads differently; check the token names the same \
                     blob; nothing was changed"
                )));
            }
        }
        Ok((state.name, state.generation))
    }
}

/// Opens and reads the witness at `url` for `member add`, within [`WITNESS_READ_LIMIT`]: its
/// location (redacted) and record.
async fn load_witness(url: &WitnessUrl) -> Result<(String, Option<witness_core::Loaded>), Status> {
    use crate::witness::Unread;
    crate::witness::load_within(url, WITNESS_READ_LIMIT)
        .await
        .map_err(|unread| match unread {
            Unread::Open(e) => {
                Status::failed_precondition(format!("etcdserver: witness {url}: {e}"))
            }
            Unread::TimedOut { location } => Status::unavailable(format!(
                "etcdserver: the witness storage {location} did not answer within \
                 {WITNESS_READ_LIMIT:?} (share not mounted here, blob host unreachable?); \
                 nothing was changed"
            )),
            Unread::Load(e) => {
                Status::failed_precondition(format!("etcdserver: {e}; nothing was changed"))
            }
        })
}

fn bad_urls(why: &str) -> Status {
    Status::invalid_argument(format!("etcdserver: given member URLs are invalid ({why})"))
}

impl Api {
    fn revision(&self) -> Result<i64, Status> {
        Ok(self.mvcc.position().map_err(internal)?.revision as i64)
    }

    /// The stored member `id`, or etcd's "member not found".
    fn member(&self, id: u64) -> Result<PbMember, Status> {
        self.mvcc
            .members()
            .map_err(internal)?
            .into_iter()
            .find(|m| m.id == id)
            .ok_or_else(|| Status::not_found("etcdserver: member not found"))
    }

    /// The members as MemberList shows them: with client URLs (this member's own, the others'
    /// as their peer links announce them; none for the witness).
    fn member_views(&self) -> Result<Vec<PbMember>, Status> {
        let learned = self
            .client_urls
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default();
        let mut members = self.mvcc.members().map_err(internal)?;
        for m in &mut members {
            // (a member list written before witness URLs were stored redacted)
            super::node::redact_witness_url(m);
            let announced = if m.id == self.member_id {
                Some(&self.own)
            } else {
                learned.get(&m.id)
            };
            if let Some(a) = announced {
                m.client_ur_ls = a.client_urls.clone();
                if m.name.is_empty() {
                    m.name = a.name.clone();
                }
            }
        }
        Ok(members)
    }

    /// Proposes a membership change and waits until this member has applied it.
    async fn change_member(
        &self,
        member: PbMember,
        remove: bool,
        witness_generation: u64,
    ) -> Result<(), Status> {
        self.require_leader()?;
        let change = MemberChange {
            id: 0,
            member: Some(member),
            remove,
            witness_generation,
        };
        self.ask(|reply| Input::ProposeMember { change, reply })
            .await
    }
}

#[tonic::async_trait]
impl PbMaintenanceService for Api {
    async fn alarm(
        &self,
        request: Request<PbAlarmRequest>,
    ) -> Result<Response<PbAlarmResponse>, Status> {
        // GET reads the alarms this member has applied; ACTIVATE and DEACTIVATE go through
        // Raft (etcdctl's `alarm disarm` deactivates each listed alarm in turn).
        if request.get_ref().action != 0 {
            self.require_root(token_of(request.metadata()).as_deref())?;
        }
        let req = request.into_inner();
        if req.action != 0 {
            return match self.propose(Op::Alarm(req)).await? {
                Applied::Alarm(r) => Ok(Response::new(r)),
                other => Err(internal(format!("unexpected result {other:?}"))),
            };
        }
        let alarms = self
            .mvcc
            .alarms()
            .map_err(internal)?
            .into_iter()
            .filter(|a| req.alarm == 0 || a.alarm == req.alarm)
            .collect();
        Ok(Response::new(PbAlarmResponse {
            header: self.current_header(),
            alarms,
        }))
    }

    async fn status(
        &self,
        _: Request<PbStatusRequest>,
    ) -> Result<Response<PbStatusResponse>, Status> {
        let s = *self.status.borrow();
        let pos = self.mvcc.position().map_err(internal)?;
        let size = self.mvcc.db_size() as i64;
        let mut errors = Vec::new();
        if s.leader == 0 {
            errors.push("etcdserver: no leader".to_string());
        }
        // The probe's last failure, a step that found the witness's state lost, or a step that
        // failed lately (the witness was needed and did not answer).
        if let Some(why) = self.metrics.witness_problem(WITNESS_ERROR_WINDOW) {
            errors.push(format!("etcdserver: witness unavailable: {why}"));
        }
        for a in self.mvcc.alarms().map_err(internal)? {
            let name =
                etcd_client::AlarmType::try_from(a.alarm).map_or("UNKNOWN", |t| t.as_str_name());
            errors.push(format!("memberID:{} alarm:{name} ", a.member_id));
        }
        let is_learner = self
            .mvcc
            .members()
            .map_err(internal)?
            .iter()
            .any(|m| m.id == self.member_id && m.is_learner);
        Ok(Response::new(PbStatusResponse {
            header: self.header(pos.revision as i64),
            version: VERSION.into(),
            db_size: size,
            leader: s.leader,
            raft_index: s.commit,
            raft_term: s.term,
            raft_applied_index: s.applied,
            errors,
            db_size_in_use: size,
            is_learner,
            ..Default::default()
        }))
    }

    /// Compacts this member's database file (writes and reads wait meanwhile, as in etcd).
    async fn defragment(
        &self,
        request: Request<PbDefragmentRequest>,
    ) -> Result<Response<PbDefragmentResponse>, Status> {
        self.require_root(token_of(request.metadata()).as_deref())?;
        let mvcc = self.mvcc.clone();
        let before = mvcc.db_size();
        tokio::task::spawn_blocking(move || mvcc.defragment())
            .await
            .map_err(internal)?
            .map_err(internal)?;
        tracing::info!(before, after = self.mvcc.db_size(), "defragmented");
        Ok(Response::new(PbDefragmentResponse {
            header: self.current_header(),
        }))
    }
    /// A CRC-32C of the whole key space as a snapshot carries it (history, members, leases):
    /// equal on members that applied the same entries.
    async fn hash(
        &self,
        request: Request<PbHashRequest>,
    ) -> Result<Response<PbHashResponse>, Status> {
        self.require_root(token_of(request.metadata()).as_deref())?;
        let dump = self.mvcc.dump().map_err(internal)?;
        Ok(Response::new(PbHashResponse {
            header: self.current_header(),
            hash: crc32c::crc32c(&dump),
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<PbHashKvRequest>,
    ) -> Result<Response<PbHashKvResponse>, Status> {
        self.require_root(token_of(request.metadata()).as_deref())?;
        let asked = u64::try_from(request.get_ref().revision).unwrap_or(0);
        let (hash, compacted, at) = self.mvcc.hash_kv(asked).map_err(internal)??;
        Ok(Response::new(PbHashKvResponse {
            header: self.current_header(),
            hash,
            compact_revision: compacted as i64,
            hash_revision: at as i64,
        }))
    }

    type SnapshotStream =
        tokio_stream::wrappers::ReceiverStream<Result<PbSnapshotResponse, Status>>;

    /// This member's key space at one revision, as a sealed snapshot file
    /// (`storage::backup`), in chunks; the header carries the revision.
    async fn snapshot(
        &self,
        request: Request<PbSnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        self.require_root(token_of(request.metadata()).as_deref())?;
        let mvcc = self.mvcc.clone();
        let (dump, revision) = tokio::task::spawn_blocking(move || mvcc.dump_with_revision())
            .await
            .map_err(internal)?
            .map_err(internal)?;
        let file = backup::seal(&dump);
        let header = self.header(revision as i64);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let mut remaining = file.len();
            for chunk in file.chunks(SNAPSHOT_CHUNK) {
                remaining -= chunk.len();
                let message = PbSnapshotResponse {
                    header,
                    remaining_bytes: remaining as u64,
                    blob: chunk.to_vec(),
                    version: VERSION.into(),
                };
                if tx.send(Ok(message)).await.is_err() {
                    return; // the client went away
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }
    /// On the leader: hands leadership to a regular voter (never the witness) and answers once
    /// the target leads.
    async fn move_leader(
        &self,
        request: Request<PbMoveLeaderRequest>,
    ) -> Result<Response<PbMoveLeaderResponse>, Status> {
        self.require_root(token_of(request.metadata()).as_deref())?;
        let to = request.get_ref().target_id;
        self.ask(|reply| Input::TransferLeader { to, reply })
            .await?;
        let mut status = self.status.clone();
        tokio::time::timeout(self.request_timeout, status.wait_for(|s| s.leader == to))
            .await
            .map_err(|_| timed_out())?
            .map_err(|_| stopped())?;
        Ok(Response::new(PbMoveLeaderResponse {
            header: self.current_header(),
        }))
    }
    async fn downgrade(
        &self,
        _: Request<PbDowngradeRequest>,
    ) -> Result<Response<PbDowngradeResponse>, Status> {
        Err(not_yet("Downgrade"))
    }
}
