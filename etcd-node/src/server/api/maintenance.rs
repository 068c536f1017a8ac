//! The Maintenance service: Status, alarms, defragment, hashes, snapshot download and
//! MoveLeader.

use etcd_client::proto::*;
use tonic::{Request, Response, Status};

use super::auth::caller_of;
use super::handle::{Api, VERSION, WITNESS_ERROR_WINDOW, internal, not_yet, stopped, timed_out};
use crate::mvcc::{Op, Response as Applied};
use crate::server::contract::Input;
use crate::storage::backup;

/// The size of the pieces a snapshot is streamed in (etcd's).
const SNAPSHOT_CHUNK: usize = 32 * 1024;

/// Maintenance, over the shared API handle.
#[derive(Debug, Clone)]
pub struct Maintenance {
    pub api: Api,
}

#[tonic::async_trait]
impl PbMaintenanceService for Maintenance {
    async fn alarm(
        &self,
        request: Request<PbAlarmRequest>,
    ) -> Result<Response<PbAlarmResponse>, Status> {
        // GET reads the alarms this member has applied; ACTIVATE and DEACTIVATE go through
        // Raft (etcdctl's `alarm disarm` deactivates each listed alarm in turn).
        if request.get_ref().action != 0 {
            self.api.require_root(caller_of(&request).as_ref())?;
        }
        let req = request.into_inner();
        if req.action != 0 {
            return match self.api.propose(Op::Alarm(req)).await? {
                Applied::Alarm(r) => Ok(Response::new(r)),
                other => Err(internal(format!("unexpected result {other:?}"))),
            };
        }
        let alarms = self
            .api
            .mvcc
            .alarms()
            .map_err(internal)?
            .into_iter()
            .filter(|a| req.alarm == 0 || a.alarm == req.alarm)
            .collect();
        Ok(Response::new(PbAlarmResponse {
            header: self.api.current_header(),
            alarms,
        }))
    }

    async fn status(
        &self,
        _: Request<PbStatusRequest>,
    ) -> Result<Response<PbStatusResponse>, Status> {
        let s = *self.api.status.borrow();
        let pos = self.api.mvcc.position().map_err(internal)?;
        let size = self.api.mvcc.db_size() as i64;
        let mut errors = Vec::new();
        if s.leader == 0 {
            errors.push("etcdserver: no leader".to_string());
        }
        // The probe's last failure, a step that found the witness's state lost, or a step that
        // failed lately (the witness was needed and did not answer).
        if let Some(why) = self.api.metrics.witness_problem(WITNESS_ERROR_WINDOW) {
            errors.push(format!("etcdserver: witness unavailable: {why}"));
        }
        for a in self.api.mvcc.alarms().map_err(internal)? {
            let name =
                etcd_client::AlarmType::try_from(a.alarm).map_or("UNKNOWN", |t| t.as_str_name());
            errors.push(format!("memberID:{} alarm:{name} ", a.member_id));
        }
        let is_learner = self
            .api
            .mvcc
            .members()
            .map_err(internal)?
            .iter()
            .any(|m| m.id == self.api.member_id && m.is_learner);
        Ok(Response::new(PbStatusResponse {
            header: self.api.header(pos.revision as i64),
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
        self.api.require_root(caller_of(&request).as_ref())?;
        let mvcc = self.api.mvcc.clone();
        let before = mvcc.db_size();
        tokio::task::spawn_blocking(move || mvcc.defragment())
            .await
            .map_err(internal)?
            .map_err(internal)?;
        tracing::info!(before, after = self.api.mvcc.db_size(), "defragmented");
        Ok(Response::new(PbDefragmentResponse {
            header: self.api.current_header(),
        }))
    }
    /// A CRC-32C of the whole key space as a snapshot carries it (history, members, leases):
    /// equal on members that applied the same entries.
    async fn hash(
        &self,
        request: Request<PbHashRequest>,
    ) -> Result<Response<PbHashResponse>, Status> {
        self.api.require_root(caller_of(&request).as_ref())?;
        let dump = self.api.mvcc.dump().map_err(internal)?;
        Ok(Response::new(PbHashResponse {
            header: self.api.current_header(),
            hash: crc32c::crc32c(&dump),
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<PbHashKvRequest>,
    ) -> Result<Response<PbHashKvResponse>, Status> {
        self.api.require_root(caller_of(&request).as_ref())?;
        let asked = u64::try_from(request.get_ref().revision).unwrap_or(0);
        let (hash, compacted, at) = self.api.mvcc.hash_kv(asked).map_err(internal)??;
        Ok(Response::new(PbHashKvResponse {
            header: self.api.current_header(),
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
        self.api.require_root(caller_of(&request).as_ref())?;
        let mvcc = self.api.mvcc.clone();
        let (dump, revision) = tokio::task::spawn_blocking(move || mvcc.dump_with_revision())
            .await
            .map_err(internal)?
            .map_err(internal)?;
        let file = backup::seal(&dump);
        let header = self.api.header(revision as i64);
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
        self.api.require_root(caller_of(&request).as_ref())?;
        let to = request.get_ref().target_id;
        self.api
            .ask(|reply| Input::TransferLeader { to, reply })
            .await?;
        let mut status = self.api.status.clone();
        tokio::time::timeout(
            self.api.request_timeout,
            status.wait_for(|s| s.leader == to),
        )
        .await
        .map_err(|_| timed_out())?
        .map_err(|_| stopped())?;
        Ok(Response::new(PbMoveLeaderResponse {
            header: self.api.current_header(),
        }))
    }
    async fn downgrade(
        &self,
        _: Request<PbDowngradeRequest>,
    ) -> Result<Response<PbDowngradeResponse>, Status> {
        Err(not_yet("Downgrade"))
    }
}
