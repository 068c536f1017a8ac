//! The KV service: ranges (linearizable after a ReadIndex round, or serializable from this
//! member's key space), puts, deletes, transactions and compaction, each write through Raft.

use etcd_client::proto::*;
use tonic::{Request, Response, Status};

use super::auth::{Caller, Need, caller_of, leases_of, needs_of};
use super::handle::{Api, internal, not_yet};
use crate::mvcc::{Op, Response as Applied};

/// KV, over the shared API handle.
#[derive(Debug, Clone)]
pub struct Kv {
    pub api: Api,
}

impl Api {
    /// Proposes a KV write once the request's token allows it (auth).
    async fn propose_as(&self, token: Option<Caller>, op: Op) -> Result<Applied, Status> {
        self.authorize(token.as_ref(), &needs_of(&op))?;
        let leases = leases_of(&op);
        if !leases.is_empty() && self.mvcc.auth_enabled() {
            self.authorize_lease_keys(token.as_ref(), &leases, true)?;
        }
        self.propose(op).await
    }
}

#[tonic::async_trait]
impl PbKvService for Kv {
    async fn range(
        &self,
        request: Request<PbRangeRequest>,
    ) -> Result<Response<PbRangeResponse>, Status> {
        let token = caller_of(&request);
        let req = request.into_inner();
        if !req.serializable {
            if self.api.status.borrow().is_learner {
                return Err(super::handle::not_for_learner());
            }
            self.api.barrier().await?;
        }
        // After the barrier: a linearizable read sees every permission change committed
        // before it, revocations included.
        self.api
            .authorize(token.as_ref(), &[Need::Read(&req.key, &req.range_end)])?;
        // (a range that holds its worker as one over a large key space does, for the tests)
        fail::fail_point!("range-stall");
        let out = self.api.mvcc.range(&req)??;
        Ok(Response::new(PbRangeResponse {
            header: self.api.header(out.revision as i64),
            kvs: out.kvs,
            more: out.more,
            count: out.count,
        }))
    }

    async fn put(&self, request: Request<PbPutRequest>) -> Result<Response<PbPutResponse>, Status> {
        let token = caller_of(&request);
        match self
            .api
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
        let token = caller_of(&request);
        match self
            .api
            .propose_as(token, Op::DeleteRange(request.into_inner()))
            .await?
        {
            Applied::DeleteRange(r) => Ok(Response::new(r)),
            other => Err(internal(format!("unexpected result {other:?}"))),
        }
    }

    async fn txn(&self, request: Request<PbTxnRequest>) -> Result<Response<PbTxnResponse>, Status> {
        let token = caller_of(&request);
        match self
            .api
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
        self.api.require_root(caller_of(&request).as_ref())?;
        match self
            .api
            .propose(Op::Compaction(request.into_inner()))
            .await?
        {
            Applied::Compaction(r) => Ok(Response::new(r)),
            other => Err(internal(format!("unexpected result {other:?}"))),
        }
    }
}
