//! `etcdutl wal dump`: what a member's WAL holds, as JSON lines, changing nothing (safe on a
//! running member's data directory).
//!
//! The first line describes the WAL (`hard_state`, `snapshot` the last snapshot marker,
//! `from_first_snapshot` the snapshot the member began from when the entries run on from it
//! unbroken, `torn_bytes`); then one line per
//! entry, in index order: `index`, `term`, `subterm`, `type` (`empty`, `normal`,
//! `conf-change`), for a normal entry `op` (what the request does) and `etcd_data`, for a
//! configuration change `changes`. `etcd_data` is the request in etcd's own encoding (base64 of
//! an `InternalRaftRequest`, what etcd writes as a normal entry's data in its WAL), so that
//! etcd's tools can read a member's history: the robustness suite's validator reads it to
//! learn which requests were persisted. Auth changes and the cluster's parameters are written
//! by etcd with messages of its own kinds; their lines name the `op` and carry no `etcd_data`.

use std::io::{self, Write};
use std::path::Path;

use base64::Engine;
use etcd_client::proto::{
    PbAlarmRequest, PbCompactionRequest, PbDeleteRequest, PbLeaseGrantRequest,
    PbLeaseRevokeRequest, PbPutRequest, PbTxnRequest,
};
use prost::Message;
use serde_json::{Value, json};

use crate::mvcc::{Op, Proposal};
use crate::raft::{ChangeKind, Entry, EntryData};
use crate::storage::wal::{self, WalError};

/// etcd's `InternalRaftRequest`, with the fields a key-space request fills (field numbers from
/// etcd's `raft_internal.proto`).
#[derive(Clone, PartialEq, prost::Message)]
struct EtcdRaftRequest {
    #[prost(uint64, tag = "1")]
    id: u64,
    #[prost(oneof = "EtcdOp", tags = "4, 5, 6, 7, 8, 9, 10")]
    op: Option<EtcdOp>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum EtcdOp {
    #[prost(message, tag = "4")]
    Put(PbPutRequest),
    #[prost(message, tag = "5")]
    DeleteRange(PbDeleteRequest),
    #[prost(message, tag = "6")]
    Txn(PbTxnRequest),
    #[prost(message, tag = "7")]
    Compaction(PbCompactionRequest),
    #[prost(message, tag = "8")]
    LeaseGrant(PbLeaseGrantRequest),
    #[prost(message, tag = "9")]
    LeaseRevoke(PbLeaseRevokeRequest),
    #[prost(message, tag = "10")]
    Alarm(PbAlarmRequest),
}

/// A normal entry's request: what it does, and etcd's encoding of it when etcd writes it with
/// the same message.
fn normal(data: &[u8]) -> (&'static str, Option<Vec<u8>>) {
    let Ok(Proposal { id, op: Some(op) }) = Proposal::decode(data) else {
        // (applied as a no-op by every member alike)
        return ("undecodable", None);
    };
    let (name, etcd) = match op {
        Op::Put(r) => ("put", Some(EtcdOp::Put(r))),
        Op::DeleteRange(r) => ("delete_range", Some(EtcdOp::DeleteRange(r))),
        Op::Txn(r) => ("txn", Some(EtcdOp::Txn(r))),
        Op::Compaction(r) => ("compaction", Some(EtcdOp::Compaction(r))),
        Op::LeaseGrant(r) => ("lease_grant", Some(EtcdOp::LeaseGrant(r))),
        Op::LeaseRevoke(r) => ("lease_revoke", Some(EtcdOp::LeaseRevoke(r))),
        Op::Alarm(r) => ("alarm", Some(EtcdOp::Alarm(r))),
        Op::Auth(_) => ("auth", None),
        Op::ClusterParams(_) => ("cluster_params", None),
        Op::MemberAttrs(_) => ("member_attrs", None),
    };
    let encoded = etcd.map(|op| EtcdRaftRequest { id, op: Some(op) }.encode_to_vec());
    (name, encoded)
}

fn entry_line(e: &Entry) -> Value {
    let mut line = json!({"index": e.index, "term": e.term, "subterm": e.subterm});
    match &e.data {
        EntryData::Empty => line["type"] = "empty".into(),
        EntryData::Normal(data) => {
            let (op, etcd) = normal(data);
            line["type"] = "normal".into();
            line["op"] = op.into();
            if let Some(bytes) = etcd {
                line["etcd_data"] = base64::engine::general_purpose::STANDARD
                    .encode(bytes)
                    .into();
            }
        }
        EntryData::ConfChange(cc) => {
            line["type"] = "conf-change".into();
            line["changes"] = cc
                .changes
                .iter()
                .map(|c| {
                    let kind = match c.kind {
                        ChangeKind::AddVoter => "add-voter",
                        ChangeKind::AddLearner => "add-learner",
                        ChangeKind::AddWitness => "add-witness",
                        ChangeKind::Remove => "remove",
                    };
                    json!({"kind": kind, "member": format!("{:x}", c.node)})
                })
                .collect();
        }
    }
    line
}

/// Why a dump stopped.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(
        "{0} holds no WAL: --data-dir names a member's data directory (the one with member/wal), \
         and --wal-dir the member's own --wal-dir when it has one"
    )]
    NoWal(String),
    #[error("{0}")]
    BadWalDir(String),
    #[error(transparent)]
    Wal(#[from] WalError),
    #[error("writing the dump")]
    Write(#[from] io::Error),
}

/// Writes the dump of the WAL of the member whose data directory is `data_dir` (its WAL in
/// `wal_dir` when given, as the member's `--wal-dir`); returns the number of entries written.
pub fn dump(
    data_dir: &Path,
    wal_dir: Option<&Path>,
    out: &mut impl Write,
) -> Result<usize, DumpError> {
    let dir = crate::storage::wal_dir(data_dir, wal_dir).map_err(DumpError::BadWalDir)?;
    if !wal::holds_segments(&dir).unwrap_or(false) {
        return Err(DumpError::NoWal(dir.display().to_string()));
    }
    let contents = wal::read_only(&dir)?;
    let rec = contents.rec;
    let hs = rec.hard_state;
    let head = json!({
        "hard_state": {"term": hs.term, "vote": format!("{:x}", hs.vote), "commit": hs.commit},
        "snapshot": {"index": rec.snapshot.0, "term": rec.snapshot.1},
        "from_first_snapshot": contents.from_first_snapshot.map(|(index, term)| json!({"index": index, "term": term})),
        "torn_bytes": rec.torn_bytes,
    });
    writeln!(out, "{head}")?;
    for e in &rec.entries {
        writeln!(out, "{}", entry_line(e))?;
    }
    out.flush()?;
    Ok(rec.entries.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proposal(op: Op) -> Vec<u8> {
        Proposal {
            id: 7,
            op: Some(op),
        }
        .encode_to_vec()
    }

    #[test]
    fn a_put_is_written_in_etcds_encoding_and_auth_changes_are_named_only() {
        let put = PbPutRequest {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
            lease: 5,
            ..Default::default()
        };
        let (op, etcd) = normal(&proposal(Op::Put(put.clone())));
        assert_eq!(op, "put");
        // field 1 (the id), then field 4 (put) as etcd's InternalRaftRequest has them
        let bytes = etcd.expect("a put converts");
        let mut want = vec![0x08, 7, 0x22];
        let inner = put.encode_to_vec();
        want.push(inner.len() as u8);
        want.extend(inner);
        assert_eq!(bytes, want);
        let (op, etcd) = normal(&proposal(Op::Auth(Default::default())));
        assert_eq!((op, etcd), ("auth", None));
        assert_eq!(normal(&[0xff, 0xff]), ("undecodable", None));
    }

    #[test]
    fn a_dump_changes_nothing_and_keeps_entries_a_snapshot_covers() {
        let dir = tempfile::tempdir().unwrap();
        let wal_dir = dir.path().join("member/wal");
        let put = |i: u64| Entry {
            term: 1,
            subterm: 0,
            index: i,
            data: EntryData::Normal(proposal(Op::Put(PbPutRequest {
                key: format!("k{i}").into_bytes(),
                ..Default::default()
            }))),
        };
        {
            let (mut w, _) = wal::Wal::open(&wal_dir, 1 << 20).unwrap();
            w.save(None, &[put(1), put(2), put(3)]).unwrap();
            w.mark_snapshot(2, 1).unwrap();
        }
        let before = std::fs::read_dir(&wal_dir)
            .unwrap()
            .map(|e| std::fs::read(e.unwrap().path()).unwrap())
            .collect::<Vec<_>>();
        let mut out = Vec::new();
        assert_eq!(dump(dir.path(), None, &mut out).unwrap(), 3);
        let lines: Vec<Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["snapshot"]["index"], 2);
        // (the first record of a WAL is not a snapshot marker here: no starting snapshot)
        assert!(lines[0]["from_first_snapshot"].is_null());
        assert_eq!(lines[1]["index"], 1);
        assert_eq!(lines[3]["op"], "put");
        assert!(lines[3]["etcd_data"].is_string());
        let after = std::fs::read_dir(&wal_dir)
            .unwrap()
            .map(|e| std::fs::read(e.unwrap().path()).unwrap())
            .collect::<Vec<_>>();
        assert_eq!(before, after);
        let err = dump(&dir.path().join("nope"), None, &mut Vec::new()).unwrap_err();
        assert!(err.to_string().contains("holds no WAL"), "{err}");
    }
}
