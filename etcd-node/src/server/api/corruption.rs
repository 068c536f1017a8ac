//! The periodic corruption check (etcd's `--experimental-corrupt-check-time`): the leader
//! hashes its key space at its newest revision (HashKV) and asks every other member, over
//! its client URLs (over TLS for `https://` ones, presenting `--cert-file`), for the hash at
//! the same revision. Members that applied the same log
//! answer the same hash; a different hash at the same compacted revision means one key space
//! diverged (a disk or a bug changed data behind Raft's back): the leader logs it and raises
//! the CORRUPT alarm for that member, which stops every write until an operator looks (as
//! etcd's leader does).
//!
//! A member whose key space fails its own checksums while it hashes (HashKV answers
//! DATA_LOSS; this member's own read says the same) is damaged: the leader raises CORRUPT for
//! it too. etcd's bbolt has no row checksums, so etcd has no such case.
//!
//! A member that is behind (the revision is in its future) or compacted differently is
//! skipped until the next round; so is one that does not answer.

use std::time::Duration;

use etcd_client::proto::{PbAlarmRequest, PbHashKvRequest, PbHashKvResponse};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Endpoint;

use super::handle::Api;
use crate::mvcc::Op;
use crate::raft::NodeId;
use crate::tls::Dialer;

/// etcd's alarm type CORRUPT.
const CORRUPT: i32 = 2;

/// Runs the check every `every` while this member leads, until the task is dropped.
pub async fn run(api: Api, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // (the first tick is immediate)
    loop {
        tick.tick().await;
        if api.status.borrow().leader != api.member_id {
            continue;
        }
        for (member, outcome) in check(&api).await {
            let member_hex = format!("{member:x}");
            match outcome {
                Outcome::Same => {
                    tracing::debug!(member = member_hex, "hashes agree");
                    continue;
                }
                Outcome::Skipped(why) => {
                    tracing::debug!(member = member_hex, why, "hash check skipped");
                    continue;
                }
                Outcome::Differs {
                    revision,
                    ours,
                    theirs,
                } => tracing::error!(
                    member = member_hex,
                    revision,
                    ours = format!("{ours:08x}"),
                    theirs = format!("{theirs:08x}"),
                    "the key spaces differ at the same revision: raising CORRUPT"
                ),
                Outcome::Damaged(why) => tracing::error!(
                    member = member_hex,
                    why,
                    "the member's key space is damaged: raising CORRUPT"
                ),
            }
            let raise = PbAlarmRequest {
                action: 1,
                member_id: member,
                alarm: CORRUPT,
            };
            if let Err(e) = api.propose(Op::Alarm(raise)).await {
                tracing::warn!(error = %e, "could not raise the CORRUPT alarm");
            }
        }
    }
}

/// What comparing with one member found.
#[derive(Debug)]
enum Outcome {
    Same,
    Skipped(String),
    Differs {
        revision: u64,
        ours: u32,
        theirs: u32,
    },
    /// Its key space failed its checksums while hashing (the error says where).
    Damaged(String),
}

/// What asking one member for its hash got.
enum Asked {
    /// (hash, compacted revision)
    Hash(u32, u64),
    /// It answered DATA_LOSS: its key space is damaged.
    Damaged(String),
    /// No answer (why).
    Failed(String),
}

/// Compares this member's hash with every other member's that announced client URLs.
async fn check(api: &Api) -> Vec<(NodeId, Outcome)> {
    // This member's own read failed: damage raises CORRUPT for it, anything else skips the round.
    let own = |e: crate::mvcc::StoreError| {
        let why = e.to_string();
        let outcome = if e.damaged {
            Outcome::Damaged(why)
        } else {
            Outcome::Skipped(why)
        };
        vec![(api.member_id, outcome)]
    };
    let revision = match api.mvcc.position() {
        Ok(p) => p.revision,
        Err(e) => return own(e),
    };
    let (ours, compacted) = match api.mvcc.hash_kv(revision) {
        Ok(Ok((hash, compacted, _))) => (hash, compacted),
        Ok(Err(e)) => return vec![(api.member_id, Outcome::Skipped(e.to_string()))],
        Err(e) => return own(e),
    };
    let others: Vec<(NodeId, Vec<String>)> = api
        .client_urls
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .filter(|(id, a)| **id != api.member_id && !a.client_urls.is_empty())
        .map(|(id, a)| (*id, a.client_urls.clone()))
        .collect();
    // While auth is on, the member vouches for itself as root (it holds the signing secret).
    let token = match api.member_token() {
        Ok(t) => t,
        Err(e) => return vec![(api.member_id, Outcome::Skipped(e.message().to_string()))],
    };
    let mut out = Vec::new();
    for (member, urls) in others {
        let asked = ask(
            &api.client_dialer,
            &urls,
            revision,
            token.as_deref(),
            api.request_timeout,
        );
        let outcome = match asked.await {
            Asked::Failed(why) => Outcome::Skipped(why),
            Asked::Damaged(why) => Outcome::Damaged(why),
            Asked::Hash(_, theirs_compacted) if theirs_compacted != compacted => Outcome::Skipped(
                format!("compacted at {theirs_compacted}, this member at {compacted}"),
            ),
            Asked::Hash(theirs, _) if theirs == ours => Outcome::Same,
            Asked::Hash(theirs, _) => Outcome::Differs {
                revision,
                ours,
                theirs,
            },
        };
        out.push((member, outcome));
    }
    out
}

/// Another member's hash at `revision`, from the first of its client URLs that answers
/// (etcd's Maintenance.HashKV, called as a plain gRPC request so it can carry the member's
/// token).
async fn ask(
    dialer: &Dialer,
    urls: &[String],
    revision: u64,
    token: Option<&str>,
    timeout: Duration,
) -> Asked {
    let mut why = String::from("no client URL");
    for url in urls {
        match ask_one(dialer, url, revision, token, timeout).await {
            Ok(r) => {
                return Asked::Hash(r.hash, u64::try_from(r.compact_revision).unwrap_or(0));
            }
            Err(Refusal::DataLoss(e)) => return Asked::Damaged(format!("{url}: {e}")),
            Err(Refusal::Other(e)) => why = format!("{url}: {e}"),
        }
    }
    Asked::Failed(why)
}

/// Why one URL gave no hash.
enum Refusal {
    DataLoss(String),
    Other(String),
}

impl From<String> for Refusal {
    fn from(e: String) -> Refusal {
        Refusal::Other(e)
    }
}

async fn ask_one(
    dialer: &Dialer,
    url: &str,
    revision: u64,
    token: Option<&str>,
    timeout: Duration,
) -> Result<PbHashKvResponse, Refusal> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| e.to_string())?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = dialer.connect(endpoint).await.map_err(|e| e.to_string())?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| e.to_string())?;
    let mut request = tonic::Request::new(PbHashKvRequest {
        revision: revision as i64,
    });
    if let Some(t) = token {
        request.metadata_mut().insert(
            "token",
            t.parse().map_err(|_| "an unsendable token".to_string())?,
        );
    }
    let path = PathAndQuery::from_static("/etcdserverpb.Maintenance/HashKV");
    let codec = tonic_prost::ProstCodec::default();
    let response = grpc
        .unary(request, path, codec)
        .await
        .map_err(|e| match e.code() {
            tonic::Code::DataLoss => Refusal::DataLoss(e.message().to_string()),
            _ => Refusal::Other(e.message().to_string()),
        })?;
    Ok(response.into_inner())
}
