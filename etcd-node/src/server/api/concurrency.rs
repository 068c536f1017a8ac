//! What the Lock and Election services share: etcd builds both from its client's
//! `concurrency` package (a session on a lease, keys `<name>/<lease in hex>`, the oldest key
//! under a name holds it). Here the same recipe runs in-process: [`Client`] calls this member's
//! KV and Lease services with the caller's identity (its token or client certificate), so every
//! step is authorised exactly as the caller's own calls would be, and waits follow the watch
//! hub instead of opening watches.
//!
//! Invariant: a key under a name is only ever created at a revision above every existing one,
//! so once no key older than a waiter's is left, none can appear again; the waits rely on it.

use etcd_client::proto::*;
use tokio::sync::broadcast::error::RecvError;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use super::handle::{Api, stopped};
use super::kv::Kv;
use super::lease::Lease;
use crate::tls::ConnInfo;

/// The TTL of the lease a Lock or Campaign without one gets (etcd's session default).
const SESSION_TTL: i64 = 60;

/// etcd's CreateRevision compare target and sort target, ascending and descending orders.
const TARGET_CREATE: i32 = 1;
const SORT_BY_CREATE: i32 = 2;
const ASCEND: i32 = 1;
const DESCEND: i32 = 2;

/// This member's KV and Lease services, called as the original caller.
#[derive(Debug, Clone)]
pub struct Client {
    kv: Kv,
    lease: Lease,
    metadata: MetadataMap,
    conn: Option<ConnInfo>,
}

/// The end of the range of keys starting with `prefix` (etcd's prefix range end).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // (all 0xff: every key from the prefix on)
    vec![0]
}

/// The prefix of the keys under a lock's or an election's name (etcd's `<name>/`).
pub fn prefix_of(name: &[u8]) -> Vec<u8> {
    let mut prefix = name.to_vec();
    prefix.push(b'/');
    prefix
}

/// The key a session on `lease` holds under `prefix` (etcd's `<prefix><lease in hex>`).
pub fn session_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(format!("{lease:x}").as_bytes());
    key
}

fn put(key: &[u8], value: &[u8], lease: i64) -> PbTxnRequestOp {
    PbTxnRequestOp {
        request: Some(PbTxnOpRequest::RequestPut(PbPutRequest {
            key: key.to_vec(),
            value: value.to_vec(),
            lease,
            ..Default::default()
        })),
    }
}

fn get(key: &[u8]) -> PbTxnRequestOp {
    PbTxnRequestOp {
        request: Some(PbTxnOpRequest::RequestRange(PbRangeRequest {
            key: key.to_vec(),
            ..Default::default()
        })),
    }
}

/// The oldest key under `prefix` (etcd's `WithFirstCreate`), or with `max_create` the newest
/// created at or before that revision (`WithLastCreate`, `WithMaxCreateRev`).
pub fn by_creation(prefix: &[u8], max_create: Option<i64>) -> PbRangeRequest {
    PbRangeRequest {
        key: prefix.to_vec(),
        range_end: prefix_end(prefix),
        limit: 1,
        sort_target: SORT_BY_CREATE,
        sort_order: if max_create.is_some() {
            DESCEND
        } else {
            ASCEND
        },
        max_create_revision: max_create.unwrap_or(0),
        ..Default::default()
    }
}

/// "`key` was created at `revision`" (0: it does not exist).
fn created_at(key: &[u8], revision: i64) -> PbCompare {
    PbCompare {
        result: 0,
        target: TARGET_CREATE,
        key: key.to_vec(),
        range_end: Vec::new(),
        target_union: Some(PbTargetUnion::CreateRevision(revision)),
    }
}

/// The range response of a transaction's `i`th result.
pub fn range_result(txn: &PbTxnResponse, i: usize) -> Option<&PbRangeResponse> {
    match txn.responses.get(i)?.response.as_ref()? {
        PbTxnOpResponse::ResponseRange(r) => Some(r),
        _ => None,
    }
}

impl Client {
    /// The services of `api`, called with the identity `request` carries.
    pub fn of<T>(api: &Api, request: &Request<T>) -> Client {
        let mut metadata = MetadataMap::new();
        for name in ["token", "authorization"] {
            if let Some(v) = request.metadata().get(name) {
                metadata.insert(name, v.clone());
            }
        }
        Client {
            kv: Kv { api: api.clone() },
            lease: Lease { api: api.clone() },
            metadata,
            conn: request.extensions().get::<ConnInfo>().cloned(),
        }
    }

    pub fn api(&self) -> &Api {
        &self.kv.api
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut r = Request::new(message);
        *r.metadata_mut() = self.metadata.clone();
        if let Some(conn) = &self.conn {
            r.extensions_mut().insert(conn.clone());
        }
        r
    }

    pub async fn txn(&self, txn: PbTxnRequest) -> Result<PbTxnResponse, Status> {
        use etcd_client::proto::PbKvService;
        Ok(self.kv.txn(self.request(txn)).await?.into_inner())
    }

    pub async fn delete(&self, key: Vec<u8>) -> Result<PbDeleteResponse, Status> {
        use etcd_client::proto::PbKvService;
        let delete = PbDeleteRequest {
            key,
            ..Default::default()
        };
        Ok(self
            .kv
            .delete_range(self.request(delete))
            .await?
            .into_inner())
    }

    /// A range, linearizable or from this member's key space (`serializable`).
    pub async fn range(
        &self,
        mut range: PbRangeRequest,
        serializable: bool,
    ) -> Result<PbRangeResponse, Status> {
        use etcd_client::proto::PbKvService;
        range.serializable = serializable;
        Ok(self.kv.range(self.request(range)).await?.into_inner())
    }

    /// The oldest key under `prefix`, linearizably.
    pub async fn first_created(&self, prefix: &[u8]) -> Result<PbRangeResponse, Status> {
        self.range(by_creation(prefix, None), false).await
    }

    /// The session's lease: `lease`, or a new one of etcd's session TTL when it is 0 (as
    /// etcd's session, which the server then stops keeping alive).
    pub async fn session(&self, lease: i64) -> Result<i64, Status> {
        use etcd_client::proto::PbLeaseService;
        if lease != 0 {
            return Ok(lease);
        }
        let grant = PbLeaseGrantRequest {
            ttl: SESSION_TTL,
            id: 0,
        };
        Ok(self
            .lease
            .lease_grant(self.request(grant))
            .await?
            .into_inner()
            .id)
    }

    /// Creates `key` with `value` on `lease` unless it exists: the transaction's answer, its
    /// first result the key when it existed, its second the oldest key under `prefix`.
    pub async fn join(
        &self,
        prefix: &[u8],
        key: &[u8],
        value: &[u8],
        lease: i64,
    ) -> Result<PbTxnResponse, Status> {
        let owner = PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestRange(by_creation(prefix, None))),
        };
        self.txn(PbTxnRequest {
            compare: vec![created_at(key, 0)],
            success: vec![put(key, value, lease), owner.clone()],
            failure: vec![get(key), owner],
        })
        .await
    }

    /// Puts `value` on `key` if it is still the one created at `revision`.
    pub async fn put_if(
        &self,
        key: &[u8],
        revision: i64,
        value: &[u8],
        lease: i64,
    ) -> Result<PbTxnResponse, Status> {
        self.txn(PbTxnRequest {
            compare: vec![created_at(key, revision)],
            success: vec![put(key, value, lease)],
            failure: Vec::new(),
        })
        .await
    }

    /// Deletes `key` if it is still the one created at `revision`.
    pub async fn delete_if(&self, key: &[u8], revision: i64) -> Result<PbTxnResponse, Status> {
        let delete = PbTxnRequestOp {
            request: Some(PbTxnOpRequest::RequestDeleteRange(PbDeleteRequest {
                key: key.to_vec(),
                ..Default::default()
            })),
        };
        self.txn(PbTxnRequest {
            compare: vec![created_at(key, revision)],
            success: vec![delete],
            failure: Vec::new(),
        })
        .await
    }

    /// Waits until no key under `prefix` created at or before `max_create` is left (etcd's
    /// `waitDeletes`): the keys ahead of a waiter are gone.
    pub async fn wait_deletes(&self, prefix: &[u8], max_create: i64) -> Result<(), Status> {
        let mut changes = self.api().watches.subscribe();
        loop {
            // (subscribed before reading: no change between the read and the wait is missed)
            let ahead = self
                .range(by_creation(prefix, Some(max_create)), true)
                .await?;
            if ahead.kvs.is_empty() {
                return Ok(());
            }
            wait_under(&mut changes, prefix).await?;
        }
    }
}

/// Waits for the next applied batch that changed a key under `prefix` (or that the hub could
/// not deliver: then the caller reads again anyway).
async fn wait_under(
    changes: &mut tokio::sync::broadcast::Receiver<std::sync::Arc<crate::server::watch_hub::Batch>>,
    prefix: &[u8],
) -> Result<(), Status> {
    loop {
        match changes.recv().await {
            Ok(batch) => {
                let touched = batch
                    .events
                    .iter()
                    .any(|e| e.kv.as_ref().is_some_and(|kv| kv.key.starts_with(prefix)));
                if touched || batch.reset {
                    return Ok(());
                }
            }
            Err(RecvError::Lagged(_)) => return Ok(()),
            Err(RecvError::Closed) => return Err(stopped()),
        }
    }
}

/// Deletes a session's key when dropped armed: a Lock or Campaign whose caller gave up (or
/// that failed) while waiting leaves no key behind to block the others (as etcd's).
#[derive(Debug)]
pub struct Withdraw {
    pub client: Client,
    pub key: Vec<u8>,
    pub revision: i64,
    pub armed: bool,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // (no runtime: the process is stopping, and the lease removes the key when it ends)
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (client, key, revision) = (self.client.clone(), self.key.clone(), self.revision);
        runtime.spawn(async move {
            if let Err(e) = client.delete_if(&key, revision).await {
                tracing::warn!(
                    key = %String::from_utf8_lossy(&key),
                    error = %e,
                    "could not withdraw a waiter's key (its lease removes it when it ends)"
                );
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ranges_and_session_keys_are_etcds() {
        assert_eq!(prefix_of(b"lock"), b"lock/");
        assert_eq!(prefix_end(b"lock/"), b"lock0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        // (etcd's client formats the lease id with %x)
        assert_eq!(
            session_key(b"lock/", 0x694d_7a1b_3c00_0f2a),
            b"lock/694d7a1b3c000f2a"
        );
    }

    #[test]
    fn the_oldest_and_the_newest_older_key_are_sorted_by_creation() {
        let first = by_creation(b"n/", None);
        assert_eq!((first.sort_order, first.max_create_revision), (ASCEND, 0));
        let older = by_creation(b"n/", Some(41));
        assert_eq!((older.sort_order, older.max_create_revision), (DESCEND, 41));
        for r in [first, older] {
            assert_eq!(
                (r.key.as_slice(), r.range_end.as_slice()),
                (&b"n/"[..], &b"n0"[..])
            );
            assert_eq!((r.limit, r.sort_target), (1, SORT_BY_CREATE));
        }
    }
}
