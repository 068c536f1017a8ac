//! The peer transport: one gRPC client stream from this member to each other regular member,
//! carrying frames of envelopes. Sending never blocks the Raft loop: each link has a bounded
//! queue, and what does not fit, or what is queued while a peer is unreachable, is dropped
//! (Raft resends what matters). A broken stream reconnects with backoff (100 ms doubling to
//! 2 s).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::node::{Announced, ClientUrls, Input};
use super::wire::Envelope;
use crate::mvcc::Mvcc;
use crate::raft::NodeId;

#[allow(clippy::all, clippy::pedantic, missing_debug_implementations)]
pub mod pb {
    tonic::include_proto!("etcdnode.peer");
}

use pb::peer_client::PeerClient;
use pb::peer_server::Peer;
use pb::{Ack, Frame, MembersReply, MembersRequest};

/// Envelopes queued per peer before new ones are dropped.
const QUEUE: usize = 4096;
/// Envelopes per frame at most.
const BATCH: usize = 512;
/// Largest frame a member accepts (a snapshot travels in one envelope).
pub const MAX_FRAME_BYTES: usize = 1 << 30;

/// Who this member is, for the frames it sends.
#[derive(Debug, Clone)]
pub struct Identity {
    pub cluster_id: u64,
    pub member_id: NodeId,
    pub client_urls: Vec<String>,
    pub name: String,
}

/// The sending side: one queue per peer.
#[derive(Debug)]
pub struct Peers {
    me: Identity,
    runtime: tokio::runtime::Handle,
    links: HashMap<NodeId, mpsc::Sender<Envelope>>,
}

impl Peers {
    /// Starts a link to each `(id, peer URL)`.
    pub fn start(
        me: &Identity,
        peers: &[(NodeId, String)],
        runtime: &tokio::runtime::Handle,
    ) -> Peers {
        let mut p = Peers {
            me: me.clone(),
            runtime: runtime.clone(),
            links: HashMap::new(),
        };
        for (id, url) in peers {
            p.add(*id, url);
        }
        p
    }

    /// Starts a link to a member added to the cluster (nothing if there is one).
    pub fn add(&mut self, id: NodeId, url: &str) {
        if id == self.me.member_id || self.links.contains_key(&id) {
            return;
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        self.runtime
            .spawn(run_link(self.me.clone(), id, url.to_string(), rx));
        self.links.insert(id, tx);
    }

    /// Ends the link to a removed member (its task stops when the queue closes).
    pub fn remove(&mut self, id: NodeId) {
        self.links.remove(&id);
    }

    /// Keeps only the links to the members `keep` accepts.
    pub fn retain(&mut self, keep: impl Fn(NodeId) -> bool) {
        self.links.retain(|id, _| keep(*id));
    }

    /// Queues `envelope` for `to`; drops it when the queue is full or `to` is unknown.
    pub fn send(&self, to: NodeId, envelope: Envelope) {
        if let Some(link) = self.links.get(&to) {
            let _ = link.try_send(envelope);
        }
    }
}

/// Asks the member at `url` for the cluster's id and members.
pub async fn fetch_members(url: &str) -> Result<(u64, Vec<etcd_client::proto::PbMember>), String> {
    use prost::Message as _;
    let channel = tonic::transport::Endpoint::from_shared(url.to_string())
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let reply = PeerClient::new(channel)
        .members(MembersRequest {})
        .await
        .map_err(|e| e.message().to_string())?
        .into_inner();
    let members = reply
        .members
        .iter()
        .map(|b| etcd_client::proto::PbMember::decode(b.as_slice()).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    Ok((reply.cluster_id, members))
}

async fn run_link(me: Identity, to: NodeId, url: String, mut rx: mpsc::Receiver<Envelope>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let client = match tonic::transport::Endpoint::from_shared(url.clone()) {
            Ok(ep) => {
                // HTTP/2 pings find a connection that died without a reset (a peer cut off, a
                // middlebox that dropped it): the stream ends and the link reconnects, instead
                // of queueing behind a dead connection.
                ep.connect_timeout(Duration::from_secs(1))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(1))
                    .keep_alive_timeout(Duration::from_secs(3))
                    .keep_alive_while_idle(true)
                    .connect()
                    .await
            }
            Err(e) => {
                tracing::error!(peer = %url, error = %e, "bad peer URL; not connecting");
                return;
            }
        };
        let channel = match client {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(peer = %url, error = %e, "peer unreachable; retrying");
                // Drop what queued up meanwhile: stale Raft messages only slow the peer down.
                while rx.try_recv().is_ok() {}
                if rx.is_closed() {
                    return; // the member was removed, or the node stopped
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        let connected = std::time::Instant::now();
        let mut client = PeerClient::new(channel)
            .max_encoding_message_size(MAX_FRAME_BYTES)
            .max_decoding_message_size(MAX_FRAME_BYTES);
        let (frames, frames_rx) = mpsc::channel::<Frame>(16);
        let mut call =
            tokio::spawn(async move { client.stream(ReceiverStream::new(frames_rx)).await });
        loop {
            let first = tokio::select! {
                e = rx.recv() => match e {
                    Some(e) => e,
                    None => return, // the node stopped
                },
                ended = &mut call => {
                    tracing::debug!(peer = %url, result = ?ended.map(|r| r.map(|_| ())), "peer stream ended");
                    break;
                }
            };
            let mut envelopes = vec![first.encode()];
            while envelopes.len() < BATCH {
                match rx.try_recv() {
                    Ok(e) => envelopes.push(e.encode()),
                    Err(_) => break,
                }
            }
            let frame = Frame {
                cluster_id: me.cluster_id,
                from: me.member_id,
                to,
                envelopes,
                client_urls: me.client_urls.clone(),
                name: me.name.clone(),
            };
            if frames.send(frame).await.is_err() {
                break;
            }
        }
        call.abort();
        if connected.elapsed() < Duration::from_secs(1) {
            // Accepted, then closed at once (a peer restarting, something else on its port):
            // back off as after a refused connection, instead of spinning.
            while rx.try_recv().is_ok() {}
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
        } else {
            backoff = Duration::from_millis(100);
        }
    }
}

/// The receiving side.
#[derive(Debug)]
pub struct PeerService {
    pub me: Identity,
    pub mvcc: Arc<Mvcc>,
    pub inputs: Sender<Input>,
    pub client_urls: ClientUrls,
}

#[tonic::async_trait]
impl Peer for PeerService {
    async fn members(&self, _: Request<MembersRequest>) -> Result<Response<MembersReply>, Status> {
        use prost::Message as _;
        let mut members = self
            .mvcc
            .members()
            .map_err(|e| Status::internal(e.to_string()))?;
        members.iter_mut().for_each(super::node::redact_witness_url);
        Ok(Response::new(MembersReply {
            cluster_id: self.me.cluster_id,
            members: members.iter().map(|m| m.encode_to_vec()).collect(),
        }))
    }

    async fn stream(&self, request: Request<Streaming<Frame>>) -> Result<Response<Ack>, Status> {
        let mut frames = request.into_inner();
        let inputs = self.inputs.clone();
        while let Some(frame) = frames.message().await? {
            if frame.cluster_id != self.me.cluster_id {
                return Err(Status::failed_precondition(format!(
                    "cluster id mismatch: this member is in cluster {:x}, the sender ({:x}) in {:x}; \
                     check --initial-cluster and --initial-cluster-token on both",
                    self.me.cluster_id, frame.from, frame.cluster_id
                )));
            }
            if frame.to != self.me.member_id {
                return Err(Status::failed_precondition(format!(
                    "frame for member {:x} reached member {:x}; check the peer URLs in --initial-cluster",
                    frame.to, self.me.member_id
                )));
            }
            if let Ok(mut urls) = self.client_urls.lock() {
                urls.insert(
                    frame.from,
                    Announced {
                        name: frame.name,
                        client_urls: frame.client_urls,
                    },
                );
            }
            for bytes in &frame.envelopes {
                match Envelope::decode(bytes) {
                    Ok(envelope) => {
                        let input = Input::Peer {
                            from: frame.from,
                            envelope,
                        };
                        if inputs.send(input).is_err() {
                            return Err(Status::unavailable("member is stopping"));
                        }
                    }
                    Err(e) => {
                        tracing::warn!(from = format!("{:x}", frame.from), error = %e, "dropped a malformed peer envelope")
                    }
                }
            }
        }
        Ok(Response::new(Ack {}))
    }
}
