//! Watch: the apply loop publishes what each applied batch changed ([`WatchHub`]); every watch
//! stream (one gRPC call, many watchers) follows those batches in order in one task, so a
//! progress notification's revision always means "every event up to here was sent".
//!
//! Writes never wait for watchers: the hub keeps the last [`HUB_CAPACITY`] batches, and a
//! stream that falls further behind (a slow client) catches up from the history instead, or
//! is told its events were compacted. A watcher starting in the past is replayed from the
//! history the same way. Events of a watcher come exactly once, in revision order: each
//! watcher remembers the next revision it may send.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::proto::{PbEvent, PbResponseHeader, PbWatchRequest, PbWatchRequestUnion};
use etcd_client::proto::{PbWatchResponse, PbWatchService};
use prost::Message;
use tokio::sync::{broadcast, mpsc};
use tonic::{Request, Response, Status, Streaming};

use super::auth::{Caller, Need, caller_of};
use super::handle::{Api, requires_leader};
use crate::errors::EtcdError;
use crate::mvcc::events::{DELETE, PUT};
use crate::mvcc::request::in_range;
use crate::server::watch_hub::Batch;

/// Responses queued for a client before its stream stops reading batches.
const STREAM_BUFFER: usize = 64;
/// At most this many events in one response when replaying (a revision is never split unless
/// the watcher asked for fragments).
const REPLAY_CHUNK_BYTES: usize = 1024 * 1024;

/// etcd's count of leaderless election timeouts before it ends require-leader streams.
const NO_LEADER_CHECKS: u32 = 3;

/// etcd's `WatchCreateRequest.FilterType`.
const NOPUT: i32 = 0;
const NODELETE: i32 = 1;

/// One watcher of a stream.
#[derive(Debug)]
struct Watcher {
    id: i64,
    key: Vec<u8>,
    range_end: Vec<u8>,
    no_put: bool,
    no_delete: bool,
    prev_kv: bool,
    progress_notify: bool,
    fragment: bool,
    /// The next revision whose events it may be sent (everything before was sent or skipped).
    next_rev: u64,
}

impl Watcher {
    fn wants(&self, e: &PbEvent) -> bool {
        let Some(kv) = &e.kv else {
            return false;
        };
        in_range(&kv.key, &self.key, &self.range_end)
            && u64::try_from(kv.mod_revision).is_ok_and(|r| r >= self.next_rev)
            && !(e.r#type == PUT && self.no_put)
            && !(e.r#type == DELETE && self.no_delete)
    }

    /// The events of `events` it is to be sent, as it is to be sent them.
    fn select(&self, events: &[PbEvent]) -> Vec<PbEvent> {
        events
            .iter()
            .filter(|e| self.wants(e))
            .map(|e| {
                let mut e = e.clone();
                if !self.prev_kv {
                    e.prev_kv = None;
                }
                e
            })
            .collect()
    }
}

/// Why a stream ends.
enum End {
    /// The client went away (or stopped sending): nothing to say.
    Gone,
    /// The stream fails with this status.
    Failed(Status),
}

/// One watch stream: its watchers and how far it has followed the hub.
struct Stream {
    api: Api,
    out: mpsc::Sender<Result<PbWatchResponse, Status>>,
    watchers: BTreeMap<i64, Watcher>,
    next_id: i64,
    /// Every event up to this revision was sent to every watcher (that wanted it).
    revision: u64,
    /// The client's auth token (each watch is checked for read access when created).
    token: Option<Caller>,
    /// The client asked for etcd's `WithRequireLeader`: the stream ends with `no leader` once
    /// this member has known no leader for [`NO_LEADER_CHECKS`] election timeouts in a row.
    require_leader: bool,
}

/// A key-space failure ends the stream (DATA_LOSS when the file is damaged).
fn store_error(e: crate::mvcc::StoreError) -> End {
    End::Failed(e.into())
}

impl Stream {
    fn header(&self, revision: u64) -> Option<PbResponseHeader> {
        self.api.header(revision as i64)
    }

    async fn send(&self, r: PbWatchResponse) -> Result<(), End> {
        self.out.send(Ok(r)).await.map_err(|_| End::Gone)
    }

    /// Sends `events` (all of revisions up to `revision`) to watcher `id`, in responses of
    /// bounded size when replaying; a single revision is split only for a watcher that asked
    /// for fragments.
    async fn send_events(&self, id: i64, events: Vec<PbEvent>, revision: u64) -> Result<(), End> {
        let Some(w) = self.watchers.get(&id) else {
            return Ok(());
        };
        let fragment = w.fragment;
        let mut chunk: Vec<PbEvent> = Vec::new();
        let mut size = 0;
        let mut events = events.into_iter().peekable();
        while let Some(e) = events.next() {
            size += e.encoded_len();
            let rev = e.kv.as_ref().map_or(0, |kv| kv.mod_revision);
            chunk.push(e);
            let next_rev = events
                .peek()
                .and_then(|n| n.kv.as_ref())
                .map(|kv| kv.mod_revision);
            let boundary = next_rev != Some(rev);
            let full = size >= REPLAY_CHUNK_BYTES;
            let split = fragment && size >= self.api.max_request_bytes;
            if next_rev.is_some() && (split || (full && boundary)) {
                self.send(PbWatchResponse {
                    header: self.header(revision),
                    watch_id: id,
                    events: std::mem::take(&mut chunk),
                    fragment: !boundary,
                    ..Default::default()
                })
                .await?;
                size = 0;
            }
        }
        if chunk.is_empty() {
            return Ok(());
        }
        self.send(PbWatchResponse {
            header: self.header(revision),
            watch_id: id,
            events: chunk,
            ..Default::default()
        })
        .await
    }

    /// A batch from the hub, in order.
    async fn deliver(&mut self, batch: &Batch) -> Result<(), End> {
        if batch.reset {
            return self.catch_up().await;
        }
        let mut out = Vec::new();
        for w in self.watchers.values_mut() {
            let mut events = w.select(&batch.events);
            if w.prev_kv && !events.is_empty() {
                // (applied events carry no previous records: read for those who want them)
                self.api.mvcc.fill_prev(&mut events).map_err(store_error)?;
            }
            w.next_rev = w.next_rev.max(batch.revision + 1);
            if !events.is_empty() {
                out.push((w.id, events));
            }
        }
        for (id, events) in out {
            self.send_events(id, events, batch.revision).await?;
        }
        self.revision = self.revision.max(batch.revision);
        Ok(())
    }

    /// Sends every watcher what it missed, from the history (the hub dropped batches this
    /// stream had not read, or a snapshot replaced the key space). A watcher whose next
    /// revision was compacted is cancelled with the compacted revision, as etcd does.
    async fn catch_up(&mut self) -> Result<(), End> {
        self.api.metrics.watch_caught_up();
        let ids: Vec<i64> = self.watchers.keys().copied().collect();
        let mut revision = u64::MAX;
        for id in ids {
            revision = revision.min(self.replay(id).await?);
        }
        if revision == u64::MAX {
            revision = self.api.mvcc.position().map_err(store_error)?.revision;
        }
        self.revision = self.revision.max(revision);
        Ok(())
    }

    /// Replays watcher `id` from its next revision to the newest from the history; returns
    /// the revision it is now at.
    async fn replay(&mut self, id: i64) -> Result<u64, End> {
        let Some(w) = self.watchers.get(&id) else {
            return Ok(self.revision);
        };
        let read = self.api.mvcc.events(&w.key, &w.range_end, w.next_rev);
        match read.map_err(store_error)? {
            Ok((events, revision)) => {
                let events = w.select(&events);
                if let Some(w) = self.watchers.get_mut(&id) {
                    w.next_rev = w.next_rev.max(revision + 1);
                }
                self.send_events(id, events, revision).await?;
                Ok(revision)
            }
            Err(compacted) => {
                self.watchers.remove(&id);
                self.send(PbWatchResponse {
                    header: self.header(self.revision),
                    watch_id: id,
                    canceled: true,
                    compact_revision: compacted as i64,
                    cancel_reason: EtcdError::COMPACTED.message.into_owned(),
                    ..Default::default()
                })
                .await?;
                Ok(u64::MAX)
            }
        }
    }

    async fn request(
        &mut self,
        r: PbWatchRequest,
        hub: &mut broadcast::Receiver<Arc<Batch>>,
    ) -> Result<(), End> {
        match r.request_union {
            Some(PbWatchRequestUnion::CreateRequest(c)) => {
                let taken = c.watch_id != 0 && self.watchers.contains_key(&c.watch_id);
                let denied = self
                    .api
                    .authorize(self.token.as_ref(), &[Need::Read(&c.key, &c.range_end)])
                    .err();
                // (an empty range end: one key; "\0": every key from `key` on)
                let empty = !c.range_end.is_empty()
                    && c.range_end != [0]
                    && c.key.as_slice() >= c.range_end.as_slice();
                let refusal = if let Some(status) = denied {
                    Some(status.message().to_string())
                } else if empty {
                    Some("mvcc: watcher range is empty".into())
                } else if taken {
                    Some("mvcc: duplicate watch ID provided on the WatchStream".into())
                } else if c.watch_id < 0 {
                    Some(EtcdError::NEGATIVE_WATCH_ID.message.into_owned())
                } else {
                    None
                };
                if let Some(cancel_reason) = refusal {
                    // (etcd's: a refused watcher has no id, -1)
                    return self
                        .send(PbWatchResponse {
                            header: self.header(self.revision),
                            watch_id: -1,
                            created: true,
                            canceled: true,
                            cancel_reason,
                            ..Default::default()
                        })
                        .await;
                }
                let id = if c.watch_id != 0 {
                    c.watch_id
                } else {
                    while self.watchers.contains_key(&self.next_id) {
                        self.next_id += 1;
                    }
                    self.next_id
                };
                let current = self.api.mvcc.position().map_err(store_error)?.revision;
                let start = u64::try_from(c.start_revision).unwrap_or(0);
                let next_rev = if start == 0 { current + 1 } else { start };
                self.watchers.insert(
                    id,
                    Watcher {
                        id,
                        key: c.key,
                        range_end: c.range_end,
                        no_put: c.filters.contains(&NOPUT),
                        no_delete: c.filters.contains(&NODELETE),
                        prev_kv: c.prev_kv,
                        progress_notify: c.progress_notify,
                        fragment: c.fragment,
                        next_rev,
                    },
                );
                self.send(PbWatchResponse {
                    header: self.header(current),
                    watch_id: id,
                    created: true,
                    ..Default::default()
                })
                .await?;
                if next_rev <= self.revision {
                    // It starts before what the stream has followed: the history has the rest.
                    self.replay(id).await?;
                }
                Ok(())
            }
            Some(PbWatchRequestUnion::CancelRequest(c)) => {
                if self.watchers.remove(&c.watch_id).is_some() {
                    self.send(PbWatchResponse {
                        header: self.header(self.revision),
                        watch_id: c.watch_id,
                        canceled: true,
                        ..Default::default()
                    })
                    .await?;
                }
                Ok(())
            }
            Some(PbWatchRequestUnion::ProgressRequest(_)) => {
                // Everything published so far first: the answer's revision then covers it.
                loop {
                    match hub.try_recv() {
                        Ok(batch) => self.deliver(&batch).await?,
                        Err(broadcast::error::TryRecvError::Lagged(_)) => self.catch_up().await?,
                        Err(_) => break,
                    }
                }
                self.send(PbWatchResponse {
                    header: self.header(self.revision),
                    watch_id: -1,
                    ..Default::default()
                })
                .await
            }
            None => Ok(()),
        }
    }

    /// The periodic progress notification of the watchers that asked for it.
    async fn notify_progress(&self) -> Result<(), End> {
        for w in self.watchers.values().filter(|w| w.progress_notify) {
            self.send(PbWatchResponse {
                header: self.header(self.revision),
                watch_id: w.id,
                ..Default::default()
            })
            .await?;
        }
        Ok(())
    }

    async fn run(
        mut self,
        mut requests: Streaming<PbWatchRequest>,
        mut hub: broadcast::Receiver<Arc<Batch>>,
        progress_every: Duration,
    ) -> Result<(), End> {
        let mut progress = tokio::time::interval(progress_every);
        progress.tick().await; // (the first tick is immediate)
        let mut leader_check = tokio::time::interval(self.api.election_timeout);
        let mut leaderless = 0;
        // A client that closes its side keeps its watchers (as etcd: a gateway client sends
        // its create requests as one body and reads the events as they come).
        let mut open = true;
        loop {
            tokio::select! {
                r = requests.message(), if open => match r {
                    Ok(Some(r)) => self.request(r, &mut hub).await?,
                    Ok(None) => open = false,
                    Err(_) => return Err(End::Gone),
                },
                b = hub.recv() => match b {
                    Ok(batch) => self.deliver(&batch).await?,
                    Err(broadcast::error::RecvError::Lagged(_)) => self.catch_up().await?,
                    Err(broadcast::error::RecvError::Closed) => return Err(End::Gone),
                },
                _ = progress.tick() => self.notify_progress().await?,
                _ = leader_check.tick(), if self.require_leader => {
                    leaderless = match self.api.status.borrow().leader {
                        0 => leaderless + 1,
                        _ => 0,
                    };
                    if leaderless >= NO_LEADER_CHECKS {
                        return Err(End::Failed(EtcdError::NO_LEADER.into()));
                    }
                }
            }
        }
    }
}

/// Watch, over the shared API handle.
#[derive(Debug, Clone)]
pub struct Watch {
    pub api: Api,
}

#[tonic::async_trait]
impl PbWatchService for Watch {
    type WatchStream = tokio_stream::wrappers::ReceiverStream<Result<PbWatchResponse, Status>>;

    async fn watch(
        &self,
        request: Request<Streaming<PbWatchRequest>>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let (out, rx) = mpsc::channel(STREAM_BUFFER);
        // Subscribe before reading the revision: no batch after it can be missed.
        let hub = self.api.watches.subscribe();
        let revision = self.api.mvcc.position().map_err(Status::from)?.revision;
        let stream = Stream {
            api: self.api.clone(),
            out: out.clone(),
            watchers: BTreeMap::new(),
            next_id: 0,
            revision,
            token: caller_of(&request),
            require_leader: requires_leader(request.metadata()),
        };
        let every = self.api.watch_progress;
        let requests = request.into_inner();
        tokio::spawn(async move {
            if let Err(End::Failed(status)) = stream.run(requests, hub, every).await {
                let _ = out.send(Err(status)).await;
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }
}
