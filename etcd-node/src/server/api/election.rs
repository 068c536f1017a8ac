//! etcd's Election service (`v3electionpb.Election`), as etcd builds it from its client's
//! election: a candidate puts `<name>/<lease in hex>` with its value on its lease (a new lease
//! of 60 s when it names none); the oldest key under the name is the leader. Campaign answers
//! once the candidate leads; Proclaim changes the leader's value while its key is the one the
//! LeaderKey names; Leader reads the leader; Observe streams each leader and each new value;
//! Resign deletes the leader's key. Errors are etcd's: "election: not leader", "election: no
//! leader", `"leader" field must be provided`.

use std::pin::Pin;

use etcd_client::proto::PbKeyValue;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::concurrency::{
    Client, Withdraw, by_creation, prefix_of, range_result, session_key, wait_under,
};
use super::handle::Api;

/// The service's messages and server, generated from etcd's v3election.proto (build.rs).
#[allow(clippy::all, missing_debug_implementations)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/services/v3electionpb.rs"));
}

use pb::{
    CampaignRequest, CampaignResponse, LeaderKey, LeaderRequest, LeaderResponse, ProclaimRequest,
    ProclaimResponse, ResignRequest, ResignResponse,
};

/// Election, over the shared API handle.
#[derive(Debug, Clone)]
pub struct Election {
    pub api: Api,
}

fn not_leader() -> Status {
    Status::unknown("election: not leader")
}

fn no_leader() -> Status {
    Status::unknown("election: no leader")
}

fn missing_leader_key() -> Status {
    Status::unknown("\"leader\" field must be provided")
}

#[tonic::async_trait]
impl pb::election_server::Election for Election {
    async fn campaign(
        &self,
        request: Request<CampaignRequest>,
    ) -> Result<Response<CampaignResponse>, Status> {
        let client = Client::of(&self.api, &request);
        let req = request.into_inner();
        let lease = client.session(req.lease).await?;
        let prefix = prefix_of(&req.name);
        let key = session_key(&prefix, lease);
        let txn = client.join(&prefix, &key, &req.value, lease).await?;
        let header = txn.header;
        let mut rev = header.as_ref().map_or(0, |h| h.revision);
        let mut withdraw = Withdraw {
            client: client.clone(),
            key: key.clone(),
            revision: rev,
            armed: true,
        };
        if !txn.succeeded {
            // This lease already campaigns: keep its key, with the value asked now.
            let kv = range_result(&txn, 0)
                .and_then(|r| r.kvs.first())
                .ok_or_else(not_leader)?;
            rev = kv.create_revision;
            withdraw.revision = rev;
            if kv.value != req.value
                && !client.put_if(&key, rev, &req.value, lease).await?.succeeded
            {
                return Err(not_leader());
            }
        }
        client.wait_deletes(&prefix, rev - 1).await?;
        withdraw.armed = false;
        Ok(Response::new(CampaignResponse {
            header,
            leader: Some(LeaderKey {
                name: req.name,
                key,
                rev,
                lease,
            }),
        }))
    }

    async fn proclaim(
        &self,
        request: Request<ProclaimRequest>,
    ) -> Result<Response<ProclaimResponse>, Status> {
        let client = Client::of(&self.api, &request);
        let req = request.into_inner();
        let leader = req.leader.ok_or_else(missing_leader_key)?;
        let txn = client
            .put_if(&leader.key, leader.rev, &req.value, leader.lease)
            .await?;
        if !txn.succeeded {
            return Err(not_leader());
        }
        Ok(Response::new(ProclaimResponse { header: txn.header }))
    }

    async fn leader(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<LeaderResponse>, Status> {
        let client = Client::of(&self.api, &request);
        let first = client
            .first_created(&prefix_of(&request.into_inner().name))
            .await?;
        let kv = first.kvs.into_iter().next().ok_or_else(no_leader)?;
        Ok(Response::new(LeaderResponse {
            header: first.header,
            kv: Some(kv),
        }))
    }

    type ObserveStream = Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>;

    /// Each leader, and each value a leader proclaims, from the one at the call on (a change
    /// superseded before this member's stream sent it may be skipped; the newest is sent).
    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let client = Client::of(&self.api, &request);
        let prefix = prefix_of(&request.into_inner().name);
        let mut changes = client.api().watches.subscribe();
        // (linearizable first: the stream starts at least where the call found the leader)
        let mut now = client.first_created(&prefix).await?;
        let stream = async_stream(move |tx| async move {
            let mut sent: Option<PbKeyValue> = None;
            loop {
                if let Some(kv) = now.kvs.first()
                    && sent.as_ref().is_none_or(|s| {
                        (s.key.as_slice(), s.mod_revision) != (kv.key.as_slice(), kv.mod_revision)
                    })
                {
                    sent = Some(kv.clone());
                    let out = LeaderResponse {
                        header: now.header,
                        kv: Some(kv.clone()),
                    };
                    if tx.send(Ok(out)).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    waited = wait_under(&mut changes, &prefix) => if let Err(e) = waited {
                        let _ = tx.send(Err(e)).await;
                        return;
                    },
                    () = tx.closed() => return,
                }
                now = match client.range(by_creation(&prefix, None), true).await {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
            }
        });
        Ok(Response::new(stream))
    }

    async fn resign(
        &self,
        request: Request<ResignRequest>,
    ) -> Result<Response<ResignResponse>, Status> {
        let client = Client::of(&self.api, &request);
        let leader = request.into_inner().leader.ok_or_else(missing_leader_key)?;
        let txn = client.delete_if(&leader.key, leader.rev).await?;
        Ok(Response::new(ResignResponse { header: txn.header }))
    }
}

/// A stream fed by `body` through a small channel; it ends when `body` returns or the receiver
/// is dropped (the client went away).
fn async_stream<F, Fut>(
    body: F,
) -> Pin<Box<dyn Stream<Item = Result<LeaderResponse, Status>> + Send>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<LeaderResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(body(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}
