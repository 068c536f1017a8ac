//! The Maintenance service: Status, alarms, defragment, hashes, snapshot download and
//! MoveLeader.

use etcd_client::proto::*;
use tonic::{Request, Response, Status};

use super::auth::caller_of;
use super::handle::{Api, WITNESS_ERROR_WINDOW, internal, stopped, timed_out};
use crate::errors::EtcdError;
use crate::mvcc::{Op, Response as Applied};
use crate::server::contract::Input;
use crate::storage::backup;
use crate::version::ETCD_VERSION;

/// The size of the pieces a snapshot is streamed in (etcd's).
const SNAPSHOT_CHUNK: usize = 32 * 1024;

/// A writer that only counts what it is given.
struct Counted(u64);

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The snapshot stream's messages, `SNAPSHOT_CHUNK` bytes each, sent as they fill (waiting
/// while the client is behind: at most 4 messages queue).
struct Chunks {
    header: Option<PbResponseHeader>,
    /// Bytes of the file not sent yet.
    remaining: u64,
    piece: Vec<u8>,
    tx: tokio::sync::mpsc::Sender<Result<PbSnapshotResponse, Status>>,
}

impl Chunks {
    /// Sends what is gathered (an error: the client went away).
    fn send(&mut self) -> std::io::Result<()> {
        if self.piece.is_empty() {
            return Ok(());
        }
        self.remaining -= self.piece.len() as u64;
        let message = PbSnapshotResponse {
            header: self.header,
            remaining_bytes: self.remaining,
            blob: std::mem::replace(&mut self.piece, Vec::with_capacity(SNAPSHOT_CHUNK)),
            version: ETCD_VERSION.into(),
        };
        self.tx
            .blocking_send(Ok(message))
            .map_err(|_| std::io::Error::other("the client went away"))
    }
}

impl std::io::Write for Chunks {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(SNAPSHOT_CHUNK - self.piece.len());
        self.piece.extend_from_slice(&buf[..n]);
        if self.piece.len() == SNAPSHOT_CHUNK {
            self.send()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

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
            .map_err(Status::from)?
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
        let pos = self.api.mvcc.position().map_err(Status::from)?;
        let size = self.api.mvcc.db_size() as i64;
        let mut errors = Vec::new();
        if s.leader == 0 {
            errors.push(EtcdError::NO_LEADER.message.into_owned());
        }
        // The probe's last failure, a step that found the witness's state lost, or a step that
        // failed lately (the witness was needed and did not answer).
        if let Some(why) = self.api.metrics.witness_problem(WITNESS_ERROR_WINDOW) {
            errors.push(format!("etcdserver: witness unavailable: {why}"));
        }
        if let Ok(refusals) = self.api.peer_refusals.lock() {
            for (peer, (when, why)) in refusals.iter() {
                if when.elapsed() < crate::server::peer::REFUSAL_SHOWN {
                    errors.push(format!(
                        "etcdserver: member {peer:x} refuses this member: {why}"
                    ));
                }
            }
        }
        for a in self.api.mvcc.alarms().map_err(Status::from)? {
            let name =
                etcd_client::AlarmType::try_from(a.alarm).map_or("UNKNOWN", |t| t.as_str_name());
            errors.push(format!("memberID:{} alarm:{name} ", a.member_id));
        }
        if !*self.api.ready.borrow() {
            return Err(super::handle::not_ready(&errors));
        }
        let is_learner = self
            .api
            .mvcc
            .members()
            .map_err(Status::from)?
            .iter()
            .any(|m| m.id == self.api.member_id && m.is_learner);
        Ok(Response::new(PbStatusResponse {
            header: self.api.header(pos.revision as i64),
            version: ETCD_VERSION.into(),
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
            .map_err(Status::from)?;
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
        let mvcc = self.api.mvcc.clone();
        let hash = tokio::task::spawn_blocking(move || mvcc.dump_crc())
            .await
            .map_err(internal)??;
        Ok(Response::new(PbHashResponse {
            header: self.api.current_header(),
            hash,
        }))
    }

    async fn hash_kv(
        &self,
        request: Request<PbHashKvRequest>,
    ) -> Result<Response<PbHashKvResponse>, Status> {
        self.api.require_root(caller_of(&request).as_ref())?;
        let asked = u64::try_from(request.get_ref().revision).unwrap_or(0);
        let (hash, compacted, at) = self.api.mvcc.hash_kv(asked)??;
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
    /// (`storage::backup`), in chunks; the header carries the revision. The dump is written
    /// twice from one view of the key space: once to learn its length (the file's header holds
    /// it), then into the chunks as they are sent, so memory does not grow with the key space.
    async fn snapshot(
        &self,
        request: Request<PbSnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        self.api.require_root(caller_of(&request).as_ref())?;
        let api = self.api.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let errors = tx.clone();
            let sent = api.mvcc.with_view(|view| {
                let mut counted = Counted(0);
                let revision = view.dump_to(&mut counted)?;
                let mut chunks = Chunks {
                    header: api.header(revision as i64),
                    remaining: backup::sealed_len(counted.0),
                    piece: Vec::with_capacity(SNAPSHOT_CHUNK),
                    tx,
                };
                let client_gone = |e: std::io::Error| crate::mvcc::StoreError {
                    path: "the snapshot stream".into(),
                    message: e.to_string(),
                    damaged: false,
                };
                let mut sealed =
                    backup::Sealer::new(&mut chunks, counted.0).map_err(client_gone)?;
                view.dump_to(&mut sealed)?;
                sealed.finish().map_err(client_gone)?;
                chunks.send().map_err(client_gone)
            });
            if let Err(e) = sent {
                let _ = errors.blocking_send(Err(internal(e)));
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
        // etcd's downgrade lowers the cluster's etcd API version (3.5 -> 3.4) so members of
        // the older etcd can join; every etcd-node release serves the same API level, and
        // going back to an older etcd-node release is a matter of its formats, not of a
        // cluster-wide switch (docs/operations.md, "Upgrades and going back").
        Err(Status::failed_precondition(
            "etcdserver: downgrade is not supported by etcd-node: every release serves etcd \
             API 3.5, so there is no cluster version to lower. To go back to an older \
             etcd-node release, replace the binaries one member at a time while the cluster's \
             version (GET /version, etcdnodecluster) allows it; a member whose key space an \
             older release cannot read refuses to start with that release and says so \
             (docs/operations.md, \"Upgrades and going back\")",
        ))
    }
}
