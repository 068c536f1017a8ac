//! The contract between the client API and the Raft loop: what the API asks the loop
//! ([`Input`]), what the loop publishes back ([`Status`]), how the loop's refusals read to an
//! etcd client, and what both know of the member list. A leaf module: the loop's code and the
//! API's both depend on it, it depends on neither (layers point one way: `bootstrap` -> `api`
//! -> `contract` <- the loop).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use witness_core::WitnessUrl;
use witness_core::rules::Caller;

use super::wire::Envelope;
use crate::errors::{Code, EtcdError};
use crate::mvcc::{MemberChange, Proposal, Response};
use crate::raft::{NONE, NodeId, Refused, WitnessResponse};

/// Something for the Raft loop to do.
#[derive(Debug)]
pub enum Input {
    /// Replicate and apply a write; the answer comes once it is applied here.
    Propose {
        proposal: Proposal,
        reply: oneshot::Sender<Result<Response, EtcdError>>,
    },
    /// Add, promote or remove a member through a configuration change; answered once applied
    /// here.
    ProposeMember {
        change: MemberChange,
        reply: oneshot::Sender<Result<(), EtcdError>>,
    },
    /// A linearizable read: answers with the index the key space must reach before reading.
    Read {
        reply: oneshot::Sender<Result<u64, EtcdError>>,
    },
    /// MoveLeader, on the leader: hand leadership to regular voter `to`; answered at once (the
    /// caller waits for the new leader).
    TransferLeader {
        to: NodeId,
        reply: oneshot::Sender<Result<(), EtcdError>>,
    },
    /// A keep-alive (`renew`) or a time-to-live question, answered by the leader: the lease's
    /// remaining and granted TTL, None when there is no such lease.
    Lease {
        id: i64,
        renew: bool,
        reply: oneshot::Sender<LeaseAnswer>,
    },
    Peer {
        from: NodeId,
        envelope: Envelope,
    },
    Witness(WitnessResponse),
    /// The applier applied lease grants or revokes (sent before their clients are answered).
    LeasesApplied(Vec<LeaseApplied>),
    /// The applier failed to apply to the key space (the member must stop).
    ApplyFailed(crate::mvcc::StoreError),
    /// Member `by` refused this member's messages: it applied this member's removal.
    RemovedByPeer {
        by: NodeId,
    },
    /// The link to member `id` failed: its connection closed or was refused (its process
    /// died, say). A hint for the leader (`Raft::report_unreachable`), never needed for safety.
    PeerDown {
        id: NodeId,
    },
    /// The loop's snapshot thread saved a snapshot of the key space, or why it could not.
    SnapshotSaved(Result<SavedSnapshot, SnapshotError>),
    /// The transport's outcome of sending snapshot `index` to `to`.
    SnapshotSent {
        to: NodeId,
        index: u64,
        delivered: bool,
    },
    Stop,
}

/// Why a snapshot of the key space could not be saved or read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// (before what: reaching the snapshot's index, making the key space durable)
    #[error("the applier stopped before {0}")]
    ApplierStopped(&'static str),
    #[error(transparent)]
    Saving(#[from] crate::storage::StorageError),
    #[error("cannot start its thread: {0}")]
    Thread(std::io::Error),
    #[error("reading the received snapshot: {0}")]
    Reading(std::io::Error),
}

/// A snapshot of the key space the loop's snapshot thread saved.
#[derive(Debug)]
pub struct SavedSnapshot {
    pub meta: crate::raft::SnapshotMeta,
    /// In place (`--snapshot-count`'s): the key space file, durable at `meta.index`, is its
    /// data. Otherwise (for a follower) its file holds a dump, sent from there.
    pub in_place: bool,
}

/// A lease change the applier applied, for the lessor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseApplied {
    Granted { id: i64, ttl: i64 },
    Revoked { id: i64 },
}

/// What the API sees of the node, updated after every batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Status {
    pub leader: NodeId,
    pub term: u64,
    pub commit: u64,
    /// The last entry applied to the key space (by the applier: readers wait for it).
    pub applied: u64,
    pub is_leader: bool,
    /// The commit index is at an entry of the current term: everything committed before this
    /// term is committed here too (a leader's first commit in its term; Raft's safety point).
    pub commit_in_term: bool,
    /// This member is a learner (it serves only what etcd's learners serve).
    pub is_learner: bool,
    /// How this member asks its witness, with what it saw of it (None: no witness).
    pub witness: Option<Caller>,
}

/// (remaining TTL, granted TTL) of a lease, None when there is no such lease.
pub type LeaseAnswer = Result<Option<(i64, i64)>, EtcdError>;

/// A refusal of the Raft core, as etcd's client sees it.
pub fn refused(r: &Refused) -> EtcdError {
    match r {
        Refused::NotLeader { leader: NONE } => EtcdError::NO_LEADER,
        Refused::NotLeader { .. } | Refused::Transferring { .. } => EtcdError::LEADER_CHANGED,
        other => EtcdError::new(Code::Unavailable, format!("etcdserver: {other}")),
    }
}

/// The witness of a member list, with its (stored) witness URL.
pub fn witness_member(
    members: &[etcd_client::proto::PbMember],
) -> Option<(&etcd_client::proto::PbMember, &str)> {
    members.iter().find_map(|m| {
        let url = m.peer_ur_ls.first().filter(|u| WitnessUrl::is_witness(u))?;
        Some((m, url.as_str()))
    })
}

/// The peer URL a regular member is reached at (none for the witness: it is storage).
pub fn regular_peer_url(m: &etcd_client::proto::PbMember) -> Option<&str> {
    m.peer_ur_ls
        .first()
        .map(String::as_str)
        .filter(|u| !WitnessUrl::is_witness(u))
}

/// A member as shown outside this member: a witness URL stored by an older release with its
/// SAS signature gets it redacted (today's member list never holds one).
pub fn redact_witness_url(m: &mut etcd_client::proto::PbMember) {
    for u in m
        .peer_ur_ls
        .iter_mut()
        .filter(|u| WitnessUrl::is_witness(u))
    {
        *u = WitnessUrl::member_list_form(u);
    }
}

/// Member attributes learned at run time (client URLs of the others come with their frames).
pub type ClientUrls = Arc<Mutex<HashMap<NodeId, Announced>>>;

/// What a member's peer frames announce about it (not stored through Raft).
#[derive(Debug, Clone, Default)]
pub struct Announced {
    pub name: String,
    pub client_urls: Vec<String>,
    /// Its version, peer protocol and cluster features.
    pub attributes: crate::version::Attributes,
}
