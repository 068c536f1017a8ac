//! The Cluster service: the member list (with client URLs as the members announce them), and
//! membership changes through Raft, a witness checked at its storage before it is added.

use std::time::Duration;

use etcd_client::proto::*;
use tonic::{Request, Response, Status};
use witness_core::WitnessUrl;

use super::auth::caller_of;
use super::handle::Api;
use crate::config::HttpUrl;
use crate::errors::EtcdError;
use crate::mvcc::MemberChange;
use crate::server::contract::{Input, regular_peer_url};

/// Cluster, over the shared API handle.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub api: Api,
}

#[tonic::async_trait]
impl PbClusterService for Cluster {
    async fn member_add(
        &self,
        request: Request<PbMemberAddRequest>,
    ) -> Result<Response<PbMemberAddResponse>, Status> {
        self.api.require_root(caller_of(&request).as_ref())?;
        let r = request.into_inner();
        if r.peer_ur_ls.is_empty() {
            return Err(bad_urls(
                "no peer URL given; write http://host:port, or a witness: URL for a witness",
            ));
        }
        let members = self.api.mvcc.members().map_err(Status::from)?;
        let mut r = r;
        let witness = match r.peer_ur_ls.as_slice() {
            [u] if WitnessUrl::is_witness(u) => Some(self.api.new_witness(u, &r, &members).await?),
            urls => {
                for u in urls {
                    if WitnessUrl::is_witness(u) {
                        return Err(Status::invalid_argument(
                            "etcdserver: a witness has exactly one peer URL, its witness: URL",
                        ));
                    }
                    HttpUrl::parse("peer-urls", u).map_err(|e| bad_urls(&e.0))?;
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
            return Err(EtcdError::PEER_URL_EXIST.into());
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
        if r.is_learner && members.iter().filter(|m| m.is_learner).count() >= self.api.max_learners
        {
            return Err(EtcdError::TOO_MANY_LEARNERS.into());
        }
        let (name, generation) = witness
            .as_ref()
            .map(|w| (w.loaded.state.name.clone(), w.loaded.state.generation))
            .unwrap_or_default();
        let member = PbMember {
            id: crate::config::member_id(&hashed, &now.to_string()),
            name,
            peer_ur_ls: r.peer_ur_ls,
            client_ur_ls: Vec::new(),
            is_learner: r.is_learner,
        };
        if members.iter().any(|m| m.id == member.id) {
            return Err(EtcdError::MEMBER_EXIST.into());
        }
        if let Some(w) = &witness {
            self.api.claim_witness(w, member.id).await?;
        }
        self.api
            .change_member(member.clone(), false, generation)
            .await?;
        Ok(Response::new(PbMemberAddResponse {
            header: self.api.header(self.api.revision()?),
            member: Some(member),
            members: self.api.member_views()?,
        }))
    }
    async fn member_remove(
        &self,
        request: Request<PbMemberRemoveRequest>,
    ) -> Result<Response<PbMemberRemoveResponse>, Status> {
        self.api.require_root(caller_of(&request).as_ref())?;
        // (the leader too, as etcd: it hands leadership over and the next leader removes it)
        let member = self.api.member(request.get_ref().id)?;
        self.api.change_member(member, true, 0).await?;
        Ok(Response::new(PbMemberRemoveResponse {
            header: self.api.header(self.api.revision()?),
            members: self.api.member_views()?,
        }))
    }
    /// New peer URLs for a regular member, as etcd's: through Raft, every member then reaches
    /// it at the new ones (the member itself is restarted listening on them; its name and
    /// client URLs stay). The witness moves by adding a new one and removing the old.
    async fn member_update(
        &self,
        request: Request<PbMemberUpdateRequest>,
    ) -> Result<Response<PbMemberUpdateResponse>, Status> {
        self.api.require_root(caller_of(&request).as_ref())?;
        let r = request.into_inner();
        let mut member = self.api.member(r.id)?;
        if regular_peer_url(&member).is_none() {
            return Err(Status::failed_precondition(format!(
                "etcdserver: member {:x} is the witness; a witness is moved by adding the new \
                 location and removing this one (docs/operations.md, \"Moving or replacing the \
                 witness\")",
                r.id
            )));
        }
        if r.peer_ur_ls.is_empty() {
            return Err(bad_urls("no peer URL given; write http://host:port"));
        }
        for u in &r.peer_ur_ls {
            if WitnessUrl::is_witness(u) {
                return Err(bad_urls(
                    "a regular member's peer URLs are http:// or https:// URLs, not witness: ones",
                ));
            }
            HttpUrl::parse("peer-urls", u).map_err(|e| bad_urls(&e.0))?;
        }
        let members = self.api.mvcc.members().map_err(Status::from)?;
        if members
            .iter()
            .filter(|m| m.id != r.id)
            .any(|m| m.peer_ur_ls.iter().any(|u| r.peer_ur_ls.contains(u)))
        {
            return Err(EtcdError::PEER_URL_EXIST.into());
        }
        member.peer_ur_ls = r.peer_ur_ls;
        self.api.change_member(member, false, 0).await?;
        Ok(Response::new(PbMemberUpdateResponse {
            header: self.api.header(self.api.revision()?),
            members: self.api.member_views()?,
        }))
    }
    async fn member_promote(
        &self,
        request: Request<PbMemberPromoteRequest>,
    ) -> Result<Response<PbMemberPromoteResponse>, Status> {
        self.api.require_root(caller_of(&request).as_ref())?;
        let mut member = self.api.member(request.get_ref().id)?;
        if !member.is_learner {
            return Err(EtcdError::MEMBER_NOT_LEARNER.into());
        }
        member.is_learner = false;
        self.api.change_member(member, false, 0).await?;
        Ok(Response::new(PbMemberPromoteResponse {
            header: self.api.header(self.api.revision()?),
            members: self.api.member_views()?,
        }))
    }
    async fn member_list(
        &self,
        request: Request<PbMemberListRequest>,
    ) -> Result<Response<PbMemberListResponse>, Status> {
        if request.get_ref().linearizable {
            self.api.barrier().await?;
        }
        Ok(Response::new(PbMemberListResponse {
            header: self.api.header(self.api.revision()?),
            members: self.api.member_views()?,
        }))
    }
}

/// How long `member add` of a witness waits for its storage to answer.
const WITNESS_READ_LIMIT: Duration = Duration::from_secs(15);

impl Api {
    /// Checks a witness that `member add` names before it is proposed: the cluster has no
    /// witness, and the location holds a freshly initialised record that no cluster used (or
    /// that this cluster claimed in an earlier `member add` and never used). Returns the record
    /// as loaded: its name (as `etcdutl witness init` recorded it) and its generation, which
    /// binds every member to it.
    async fn new_witness(
        &self,
        url: &str,
        request: &PbMemberAddRequest,
        members: &[PbMember],
    ) -> Result<NewWitness, Status> {
        let parsed = WitnessUrl::parse(url)
            .map_err(|e| Status::invalid_argument(format!("etcdserver: {e}")))?;
        let shown = witness_core::url::redact(url);
        if request.is_learner {
            return Err(Status::invalid_argument(
                "etcdserver: a witness cannot be a learner (it stores no log); add it without --learner",
            ));
        }
        if let Some((w, _)) = crate::server::contract::witness_member(members) {
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
        let state = &loaded.state;
        let fresh = state.cluster_id == 0 && state.member_id == 0 && state.term == 0;
        let ours_unused = state.cluster_id == self.cluster_id && crate::witness::unused(state);
        if !fresh && !ours_unused && crate::witness::unused(state) {
            return Err(Status::failed_precondition(format!(
                "etcdserver: the witness at {location} was claimed by another cluster ({:x}, as \
                 its member {:x}) when it was added there; a witness location serves one \
                 cluster: initialise a new, empty location (another directory or blob) with \
                 `etcdutl witness init` and add that; nothing was changed",
                state.cluster_id, state.member_id
            )));
        }
        if !fresh && !ours_unused {
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
        Ok(NewWitness {
            url: parsed,
            loaded,
        })
    }

    /// Binds the witness `member add` checked to this cluster and the member id it gets, before
    /// the change is proposed: a second cluster adding the same location is refused at once. A
    /// claim that loses the race (another cluster claimed it meanwhile) refuses this add.
    async fn claim_witness(&self, w: &NewWitness, member: u64) -> Result<(), Status> {
        use crate::witness::{Claim, claim_within};
        let claimed = claim_within(
            &w.url,
            &w.loaded,
            self.cluster_id,
            member,
            WITNESS_READ_LIMIT,
        )
        .await
        .map_err(|u| unread(&w.url, u))?;
        if claimed == Claim::Lost {
            let (location, now) = load_witness(&w.url).await?;
            let by = now.map_or(0, |l| l.state.cluster_id);
            return Err(Status::failed_precondition(format!(
                "etcdserver: the witness at {location} was claimed by another cluster ({by:x}) \
                 while this one was adding it; a witness location serves one cluster: \
                 initialise a new, empty location with `etcdutl witness init` and add that; \
                 nothing was changed"
            )));
        }
        Ok(())
    }
}

/// A witness `member add` checked, as it read it.
#[derive(Debug)]
struct NewWitness {
    /// The URL as given (for a blob, with the caller's SAS token).
    url: WitnessUrl,
    loaded: witness_core::Loaded,
}

/// Opens and reads the witness at `url` for `member add`, within [`WITNESS_READ_LIMIT`]: its
/// location (redacted) and record.
async fn load_witness(url: &WitnessUrl) -> Result<(String, Option<witness_core::Loaded>), Status> {
    crate::witness::load_within(url, WITNESS_READ_LIMIT)
        .await
        .map_err(|u| unread(url, u))
}

/// A witness `member add` could not read (or claim), as the client sees it.
fn unread(url: &WitnessUrl, unread: crate::witness::Unread) -> Status {
    use crate::witness::Unread;
    match unread {
        Unread::Open(e) => Status::failed_precondition(format!("etcdserver: witness {url}: {e}")),
        Unread::TimedOut { location } => Status::unavailable(format!(
            "etcdserver: the witness storage {location} did not answer within \
             {WITNESS_READ_LIMIT:?} (share not mounted here, blob host unreachable?); nothing \
             was changed"
        )),
        Unread::Load(e) => {
            Status::failed_precondition(format!("etcdserver: {e}; nothing was changed"))
        }
    }
}

fn bad_urls(why: &str) -> Status {
    Status::invalid_argument(format!("etcdserver: given member URLs are invalid ({why})"))
}

impl Api {
    fn revision(&self) -> Result<i64, Status> {
        Ok(self.mvcc.position().map_err(Status::from)?.revision as i64)
    }

    /// The stored member `id`, or etcd's "member not found".
    fn member(&self, id: u64) -> Result<PbMember, Status> {
        self.mvcc
            .members()
            .map_err(Status::from)?
            .into_iter()
            .find(|m| m.id == id)
            .ok_or_else(|| Status::from(EtcdError::MEMBER_NOT_FOUND))
    }

    /// The members as MemberList shows them: with client URLs (this member's own, the others'
    /// as their peer links announce them; none for the witness).
    fn member_views(&self) -> Result<Vec<PbMember>, Status> {
        let learned = self
            .client_urls
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default();
        let mut members = self.mvcc.members().map_err(Status::from)?;
        for m in &mut members {
            // (a member list written before witness URLs were stored redacted)
            crate::server::contract::redact_witness_url(m);
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
