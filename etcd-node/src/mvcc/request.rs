//! What goes through Raft for the key space (a [`Proposal`] in an entry's data) and the checks
//! etcd makes before proposing, with etcd's messages.

use std::collections::BTreeSet;

use etcd_client::proto::{
    PbAlarmRequest, PbAlarmResponse, PbCompactionRequest, PbCompactionResponse, PbDeleteRequest,
    PbDeleteResponse, PbLeaseGrantRequest, PbLeaseGrantResponse, PbLeaseRevokeRequest,
    PbLeaseRevokeResponse, PbPutRequest, PbPutResponse, PbRangeRequest, PbTxnOpRequest,
    PbTxnRequest, PbTxnResponse,
};

use super::auth::AuthChange;
use crate::errors::EtcdError;

/// etcd's default `--max-txn-ops`.
pub const MAX_TXN_OPS: usize = 128;

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Op {
    #[prost(message, tag = "2")]
    Put(PbPutRequest),
    #[prost(message, tag = "3")]
    DeleteRange(PbDeleteRequest),
    #[prost(message, tag = "4")]
    Txn(PbTxnRequest),
    #[prost(message, tag = "5")]
    Compaction(PbCompactionRequest),
    /// A lease with its id and TTL decided (the proposer picks an id for 0 and raises the TTL
    /// to the minimum).
    #[prost(message, tag = "6")]
    LeaseGrant(PbLeaseGrantRequest),
    /// A client's revoke, or the leader's when the lease expired.
    #[prost(message, tag = "7")]
    LeaseRevoke(PbLeaseRevokeRequest),
    /// Raise or clear an alarm (a member over its quota raises NOSPACE; `etcdctl alarm
    /// disarm` clears).
    #[prost(message, tag = "8")]
    Alarm(PbAlarmRequest),
    /// A change of users, roles, permissions, or auth on/off.
    #[prost(message, tag = "9")]
    Auth(AuthChange),
    /// The cluster's version and features, as the leader decided them
    /// (`crate::version::decide`). A member from before it decodes no op here and changes
    /// nothing.
    #[prost(message, tag = "10")]
    ClusterParams(ClusterParamsSet),
    /// A member's name and client URLs, as the leader heard it announce them (etcd's
    /// `ClusterMemberAttrSet`): every member then lists them, also while it is down. A member
    /// from before it decodes no op here and changes nothing.
    #[prost(message, tag = "11")]
    MemberAttrs(MemberAttrsSet),
}

/// A member's attributes, through Raft.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct MemberAttrsSet {
    #[prost(uint64, tag = "1")]
    pub member_id: u64,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, repeated, tag = "3")]
    pub client_urls: Vec<String>,
}

/// The cluster's parameters, through Raft.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct ClusterParamsSet {
    #[prost(string, tag = "1")]
    pub version: String,
    #[prost(string, repeated, tag = "2")]
    pub features: Vec<String>,
}

/// Does `op` need space: a Put, a lease grant, or a Txn with a Put in any branch (what etcd
/// refuses while NOSPACE is raised)?
pub fn needs_space(op: &Op) -> bool {
    fn txn_puts(t: &PbTxnRequest) -> bool {
        t.success
            .iter()
            .chain(&t.failure)
            .any(|o| match &o.request {
                Some(PbTxnOpRequest::RequestPut(_)) => true,
                Some(PbTxnOpRequest::RequestTxn(t)) => txn_puts(t),
                _ => false,
            })
    }
    match op {
        Op::Put(_) | Op::LeaseGrant(_) => true,
        Op::Txn(t) => txn_puts(t),
        Op::DeleteRange(_)
        | Op::Compaction(_)
        | Op::LeaseRevoke(_)
        | Op::Alarm(_)
        | Op::Auth(_)
        | Op::ClusterParams(_)
        | Op::MemberAttrs(_) => false,
    }
}

/// The data of a normal Raft entry. `id` lets the proposing node answer its client.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Proposal {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(oneof = "Op", tags = "2, 3, 4, 5, 6, 7, 8, 9, 10, 11")]
    pub op: Option<Op>,
}

/// The data of a configuration change entry (its context): the member as the change leaves it
/// (or the member removed), and `id` to answer the proposing node's client.
#[derive(Clone, PartialEq, prost::Message)]
pub struct MemberChange {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(message, optional, tag = "2")]
    pub member: Option<etcd_client::proto::PbMember>,
    #[prost(bool, tag = "3")]
    pub remove: bool,
    /// When a witness is added: the generation the proposer read from its freshly initialised
    /// storage (every member binds to it; see `ConfChange::witness_generation`). 0 otherwise.
    #[prost(uint64, tag = "4")]
    pub witness_generation: u64,
}

/// The result of applying an [`Op`]; headers carry only the revision (the server fills in the
/// rest).
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Put(PbPutResponse),
    DeleteRange(PbDeleteResponse),
    Txn(PbTxnResponse),
    Compaction(PbCompactionResponse),
    LeaseGrant(PbLeaseGrantResponse),
    LeaseRevoke(PbLeaseRevokeResponse),
    Alarm(PbAlarmResponse),
    /// An auth change applied (the API builds the response of its kind).
    Auth(Option<etcd_client::proto::PbResponseHeader>),
    /// The cluster's parameters recorded.
    ClusterParams(Option<etcd_client::proto::PbResponseHeader>),
    /// A member's attributes recorded (or none: no such member).
    MemberAttrs(Option<etcd_client::proto::PbResponseHeader>),
}

impl Response {
    /// The response's top-level header.
    pub fn header_mut(&mut self) -> &mut Option<etcd_client::proto::PbResponseHeader> {
        match self {
            Response::Put(r) => &mut r.header,
            Response::DeleteRange(r) => &mut r.header,
            Response::Txn(r) => &mut r.header,
            Response::Compaction(r) => &mut r.header,
            Response::LeaseGrant(r) => &mut r.header,
            Response::LeaseRevoke(r) => &mut r.header,
            Response::Alarm(r) => &mut r.header,
            Response::Auth(header)
            | Response::ClusterParams(header)
            | Response::MemberAttrs(header) => header,
        }
    }
}

pub(super) fn check_range(r: &PbRangeRequest) -> Result<(), EtcdError> {
    if r.key.is_empty() {
        return Err(EtcdError::EMPTY_KEY);
    }
    if !(0..=2).contains(&r.sort_order) || !(0..=4).contains(&r.sort_target) {
        return Err(EtcdError::INVALID_SORT_OPTION);
    }
    Ok(())
}

fn check_put(r: &PbPutRequest) -> Result<(), EtcdError> {
    if r.key.is_empty() {
        return Err(EtcdError::EMPTY_KEY);
    }
    if r.ignore_value && !r.value.is_empty() {
        return Err(EtcdError::VALUE_PROVIDED);
    }
    if r.ignore_lease && r.lease != 0 {
        return Err(EtcdError::LEASE_PROVIDED);
    }
    Ok(())
}

fn check_txn(r: &PbTxnRequest) -> Result<(), EtcdError> {
    if r.compare.len() > MAX_TXN_OPS
        || r.success.len() > MAX_TXN_OPS
        || r.failure.len() > MAX_TXN_OPS
    {
        return Err(EtcdError::TOO_MANY_OPS);
    }
    for c in &r.compare {
        if c.key.is_empty() {
            return Err(EtcdError::EMPTY_KEY);
        }
    }
    for op in r.success.iter().chain(&r.failure) {
        match &op.request {
            Some(PbTxnOpRequest::RequestRange(q)) => check_range(q)?,
            Some(PbTxnOpRequest::RequestPut(q)) => check_put(q)?,
            Some(PbTxnOpRequest::RequestDeleteRange(q)) if q.key.is_empty() => {
                return Err(EtcdError::EMPTY_KEY);
            }
            Some(PbTxnOpRequest::RequestTxn(q)) => check_txn(q)?,
            Some(PbTxnOpRequest::RequestDeleteRange(_)) | None => {}
        }
    }
    written_keys(&r.success)?;
    written_keys(&r.failure)?;
    Ok(())
}

/// Checks a request before it is proposed.
pub fn check(op: &Op) -> Result<(), EtcdError> {
    match op {
        Op::Put(r) => check_put(r),
        Op::DeleteRange(r) if r.key.is_empty() => Err(EtcdError::EMPTY_KEY),
        Op::Txn(r) => check_txn(r),
        Op::LeaseGrant(r) if r.ttl > MAX_LEASE_TTL => Err(EtcdError::LEASE_TTL_TOO_LARGE),
        Op::DeleteRange(_)
        | Op::Compaction(_)
        | Op::LeaseGrant(_)
        | Op::LeaseRevoke(_)
        | Op::Alarm(_)
        | Op::Auth(_)
        | Op::ClusterParams(_)
        | Op::MemberAttrs(_) => Ok(()),
    }
}

/// etcd's largest lease TTL, in seconds.
pub const MAX_LEASE_TTL: i64 = 9_000_000_000;

/// Does `[start, end)` in etcd's spelling (empty end: one key; end "\0": every key from
/// start) contain `key`?
pub fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
    match end {
        [] => key == start,
        [0] => key >= start,
        _ => key >= start && key < end,
    }
}

/// The keys a branch puts and the ranges it deletes, refusing (as etcd does) a key put twice
/// or put inside a range the same branch deletes. The two branches of a nested transaction
/// each count: at most one of them runs, but either one may.
fn written_keys(ops: &[etcd_client::proto::PbTxnRequestOp]) -> Result<Writes, EtcdError> {
    let duplicate = || EtcdError::DUPLICATE_KEY;
    let mut w = Writes::default();
    for op in ops {
        match &op.request {
            Some(PbTxnOpRequest::RequestPut(p)) => {
                if !w.puts.insert(p.key.clone()) {
                    return Err(duplicate());
                }
            }
            Some(PbTxnOpRequest::RequestDeleteRange(d)) => {
                w.deletes.push((d.key.clone(), d.range_end.clone()));
            }
            Some(PbTxnOpRequest::RequestTxn(t)) => {
                let (s, f) = (written_keys(&t.success)?, written_keys(&t.failure)?);
                for k in s.puts.union(&f.puts) {
                    if w.puts.contains(k) {
                        return Err(duplicate());
                    }
                }
                w.puts.extend(s.puts.into_iter().chain(f.puts));
                w.deletes.extend(s.deletes.into_iter().chain(f.deletes));
            }
            Some(PbTxnOpRequest::RequestRange(_)) | None => {}
        }
    }
    for k in &w.puts {
        if w.deletes.iter().any(|(s, e)| in_range(k, s, e)) {
            return Err(duplicate());
        }
    }
    Ok(w)
}

#[derive(Default)]
struct Writes {
    puts: BTreeSet<Vec<u8>>,
    deletes: Vec<(Vec<u8>, Vec<u8>)>,
}
