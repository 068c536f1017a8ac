//! etcd's Election service (`v3electionpb.Election`), as etcd builds it from its client's
//! election: a candidate puts `<name>/<lease in hex>` with its value on its lease (a new lease
//! of 60 s when it names none); the oldest key under the name is the leader. Campaign answers
//! once the candidate leads; Proclaim changes the leader's value while its key is the one the
//! LeaderKey names; Leader reads the leader; Observe streams each leader and each new value;
//! Resign deletes the leader's key. Errors are etcd's: "election: not leader", "election: no
//! leader", `"leader" field must be provided`.

use std::pin::Pin;

use etcd_client::proto::{PbKeyValue, PbResponseHeader};
use tokio::sync::broadcast::error::RecvError;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::concurrency::{Client, Withdraw, by_creation, prefix_of, range_result, session_key};
use super::handle::Api;
use crate::mvcc::events::DELETE;
use crate::server::watch_hub::Batch;

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

    /// The leader at the call, then each value its key is put with, each new leader when it
    /// resigns or its lease ends, as etcd's Observe (changes that reach this member in one
    /// applied batch, or while the stream is behind, are read as their end result).
    async fn observe(
        &self,
        request: Request<LeaderRequest>,
    ) -> Result<Response<Self::ObserveStream>, Status> {
        let client = Client::of(&self.api, &request);
        let prefix = prefix_of(&request.into_inner().name);
        let mut changes = client.api().watches.subscribe();
        // (linearizable first: the stream starts at least where the call found the leader)
        let first = client.first_created(&prefix).await?;
        let stream = async_stream(move |tx| async move {
            let mut observer = Observer {
                client,
                prefix,
                tx,
                sent: None,
            };
            if let Some(kv) = first.kvs.into_iter().next()
                && !observer.send(first.header, kv).await
            {
                return;
            }
            loop {
                let next = tokio::select! {
                    next = changes.recv() => next,
                    () = observer.tx.closed() => return,
                };
                let went_on = match next {
                    Ok(batch) if !batch.reset => observer.batch(&batch).await,
                    Ok(_) | Err(RecvError::Lagged(_)) => observer.read_again().await,
                    Err(RecvError::Closed) => Err(super::handle::stopped()),
                };
                match went_on {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => {
                        let _ = observer.tx.send(Err(e)).await;
                        return;
                    }
                }
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

/// An Observe stream: where it sends, and the leader's key-value it sent last.
struct Observer {
    client: Client,
    prefix: Vec<u8>,
    tx: tokio::sync::mpsc::Sender<Result<LeaderResponse, Status>>,
    sent: Option<PbKeyValue>,
}

impl Observer {
    /// Sends `kv` unless it is what was sent last; false once the client is gone.
    async fn send(&mut self, header: Option<PbResponseHeader>, kv: PbKeyValue) -> bool {
        let same = |s: &PbKeyValue| (&s.key, s.mod_revision) == (&kv.key, kv.mod_revision);
        if self.sent.as_ref().is_some_and(same) {
            return true;
        }
        self.sent = Some(kv.clone());
        let out = LeaderResponse {
            header,
            kv: Some(kv),
        };
        self.tx.send(Ok(out)).await.is_ok()
    }

    /// Reads the leader from this member's key space (it has applied what it was told of) and
    /// sends it if it changed.
    async fn read_again(&mut self) -> Result<bool, Status> {
        let now = self
            .client
            .range(by_creation(&self.prefix, None), true)
            .await?;
        match now.kvs.into_iter().next() {
            Some(kv) => Ok(self.send(now.header, kv).await),
            None => Ok(true),
        }
    }

    /// One applied batch: each value the leader's key is put with is sent; the leader's key
    /// deleted, or a first candidate's put while there is none, reads the leader again.
    async fn batch(&mut self, batch: &Batch) -> Result<bool, Status> {
        let mut again = false;
        for e in &batch.events {
            let Some(kv) = e.kv.as_ref().filter(|kv| kv.key.starts_with(&self.prefix)) else {
                continue;
            };
            match &self.sent {
                Some(leader) if leader.key == kv.key => {
                    if e.r#type == DELETE {
                        again = true;
                    } else if !again {
                        let header = self.client.api().header(kv.mod_revision);
                        if !self.send(header, kv.clone()).await {
                            return Ok(false);
                        }
                    }
                }
                Some(_) => {}
                None => again = true,
            }
        }
        if again {
            return self.read_again().await;
        }
        Ok(true)
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
