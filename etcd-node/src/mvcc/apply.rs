//! Applying writes: Put, DeleteRange, Txn and Compaction, inside one redb write transaction.
//! A write request that changes anything takes the next main revision; one that changes
//! nothing (a delete of no key, a read-only Txn) leaves the revision alone, as in etcd.

use etcd_client::proto::{
    PbAlarmMember, PbAlarmRequest, PbAlarmResponse, PbCompactionResponse, PbDeleteRequest,
    PbDeleteResponse, PbEvent, PbKeyValue, PbLeaseGrantRequest, PbLeaseGrantResponse,
    PbLeaseRevokeResponse, PbPutRequest, PbPutResponse, PbRangeResponse, PbResponseHeader,
    PbResponseOp, PbTargetUnion, PbTxnOpRequest, PbTxnOpResponse, PbTxnRequest, PbTxnRequestOp,
    PbTxnResponse,
};
use redb::{ReadableTable, Table, WriteTransaction};

use super::auth;
use super::events::event;
use super::range;
use super::record::{self, Rows, VALUES};
use super::request::{Op, Response, needs_space};
use super::sealed::{self, Lazy, Writable, meta_get, meta_set};
use super::{ALARMS, AUTH, CLUSTER, HISTORY, LEASE_KEYS, LEASES, META, lease_keys_of};
use crate::errors::EtcdError;

/// etcd's alarm types (`AlarmType`).
const NOSPACE: i32 = 1;
const CORRUPT: i32 = 2;

/// The result of applying one entry (None: applied before a restart, skipped).
pub type Applied = Option<Result<Response, EtcdError>>;

pub(super) struct Writer<'t> {
    rows: Rows<'t>,
    meta: Table<'t, &'static str, u64>,
    // (the tables a batch of puts does not touch are opened when first used)
    leases: Lazy<'t, i64>,
    lease_keys: Lazy<'t, (i64, &'static [u8])>,
    alarms: Writable<'t, (u64, i32)>,
    /// The `alarms` table's keys, read once per batch: every request asks.
    raised: Vec<(u64, i32)>,
    auth: Lazy<'t, &'static [u8]>,
    cluster: Lazy<'t, &'static [u8]>,
    /// For the member tables, which a batch rarely writes.
    tx: &'t WriteTransaction,
    pub applied: u64,
    pub revision: u64,
    compacted: u64,
    /// `meta` as read when the batch began: [`Writer::finish`] writes only what changed.
    stored: Stored,
    /// What the writes changed, in the order they were applied (for watchers).
    pub events: Vec<PbEvent>,
}

/// The `meta` rows a batch updates.
struct Stored {
    applied: u64,
    revision: u64,
    compacted: u64,
    values: u64,
}

/// The revision a write request writes at, whether it changed anything, and the sub-revision
/// of its next change (its changes count up from 0 in the order they are made).
struct Step {
    rev: u64,
    changed: bool,
    sub: u64,
}

impl Step {
    /// (revision, sub-revision) of the next change.
    fn next_change(&mut self) -> (u64, Option<u64>) {
        self.changed = true;
        self.sub += 1;
        (self.rev, Some(self.sub - 1))
    }
}

fn header(revision: u64) -> Option<PbResponseHeader> {
    Some(PbResponseHeader {
        revision: revision as i64,
        ..Default::default()
    })
}

impl<'t> Writer<'t> {
    pub fn open(tx: &'t WriteTransaction) -> Result<Self, redb::Error> {
        let meta = tx.open_table(META)?;
        let stored = Stored {
            applied: meta_get(&meta, "applied")?,
            revision: meta_get(&meta, "revision")?,
            compacted: meta_get(&meta, "compact")?,
            values: meta_get(&meta, "values")?,
        };
        let rows = Rows {
            history: tx.open_table(HISTORY)?,
            values: tx.open_table(VALUES)?,
            last: stored.values,
        };
        let alarms = sealed::write(tx, ALARMS)?;
        let raised = alarms
            .iter()?
            .map(|row| row.map(|(key, _)| key.value()))
            .collect::<Result<_, _>>()?;
        Ok(Writer {
            rows,
            meta,
            leases: Lazy::new(tx, LEASES),
            lease_keys: Lazy::new(tx, LEASE_KEYS),
            alarms,
            raised,
            auth: Lazy::new(tx, AUTH),
            cluster: Lazy::new(tx, CLUSTER),
            tx,
            applied: stored.applied,
            revision: stored.revision.max(1),
            compacted: stored.compacted,
            stored,
            events: Vec::new(),
        })
    }

    /// Records the applied index and revisions (in the same transaction as the changes), the
    /// rows that changed only.
    pub fn finish(mut self) -> Result<(), redb::Error> {
        for (name, old, new) in [
            ("applied", self.stored.applied, self.applied),
            ("revision", self.stored.revision, self.revision),
            ("compact", self.stored.compacted, self.compacted),
            ("values", self.stored.values, self.rows.last),
        ] {
            if old != new {
                meta_set(&mut self.meta, name, new)?;
            }
        }
        Ok(())
    }

    pub fn apply(&mut self, op: &Option<Op>) -> Result<Result<Response, EtcdError>, redb::Error> {
        let Some(op) = op else {
            return Ok(Err(EtcdError::EMPTY_REQUEST));
        };
        if !matches!(op, Op::Alarm(_)) {
            if self.raised(CORRUPT) {
                return Ok(Err(EtcdError::CORRUPT));
            }
            if needs_space(op) && self.raised(NOSPACE) {
                return Ok(Err(EtcdError::NO_SPACE));
            }
        }
        let mut step = Step {
            rev: self.revision + 1,
            changed: false,
            sub: 0,
        };
        let out = match op {
            Op::Alarm(r) => Ok(Response::Alarm(self.alarm(r)?)),
            Op::ClusterParams(p) => {
                let cluster = self.cluster.open_mut()?;
                cluster.insert("version".as_bytes(), p.version.as_bytes())?;
                cluster.insert("features".as_bytes(), p.features.join(",").as_bytes())?;
                Ok(Response::ClusterParams(None))
            }
            Op::MemberAttrs(a) => {
                super::set_member_attrs(self.tx, a)?;
                Ok(Response::MemberAttrs(None))
            }
            Op::Auth(c) => match &c.op {
                Some(op) => auth::apply(self.auth.open_mut()?, op)?.map(|()| Response::Auth(None)),
                None => Err(EtcdError::EMPTY_REQUEST),
            },
            Op::Compaction(c) => {
                return self
                    .compact(c.revision)
                    .map(|r| r.map(Response::Compaction));
            }
            Op::Put(r) => match self.refuse_put(r)? {
                Some(e) => Err(e),
                None => Ok(Response::Put(self.put(&mut step, r)?)),
            },
            Op::DeleteRange(r) => Ok(Response::DeleteRange(self.delete(&mut step, r)?)),
            Op::LeaseGrant(r) => self.grant(r)?.map(Response::LeaseGrant),
            Op::LeaseRevoke(r) => self.revoke(&mut step, r.id)?.map(Response::LeaseRevoke),
            Op::Txn(r) => {
                let succeeded = self.compare_all(r)?;
                let ops = if succeeded { &r.success } else { &r.failure };
                match self.refuse_ops(ops)? {
                    Some(e) => Err(e),
                    None => Ok(Response::Txn(self.txn(&mut step, r)?)),
                }
            }
        };
        let mut out = match out {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        if step.changed {
            self.revision = step.rev;
        }
        *out.header_mut() = header(self.revision);
        Ok(Ok(out))
    }

    /// Is an alarm of type `alarm` raised (by any member)?
    fn raised(&self, alarm: i32) -> bool {
        self.raised.iter().any(|&(_, raised)| raised == alarm)
    }

    /// Raises or clears an alarm, as etcd's alarm store: the response lists the alarm that
    /// changed (none when it already was so, and for GET, which is answered without Raft).
    fn alarm(&mut self, r: &PbAlarmRequest) -> Result<PbAlarmResponse, redb::Error> {
        let key = (r.member_id, r.alarm);
        let changed = match r.action {
            1 if r.alarm != 0 => self.alarms.insert(key, &[])?.is_none(),
            2 => self.alarms.remove(key)?.is_some(),
            _ => false,
        };
        if changed {
            self.raised.retain(|&raised| raised != key);
            if r.action == 1 {
                self.raised.push(key);
            }
        }
        let alarms = if changed {
            vec![PbAlarmMember {
                member_id: r.member_id,
                alarm: r.alarm,
            }]
        } else {
            Vec::new()
        };
        Ok(PbAlarmResponse {
            header: None,
            alarms,
        })
    }

    /// The newest record of `key` (None: none, or a tombstone), with its value if `value`
    /// (without, it is empty: the value's row, a random read in a large key space, is left
    /// alone).
    fn newest(&self, key: &[u8], value: bool) -> Result<Option<PbKeyValue>, redb::Error> {
        let Some(stored) = range::row_at(&self.rows.history, key, u64::MAX)? else {
            return Ok(None);
        };
        Ok(Some(if value {
            record::decode(&self.rows.values, key, &stored)?
        } else {
            record::decode_meta(key, &stored)?.0
        }))
    }

    /// What etcd refuses only against the data: `ignore_value`/`ignore_lease` on a missing
    /// key, an unknown lease.
    fn refuse_put(&self, r: &PbPutRequest) -> Result<Option<EtcdError>, redb::Error> {
        if (r.ignore_value || r.ignore_lease) && self.newest(&r.key, false)?.is_none() {
            return Ok(Some(EtcdError::KEY_NOT_FOUND));
        }
        if r.lease != 0 && self.leases.open()?.get(r.lease)?.is_none() {
            return Ok(Some(EtcdError::LEASE_NOT_FOUND));
        }
        Ok(None)
    }

    fn grant(
        &mut self,
        r: &PbLeaseGrantRequest,
    ) -> Result<Result<PbLeaseGrantResponse, EtcdError>, redb::Error> {
        let leases = self.leases.open_mut()?;
        if leases.get(r.id)?.is_some() {
            return Ok(Err(EtcdError::LEASE_EXIST));
        }
        leases.insert(r.id, &r.ttl.to_le_bytes())?;
        Ok(Ok(PbLeaseGrantResponse {
            header: header(self.revision),
            id: r.id,
            ttl: r.ttl,
            error: String::new(),
        }))
    }

    /// Deletes the lease and every key attached to it, in one revision.
    fn revoke(
        &mut self,
        s: &mut Step,
        id: i64,
    ) -> Result<Result<PbLeaseRevokeResponse, EtcdError>, redb::Error> {
        if self.leases.open_mut()?.remove(id)?.is_none() {
            return Ok(Err(EtcdError::LEASE_NOT_FOUND));
        }
        for key in lease_keys_of(self.lease_keys.open()?, id)? {
            self.delete(
                s,
                &PbDeleteRequest {
                    key,
                    ..Default::default()
                },
            )?;
        }
        Ok(Ok(PbLeaseRevokeResponse {
            header: header(s.rev),
        }))
    }

    /// Checks a Txn branch before any of it runs, so a refused Txn changes nothing. Its
    /// puts cannot touch a key written earlier in the branch (checked before proposing), so
    /// the data seen here is the data each put will see.
    fn refuse_ops(&self, ops: &[PbTxnRequestOp]) -> Result<Option<EtcdError>, redb::Error> {
        for op in ops {
            let refusal = match &op.request {
                Some(PbTxnOpRequest::RequestPut(p)) => self.refuse_put(p)?,
                Some(PbTxnOpRequest::RequestRange(q)) => {
                    let asked = u64::try_from(q.revision).unwrap_or(0);
                    if asked > self.revision {
                        Some(EtcdError::FUTURE_REV)
                    } else if asked != 0 && asked < self.compacted {
                        Some(EtcdError::COMPACTED)
                    } else {
                        None
                    }
                }
                Some(PbTxnOpRequest::RequestTxn(t)) => {
                    let ops = if self.compare_all(t)? {
                        &t.success
                    } else {
                        &t.failure
                    };
                    self.refuse_ops(ops)?
                }
                Some(PbTxnOpRequest::RequestDeleteRange(_)) | None => None,
            };
            if refusal.is_some() {
                return Ok(refusal);
            }
        }
        Ok(None)
    }

    /// Moves `key` from lease `old` to lease `new` (0: none).
    fn attach(&mut self, key: &[u8], old: i64, new: i64) -> Result<(), redb::Error> {
        if old != new {
            let lease_keys = self.lease_keys.open_mut()?;
            if old != 0 {
                lease_keys.remove((old, key))?;
            }
            if new != 0 {
                lease_keys.insert((new, key), &[])?;
            }
        }
        Ok(())
    }

    fn put(&mut self, s: &mut Step, r: &PbPutRequest) -> Result<PbPutResponse, redb::Error> {
        // (the previous value only if the request needs it: watchers that want it read it
        // when they send the event, as etcd's do)
        let prev = self.newest(&r.key, r.prev_kv || r.ignore_value)?;
        let kv = PbKeyValue {
            key: Vec::new(),
            create_revision: prev.as_ref().map_or(s.rev as i64, |p| p.create_revision),
            mod_revision: s.rev as i64,
            version: prev.as_ref().map_or(1, |p| p.version + 1),
            value: match (&prev, r.ignore_value) {
                (Some(p), true) => p.value.clone(),
                _ => r.value.clone(),
            },
            lease: match (&prev, r.ignore_lease) {
                (Some(p), true) => p.lease,
                _ => r.lease,
            },
        };
        self.rows.put(&r.key, s.next_change(), &kv)?;
        self.attach(&r.key, prev.as_ref().map_or(0, |p| p.lease), kv.lease)?;
        self.events.push(event(&r.key, &kv, None));
        Ok(PbPutResponse {
            header: header(s.rev),
            prev_kv: prev.filter(|_| r.prev_kv),
        })
    }

    fn delete(
        &mut self,
        s: &mut Step,
        r: &PbDeleteRequest,
    ) -> Result<PbDeleteResponse, redb::Error> {
        let mut doomed = Vec::new();
        range::scan(
            &self.rows.history,
            &r.key,
            &r.range_end,
            None,
            |k, record| {
                doomed.push(if r.prev_kv {
                    record::decode(&self.rows.values, k, record)?
                } else {
                    record::decode_meta(k, record)?.0
                });
                Ok(true)
            },
        )?;
        let tombstone = PbKeyValue {
            mod_revision: s.rev as i64,
            ..Default::default()
        };
        for kv in &doomed {
            self.rows.put(&kv.key, s.next_change(), &tombstone)?;
            self.attach(&kv.key, kv.lease, 0)?;
            self.events.push(event(&kv.key, &tombstone, None));
        }
        Ok(PbDeleteResponse {
            header: header(s.rev),
            deleted: doomed.len() as i64,
            prev_kvs: if r.prev_kv { doomed } else { Vec::new() },
        })
    }

    fn compare_all(&self, r: &PbTxnRequest) -> Result<bool, redb::Error> {
        for c in &r.compare {
            let mut kvs = Vec::new();
            range::scan(
                &self.rows.history,
                &c.key,
                &c.range_end,
                None,
                |k, record| {
                    kvs.push(record::decode(&self.rows.values, k, record)?);
                    Ok(true)
                },
            )?;
            let holds = if kvs.is_empty() {
                // etcd compares a missing key as a zero KeyValue, except by value.
                c.target != 3 && compare(c, &PbKeyValue::default())
            } else {
                kvs.iter().all(|kv| compare(c, kv))
            };
            if !holds {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn txn(&mut self, s: &mut Step, r: &PbTxnRequest) -> Result<PbTxnResponse, redb::Error> {
        let succeeded = self.compare_all(r)?;
        let ops = if succeeded { &r.success } else { &r.failure };
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            let response = match &op.request {
                Some(PbTxnOpRequest::RequestRange(q)) => {
                    let out = range::range(
                        (&self.rows.history, &self.rows.values),
                        self.revision,
                        self.compacted,
                        q,
                    )?
                    .unwrap_or_default(); // refusals were checked before the Txn ran
                    PbTxnOpResponse::ResponseRange(PbRangeResponse {
                        header: header(self.revision),
                        kvs: out.kvs,
                        more: out.more,
                        count: out.count,
                    })
                }
                Some(PbTxnOpRequest::RequestPut(p)) => {
                    PbTxnOpResponse::ResponsePut(self.put(s, p)?)
                }
                Some(PbTxnOpRequest::RequestDeleteRange(d)) => {
                    PbTxnOpResponse::ResponseDeleteRange(self.delete(s, d)?)
                }
                Some(PbTxnOpRequest::RequestTxn(t)) => {
                    PbTxnOpResponse::ResponseTxn(self.txn(s, t)?)
                }
                None => continue,
            };
            responses.push(PbResponseOp {
                response: Some(response),
            });
        }
        Ok(PbTxnResponse {
            header: header(s.rev),
            succeeded,
            responses,
        })
    }

    fn compact(
        &mut self,
        revision: i64,
    ) -> Result<Result<PbCompactionResponse, EtcdError>, redb::Error> {
        let rev = u64::try_from(revision).unwrap_or(0);
        if rev > self.revision {
            return Ok(Err(EtcdError::FUTURE_REV));
        }
        if rev <= self.compacted {
            return Ok(Err(EtcdError::COMPACTED));
        }
        // Per key, keep the newest row at or below `rev` unless it is a tombstone older than
        // `rev` (a deletion at `rev` itself stays, so a watch may still start at `rev`, as in
        // etcd); drop the older ones.
        let mut doomed: Vec<(Vec<u8>, u64)> = Vec::new();
        let mut last: Option<(Vec<u8>, u64, bool)> = None;
        let finish = |last: Option<(Vec<u8>, u64, bool)>, doomed: &mut Vec<(Vec<u8>, u64)>| {
            if let Some((k, r, true)) = last
                && r < rev
            {
                doomed.push((k, r));
            }
        };
        for row in self.rows.history.iter()? {
            let (k, v) = row?;
            let (key, r) = k.value();
            if r > rev {
                continue;
            }
            let tombstone = record::is_tombstone(key, v.value())?;
            match last.take() {
                Some((lk, lr, _)) if lk.as_slice() == key => doomed.push((lk, lr)),
                other => finish(other, &mut doomed),
            }
            last = Some((key.to_vec(), r, tombstone));
        }
        finish(last, &mut doomed);
        for (k, r) in &doomed {
            self.rows.remove(k, *r)?;
        }
        self.compacted = rev;
        Ok(Ok(PbCompactionResponse {
            header: header(self.revision),
        }))
    }
}

/// Compares `kv` with the compare's target value (etcd's `compareKV`).
fn compare(c: &etcd_client::proto::PbCompare, kv: &PbKeyValue) -> bool {
    let ord = match (c.target, &c.target_union) {
        (3, Some(PbTargetUnion::Value(v))) => kv.value.as_slice().cmp(v.as_slice()),
        (3, _) => kv.value.as_slice().cmp(&[]),
        (t, u) => {
            let target = match u {
                Some(
                    PbTargetUnion::Version(n)
                    | PbTargetUnion::CreateRevision(n)
                    | PbTargetUnion::ModRevision(n)
                    | PbTargetUnion::Lease(n),
                ) => *n,
                _ => 0,
            };
            let mine = match t {
                0 => kv.version,
                1 => kv.create_revision,
                2 => kv.mod_revision,
                _ => kv.lease,
            };
            mine.cmp(&target)
        }
    };
    match c.result {
        0 => ord.is_eq(),
        1 => ord.is_gt(),
        2 => ord.is_lt(),
        _ => ord.is_ne(),
    }
}
