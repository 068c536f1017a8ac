//! etcd's Lock service (`v3lockpb.Lock`), as etcd builds it from its client's mutex: Lock
//! puts `<name>/<lease in hex>` on the caller's lease (a new lease of 60 s when it names
//! none) and answers once every older key under the name is gone, with that key; Unlock
//! deletes it. A lease that ends releases the lock; a caller that gives up while waiting leaves
//! no key behind. Errors are etcd's: the KV's own, and "mutex: session is expired" when the
//! lease ended while waiting.

use tonic::{Request, Response, Status};

use super::concurrency::{Client, Withdraw, prefix_of, range_result, session_key};
use super::handle::Api;

/// The service's messages and server, generated from etcd's v3lock.proto (build.rs).
#[allow(clippy::all, missing_debug_implementations)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/services/v3lockpb.rs"));
}

use pb::{LockRequest, LockResponse, UnlockRequest, UnlockResponse};

/// Lock, over the shared API handle.
#[derive(Debug, Clone)]
pub struct Lock {
    pub api: Api,
}

/// The session's key was deleted while it waited (its lease ended).
fn session_expired() -> Status {
    Status::unknown("mutex: session is expired")
}

#[tonic::async_trait]
impl pb::lock_server::Lock for Lock {
    async fn lock(&self, request: Request<LockRequest>) -> Result<Response<LockResponse>, Status> {
        let client = Client::of(&self.api, &request);
        let req = request.into_inner();
        let lease = client.session(req.lease).await?;
        let prefix = prefix_of(&req.name);
        let key = session_key(&prefix, lease);
        let txn = client.join(&prefix, &key, b"", lease).await?;
        let header = txn.header;
        // (this lease's key: created now, or earlier by a Lock on the same lease)
        let mine = if txn.succeeded {
            header.as_ref().map_or(0, |h| h.revision)
        } else {
            range_result(&txn, 0)
                .and_then(|r| r.kvs.first())
                .map(|kv| kv.create_revision)
                .ok_or_else(session_expired)?
        };
        let owner = range_result(&txn, 1).and_then(|r| r.kvs.first());
        if owner.is_none_or(|kv| kv.create_revision == mine) {
            return Ok(Response::new(LockResponse { header, key }));
        }
        let mut withdraw = Withdraw {
            client: client.clone(),
            key: key.clone(),
            revision: mine,
            armed: true,
        };
        client.wait_deletes(&prefix, mine - 1).await?;
        let held = client
            .range(
                etcd_client::proto::PbRangeRequest {
                    key: key.clone(),
                    ..Default::default()
                },
                false,
            )
            .await?;
        // (held or expired, the key is no longer the waiter's to withdraw)
        withdraw.armed = false;
        if held.kvs.is_empty() {
            return Err(session_expired());
        }
        Ok(Response::new(LockResponse {
            header: held.header,
            key,
        }))
    }

    async fn unlock(
        &self,
        request: Request<UnlockRequest>,
    ) -> Result<Response<UnlockResponse>, Status> {
        let client = Client::of(&self.api, &request);
        let done = client.delete(request.into_inner().key).await?;
        Ok(Response::new(UnlockResponse {
            header: done.header,
        }))
    }
}
