//! The Lease service. Grant and Revoke go through Raft (the proposer picks the id of a grant
//! without one, and raises a short TTL to the minimum, as etcd's leader does); KeepAlive and
//! TimeToLive are answered by the leader's lessor (a follower asks it); Leases and the keys of
//! a lease come from this member's store.

use std::time::Duration;

use etcd_client::proto::{
    PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseKeepAliveRequest, PbLeaseKeepAliveResponse,
    PbLeaseLeasesRequest, PbLeaseLeasesResponse, PbLeaseRevokeRequest, PbLeaseRevokeResponse,
    PbLeaseService, PbLeaseStatus, PbLeaseTimeToLiveRequest, PbLeaseTimeToLiveResponse,
};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use super::auth::caller_of;
use super::handle::{Api, internal};
use crate::mvcc::{Op, Response as Applied};
use crate::server::contract::Input;

/// etcd's minimum lease TTL: one and a half election timeouts, in whole seconds (rounded up).
pub fn min_lease_ttl(election_timeout: Duration) -> i64 {
    let ms = election_timeout.as_millis() * 3 / 2;
    i64::try_from(ms.div_ceil(1000)).unwrap_or(i64::MAX)
}

impl Api {
    /// The leader's answer about lease `id`: (remaining TTL, granted TTL), None if unknown.
    async fn ask_lease(&self, id: i64, renew: bool) -> Result<Option<(i64, i64)>, Status> {
        self.require_leader()?;
        self.ask(|reply| Input::Lease { id, renew, reply }).await
    }
}

/// Lease, over the shared API handle.
#[derive(Debug, Clone)]
pub struct Lease {
    pub api: Api,
}

#[tonic::async_trait]
impl PbLeaseService for Lease {
    async fn lease_grant(
        &self,
        request: Request<PbLeaseGrantRequest>,
    ) -> Result<Response<PbLeaseGrantResponse>, Status> {
        self.api.rights(caller_of(&request).as_ref())?;
        let mut req = request.into_inner();
        if req.id == 0 {
            // Positive and non-zero, as etcd's generated ids.
            req.id = (rand::random::<i64>() & i64::MAX).max(1);
        }
        req.ttl = req.ttl.max(self.api.min_lease_ttl);
        match self.api.propose(Op::LeaseGrant(req)).await? {
            Applied::LeaseGrant(r) => Ok(Response::new(r)),
            other => Err(internal(format!("unexpected result {other:?}"))),
        }
    }

    async fn lease_revoke(
        &self,
        request: Request<PbLeaseRevokeRequest>,
    ) -> Result<Response<PbLeaseRevokeResponse>, Status> {
        let token = caller_of(&request);
        if self.api.mvcc.auth_enabled() {
            self.api
                .authorize_lease_keys(token.as_ref(), &[request.get_ref().id], true)?;
        }
        match self
            .api
            .propose(Op::LeaseRevoke(request.into_inner()))
            .await?
        {
            Applied::LeaseRevoke(r) => Ok(Response::new(r)),
            other => Err(internal(format!("unexpected result {other:?}"))),
        }
    }

    type LeaseKeepAliveStream =
        tokio_stream::wrappers::ReceiverStream<Result<PbLeaseKeepAliveResponse, Status>>;

    async fn lease_keep_alive(
        &self,
        request: Request<Streaming<PbLeaseKeepAliveRequest>>,
    ) -> Result<Response<Self::LeaseKeepAliveStream>, Status> {
        self.api.rights(caller_of(&request).as_ref())?;
        let mut requests = request.into_inner();
        let (out, rx) = mpsc::channel(16);
        let api = self.api.clone();
        tokio::spawn(async move {
            while let Ok(Some(r)) = requests.message().await {
                let answer = match api.ask_lease(r.id, true).await {
                    // An unknown lease answers TTL 0, as etcd's.
                    Ok(found) => Ok(PbLeaseKeepAliveResponse {
                        header: api.current_header(),
                        id: r.id,
                        ttl: found.map_or(0, |(_, granted)| granted),
                    }),
                    Err(e) => Err(e),
                };
                let failed = answer.is_err();
                if out.send(answer).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn lease_time_to_live(
        &self,
        request: Request<PbLeaseTimeToLiveRequest>,
    ) -> Result<Response<PbLeaseTimeToLiveResponse>, Status> {
        let token = caller_of(&request);
        let req = request.into_inner();
        let listed = if req.keys { vec![req.id] } else { Vec::new() };
        let keys = self
            .api
            .authorize_lease_keys(token.as_ref(), &listed, false)?;
        let Some((ttl, granted_ttl)) = self.api.ask_lease(req.id, false).await? else {
            // etcd answers an unknown lease with TTL -1, not an error.
            return Ok(Response::new(PbLeaseTimeToLiveResponse {
                header: self.api.current_header(),
                id: req.id,
                ttl: -1,
                ..Default::default()
            }));
        };
        Ok(Response::new(PbLeaseTimeToLiveResponse {
            header: self.api.current_header(),
            id: req.id,
            ttl,
            granted_ttl,
            keys,
        }))
    }

    async fn lease_leases(
        &self,
        request: Request<PbLeaseLeasesRequest>,
    ) -> Result<Response<PbLeaseLeasesResponse>, Status> {
        self.api.rights(caller_of(&request).as_ref())?;
        let leases = self.api.mvcc.leases().map_err(Status::from)?;
        Ok(Response::new(PbLeaseLeasesResponse {
            header: self.api.current_header(),
            leases: leases
                .into_iter()
                .map(|(id, _)| PbLeaseStatus { id })
                .collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minimum_ttl_is_etcds() {
        assert_eq!(min_lease_ttl(Duration::from_millis(1000)), 2);
        assert_eq!(min_lease_ttl(Duration::from_millis(500)), 1);
        assert_eq!(min_lease_ttl(Duration::from_millis(5000)), 8);
    }
}
