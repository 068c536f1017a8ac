//! The peer transport: one gRPC client stream from this member to each other regular member,
//! carrying frames of envelopes. Sending never blocks the Raft loop: each link has a bounded
//! queue, and what does not fit, or what is queued while a peer is unreachable, is dropped
//! (Raft resends what matters). A broken stream reconnects with backoff (100 ms doubling to
//! [`RECONNECT_MAX`]).
//!
//! A Raft snapshot (the whole key space) goes apart: each link has a second task that streams
//! at most one snapshot at a time in 1 MiB chunks on its own connection, drops any snapshot
//! asked for while one is on its way, and reports to the loop whether the receiver got it
//! whole ([`crate::raft::Raft::report_snapshot`]). The data comes from the snapshot's file, a
//! few pieces in memory at a time (or, for a snapshot whose data the loop still holds, as
//! slices of that shared buffer). After a failed transfer the sender waits before the next
//! (0.5 s, doubling to 8 s): a follower that answers heartbeats but cannot take the snapshot
//! (a member without the Snapshot RPC, a damaged file here) is not sent one every heartbeat.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::contract::{Announced, ClientUrls, Input};
use super::wire::{Envelope, pb};
use crate::mvcc::Mvcc;
use crate::raft::{Body, Message, NodeId, Snapshot};
use crate::storage::snap::{DataReader, SnapDir};
use crate::tls::Dialer;
use crate::version::{self, Attributes};

use pb::peer_client::PeerClient;
use pb::peer_server::Peer;
use pb::{Ack, Frame, MembersReply, MembersRequest, SnapshotChunk};

/// Envelopes queued per peer before new ones are dropped.
const QUEUE: usize = 4096;
/// Envelopes per frame at most.
const BATCH: usize = 512;
/// Largest frame a member accepts (a member of an older version sends a snapshot in one).
pub const MAX_FRAME_BYTES: usize = 1 << 30;
/// Snapshot data per chunk.
const CHUNK: usize = 1 << 20;
/// The first wait after a failed snapshot transfer (doubling, up to 8 s).
const SNAPSHOT_BACKOFF: Duration = Duration::from_millis(500);

/// Who this member is, for the frames it sends.
#[derive(Debug, Clone)]
pub struct Identity {
    pub cluster_id: u64,
    pub member_id: NodeId,
    pub client_urls: Vec<String>,
    pub name: String,
    /// How it connects to its peers (TLS for `https://` peer URLs).
    pub dialer: Dialer,
    /// Its version, peer protocol and cluster features, announced on every frame.
    pub attributes: Attributes,
    /// Peers that refused this member's frames lately, and why (Status shows them).
    pub refusals: Refusals,
    /// The key space: the cluster's features, as recorded, say how snapshots travel.
    pub key_space: Arc<Mvcc>,
}

/// Peers that refused this member's frames (a peer protocol it does not speak), by peer: when
/// and why.
pub type Refusals = Arc<std::sync::Mutex<HashMap<NodeId, (Instant, String)>>>;

/// How long a refusal shows in Status after the last one.
pub const REFUSAL_SHOWN: Duration = Duration::from_secs(10);

/// The start of the message a member refuses a frame of a protocol it does not speak with.
pub const PROTOCOL_REFUSED: &str = "peer protocol not spoken";

/// The sending side: one queue per peer, and one slot for a snapshot.
#[derive(Debug)]
pub struct Peers {
    me: Identity,
    runtime: tokio::runtime::Handle,
    links: HashMap<NodeId, Link>,
    /// Where snapshot reports go (the loop's inputs).
    reports: Sender<Input>,
    /// Where the snapshot files are (a snapshot message without data is sent from its file).
    snap_dir: PathBuf,
}

#[derive(Debug)]
struct Link {
    /// The peer URL it reaches the member at.
    url: String,
    envelopes: mpsc::Sender<Envelope>,
    snapshots: mpsc::Sender<Message>,
}

impl Peers {
    /// Starts a link to each `(id, peer URL)`.
    pub fn start(
        me: &Identity,
        peers: &[(NodeId, String)],
        runtime: &tokio::runtime::Handle,
        reports: Sender<Input>,
        snap_dir: &Path,
    ) -> Peers {
        let mut p = Peers {
            me: me.clone(),
            runtime: runtime.clone(),
            links: HashMap::new(),
            reports,
            snap_dir: snap_dir.to_path_buf(),
        };
        for (id, url) in peers {
            p.add(*id, url);
        }
        p
    }

    /// Starts a link to a member added to the cluster (nothing if there is one to the same
    /// URL; a link to another URL is replaced).
    pub fn add(&mut self, id: NodeId, url: &str) {
        if id == self.me.member_id || self.links.get(&id).is_some_and(|l| l.url == url) {
            return;
        }
        // (a member given new peer URLs: the old link ends as its queues close)
        self.links.remove(&id);
        let (envelopes, rx) = mpsc::channel(QUEUE);
        self.runtime.spawn(run_link(
            self.me.clone(),
            id,
            url.to_string(),
            rx,
            self.reports.clone(),
        ));
        // One snapshot in the slot, one on its way: more would only repeat them.
        let (snapshots, rx) = mpsc::channel(1);
        let sender = SnapshotSender {
            me: self.me.clone(),
            to: id,
            url: url.to_string(),
            reports: self.reports.clone(),
            snap_dir: self.snap_dir.clone(),
        };
        self.runtime.spawn(sender.run(rx));
        self.links.insert(
            id,
            Link {
                url: url.to_string(),
                envelopes,
                snapshots,
            },
        );
    }

    /// Ends the link to a removed member (its task stops when the queue closes).
    pub fn remove(&mut self, id: NodeId) {
        self.links.remove(&id);
    }

    /// Keeps only the links to the members `keep` accepts.
    pub fn retain(&mut self, keep: impl Fn(NodeId) -> bool) {
        self.links.retain(|id, _| keep(*id));
    }

    /// Queues `envelope` for `to`; drops it when the queue is full or `to` is unknown. A
    /// snapshot goes to the link's snapshot sender, and is dropped (with no report) while
    /// another is waiting there.
    pub fn send(&self, to: NodeId, envelope: Envelope) {
        let Some(link) = self.links.get(&to) else {
            return;
        };
        match envelope {
            Envelope::Raft(m) if matches!(m.body, Body::Snapshot { .. }) => {
                if link.snapshots.try_send(m).is_err() {
                    tracing::debug!(peer = format!("{to:x}"), "a snapshot is on its way already");
                }
            }
            other => {
                let _ = link.envelopes.try_send(other);
            }
        }
    }
}

/// Why a peer could not be reached, or a transfer to it failed.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("bad peer URL {url}: {source}")]
    BadUrl {
        url: String,
        source: tonic::transport::Error,
    },
    /// The dial (TCP, TLS, HTTP/2) failed.
    #[error(transparent)]
    Dial(#[from] crate::tls::TlsError),
    #[error(transparent)]
    Transport(#[from] tonic::transport::Error),
    #[error("no gRPC answer within {PROVE_LIMIT:?} of the dial")]
    Unproven,
    /// A call failed: the peer's (or the transport's) message.
    #[error("{}", .0.message())]
    Call(#[from] Status),
    #[error("the peer did not answer: {}", .0.message())]
    NoAnswer(Status),
    #[error("snapshot {index} in {dir}: {source}")]
    SnapshotFile {
        index: u64,
        dir: String,
        source: std::io::Error,
    },
    /// Reading the snapshot's file as it was sent.
    #[error(transparent)]
    Reading(#[from] std::io::Error),
    #[error("the snapshot's reader stopped: {0}")]
    Reader(#[from] tokio::task::JoinError),
    #[error("the peer's member list: {0}")]
    Members(#[from] prost::DecodeError),
}

/// Connects to the peer at `url`, with HTTP/2 pings that find a connection that died without
/// a reset (a peer cut off or paused, a middlebox that dropped it).
async fn connect(
    dialer: &Dialer,
    url: &str,
) -> Result<PeerClient<tonic::transport::Channel>, PeerError> {
    let endpoint = endpoint(url)?
        .connect_timeout(Duration::from_secs(1))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(Duration::from_secs(3))
        .keep_alive_while_idle(true);
    let channel = dialer.connect(endpoint).await?;
    tokio::time::timeout(PROVE_LIMIT, prove(channel.clone()))
        .await
        .map_err(|_| PeerError::Unproven)??;
    Ok(PeerClient::new(channel)
        .max_encoding_message_size(MAX_FRAME_BYTES)
        .max_decoding_message_size(MAX_FRAME_BYTES))
}

/// `url` as an endpoint to dial.
fn endpoint(url: &str) -> Result<tonic::transport::Endpoint, PeerError> {
    tonic::transport::Endpoint::from_shared(url.to_string()).map_err(|source| PeerError::BadUrl {
        url: url.to_string(),
        source,
    })
}

/// The longest a new connection may take to answer its first request.
const PROVE_LIMIT: Duration = Duration::from_secs(1);

/// Proves a new connection end to end before the link streams on it: it asks for a method no
/// member serves, which a live member's gRPC server refuses at once (UNIMPLEMENTED, in every
/// release) without touching its disk. A dial that a proxy accepted with no member behind it
/// fails here. Without this, the stream's call waited on tonic's channel, which kept making
/// new connections to the proxy, and took no frame until the link's stall guard dropped it
/// (the fault campaign's "stuck link": every time, a peer that was down or cut off behind the
/// campaign's proxies).
async fn prove(channel: tonic::transport::Channel) -> Result<(), PeerError> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/etcdnode.peer.Peer/Probe");
    let codec = tonic_prost::ProstCodec::<MembersRequest, MembersReply>::default();
    match grpc
        .unary(Request::new(MembersRequest {}), path, codec)
        .await
    {
        Err(status) if status.code() == tonic::Code::Unimplemented => Ok(()),
        Err(status) => Err(PeerError::NoAnswer(status)),
        Ok(_) => Ok(()),
    }
}

/// Streams the snapshots of one link, one at a time.
#[derive(Debug)]
struct SnapshotSender {
    me: Identity,
    to: NodeId,
    url: String,
    reports: Sender<Input>,
    snap_dir: PathBuf,
}

impl SnapshotSender {
    async fn run(self, mut rx: mpsc::Receiver<Message>) {
        let mut next = None;
        let mut backoff = SNAPSHOT_BACKOFF;
        loop {
            let m = match next.take() {
                Some(m) => m,
                None => match rx.recv().await {
                    Some(m) => m,
                    None => return, // the link was removed, or the node stopped
                },
            };
            let Body::Snapshot { snapshot } = &m.body else {
                continue;
            };
            let index = snapshot.meta.index;
            let started = std::time::Instant::now();
            let outcome = self.send(&m, snapshot).await;
            let delivered = outcome.is_ok();
            match outcome {
                Ok((bytes, compressed)) => tracing::info!(
                    peer = format!("{:x}", self.to),
                    index,
                    bytes,
                    compressed,
                    seconds = started.elapsed().as_secs_f64(),
                    "sent a snapshot"
                ),
                Err(e) => tracing::warn!(
                    peer = format!("{:x}", self.to),
                    index,
                    error = %e,
                    "sending a snapshot failed; it is sent again once the member answers"
                ),
            }
            let report = Input::SnapshotSent {
                to: self.to,
                index,
                delivered,
            };
            if self.reports.send(report).is_err() {
                return; // the node stopped
            }
            if delivered {
                backoff = SNAPSHOT_BACKOFF;
            } else {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(8));
            }
            // The same snapshot, asked for again while this one was on its way, is delivered.
            next = rx.try_recv().ok().filter(|queued| {
                !delivered || !matches!(&queued.body, Body::Snapshot { snapshot } if snapshot.meta.index == index)
            });
        }
    }

    /// Sends the snapshot; (its data length, whether it went compressed).
    async fn send(&self, m: &Message, snapshot: &Snapshot) -> Result<(u64, bool), PeerError> {
        let mut client = connect(&self.me.dialer, &self.url).await?;
        let head = Message {
            body: Body::Snapshot {
                snapshot: Snapshot {
                    meta: snapshot.meta.clone(),
                    data: bytes::Bytes::new(),
                },
            },
            ..m.clone()
        };
        // No data in memory: the loop released it, and the file has it. A missing file is an
        // error, never an empty snapshot (the follower would install an empty key space).
        let reader = if snapshot.data.is_empty() {
            let r = DataReader::open(&self.snap_dir, &snapshot.meta).map_err(|source| {
                PeerError::SnapshotFile {
                    index: snapshot.meta.index,
                    dir: self.snap_dir.display().to_string(),
                    source,
                }
            })?;
            Some(r)
        } else {
            None
        };
        let length = reader
            .as_ref()
            .map_or(snapshot.data.len() as u64, |r| r.data_len);
        let compress = self
            .me
            .key_space
            .cluster_feature(version::SNAPSHOT_COMPRESSION);
        let first = SnapshotChunk {
            cluster_id: self.me.cluster_id,
            from: self.me.member_id,
            to: self.to,
            envelope: Envelope::Raft(head).encode(),
            data_length: length,
            data: bytes::Bytes::new(),
            compressed: compress,
        };
        let outcome = match reader {
            // From the file, a few pieces in memory at a time.
            Some(reader) => {
                let (tx, rx) = mpsc::channel(2);
                let reading =
                    tokio::task::spawn_blocking(move || read_pieces(reader, first, compress, &tx));
                let sent = client.snapshot(ReceiverStream::new(rx)).await;
                reading.await??;
                sent
            }
            // From memory: slices of the shared buffer.
            None => {
                let data = snapshot.data.clone();
                let length = data.len();
                let mut first = Some(first);
                let chunks = (0..length.div_ceil(CHUNK).max(1)).map(move |i| {
                    let piece = data.slice((i * CHUNK).min(length)..((i + 1) * CHUNK).min(length));
                    let mut chunk = first.take().unwrap_or_default();
                    chunk.data = if compress { deflate(&piece) } else { piece };
                    chunk.compressed = compress;
                    chunk
                });
                client.snapshot(tokio_stream::iter(chunks)).await
            }
        };
        Ok(outcome.map(|_| (length, compress))?)
    }
}

/// A piece of snapshot data, deflate-compressed (the cluster feature SnapshotCompression).
fn deflate(piece: &[u8]) -> bytes::Bytes {
    use std::io::Write as _;
    let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::fast());
    // (writing into memory cannot fail)
    let _ = e.write_all(piece);
    e.finish().unwrap_or_default().into()
}

/// A compressed piece back, refusing one that inflates past a chunk (damage, or a sender
/// that does not keep to the chunk size).
fn inflate(piece: &[u8]) -> std::io::Result<bytes::Bytes> {
    use std::io::Read as _;
    let mut out = Vec::new();
    flate2::read::DeflateDecoder::new(piece)
        .take(CHUNK as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| std::io::Error::other(format!("a compressed chunk does not inflate: {e}")))?;
    if out.len() > CHUNK {
        return Err(std::io::Error::other(format!(
            "a compressed chunk inflates past {CHUNK} bytes"
        )));
    }
    Ok(out.into())
}

/// Feeds `tx` the chunks of a snapshot file, `first` with the first piece. A piece that cannot
/// be read, or a checksum that does not match, ends the stream early: the receiver, short of
/// the announced length, refuses the snapshot.
fn read_pieces(
    mut reader: DataReader,
    mut first: SnapshotChunk,
    compress: bool,
    tx: &mpsc::Sender<SnapshotChunk>,
) -> std::io::Result<()> {
    let encode = |piece: Vec<u8>| -> bytes::Bytes {
        if compress {
            deflate(&piece)
        } else {
            piece.into()
        }
    };
    first.data = encode(reader.next_piece(CHUNK)?.unwrap_or_default());
    if tx.blocking_send(first).is_err() {
        return Ok(()); // the transfer failed; its error is reported
    }
    while let Some(piece) = reader.next_piece(CHUNK)? {
        let chunk = SnapshotChunk {
            data: encode(piece),
            compressed: compress,
            ..Default::default()
        };
        if tx.blocking_send(chunk).is_err() {
            return Ok(());
        }
    }
    Ok(())
}

/// Asks the member at `url` for the cluster's id and members.
pub async fn fetch_members(
    dialer: &Dialer,
    url: &str,
) -> Result<(u64, Vec<etcd_client::proto::PbMember>), PeerError> {
    use prost::Message as _;
    let endpoint = endpoint(url)?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(5));
    let channel = dialer.connect(endpoint).await?;
    let reply = PeerClient::new(channel)
        .members(MembersRequest {})
        .await?
        .into_inner();
    let members = reply
        .members
        .iter()
        .map(|b| etcd_client::proto::PbMember::decode(b.as_slice()))
        .collect::<Result<_, _>>()?;
    Ok((reply.cluster_id, members))
}

/// What a member answers to the messages of a member it knows was removed (etcd's words); the
/// removed member stops when it reads them.
pub const MEMBER_REMOVED: &str = "the member has been permanently removed from the cluster";

/// The longest wait between two attempts to reach a peer. A member that restarts learns who
/// leads only when the leader's link reaches it: with 2 s here it served "no leader" for up to
/// 2 s after a restart (kube-apiserver's writes routed to it failed meanwhile). etcd's peer
/// streams redial every 100 ms; a refused or timed-out dial costs little.
const RECONNECT_MAX: Duration = Duration::from_millis(400);

/// The longest a dial (TCP, TLS and HTTP/2 handshakes) may take.
const CONNECT_LIMIT: Duration = Duration::from_secs(3);

/// The longest a link waits to queue a frame on its stream. A healthy stream takes a frame in
/// microseconds (16 frames of up to [`BATCH`] envelopes are queued ahead of the connection);
/// one that takes none for this long is stuck, and the link drops the stream and dials again.
/// A guard: in seeds 70141 and 20131 of the fault campaign a leader's link sent nothing for
/// 60 s after a heal while its connection never failed, and the follower, hearing nothing,
/// could not be elected either. The one firing seen with `call_ended` logged (2026-11-28) was
/// a call still waiting while the peer behind the campaign's proxy was down, which [`prove`]
/// now refuses at the dial; the guard stays for whatever else may stick. The warning below says
/// when it fires (docs/runs/ records how often).
const STALL_LIMIT: Duration = Duration::from_secs(5);

async fn run_link(
    me: Identity,
    to: NodeId,
    url: String,
    mut rx: mpsc::Receiver<Envelope>,
    reports: Sender<Input>,
) {
    let mut backoff = Duration::from_millis(100);
    if let Err(e) = tonic::transport::Endpoint::from_shared(url.clone()) {
        tracing::error!(peer = %url, error = %e, "bad peer URL; not connecting");
        return;
    }
    loop {
        // A dead connection ends the stream and the link reconnects, instead of queueing
        // behind it.
        let connected = tokio::time::timeout(CONNECT_LIMIT, connect(&me.dialer, &url)).await;
        let mut client = match connected {
            Ok(Ok(c)) => c,
            failed => {
                if let Ok(Err(e)) = &failed {
                    // Nothing answers there: a dead process's port refuses at once, and this
                    // report lets Raft act on it without waiting for its timeouts (a follower
                    // campaigns; a leader asks the witness).
                    tracing::debug!(peer = %url, error = %e, "peer unreachable; retrying");
                    let _ = reports.send(Input::PeerDown { id: to });
                } else {
                    // A dial that hangs (a handshake nobody answers) is not a death: retry,
                    // quietly, and leave it to Raft's timeouts.
                    tracing::debug!(peer = %url, "connecting to the peer hung; retrying");
                }
                // Drop what queued up meanwhile: stale Raft messages only slow the peer down.
                while rx.try_recv().is_ok() {}
                if rx.is_closed() {
                    return; // the member was removed, or the node stopped
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RECONNECT_MAX);
                continue;
            }
        };
        let connected = std::time::Instant::now();
        // (a peer that refused the protocol is running: its stream's end is not a death)
        let mut refused = false;
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
                    if let Ok(Err(status)) = &ended
                        && status.message().starts_with(MEMBER_REMOVED)
                    {
                        tracing::error!(peer = %url, "{}", status.message());
                        let _ = reports.send(Input::RemovedByPeer { by: to });
                        return;
                    }
                    if let Ok(Err(status)) = &ended
                        && status.message().starts_with(PROTOCOL_REFUSED)
                    {
                        // (the seed's rule: wait for the cluster, retrying, and say so)
                        tracing::warn!(peer = %url, "{}; retrying", status.message());
                        if let Ok(mut r) = me.refusals.lock() {
                            r.insert(to, (Instant::now(), status.message().to_string()));
                        }
                        refused = true;
                    }
                    // Not a death yet: a live peer's connection can end too (a proxy, a reset
                    // after a heal). The link dials again at once; only a dial that fails, or
                    // one whose stream dies at once (below), reports the peer down, which costs
                    // a dead process one dial and spares a live leader a needless election.
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
                version: me.attributes.version.clone(),
                protocol: me.attributes.protocol,
                features: me.attributes.features.iter().cloned().collect(),
            };
            match tokio::time::timeout(STALL_LIMIT, frames.send(frame)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => break, // the call ended
                Err(_) => {
                    tracing::warn!(
                        peer = %url,
                        call_ended = call.is_finished(),
                        "the stream to this peer took no frame for {STALL_LIMIT:?}; reconnecting"
                    );
                    break;
                }
            }
        }
        call.abort();
        if connected.elapsed() < Duration::from_secs(1) {
            // Accepted, then closed at once: a proxy in front of a peer that is gone (it
            // accepts, then finds nothing behind it), a peer restarting, something else on its
            // port. As good as a refused dial: report it (unless the peer refused the
            // protocol, which it does running), and back off instead of spinning.
            if !refused {
                let _ = reports.send(Input::PeerDown { id: to });
            }
            while rx.try_recv().is_ok() {}
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RECONNECT_MAX);
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
    /// Where a received snapshot's data is written.
    pub snaps: SnapDir,
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
        members
            .iter_mut()
            .for_each(super::contract::redact_witness_url);
        Ok(Response::new(MembersReply {
            cluster_id: self.me.cluster_id,
            members: members.iter().map(|m| m.encode_to_vec()).collect(),
        }))
    }

    async fn stream(&self, request: Request<Streaming<Frame>>) -> Result<Response<Ack>, Status> {
        let mut frames = request.into_inner();
        let inputs = self.inputs.clone();
        while let Some(frame) = frames.message().await? {
            self.check_addressing(frame.cluster_id, frame.from, frame.to)?;
            if !version::speaks(frame.protocol) {
                let version = if frame.version.is_empty() {
                    "an older release"
                } else {
                    frame.version.as_str()
                };
                return Err(Status::failed_precondition(format!(
                    "{PROTOCOL_REFUSED}: member {:x} (etcd-node {version}) speaks peer protocol \
                     {}; member {:x} (etcd-node {}) speaks {}..={}. Upgrade the older one \
                     (one member at a time), or run versions that share a protocol",
                    frame.from,
                    version::announced_protocol(frame.protocol),
                    self.me.member_id,
                    version::BINARY,
                    version::spoken().start(),
                    version::spoken().end()
                )));
            }
            if let Ok(mut urls) = self.client_urls.lock() {
                urls.insert(
                    frame.from,
                    Announced {
                        name: frame.name,
                        client_urls: frame.client_urls,
                        attributes: Attributes {
                            version: version::announced_version(frame.version),
                            protocol: version::announced_protocol(frame.protocol),
                            features: frame.features.into_iter().collect(),
                        },
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

    async fn snapshot(
        &self,
        request: Request<Streaming<SnapshotChunk>>,
    ) -> Result<Response<Ack>, Status> {
        let mut chunks = request.into_inner();
        let Some(first) = chunks.message().await? else {
            return Err(Status::invalid_argument("empty snapshot stream"));
        };
        self.check_addressing(first.cluster_id, first.from, first.to)?;
        let bad = |why: String| {
            let why = format!("snapshot from member {:x}: {why}", first.from);
            tracing::warn!("{why}");
            Status::invalid_argument(why)
        };
        let mut m = match Envelope::decode(&first.envelope) {
            Ok(Envelope::Raft(m)) => m,
            Ok(_) => return Err(bad("the first chunk is not a Raft message".into())),
            Err(e) => return Err(bad(e.to_string())),
        };
        let Body::Snapshot { snapshot } = &mut m.body else {
            return Err(bad("the first chunk is not a Raft snapshot message".into()));
        };
        // (an empty data: in its file, received below)
        snapshot.data = bytes::Bytes::new();
        // The data goes straight into a file of its own, a chunk at a time (memory does not
        // grow with the key space); the Raft core gets the message once it is all there, and
        // the file becomes a snapshot of this member only if the core takes it.
        let length = first.data_length;
        let (pieces, mut to_write) = mpsc::channel::<Option<bytes::Bytes>>(2);
        let (snaps, meta) = (self.snaps.clone(), snapshot.meta.clone());
        let index = meta.index;
        let writer = tokio::task::spawn_blocking(move || {
            snaps.receive(&meta, |out| {
                loop {
                    match to_write.blocking_recv() {
                        Some(Some(piece)) => out.write_all(&piece)?,
                        Some(None) => return Ok(()),
                        None => return Err(std::io::Error::other("the transfer stopped")),
                    }
                }
            })
        });
        let mut got = 0u64;
        let mut chunk = SnapshotChunk {
            data: first.data,
            compressed: first.compressed,
            ..Default::default()
        };
        loop {
            let piece = if chunk.compressed {
                inflate(&chunk.data).map_err(|e| bad(e.to_string()))?
            } else {
                std::mem::take(&mut chunk.data)
            };
            got += piece.len() as u64;
            if got > length {
                return Err(bad(format!("more data than the {length} bytes announced")));
            }
            if pieces.send(Some(piece)).await.is_err() {
                break; // (the writer failed: its error is below)
            }
            match chunks.message().await? {
                Some(next) => chunk = next,
                None => break,
            }
        }
        if got != length {
            return Err(bad(format!(
                "{got} of the {length} bytes announced arrived"
            )));
        }
        let _ = pieces.send(None).await;
        let written = writer
            .await
            .map_err(|e| e.to_string())
            .and_then(|w| w.map_err(|e| e.to_string()));
        if let Err(e) = written {
            let why = format!(
                "writing received snapshot {index} into {}: {e}",
                self.snaps.dir().display()
            );
            tracing::error!("{why}");
            return Err(Status::internal(why));
        }
        let input = Input::Peer {
            from: first.from,
            envelope: Envelope::Raft(m),
        };
        self.inputs
            .send(input)
            .map_err(|_| Status::unavailable("member is stopping"))?;
        Ok(Response::new(Ack {}))
    }
}

impl PeerService {
    /// Refuses what another cluster, or a sender that means another member, sends.
    fn check_addressing(&self, cluster_id: u64, from: NodeId, to: NodeId) -> Result<(), Status> {
        if cluster_id != self.me.cluster_id {
            return Err(Status::failed_precondition(format!(
                "cluster id mismatch: this member is in cluster {:x}, the sender ({from:x}) in \
                 {cluster_id:x}; check --initial-cluster and --initial-cluster-token on both",
                self.me.cluster_id
            )));
        }
        if self.mvcc.was_removed(from) {
            return Err(Status::failed_precondition(format!(
                "{MEMBER_REMOVED}: member {from:x} was removed by a configuration change that \
                 member {:x} applied; it must stop, and its data directory must not be used again",
                self.me.member_id
            )));
        }
        if to != self.me.member_id {
            return Err(Status::failed_precondition(format!(
                "frame for member {to:x} reached member {:x}; check the peer URLs in --initial-cluster",
                self.me.member_id
            )));
        }
        Ok(())
    }
}
