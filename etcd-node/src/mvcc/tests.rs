use etcd_client::proto::{
    PbCompactionRequest, PbCompare, PbDeleteRequest, PbPutRequest, PbRangeRequest, PbTargetUnion,
    PbTxnOpRequest, PbTxnOpResponse, PbTxnRequest, PbTxnRequestOp,
};

use std::collections::BTreeMap;

use super::*;
use redb::ReadableTableMetadata;

struct Fixture {
    _dir: tempfile::TempDir,
    mvcc: Mvcc,
    index: u64,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mvcc = Mvcc::open(&dir.path().join("kv.redb")).unwrap();
    Fixture {
        _dir: dir,
        mvcc,
        index: 0,
    }
}

fn put(k: &str, v: &str) -> Op {
    Op::Put(PbPutRequest {
        key: k.into(),
        value: v.into(),
        ..Default::default()
    })
}

fn del(k: &str, end: &str) -> Op {
    Op::DeleteRange(PbDeleteRequest {
        key: k.into(),
        range_end: end.into(),
        prev_kv: true,
    })
}

fn get(k: &str, end: &str) -> PbRangeRequest {
    PbRangeRequest {
        key: k.into(),
        range_end: end.into(),
        ..Default::default()
    }
}

fn value_cmp(k: &str, v: &str) -> PbCompare {
    PbCompare {
        key: k.into(),
        target: 3,
        result: 0,
        target_union: Some(PbTargetUnion::Value(v.into())),
        ..Default::default()
    }
}

fn op(o: Op) -> PbTxnRequestOp {
    PbTxnRequestOp {
        request: Some(match o {
            Op::Put(p) => PbTxnOpRequest::RequestPut(p),
            Op::DeleteRange(d) => PbTxnOpRequest::RequestDeleteRange(d),
            Op::Txn(t) => PbTxnOpRequest::RequestTxn(t),
            _ => panic!("not a txn op"),
        }),
    }
}

impl Fixture {
    fn apply(&mut self, o: Op) -> Result<Response, EtcdError> {
        self.index += 1;
        let p = Proposal {
            id: self.index,
            op: Some(o),
        };
        self.mvcc
            .apply(&[(self.index, Command::Kv(p))], false)
            .unwrap()
            .results[0]
            .clone()
            .expect("applied")
    }
    fn range(&self, r: &PbRangeRequest) -> Result<RangeOutput, EtcdError> {
        self.mvcc.range(r).unwrap()
    }
    fn values(&self, r: &PbRangeRequest) -> Vec<(String, String)> {
        self.range(r)
            .unwrap()
            .kvs
            .into_iter()
            .map(|kv| {
                (
                    String::from_utf8(kv.key).unwrap(),
                    String::from_utf8(kv.value).unwrap(),
                )
            })
            .collect()
    }
    fn revision(&self) -> u64 {
        self.mvcc.position().unwrap().revision
    }
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn revisions_versions_and_history() {
    let mut f = fixture();
    assert_eq!(f.revision(), 1, "an empty store is at revision 1, as etcd");
    f.apply(put("a", "1")).unwrap();
    f.apply(put("a", "2")).unwrap();
    f.apply(put("b", "x")).unwrap();
    assert_eq!(f.revision(), 4);
    let a = &f.range(&get("a", "")).unwrap().kvs[0];
    assert_eq!(
        (
            a.create_revision,
            a.mod_revision,
            a.version,
            a.value.as_slice()
        ),
        (2, 3, 2, b"2".as_slice())
    );
    let old = PbRangeRequest {
        revision: 2,
        ..get("a", "\0")
    };
    assert_eq!(f.values(&old), pairs(&[("a", "1")]), "b did not exist yet");
    let future = PbRangeRequest {
        revision: 9,
        ..get("a", "")
    };
    assert_eq!(f.range(&future), Err(EtcdError::FUTURE_REV));
}

#[test]
fn delete_writes_tombstones_and_only_changes_bump_the_revision() {
    let mut f = fixture();
    for k in ["a", "ab", "b"] {
        f.apply(put(k, k)).unwrap();
    }
    let Response::DeleteRange(d) = f.apply(del("a", "b")).unwrap() else {
        panic!()
    };
    assert_eq!(d.deleted, 2);
    assert_eq!(d.prev_kvs.len(), 2);
    assert_eq!(f.revision(), 5);
    f.apply(del("zz", "")).unwrap();
    assert_eq!(f.revision(), 5, "deleting nothing is not a change");
    assert_eq!(f.values(&get("\0", "\0")), pairs(&[("b", "b")]));
    f.apply(put("a", "again")).unwrap();
    let a = &f.range(&get("a", "")).unwrap().kvs[0];
    assert_eq!((a.create_revision, a.version), (6, 1), "a new generation");
    let before = PbRangeRequest {
        revision: 4,
        ..get("\0", "\0")
    };
    assert_eq!(
        f.values(&before),
        pairs(&[("a", "a"), ("ab", "ab"), ("b", "b")])
    );
}

#[test]
fn txn_branches_nesting_and_refusals() {
    let mut f = fixture();
    f.apply(put("k", "v")).unwrap();
    let txn = |cmp: PbCompare| {
        Op::Txn(PbTxnRequest {
            compare: vec![cmp],
            success: vec![
                op(put("then", "1")),
                op(Op::Txn(PbTxnRequest {
                    compare: vec![value_cmp("then", "1")],
                    success: vec![op(put("nested", "seen"))],
                    failure: vec![],
                })),
            ],
            failure: vec![op(put("else", "1"))],
        })
    };
    let Response::Txn(t) = f.apply(txn(value_cmp("k", "v"))).unwrap() else {
        panic!()
    };
    assert!(t.succeeded);
    assert_eq!(f.revision(), 3, "one revision for the whole Txn");
    assert_eq!(
        f.values(&get("\0", "\0")),
        pairs(&[("k", "v"), ("nested", "seen"), ("then", "1")]),
        "a nested Txn sees the writes before it"
    );
    let Some(PbTxnOpResponse::ResponseTxn(inner)) = &t.responses[1].response else {
        panic!()
    };
    assert!(inner.succeeded);
    let Response::Txn(t) = f.apply(txn(value_cmp("missing", ""))).unwrap() else {
        panic!()
    };
    assert!(!t.succeeded, "a missing key never equals by value");
    assert_eq!(f.values(&get("else", "")), pairs(&[("else", "1")]));

    // A refused branch changes nothing.
    let refused = Op::Txn(PbTxnRequest {
        compare: vec![],
        success: vec![
            op(put("first", "1")),
            op(Op::Put(PbPutRequest {
                key: "absent".into(),
                ignore_value: true,
                ..Default::default()
            })),
        ],
        failure: vec![],
    });
    let rev = f.revision();
    assert_eq!(
        f.apply(refused).unwrap_err().message,
        "etcdserver: key not found"
    );
    assert_eq!(f.revision(), rev);
    assert!(f.values(&get("first", "")).is_empty());
}

#[test]
fn requests_are_checked_before_proposing() {
    let dup = Op::Txn(PbTxnRequest {
        success: vec![op(put("a", "1")), op(put("a", "2"))],
        ..Default::default()
    });
    assert_eq!(
        check(&dup).unwrap_err().message,
        "etcdserver: duplicate key given in txn request"
    );
    let put_in_deleted = Op::Txn(PbTxnRequest {
        success: vec![op(del("a", "c")), op(put("b", "2"))],
        ..Default::default()
    });
    assert!(check(&put_in_deleted).is_err());
    let nested_both_branches = Op::Txn(PbTxnRequest {
        success: vec![op(Op::Txn(PbTxnRequest {
            success: vec![op(put("a", "1"))],
            failure: vec![op(put("a", "2"))],
            ..Default::default()
        }))],
        ..Default::default()
    });
    assert_eq!(check(&nested_both_branches), Ok(()));
    assert_eq!(
        check(&put("", "x")).unwrap_err().message,
        "etcdserver: key is not provided"
    );
    let too_many = Op::Txn(PbTxnRequest {
        success: (0..129).map(|i| op(put(&format!("k{i}"), "v"))).collect(),
        ..Default::default()
    });
    assert_eq!(
        check(&too_many).unwrap_err().message,
        "etcdserver: too many operations in txn request"
    );
}

#[test]
fn range_limit_sort_filters_and_counts() {
    let mut f = fixture();
    for (k, v) in [("p/a", "3"), ("p/b", "1"), ("p/c", "2"), ("q", "0")] {
        f.apply(put(k, v)).unwrap();
    }
    f.apply(put("p/a", "4")).unwrap();
    let prefix = get("p/", "p0");
    let limited = f
        .range(&PbRangeRequest {
            limit: 2,
            ..prefix.clone()
        })
        .unwrap();
    assert_eq!(
        (limited.kvs.len(), limited.more, limited.count),
        (2, true, 3)
    );
    let by_value = PbRangeRequest {
        sort_target: 4,
        sort_order: 2,
        ..prefix.clone()
    };
    assert_eq!(
        f.values(&by_value),
        pairs(&[("p/a", "4"), ("p/c", "2"), ("p/b", "1")])
    );
    let counted = f
        .range(&PbRangeRequest {
            count_only: true,
            ..prefix.clone()
        })
        .unwrap();
    assert_eq!((counted.kvs.len(), counted.count), (0, 3));
    let keys_only = f
        .range(&PbRangeRequest {
            keys_only: true,
            ..prefix.clone()
        })
        .unwrap();
    assert!(keys_only.kvs.iter().all(|kv| kv.value.is_empty()));
    let recent = PbRangeRequest {
        min_mod_revision: 4,
        ..prefix.clone()
    };
    assert_eq!(
        f.values(&recent),
        pairs(&[("p/a", "4"), ("p/c", "2")]),
        "p/b was last modified at revision 3"
    );
    let empty = PbRangeRequest {
        key: "".into(),
        ..Default::default()
    };
    assert_eq!(
        f.range(&empty).unwrap_err().message,
        "etcdserver: key is not provided"
    );
}

#[test]
fn compaction_drops_old_revisions_and_refuses_reads_below_it() {
    let mut f = fixture();
    f.apply(put("a", "1")).unwrap(); // 2
    f.apply(put("a", "2")).unwrap(); // 3
    f.apply(put("b", "1")).unwrap(); // 4
    f.apply(del("b", "")).unwrap(); // 5
    f.apply(put("c", "1")).unwrap(); // 6
    let compact = |r| {
        Op::Compaction(PbCompactionRequest {
            revision: r,
            physical: true,
        })
    };
    f.apply(compact(5)).unwrap();
    assert_eq!(f.apply(compact(5)).unwrap_err(), EtcdError::COMPACTED);
    assert_eq!(f.apply(compact(99)).unwrap_err(), EtcdError::FUTURE_REV);
    let at = |r| PbRangeRequest {
        revision: r,
        ..get("\0", "\0")
    };
    assert_eq!(f.range(&at(4)).unwrap_err(), EtcdError::COMPACTED);
    assert_eq!(f.values(&at(5)), pairs(&[("a", "2")]));
    assert_eq!(f.values(&at(6)), pairs(&[("a", "2"), ("c", "1")]));
    // What is left: a@3 (newest at or below 5), b's deletion at 5 (a watch may start at 5) and
    // c@6; a@2 and b@4 are gone.
    let dump = PbDump::decode(f.mvcc.dump().unwrap().as_slice()).unwrap();
    let rows: Vec<_> = dump
        .history
        .iter()
        .map(|e| (String::from_utf8(e.key.clone()).unwrap(), e.revision))
        .collect();
    assert_eq!(
        rows,
        [
            ("a".to_string(), 3),
            ("b".to_string(), 5),
            ("c".to_string(), 6)
        ]
    );
    assert_eq!(
        f.values(&at(5)),
        pairs(&[("a", "2")]),
        "the tombstone is not a key"
    );
    f.apply(put("d", "1")).unwrap(); // 7
    f.apply(compact(7)).unwrap();
    let dump = PbDump::decode(f.mvcc.dump().unwrap().as_slice()).unwrap();
    assert_eq!(
        dump.history.len(),
        3,
        "b's old deletion goes at the next compaction"
    );
    // The values of the rows compacted away are gone too: one per row left with a value.
    let path = f._dir.path().join("kv.redb");
    drop(f.mvcc);
    assert_eq!(value_rows(&path), 3, "a@3, c@6, d@7");
}

/// The rows of the `values` table in the file at `path` (closed).
fn value_rows(path: &Path) -> u64 {
    let db = redb::Database::open(path).unwrap();
    let tx = db.begin_read().unwrap();
    tx.open_table(record::VALUES).unwrap().len().unwrap()
}

#[test]
fn values_are_numbered_in_the_order_written_and_hashed_as_records() {
    let mut f = fixture();
    f.apply(put("b", "1")).unwrap(); // 2
    f.apply(put("a", "1")).unwrap(); // 3
    f.apply(put("e", "")).unwrap(); // 4: an empty value has no row
    f.apply(Op::Txn(PbTxnRequest {
        success: vec![op(put("c", "2")), op(put("a", "2"))],
        ..Default::default()
    }))
    .unwrap(); // 5
    f.apply(del("b", "")).unwrap(); // 6: a tombstone has no row
    let (hash, _, _) = f.mvcc.hash_kv(0).unwrap().unwrap();
    // HashKV covers (key, revision, record) as format 2 stored the record: the KeyValue
    // without its key, with its value. A dump carries the same records.
    let dump = PbDump::decode(f.mvcc.dump().unwrap().as_slice()).unwrap();
    let mut crc = 0u32;
    for e in &dump.history {
        crc = crc32c::crc32c_append(crc, &e.key);
        crc = crc32c::crc32c_append(crc, &e.revision.to_le_bytes());
        crc = crc32c::crc32c_append(crc, &e.record);
    }
    assert_eq!(hash, crc);
    let a3 = &dump.history[0];
    assert_eq!((a3.key.as_slice(), a3.revision), (&b"a"[..], 3));
    assert_eq!(decode_kv(b"a", &a3.record).unwrap().value, b"1");
    let path = f._dir.path().join("kv.redb");
    drop(f.mvcc);
    let db = redb::Database::open(&path).unwrap();
    let tx = db.begin_read().unwrap();
    let values: Vec<(u64, Vec<u8>)> = tx
        .open_table(record::VALUES)
        .unwrap()
        .iter()
        .unwrap()
        .map(|r| {
            let (k, v) = r.unwrap();
            (k.value(), v.value().to_vec())
        })
        .collect();
    let expected: Vec<(u64, Vec<u8>)> = vec![
        (1, b"1".to_vec()),
        (2, b"1".to_vec()),
        (3, b"2".to_vec()),
        (4, b"2".to_vec()),
    ];
    assert_eq!(values, expected, "appended in the order applied");
    assert_eq!(
        meta_get(&tx.open_table(META).unwrap(), "values").unwrap(),
        4
    );
}

#[test]
fn applied_writes_yield_the_events_the_history_replays() {
    use crate::mvcc::events::{DELETE, PUT};
    let dir = tempfile::tempdir().unwrap();
    let m = Mvcc::open(&dir.path().join("kv.redb")).unwrap();
    let entry = |i: u64, o: Op| (i, Command::Kv(Proposal { id: i, op: Some(o) }));
    let out = m
        .apply(
            &[
                entry(1, put("a", "1")), // 2
                entry(2, put("b", "1")), // 3
                entry(
                    3,
                    Op::Txn(PbTxnRequest {
                        // (not in key order: events come in the order of the changes)
                        success: vec![op(put("c", "1")), op(put("a", "2"))],
                        ..Default::default()
                    }),
                ), // 4
                entry(4, del("a", "c")), // 5: a and b
                entry(5, del("zz", "")), // nothing
            ],
            false,
        )
        .unwrap();
    assert_eq!(out.revision, 5);
    // Applied events carry no previous records; a watcher that wants them reads them.
    assert!(out.events.iter().all(|e| e.prev_kv.is_none()));
    let mut live = out.events.clone();
    m.fill_prev(&mut live).unwrap();
    let prev_values = |events: &[PbEvent]| -> Vec<(i32, String, i64, Option<String>)> {
        events
            .iter()
            .map(|e| {
                let kv = e.kv.clone().unwrap();
                (
                    e.r#type,
                    String::from_utf8(kv.key).unwrap(),
                    kv.mod_revision,
                    e.prev_kv
                        .as_ref()
                        .map(|p| String::from_utf8(p.value.clone()).unwrap()),
                )
            })
            .collect()
    };
    let s = |v: &str| Some(v.to_string());
    assert_eq!(
        prev_values(&live),
        [
            (PUT, "a".into(), 2, None),
            (PUT, "b".into(), 3, None),
            (PUT, "c".into(), 4, None),
            (PUT, "a".into(), 4, s("1")),
            (DELETE, "a".into(), 5, s("2")),
            (DELETE, "b".into(), 5, s("1")),
        ]
    );
    // The history replays exactly the same events, from any revision; so does a member that
    // restored it from a snapshot (the dump carries each change's place in its revision).
    let (all, revision) = m.events(b"\0", b"\0", 1).unwrap().unwrap();
    assert_eq!((all, revision), (live.clone(), 5));
    let other_dir = tempfile::tempdir().unwrap();
    let other = Mvcc::open(&other_dir.path().join("kv.redb")).unwrap();
    other
        .restore(m.dump().unwrap().as_slice(), 5, Commits::One)
        .unwrap();
    assert_eq!(other.events(b"\0", b"\0", 1).unwrap().unwrap().0, live);
    let (tail, _) = m.events(b"a", b"", 4).unwrap().unwrap();
    assert_eq!(tail, [live[3].clone(), live[4].clone()]);
    // Compacted: the events below the compacted revision are gone.
    let compact = Op::Compaction(PbCompactionRequest {
        revision: 4,
        physical: true,
    });
    m.apply(&[entry(6, compact)], false).unwrap();
    assert_eq!(m.events(b"\0", b"\0", 3).unwrap(), Err(4));
    let (from_4, _) = m.events(b"\0", b"\0", 4).unwrap().unwrap();
    assert_eq!(from_4.len(), 4);
    // A previous record at a compacted revision is not read (etcd leaves it out too).
    let mut late = out.events.clone();
    m.fill_prev(&mut late).unwrap();
    assert_eq!(
        prev_values(&late)[2..],
        [
            (PUT, "c".into(), 4, None),
            (PUT, "a".into(), 4, None),
            (DELETE, "a".into(), 5, s("2")),
            (DELETE, "b".into(), 5, s("1")),
        ]
    );
}

#[test]
fn replay_after_restart_skips_applied_entries_and_restore_replaces_everything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    let entry = |i: u64, o: Op| (i, Command::Kv(Proposal { id: i, op: Some(o) }));
    {
        let m = Mvcc::open(&path).unwrap();
        m.apply(&[entry(5, put("a", "1")), entry(6, put("a", "2"))], true)
            .unwrap();
    }
    let m = Mvcc::open(&path).unwrap();
    let again = m
        .apply(&[entry(6, put("a", "2")), entry(7, put("b", "1"))], true)
        .unwrap();
    assert!(
        again.results[0].is_none(),
        "index 6 was applied before the restart"
    );
    assert!(again.results[1].is_some());
    assert_eq!(
        m.position().unwrap(),
        Position {
            revision: 4,
            compacted: 0,
            applied: 7
        }
    );
    let dump = m.dump().unwrap();
    let other = Mvcc::open(&dir.path().join("other.redb")).unwrap();
    other.apply(&[entry(1, put("stale", "x"))], false).unwrap();
    other.restore(dump.as_slice(), 7, Commits::One).unwrap();
    assert_eq!(other.position().unwrap(), m.position().unwrap());
    assert_eq!(other.dump().unwrap(), dump);
    // (Maintenance.Hash: the dump's CRC, computed without holding the dump)
    assert_eq!(other.dump_crc().unwrap(), crc32c::crc32c(&dump));
    assert_eq!(
        other.range(&get("\0", "\0")).unwrap(),
        m.range(&get("\0", "\0")).unwrap()
    );
    assert!(
        Mvcc::open(&dir.path().join("bad.redb"))
            .unwrap()
            .restore(&b"\xff\xff"[..], 1, Commits::Chunked)
            .is_err(),
        "a corrupt snapshot is an error, not a panic"
    );
}

#[test]
fn members_are_seeded_once_changed_by_entries_and_carried_by_snapshots() {
    let dir = tempfile::tempdir().unwrap();
    let m = Mvcc::open(&dir.path().join("kv.redb")).unwrap();
    let member = |id: u64, name: &str, learner: bool| PbMember {
        id,
        name: name.into(),
        peer_ur_ls: vec![format!("http://{name}:2380")],
        client_ur_ls: Vec::new(),
        is_learner: learner,
    };
    m.seed_members(&[member(1, "a", false), member(2, "b", false)])
        .unwrap();
    m.seed_members(&[member(9, "ignored", false)]).unwrap();
    let change = |id, member, remove| {
        Command::Member(MemberChange {
            id,
            member,
            remove,
            witness_generation: 0,
        })
    };
    m.apply(
        &[
            (3, change(1, Some(member(3, "c", true)), false)),
            (4, change(2, Some(member(2, "b", false)), true)),
        ],
        false,
    )
    .unwrap();
    // The leader records what a member announced (a member added by `member add` has no
    // name yet); a record for a member no longer there changes nothing.
    let attrs = |id, member_id: u64, name: &str| {
        Command::Kv(Proposal {
            id,
            op: Some(Op::MemberAttrs(MemberAttrsSet {
                member_id,
                name: name.into(),
                client_urls: vec![format!("http://{name}:2379")],
            })),
        })
    };
    let out = m
        .apply(&[(5, attrs(3, 3, "c3")), (6, attrs(4, 2, "b"))], false)
        .unwrap();
    assert!(matches!(out.results[..], [Some(Ok(_)), Some(Ok(_))]));
    let mut c3 = member(3, "c3", true);
    c3.peer_ur_ls = member(3, "c", true).peer_ur_ls;
    c3.client_ur_ls = vec!["http://c3:2379".into()];
    let want = vec![member(1, "a", false), c3];
    assert_eq!(m.members().unwrap(), want);
    assert_eq!(m.position().unwrap().applied, 6);

    let other = Mvcc::open(&dir.path().join("other.redb")).unwrap();
    other.seed_members(&[member(7, "stale", false)]).unwrap();
    other
        .restore(m.dump().unwrap().as_slice(), 6, Commits::One)
        .unwrap();
    assert_eq!(other.members().unwrap(), want);
}

#[test]
fn leases_attach_keys_and_a_revoke_deletes_them_in_one_revision() {
    use etcd_client::proto::{PbLeaseGrantRequest, PbLeaseRevokeRequest};
    let mut f = fixture();
    let grant = |id| Op::LeaseGrant(PbLeaseGrantRequest { id, ttl: 30 });
    let revoke = |id| Op::LeaseRevoke(PbLeaseRevokeRequest { id });
    let put_on = |k: &str, lease| {
        Op::Put(PbPutRequest {
            key: k.into(),
            value: b"v".to_vec(),
            lease,
            ..Default::default()
        })
    };
    assert_eq!(
        f.apply(put_on("a", 7)).unwrap_err().message,
        "etcdserver: requested lease not found"
    );
    f.apply(grant(7)).unwrap();
    assert_eq!(
        f.apply(grant(7)).unwrap_err().message,
        "etcdserver: lease already exists"
    );
    assert_eq!(f.revision(), 1, "a grant takes no revision");
    f.apply(put_on("a", 7)).unwrap(); // 2
    f.apply(put_on("b", 7)).unwrap(); // 3
    f.apply(put_on("c", 7)).unwrap(); // 4
    f.apply(put_on("c", 0)).unwrap(); // 5: c leaves the lease
    f.apply(del("b", "")).unwrap(); // 6: b goes
    assert_eq!(f.mvcc.lease(7).unwrap(), Some((30, vec![b"a".to_vec()])));
    // A snapshot carries the lease and its keys.
    let other = Mvcc::open(&f._dir.path().join("other.redb")).unwrap();
    other
        .restore(f.mvcc.dump().unwrap().as_slice(), 9, Commits::One)
        .unwrap();
    assert_eq!(other.leases().unwrap(), [(7, 30)]);
    assert_eq!(other.lease(7).unwrap(), f.mvcc.lease(7).unwrap());
    f.apply(put_on("d", 7)).unwrap(); // 7
    f.apply(revoke(7)).unwrap(); // 8: a and d together
    assert_eq!(f.revision(), 8);
    assert_eq!(f.values(&get("\0", "\0")), pairs(&[("c", "v")]));
    assert_eq!(f.mvcc.lease(7).unwrap(), None);
    assert!(f.mvcc.leases().unwrap().is_empty());
    assert_eq!(
        f.apply(revoke(7)).unwrap_err().message,
        "etcdserver: requested lease not found"
    );
}

#[test]
fn a_restore_dump_gets_new_members_and_optionally_a_bumped_compacted_revision() {
    let mut f = fixture();
    f.apply(put("a", "1")).unwrap();
    f.apply(put("a", "2")).unwrap();
    f.apply(put("b", "1")).unwrap();
    f.apply(del("b", "")).unwrap();
    f.apply(put("c", "1")).unwrap(); // revision 6
    let dump = f.mvcc.dump().unwrap();
    let s = summarize(dump.as_slice()).unwrap();
    assert_eq!((s.revision, s.compacted, s.keys, s.versions), (6, 0, 2, 5));

    let new = PbMember {
        id: 42,
        name: "fresh".into(),
        ..Default::default()
    };
    let same = rewritten(&dump, vec![new.clone()], 0, false).unwrap();
    let restored = fixture();
    restored
        .mvcc
        .restore(same.as_slice(), 1, Commits::Chunked)
        .unwrap();
    assert_eq!(restored.mvcc.members().unwrap(), vec![new.clone()]);
    assert_eq!(restored.mvcc.position().unwrap().revision, 6);
    assert_eq!(
        restored.mvcc.range(&get("a", "")).unwrap(),
        f.mvcc.range(&get("a", "")).unwrap(),
        "the same history, revisions and versions"
    );

    let bumped = rewritten(&dump, vec![new], 100, true).unwrap();
    let s = summarize(bumped.as_slice()).unwrap();
    assert_eq!(
        (s.revision, s.compacted, s.keys, s.versions),
        (106, 106, 2, 2)
    );
    let mut restored = fixture();
    restored
        .mvcc
        .restore(bumped.as_slice(), 1, Commits::One)
        .unwrap();
    let old = PbRangeRequest {
        revision: 5,
        ..get("a", "")
    };
    assert_eq!(
        restored.mvcc.range(&old).unwrap().unwrap_err().message,
        EtcdError::COMPACTED.message
    );
    let r = restored.mvcc.range(&get("\0", "\0")).unwrap().unwrap();
    let values: Vec<_> = r
        .kvs
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect();
    assert_eq!(
        values,
        vec![
            (b"a".to_vec(), b"2".to_vec()),
            (b"c".to_vec(), b"1".to_vec())
        ]
    );
    restored.index = 1;
    let mut next = restored.apply(put("d", "1")).unwrap();
    assert_eq!(
        next.header_mut().as_ref().unwrap().revision,
        107,
        "writes continue after the bump"
    );
    assert!(rewritten(&b"\xff\xff"[..], Vec::new(), 0, false).is_err());
    // The snapshot is at revision 6: the largest bump takes it to 2^62, one more is refused.
    let most = (1u64 << 62) - 6;
    assert!(rewritten(&dump, Vec::new(), most, false).is_ok());
    let err = rewritten(&dump, Vec::new(), most + 1, false).unwrap_err();
    assert!(err.to_string().contains("--bump-revision"), "{err}");
    assert!(rewritten(&dump, Vec::new(), u64::MAX, false).is_err());
}

#[test]
fn an_alarm_raised_or_cleared_in_a_batch_holds_for_the_rest_of_it() {
    use etcd_client::proto::PbAlarmRequest;
    // (the applier reads the raised alarms once per batch and follows the batch's changes)
    let alarm = |action, member_id| {
        Op::Alarm(PbAlarmRequest {
            action,
            member_id,
            alarm: 1,
        })
    };
    let mut f = fixture();
    let batch = |f: &mut Fixture, ops: Vec<Op>| -> Vec<Result<Response, EtcdError>> {
        let entries: Vec<_> = ops
            .into_iter()
            .map(|op| {
                f.index += 1;
                let p = Proposal {
                    id: f.index,
                    op: Some(op),
                };
                (f.index, Command::Kv(p))
            })
            .collect();
        let out = f.mvcc.apply(&entries, false).unwrap().results;
        out.into_iter().map(|r| r.expect("applied")).collect()
    };
    let no_space = Err(EtcdError::NO_SPACE);
    let out = batch(
        &mut f,
        vec![
            put("a", "1"),
            alarm(1, 7),
            put("b", "1"),
            alarm(1, 8),
            alarm(2, 7),
            put("c", "1"),
            alarm(2, 8),
            put("d", "1"),
        ],
    );
    assert!(out[0].is_ok());
    assert_eq!(out[2], no_space, "raised by member 7 earlier in the batch");
    assert_eq!(out[5], no_space, "member 8's alarm still stands");
    assert!(out[7].is_ok(), "both cleared");
    let out = batch(&mut f, vec![alarm(1, 9)]);
    assert!(out[0].is_ok());
    let out = batch(&mut f, vec![put("e", "1"), alarm(2, 9), put("f", "1")]);
    assert_eq!(out[0], no_space, "raised in an earlier batch");
    assert!(out[2].is_ok());
    assert_eq!(f.mvcc.alarms().unwrap(), Vec::new());
}

#[test]
fn alarms_refuse_the_writes_etcd_refuses_and_travel_in_snapshots() {
    use etcd_client::proto::{PbAlarmRequest, PbLeaseGrantRequest};
    let alarm = |action, alarm| {
        Op::Alarm(PbAlarmRequest {
            action,
            member_id: 7,
            alarm,
        })
    };
    let raised = |r: Result<Response, EtcdError>| match r.unwrap() {
        Response::Alarm(a) => a.alarms.len(),
        other => panic!("{other:?}"),
    };
    let mut f = fixture();
    f.apply(put("a", "1")).unwrap();
    assert_eq!(raised(f.apply(alarm(1, 1))), 1, "NOSPACE raised");
    assert_eq!(raised(f.apply(alarm(1, 1))), 0, "already raised");
    let no_space = Err(EtcdError::NO_SPACE);
    assert_eq!(f.apply(put("b", "1")), no_space);
    let grant = Op::LeaseGrant(PbLeaseGrantRequest { ttl: 10, id: 5 });
    assert_eq!(f.apply(grant.clone()), no_space);
    let nested_put = PbTxnRequest {
        failure: vec![op(Op::Txn(PbTxnRequest {
            success: vec![op(put("c", "1"))],
            ..Default::default()
        }))],
        ..Default::default()
    };
    assert_eq!(f.apply(Op::Txn(nested_put.clone())), no_space);
    let deletes_only = PbTxnRequest {
        success: vec![op(del("a", ""))],
        ..Default::default()
    };
    assert!(f.apply(Op::Txn(deletes_only)).is_ok(), "deletes free space");
    assert!(
        f.apply(Op::Compaction(PbCompactionRequest {
            revision: 2,
            physical: false
        }))
        .is_ok()
    );
    assert_eq!(f.mvcc.alarms().unwrap().len(), 1);

    let other = fixture();
    other
        .mvcc
        .restore(f.mvcc.dump().unwrap().as_slice(), 9, Commits::One)
        .unwrap();
    assert_eq!(other.mvcc.alarms().unwrap(), f.mvcc.alarms().unwrap());

    assert_eq!(raised(f.apply(alarm(2, 1))), 1, "disarmed");
    assert!(f.apply(put("b", "1")).is_ok());
    assert!(f.apply(grant).is_ok());
    f.apply(alarm(1, 2)).unwrap();
    assert_eq!(
        f.apply(del("b", "")),
        Err(EtcdError::CORRUPT),
        "CORRUPT refuses every write"
    );
    assert_eq!(raised(f.apply(alarm(2, 2))), 1);
    assert!(f.apply(Op::Txn(nested_put)).is_ok());
}

#[test]
fn auth_changes_follow_etcds_rules_and_travel_in_snapshots() {
    use super::auth::{AuthChange, AuthOp, StoredUser, decode, user_key};
    use etcd_client::proto::{
        PbAuthRoleAddRequest, PbAuthRoleDeleteRequest, PbAuthRoleGrantPermissionRequest,
        PbAuthUserAddRequest, PbAuthUserDeleteRequest, PbAuthUserGrantRoleRequest,
        PbAuthUserRevokeRoleRequest,
    };
    let auth = |op| Op::Auth(AuthChange { op: Some(op) });
    let add_user = |name: &str| {
        auth(AuthOp::UserAdd(PbAuthUserAddRequest {
            name: name.into(),
            hashed_password: "$2b$hash".into(),
            ..Default::default()
        }))
    };
    let grant = |user: &str, role: &str| {
        auth(AuthOp::UserGrantRole(PbAuthUserGrantRoleRequest {
            user: user.into(),
            role: role.into(),
        }))
    };
    let message = |r: Result<Response, EtcdError>| r.unwrap_err().message;
    let mut f = fixture();
    assert_eq!(
        message(f.apply(auth(AuthOp::Enable(vec![1])))),
        "etcdserver: root user does not exist"
    );
    f.apply(add_user("root")).unwrap();
    assert_eq!(
        message(f.apply(add_user("root"))),
        "etcdserver: user name already exists"
    );
    assert_eq!(
        message(f.apply(auth(AuthOp::Enable(vec![1])))),
        "etcdserver: root user does not have root role"
    );
    f.apply(grant("root", "root")).unwrap();
    assert_eq!(
        message(f.apply(grant("bob", "root"))),
        "etcdserver: user name not found"
    );
    assert_eq!(
        message(f.apply(grant("root", "nope"))),
        "etcdserver: role name not found"
    );
    f.apply(auth(AuthOp::Enable(vec![1]))).unwrap();
    let revoke_root = auth(AuthOp::UserRevokeRole(PbAuthUserRevokeRoleRequest {
        name: "root".into(),
        role: "root".into(),
    }));
    assert_eq!(
        message(f.apply(revoke_root)),
        "etcdserver: invalid auth management"
    );
    let delete_root = auth(AuthOp::UserDelete(PbAuthUserDeleteRequest {
        name: "root".into(),
    }));
    assert_eq!(
        message(f.apply(delete_root)),
        "etcdserver: invalid auth management"
    );

    f.apply(add_user("alice")).unwrap();
    f.apply(auth(AuthOp::RoleAdd(PbAuthRoleAddRequest {
        name: "r".into(),
    })))
    .unwrap();
    f.apply(grant("alice", "r")).unwrap();
    f.apply(grant("alice", "r")).unwrap(); // again: no change, no error
    let mut permit = |key: &str, end: &str| {
        // (etcd-client does not export the Permission message's type: fill in a default one)
        let mut r = PbAuthRoleGrantPermissionRequest {
            name: "r".into(),
            perm: Some(Default::default()),
        };
        let p = r.perm.as_mut().unwrap();
        (p.key, p.range_end) = (key.into(), end.into());
        f.apply(auth(AuthOp::RoleGrantPermission(r)))
    };
    for (key, end) in [("", ""), ("b", "a"), ("b", "b"), ("a", "\0b")] {
        assert_eq!(
            message(permit(key, end)),
            "etcdserver: invalid auth management",
            "[{key:?}, {end:?})"
        );
    }
    for (key, end) in [("a", ""), ("a", "b"), ("a", "\0")] {
        permit(key, end).unwrap();
    }
    let alice = |m: &Mvcc| -> StoredUser {
        decode(&m.auth_row(&user_key("alice")).unwrap().unwrap()).unwrap()
    };
    assert_eq!(alice(&f.mvcc).roles, vec!["r".to_string()]);
    assert_eq!(alice(&f.mvcc).password_hash, "$2b$hash");

    let other = fixture();
    other
        .mvcc
        .restore(f.mvcc.dump().unwrap().as_slice(), 20, Commits::One)
        .unwrap();
    assert_eq!(
        other.mvcc.auth_rows("").unwrap(),
        f.mvcc.auth_rows("").unwrap()
    );
    // A restored cluster keeps the users and roles but not the token secret (no old token
    // is valid there); every member restored with the same flags gets the same new one.
    let member = |id| PbMember {
        id,
        ..Default::default()
    };
    let restored = |members| {
        let r = fixture();
        let dump = rewritten(&f.mvcc.dump().unwrap(), members, 0, false).unwrap();
        r.mvcc.restore(dump.as_slice(), 1, Commits::One).unwrap();
        r
    };
    let (a, b, c) = (
        restored(vec![member(1), member(2)]),
        restored(vec![member(1), member(2)]),
        restored(vec![member(1), member(3)]),
    );
    let secret = |f: &Fixture| f.mvcc.auth_row("secret").unwrap().unwrap();
    assert_ne!(secret(&a), secret(&f));
    assert_eq!(secret(&a), secret(&b));
    assert_ne!(secret(&a), secret(&c));
    assert_eq!(
        a.mvcc.auth_row(&user_key("alice")).unwrap(),
        f.mvcc.auth_row(&user_key("alice")).unwrap()
    );

    f.apply(auth(AuthOp::RoleDelete(PbAuthRoleDeleteRequest {
        role: "r".into(),
    })))
    .unwrap();
    assert!(
        alice(&f.mvcc).roles.is_empty(),
        "a deleted role leaves its users"
    );
    assert!(f.mvcc.auth_row("enabled").unwrap().is_some());
    f.apply(auth(AuthOp::Disable(true))).unwrap();
    assert!(f.mvcc.auth_row("enabled").unwrap().is_none());
}

#[test]
fn defragment_while_auth_entries_apply_never_deadlocks() {
    use super::auth::{AuthChange, AuthOp};
    use etcd_client::proto::PbAuthRoleAddRequest;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let m = Arc::new(Mvcc::open(&dir.path().join("kv.redb")).unwrap());
    let (done_tx, done) = std::sync::mpsc::channel();
    let writer = m.clone();
    let applied = Arc::new(AtomicU64::new(0));
    let applying = applied.clone();
    std::thread::spawn(move || {
        for i in 1..=300u64 {
            let op = Op::Auth(AuthChange {
                op: Some(AuthOp::RoleAdd(PbAuthRoleAddRequest {
                    name: format!("r{i}"),
                })),
            });
            let p = Proposal {
                id: i,
                op: Some(op),
            };
            writer.apply(&[(i, Command::Kv(p))], false).unwrap();
            applying.store(i, Ordering::Release);
        }
        done_tx.send(()).unwrap();
    });
    let compactor = m.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let defrags = std::thread::spawn(move || {
        let mut seen = 0;
        while !stopping.load(Ordering::Relaxed) {
            compactor.defragment().unwrap();
            // One apply at least between two defragments, which a client's come a round trip
            // apart anyway. Back to back, this thread took the lock again before the woken
            // applier ran, and on a loaded machine the applier starved for over a minute.
            while applied.load(Ordering::Acquire) == seen && !stopping.load(Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
            seen = applied.load(Ordering::Acquire);
        }
    });
    // (a deadlock shows as a timeout, not a hung test run)
    done.recv_timeout(std::time::Duration::from_secs(60))
        .expect("applying auth entries while defragmenting deadlocked");
    stop.store(true, Ordering::Relaxed);
    defrags.join().unwrap();
    assert_eq!(m.auth_rows("role/").unwrap().len(), 300);
}

/// `rewrite` into memory.
fn rewritten(
    dump: &[u8],
    members: Vec<PbMember>,
    bump: u64,
    mark_compacted: bool,
) -> Result<Vec<u8>, DumpError> {
    let mut out = Vec::new();
    rewrite(dump, &mut out, &members, bump, mark_compacted)?;
    Ok(out)
}

/// A key-space file as format 2 wrote it: records with their values in `history`, `live`.
fn write_format2(path: &Path, rows: &[(&str, u64, PbKeyValue)]) {
    let db = redb::Database::create(path).unwrap();
    let tx = db.begin_write().unwrap();
    {
        let mut history = tx.open_table(HISTORY).unwrap();
        let mut live = tx.open_table(LIVE).unwrap();
        let mut meta = tx.open_table(META).unwrap();
        tx.open_table(DOWNGRADE_GUARD).unwrap();
        for (key, rev, kv) in rows {
            history
                .insert((key.as_bytes(), *rev), kv.encode_to_vec().as_slice())
                .unwrap();
            if kv.version == 0 {
                live.remove(key.as_bytes()).unwrap();
            } else {
                live.insert(key.as_bytes(), *rev).unwrap();
            }
            meta.insert("revision", *rev).unwrap();
        }
        meta.insert("format", 2).unwrap();
    }
    tx.commit().unwrap();
}

#[test]
fn a_format2_file_is_upgraded_with_its_hash_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    // More rows than one chunk of the upgrade, some without a value.
    let mut rows = Vec::new();
    let keys: Vec<String> = (0..12_000).map(|i| format!("k{i:05}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let rev = i as u64 + 2;
        let value = if i % 7 == 0 {
            String::new()
        } else {
            format!("v{i}")
        };
        rows.push((key.as_str(), rev, kv(&value, rev as i64, rev as i64, 1)));
    }
    rows.push(("k00001", 12_002, kv("", 0, 12_002, 0)));
    write_format2(&path, &rows);
    // What a format-2 binary answered for HashKV: its records as stored.
    let mut crc = 0u32;
    let mut sorted: Vec<_> = rows.iter().collect();
    sorted.sort_by_key(|(k, r, _)| (*k, *r));
    for (key, rev, kv) in sorted {
        crc = crc32c::crc32c_append(crc, key.as_bytes());
        crc = crc32c::crc32c_append(crc, &rev.to_le_bytes());
        crc = crc32c::crc32c_append(crc, &kv.encode_to_vec());
    }
    let mvcc = Mvcc::open(&path).unwrap();
    assert_eq!(mvcc.hash_kv(0).unwrap().unwrap().0, crc);
    let mut f = Fixture {
        _dir: dir,
        mvcc,
        index: 0,
    };
    assert_eq!(f.values(&get("k00002", "")), pairs(&[("k00002", "v2")]));
    assert_eq!(f.values(&get("k00001", "")), pairs(&[]));
    let before = PbRangeRequest {
        revision: 12_001,
        ..get("k00001", "")
    };
    assert_eq!(f.values(&before), pairs(&[("k00001", "v1")]));
    assert_eq!(f.range(&get("k", "l")).unwrap().count, 11_999);
    f.apply(put("k00002", "new")).unwrap();
    let k2 = &f.range(&get("k00002", "")).unwrap().kvs[0];
    assert_eq!((k2.mod_revision, k2.version), (12_003, 2));
    drop(f.mvcc);
    let without_value = keys.len().div_ceil(7) as u64;
    let path = f._dir.path().join("kv.redb");
    assert_eq!(value_rows(&path), keys.len() as u64 - without_value + 1);
    assert!(!has_table(&path, "live"), "format 4 has no live table");
}

/// Turns a file of this release into what the release of format 4 left: the small tables'
/// rows without checksums, in their types then, and `meta` without its checks.
fn to_format4(path: &Path) {
    use redb::Value;
    use sealed::format4 as f4;
    fn take<K: redb::Key + 'static>(
        tx: &redb::WriteTransaction,
        def: sealed::Def<K>,
    ) -> Vec<(Vec<u8>, Vec<u8>)> {
        let rows = {
            let t = sealed::write(tx, def).unwrap();
            t.iter()
                .unwrap()
                .map(|r| {
                    let (k, v) = r.unwrap();
                    (K::as_bytes(&k.value()).as_ref().to_vec(), v)
                })
                .collect()
        };
        tx.delete_table(def).unwrap();
        rows
    }
    let db = redb::Database::open(path).unwrap();
    let tx = db.begin_write().unwrap();
    {
        let rows = take(&tx, MEMBERS);
        let mut t = tx.open_table(f4::MEMBERS).unwrap();
        for (k, v) in rows {
            t.insert(u64::from_bytes(&k), v.as_slice()).unwrap();
        }
        let rows = take(&tx, REMOVED);
        let mut t = tx.open_table(f4::REMOVED).unwrap();
        for (k, _) in rows {
            t.insert(u64::from_bytes(&k), ()).unwrap();
        }
        let rows = take(&tx, LEASES);
        let mut t = tx.open_table(f4::LEASES).unwrap();
        for (k, v) in rows {
            let id = i64::from_bytes(&k);
            t.insert(id, sealed::ttl(id, &v).unwrap()).unwrap();
        }
        let rows = take(&tx, LEASE_KEYS);
        let mut t = tx.open_table(f4::LEASE_KEYS).unwrap();
        for (k, _) in rows {
            t.insert(<(i64, &[u8])>::from_bytes(&k), ()).unwrap();
        }
        let rows = take(&tx, ALARMS);
        let mut t = tx.open_table(f4::ALARMS).unwrap();
        for (k, _) in rows {
            t.insert(<(u64, i32)>::from_bytes(&k), ()).unwrap();
        }
        let rows = take(&tx, AUTH);
        let mut t = tx.open_table(f4::AUTH).unwrap();
        for (k, v) in rows {
            t.insert(<&str>::from_bytes(&k), v.as_slice()).unwrap();
        }
        let rows = take(&tx, CLUSTER);
        let mut t = tx.open_table(f4::CLUSTER).unwrap();
        for (k, v) in rows {
            t.insert(<&str>::from_bytes(&k), v.as_slice()).unwrap();
        }
        let mut meta = tx.open_table(META).unwrap();
        meta.retain(|name, _| !name.starts_with("check:")).unwrap();
        meta.insert("format", 4).unwrap();
    }
    tx.commit().unwrap();
}

/// A file with a row in every small table: a member added and one removed, a lease with a
/// key, an alarm, auth rows, the cluster's parameters.
fn every_small_table() -> Fixture {
    use crate::mvcc::auth::{AuthChange, AuthOp};
    use etcd_client::proto::{PbAlarmRequest, PbAuthUserAddRequest, PbLeaseGrantRequest};
    let mut f = fixture();
    let member = |id: u64, name: &str| PbMember {
        id,
        name: name.into(),
        peer_ur_ls: vec![format!("http://{name}:2380")],
        ..Default::default()
    };
    f.mvcc
        .seed_members(&[member(1, "a"), member(2, "b")])
        .unwrap();
    f.index += 1;
    let removal = Command::Member(MemberChange {
        id: 1,
        member: Some(member(2, "b")),
        remove: true,
        witness_generation: 0,
    });
    f.mvcc.apply(&[(f.index, removal)], false).unwrap();
    f.apply(Op::LeaseGrant(PbLeaseGrantRequest { id: 5, ttl: 60 }))
        .unwrap();
    f.apply(Op::Put(PbPutRequest {
        key: b"leased".to_vec(),
        value: b"v".to_vec(),
        lease: 5,
        ..Default::default()
    }))
    .unwrap();
    f.apply(Op::Auth(AuthChange {
        op: Some(AuthOp::UserAdd(PbAuthUserAddRequest {
            name: "u".into(),
            hashed_password: "$2b$hash".into(),
            ..Default::default()
        })),
    }))
    .unwrap();
    f.apply(Op::ClusterParams(ClusterParamsSet {
        version: "3.6.0".into(),
        features: vec!["f".into()],
    }))
    .unwrap();
    f.apply(Op::Alarm(PbAlarmRequest {
        action: 1,
        member_id: 1,
        alarm: 2,
    }))
    .unwrap();
    f
}

#[test]
fn a_format4_file_is_sealed_with_nothing_changed() {
    let f = every_small_table();
    let path = f._dir.path().join("kv.redb");
    let before = f.mvcc.dump().unwrap();
    let position = f.mvcc.position().unwrap();
    drop(f.mvcc);
    to_format4(&path);
    let mvcc = Mvcc::open(&path).unwrap();
    assert_eq!(mvcc.dump().unwrap(), before, "every table as it was");
    assert_eq!(mvcc.position().unwrap(), position);
    assert_eq!(mvcc.lease(5).unwrap(), Some((60, vec![b"leased".to_vec()])));
    assert!(mvcc.was_removed(2));
    drop(mvcc);
    let db = redb::Database::open(&path).unwrap();
    let tx = db.begin_read().unwrap();
    assert_eq!(
        sealed::stored_format(&tx.open_table(META).unwrap()).unwrap(),
        FORMAT
    );
    // (the tables of format 4's types are gone: these are the sealed ones)
    assert!(tx.open_table(sealed::format4::LEASES).is_err());
}

/// Rewrites row `at` (in key order) of `def` as raw bytes: with `bit` of the last byte of its
/// stored value flipped, or (`key`) moved to a key with that bit flipped. Returns whether the
/// table had it.
fn flip_row<K: redb::Key + 'static, V: redb::Value + 'static>(
    path: &Path,
    def: TableDefinition<K, V>,
    at: u64,
    key: bool,
    bit: u8,
) -> bool {
    use redb::ReadableTableMetadata;
    let db = redb::Database::open(path).unwrap();
    let tx = db.begin_write().unwrap();
    {
        let mut t = tx.open_table(def).unwrap();
        if at >= t.len().unwrap() {
            return false;
        }
        let (mut k, mut v) = {
            let (k, v) = t.iter().unwrap().nth(at as usize).unwrap().unwrap();
            (
                K::as_bytes(&k.value()).as_ref().to_vec(),
                V::as_bytes(&v.value()).as_ref().to_vec(),
            )
        };
        t.remove(K::from_bytes(&k)).unwrap();
        let flipped = if key { &mut k } else { &mut v };
        *flipped.last_mut().unwrap() ^= bit;
        t.insert(K::from_bytes(&k), V::from_bytes(&v)).unwrap();
    }
    tx.commit().unwrap();
    true
}

/// Every row of every small table, and of `meta`, with one bit flipped in its value or its
/// key, makes what a member reads of its store fail as damage, naming the table.
#[test]
fn a_flipped_bit_in_any_small_table_row_is_damage() {
    use etcd_client::proto::{PbAlarmRequest, PbDeleteRequest};
    let mut f = every_small_table();
    // (NOSPACE, which lets deletes through, beside the CORRUPT alarm of `every_small_table`)
    f.apply(Op::Alarm(PbAlarmRequest {
        action: 1,
        member_id: 2,
        alarm: 1,
    }))
    .unwrap();
    let path = f._dir.path().join("kv.redb");
    drop(f.mvcc);
    let pristine = std::fs::read(&path).unwrap();
    // What a member reads of its store: at start, serving, applying.
    let read_all = |path: &Path| -> Result<(), StoreError> {
        let m = Mvcc::open(path)?;
        m.position()?;
        m.identity()?;
        m.members()?;
        m.alarms()?;
        m.leases()?;
        m.lease(5)?;
        m.auth_rows("")?;
        m.dump()?;
        let delete = Proposal {
            id: 1,
            op: Some(Op::DeleteRange(PbDeleteRequest {
                key: b"none".to_vec(),
                ..Default::default()
            })),
        };
        m.apply(&[(1_000, Command::Kv(delete))], false)?;
        Ok(())
    };
    read_all(&path).expect("the file as written reads back");
    let mut tried = 0;
    // (bit 7 of a text key's last byte makes it invalid UTF-8: the small tables keep text keys
    // as bytes, so the checksum finds it; `meta`'s keys are redb text, whose decoding would
    // panic, and get bit 0 only)
    let mut each = |table: &str, flip: &dyn Fn(u64, bool, u8) -> bool| {
        let mut at = 0;
        loop {
            for (key, bit) in [(false, 1), (false, 0x80), (true, 1), (true, 0x80)] {
                if key && bit == 0x80 && table == "meta" {
                    continue;
                }
                std::fs::write(&path, &pristine).unwrap();
                if !flip(at, key, bit) {
                    assert!(at > 0, "table {table} has rows");
                    return;
                }
                let part = if key { "key" } else { "value" };
                let what = format!("row {at} of {table}, bit {bit:#x} flipped in its {part}");
                let e = read_all(&path).expect_err(&what);
                assert!(e.damaged, "{what}: {e}");
                assert!(
                    e.message.contains(&format!("of table {table}"))
                        && e.message.contains("damaged"),
                    "{what}: {e}"
                );
                tried += 1;
            }
            at += 1;
        }
    };
    each("members", &|at, key, bit| {
        flip_row(&path, MEMBERS, at, key, bit)
    });
    each("removed", &|at, key, bit| {
        flip_row(&path, REMOVED, at, key, bit)
    });
    each("leases", &|at, key, bit| {
        flip_row(&path, LEASES, at, key, bit)
    });
    each("lease_keys", &|at, key, bit| {
        flip_row(&path, LEASE_KEYS, at, key, bit)
    });
    each("alarms", &|at, key, bit| {
        flip_row(&path, ALARMS, at, key, bit)
    });
    each("auth", &|at, key, bit| flip_row(&path, AUTH, at, key, bit));
    each("cluster", &|at, key, bit| {
        flip_row(&path, CLUSTER, at, key, bit)
    });
    each("meta", &|at, key, bit| flip_row(&path, META, at, key, bit));
    assert!(tried > 60, "{tried} flips tried");
}

fn has_table(path: &Path, name: &str) -> bool {
    use redb::TableHandle;
    let db = redb::Database::open(path).unwrap();
    let tx = db.begin_read().unwrap();
    tx.list_tables().unwrap().any(|t| t.name() == name)
}

#[test]
fn a_format3_file_loses_its_live_table_and_nothing_else() {
    let mut f = fixture();
    f.apply(put("a", "1")).unwrap(); // 2
    f.apply(put("b", "1")).unwrap(); // 3
    f.apply(del("a", "")).unwrap(); // 4
    f.apply(put("b", "2")).unwrap(); // 5
    let path = f._dir.path().join("kv.redb");
    drop(f.mvcc);
    // Format 3 kept `live` (key -> newest revision) beside the same rows.
    to_format4(&path);
    {
        let db = redb::Database::open(&path).unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(META).unwrap().insert("format", 3).unwrap();
        tx.open_table(LIVE).unwrap().insert(&b"b"[..], 5).unwrap();
        tx.commit().unwrap();
    }
    f.mvcc = Mvcc::open(&path).unwrap();
    assert_eq!(f.values(&get("\0", "\0")), pairs(&[("b", "2")]));
    let at3 = PbRangeRequest {
        revision: 3,
        ..get("\0", "\0")
    };
    assert_eq!(f.values(&at3), pairs(&[("a", "1"), ("b", "1")]));
    drop(f.mvcc);
    assert!(!has_table(&path, "live"));
    assert_eq!(value_rows(&path), 3);
}

#[test]
fn an_upgrade_stopped_midway_resumes_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    let first: Vec<(String, u64)> = (0..7_000).map(|i| (format!("a{i:05}"), i + 2)).collect();
    let rows: Vec<_> = first
        .iter()
        .map(|(k, r)| (k.as_str(), *r, kv(k, *r as i64, *r as i64, 1)))
        .collect();
    write_format2(&path, &rows);
    drop(Mvcc::open(&path).unwrap());
    // As a start stopped after moving the values of the "a" keys would leave it: format 3, the
    // move under way after the last "a" row, and the "b" rows still as format 2 stored them.
    {
        let db = redb::Database::open(&path).unwrap();
        let tx = db.begin_write().unwrap();
        {
            let mut history = tx.open_table(HISTORY).unwrap();
            for i in 0..6_000u64 {
                let (key, rev) = (format!("b{i:05}"), 7_002 + i);
                let record = kv(&key, rev as i64, rev as i64, 1).encode_to_vec();
                history
                    .insert((key.as_bytes(), rev), record.as_slice())
                    .unwrap();
            }
            meta_set(&mut tx.open_table(META).unwrap(), "revision", 13_001).unwrap();
            let mut aside = tx.open_table(VALUES_ASIDE).unwrap();
            aside.insert("after", (&b"a06999"[..], 7_001)).unwrap();
        }
        tx.commit().unwrap();
    }
    let mvcc = Mvcc::open(&path).unwrap();
    let f = Fixture {
        _dir: dir,
        mvcc,
        index: 0,
    };
    let all = f.range(&get("\0", "\0")).unwrap().kvs;
    assert_eq!(all.len(), 13_000);
    assert!(
        all.iter().all(|kv| kv.value == kv.key),
        "every value read back"
    );
    drop(f.mvcc);
    assert_eq!(value_rows(&f._dir.path().join("kv.redb")), 13_000);
    let db = redb::Database::open(f._dir.path().join("kv.redb")).unwrap();
    let tx = db.begin_read().unwrap();
    assert!(
        tx.open_table(VALUES_ASIDE).is_err(),
        "the move is over: its table is gone"
    );
}

/// A key-space file as format 1 wrote it: every live record also in `current`.
fn write_format1(path: &Path, rows: &[(&str, u64, PbKeyValue)]) {
    let db = redb::Database::create(path).unwrap();
    let tx = db.begin_write().unwrap();
    {
        let mut history = tx.open_table(HISTORY).unwrap();
        let mut current = tx.open_table(FORMAT1_CURRENT).unwrap();
        let mut meta = tx.open_table(META).unwrap();
        for (key, rev, kv) in rows {
            let record = kv.encode_to_vec();
            history
                .insert((key.as_bytes(), *rev), record.as_slice())
                .unwrap();
            if kv.version == 0 {
                current.remove(key.as_bytes()).unwrap();
            } else {
                current.insert(key.as_bytes(), record.as_slice()).unwrap();
            }
            meta.insert("revision", *rev).unwrap();
        }
    }
    tx.commit().unwrap();
}

fn kv(value: &str, create: i64, rev: i64, version: i64) -> PbKeyValue {
    PbKeyValue {
        value: value.into(),
        create_revision: create,
        mod_revision: rev,
        version,
        ..Default::default()
    }
}

#[test]
fn a_format1_file_is_upgraded_and_a_format1_binary_refuses_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    write_format1(
        &path,
        &[
            ("a", 2, kv("1", 2, 2, 1)),
            ("a", 3, kv("2", 2, 3, 2)),
            ("b", 4, kv("x", 4, 4, 1)),
            ("c", 5, kv("y", 5, 5, 1)),
            ("c", 6, kv("", 0, 6, 0)),
        ],
    );
    let mvcc = Mvcc::open(&path).unwrap();
    let mut f = Fixture {
        _dir: dir,
        mvcc,
        index: 0,
    };
    assert_eq!(f.values(&get("a", "\0")), pairs(&[("a", "2"), ("b", "x")]));
    let a = &f.range(&get("a", "")).unwrap().kvs[0];
    assert_eq!((a.create_revision, a.mod_revision, a.version), (2, 3, 2));
    f.apply(put("a", "3")).unwrap();
    let a = &f.range(&get("a", "")).unwrap().kvs[0];
    assert_eq!((a.mod_revision, a.version), (7, 3));
    let old = PbRangeRequest {
        revision: 5,
        ..get("a", "\0")
    };
    assert_eq!(f.values(&old), pairs(&[("a", "2"), ("b", "x"), ("c", "y")]));

    // A binary of format 1 opens `current` as key -> record: the types differ, it fails.
    let path = f._dir.path().join("kv.redb");
    drop(f.mvcc);
    let db = redb::Database::open(&path).unwrap();
    let tx = db.begin_write().unwrap();
    let err = tx.open_table(FORMAT1_CURRENT).map(|_| ()).unwrap_err();
    assert!(
        matches!(err, redb::TableError::TableTypeMismatch { .. }),
        "{err}"
    );
}

#[test]
fn a_file_of_a_newer_format_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    drop(Mvcc::open(&path).unwrap());
    {
        let db = redb::Database::open(&path).unwrap();
        let tx = db.begin_write().unwrap();
        meta_set(&mut tx.open_table(META).unwrap(), "format", FORMAT + 1).unwrap();
        tx.commit().unwrap();
    }
    let err = Mvcc::open(&path).unwrap_err().to_string();
    assert!(
        err.contains(&format!("has format {}", FORMAT + 1))
            && err.contains("written by a newer etcd-node")
            && err.contains("restore a snapshot"),
        "{err}"
    );
}

/// Ranges over keys with long histories (past `range::ROWS_BEFORE_SEEK`, where the scan seeks
/// instead of reading every row) give, at every revision, the state a plain model has:
/// a key written many times around others, deleted and created again inside its run, and
/// keys created after the revision read.
#[test]
fn ranges_over_long_histories_match_a_model_at_every_revision() {
    let mut f = fixture();
    let mut model = BTreeMap::new();
    // (revision, the model's state after it)
    let mut states = vec![(f.revision(), model.clone())];
    let mut write = |f: &mut Fixture, o: Op| {
        match &o {
            Op::Put(p) => {
                model.insert(p.key.clone(), p.value.clone());
            }
            Op::DeleteRange(d) => {
                model.remove(&d.key);
            }
            _ => unreachable!(),
        }
        f.apply(o).unwrap();
        states.push((f.revision(), model.clone()));
    };
    write(&mut f, put("a", "1"));
    for i in 0..60 {
        if i == 25 {
            write(&mut f, del("c", ""));
            continue;
        }
        write(&mut f, put("c", &format!("c{i}")));
        if i % 20 == 7 {
            write(&mut f, put("b", &format!("b{i}")));
            write(&mut f, put("d", &format!("d{i}")));
        }
    }
    for i in 0..40 {
        write(&mut f, put("e", &format!("e{i}")));
    }
    write(&mut f, del("a", ""));
    for (revision, state) in &states {
        for (start, end) in [("a", "\0"), ("b", "e"), ("c", "d"), ("c", "\0")] {
            let want: Vec<(String, String)> = state
                .iter()
                .filter(|(k, _)| {
                    k.as_slice() >= start.as_bytes()
                        && (end == "\0" || k.as_slice() < end.as_bytes())
                })
                .map(|(k, v): (&Vec<u8>, &Vec<u8>)| {
                    (
                        String::from_utf8(k.clone()).unwrap(),
                        String::from_utf8(v.clone()).unwrap(),
                    )
                })
                .collect();
            let req = PbRangeRequest {
                revision: *revision as i64,
                ..get(start, end)
            };
            assert_eq!(
                f.values(&req),
                want,
                "[{start}, {end}) at revision {revision}"
            );
            let count = PbRangeRequest {
                count_only: true,
                ..req
            };
            assert_eq!(f.range(&count).unwrap().count, want.len() as i64);
        }
    }
}

#[test]
fn a_bit_flipped_in_a_value_on_the_disk_is_an_error_naming_the_file_and_the_recovery() {
    let mut f = fixture();
    let value = "a value no other bytes of the file hold: 0123456789";
    f.apply(put("k", value)).unwrap();
    let path = f._dir.path().join("kv.redb");
    let Fixture { _dir, mvcc, .. } = f;
    drop(mvcc);
    let mut bytes = std::fs::read(&path).unwrap();
    let at: Vec<usize> = bytes
        .windows(value.len())
        .enumerate()
        .filter(|(_, w)| *w == value.as_bytes())
        .map(|(i, _)| i)
        .collect();
    assert!(!at.is_empty(), "the value is in the file");
    for i in at {
        bytes[i + 7] ^= 0x10;
    }
    std::fs::write(&path, bytes).unwrap();
    let mvcc = Mvcc::open(&path).unwrap();
    let err = mvcc.range(&get("k", "")).unwrap_err();
    assert!(err.damaged, "{err}");
    let err = err.to_string();
    assert!(
        err.contains("kv.redb") && err.contains("fails its checksum") && err.contains("replace"),
        "{err}"
    );
    let hashed = mvcc.hash_kv(0).unwrap_err();
    assert!(hashed.damaged, "{hashed}");
    // (a failure that is not damage is not marked as damage)
    assert!(!Mvcc::open(_dir.path()).unwrap_err().damaged);
}

#[test]
fn damage_is_recognised_under_every_redb_error_that_carries_it() {
    use redb::{CommitError, StorageError, TableError, TransactionError};
    let corrupted = || StorageError::Corrupted("a bad page".into());
    assert!(super::is_damage(&corrupted()));
    assert!(super::is_damage(&redb::Error::Corrupted("x".into())));
    assert!(super::is_damage(&TableError::Storage(corrupted())));
    assert!(super::is_damage(&TransactionError::Storage(corrupted())));
    assert!(super::is_damage(&CommitError::Storage(corrupted())));
    // Failures that say nothing about the file's contents are not damage.
    assert!(!super::is_damage(&StorageError::Io(std::io::Error::other(
        "EIO"
    ))));
    assert!(!super::is_damage(&std::io::Error::other("EIO")));
    assert!(!super::is_damage(&"a message".to_string()));
    assert!(!super::is_damage(&TableError::TableDoesNotExist(
        "t".into()
    )));
}

/// Batches wait in the applier's open transaction (a commit per batch costs as much as a few
/// puts), but never from a reader: any read commits them first, so it sees every write applied
/// before it started. A batch that finds the transaction old enough commits it; closing the
/// store commits it too.
#[test]
fn applied_batches_wait_for_a_commit_but_readers_see_them() {
    let mut f = fixture();
    let pending = |f: &Fixture| f.mvcc.has_pending.load(Ordering::Acquire);
    f.apply(put("a", "1")).unwrap();
    f.apply(put("b", "2")).unwrap();
    assert!(pending(&f), "two batches in one open transaction");
    assert_eq!(f.values(&get("a", "c")), pairs(&[("a", "1"), ("b", "2")]));
    assert!(!pending(&f), "the read committed them");
    f.apply(put("a", "3")).unwrap();
    std::thread::sleep(DEFER_COMMIT);
    f.apply(put("c", "4")).unwrap();
    assert!(!pending(&f), "committed by the batch that found it old");
    f.apply(put("d", "5")).unwrap();
    f.mvcc.sync().unwrap();
    assert!(!pending(&f), "a durable commit takes it");
    f.apply(put("e", "6")).unwrap();
    assert!(pending(&f));
    let dir = f._dir;
    drop(f.mvcc);
    let reopened = Mvcc::open(&dir.path().join("kv.redb")).unwrap();
    assert_eq!(reopened.position().unwrap().applied, 6);
    let keys = reopened.range(&get("a", "z")).unwrap().unwrap().kvs.len();
    assert_eq!(keys, 5);
}

/// Once a commit of held batches failed (the key space lacks writes that were answered), the
/// store serves nothing more: reads, applies and other writes fail and say how to recover.
#[test]
fn after_a_failed_commit_of_held_batches_nothing_is_served() {
    let mut f = fixture();
    f.apply(put("a", "1")).unwrap();
    f.mvcc.failed.store(true, Ordering::Release);
    let read = f.mvcc.range(&get("a", "")).unwrap_err().to_string();
    assert!(read.contains("restart the member"), "{read}");
    let entry = [(99, Command::Noop)];
    assert!(f.mvcc.apply(&entry, false).is_err());
    assert!(f.mvcc.set_identity(1, 2).is_err());
}

#[test]
fn the_size_a_write_is_checked_against_follows_every_commit() {
    let mut f = fixture();
    let checked = f.mvcc.db_size_at_commit();
    let opened = f.mvcc.db_size();
    assert!(opened > 0);
    assert_eq!(checked, opened);
    // Puts of 4 KiB over 50 keys, applied as the applier does, then made durable: the file
    // grows, and what the quota check reads grew with it, without a look at the file.
    // (values that do not compress: the file must grow with what is written)
    for i in 0..500 {
        f.apply(put_bytes(&format!("k{}", i % 50), incompressible(4096)))
            .unwrap();
    }
    f.mvcc.apply(&[], true).unwrap();
    // (the memory first: `db_size` reads the file and records what it found)
    let checked = f.mvcc.db_size_at_commit();
    let grown = f.mvcc.db_size();
    assert!(grown > opened + 1_000_000, "{opened} -> {grown}");
    assert_eq!(checked, grown);
    // A compaction and a defragment give space back: the quota check sees that too.
    let revision = f.revision() as i64;
    f.apply(Op::Compaction(PbCompactionRequest {
        revision,
        physical: true,
    }))
    .unwrap();
    f.mvcc.apply(&[], true).unwrap();
    f.mvcc.defragment().unwrap();
    let checked = f.mvcc.db_size_at_commit();
    let shrunk = f.mvcc.db_size();
    assert!(shrunk < grown, "{grown} -> {shrunk}");
    assert_eq!(checked, shrunk);
}

/// A defragment copies every row into a new file that replaces the old one: the same key space
/// before, after and after a reopen, in a file a fraction of the size once a compaction freed
/// most of it, and writes go on after it. A copy a crash left beside the file is removed when
/// the key space opens; no room on the disk for a copy, a copy that fails, and a table the copy
/// does not know leave the defragment to redb's compaction in place (which never drops a
/// table).
#[test]
fn a_defragment_copies_every_row_into_a_smaller_file() {
    let mut f = fixture();
    let path = f._dir.path().join("kv.redb");
    let copy = f._dir.path().join("kv.redb.defrag");
    // (values that do not compress: the file must grow with what is written)
    for i in 0..500 {
        f.apply(put_bytes(&format!("k{}", i % 50), incompressible(4096)))
            .unwrap();
    }
    let revision = f.revision() as i64;
    f.apply(Op::Compaction(PbCompactionRequest {
        revision,
        physical: true,
    }))
    .unwrap();
    f.mvcc.apply(&[], true).unwrap();
    let before = f.mvcc.dump().unwrap();
    let grown = std::fs::metadata(&path).unwrap().len();
    let inode = || std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
    let old_file = inode();
    f.mvcc.defragment().unwrap();
    assert_ne!(inode(), old_file, "a new file replaced the old one");
    assert_eq!(f.mvcc.dump().unwrap(), before, "the same key space");
    let shrunk = std::fs::metadata(&path).unwrap().len();
    assert!(shrunk * 4 < grown, "{grown} -> {shrunk}");
    assert!(!copy.exists());
    f.apply(put("after", "1")).unwrap();
    f.mvcc.apply(&[], true).unwrap();
    let after = f.mvcc.dump().unwrap();

    // A crash after the copy was written and before its rename left it: removed at open.
    std::fs::write(&copy, b"an unfinished copy").unwrap();
    let placeholder = Mvcc::open(&f._dir.path().join("placeholder.redb")).unwrap();
    drop(std::mem::replace(&mut f.mvcc, placeholder));
    f.mvcc = Mvcc::open(&path).unwrap();
    assert!(!copy.exists());
    assert_eq!(f.mvcc.dump().unwrap(), after, "reopened");

    // No room on the disk for a copy: compacted in place.
    fail::cfg("defrag-no-room", "return").unwrap();
    let in_place = inode();
    let defragmented = f.mvcc.defragment();
    fail::remove("defrag-no-room");
    defragmented.unwrap();
    assert_eq!(inode(), in_place, "compacted in place");
    assert!(!copy.exists());
    assert_eq!(f.mvcc.dump().unwrap(), after);

    // A copy that fails (its path taken by a directory): compacted in place instead.
    std::fs::create_dir(&copy).unwrap();
    let in_place = inode();
    f.mvcc.defragment().unwrap();
    assert_eq!(inode(), in_place, "compacted in place");
    std::fs::remove_dir(&copy).unwrap();
    assert_eq!(f.mvcc.dump().unwrap(), after);

    // A table this release does not copy (a later format's): kept, by a compaction in place.
    const OTHER: TableDefinition<u64, u64> = TableDefinition::new("a_later_table");
    {
        let db = f.mvcc.db.read().unwrap();
        let tx = db.begin_write().unwrap();
        tx.open_table(OTHER).unwrap().insert(1, 2).unwrap();
        tx.commit().unwrap();
    }
    let in_place = inode();
    f.mvcc.defragment().unwrap();
    assert_eq!(inode(), in_place, "compacted in place");
    let db = f.mvcc.db.read().unwrap();
    let tx = db.begin_read().unwrap();
    assert_eq!(
        tx.open_table(OTHER)
            .unwrap()
            .get(1)
            .unwrap()
            .unwrap()
            .value(),
        2
    );
    drop((tx, db));
    assert_eq!(f.mvcc.dump().unwrap(), after);
}

/// A value of the kind Kubernetes stores (JSON with repeated field names), about 900 bytes,
/// different for each `i`.
fn object_like(i: u32) -> Vec<u8> {
    let labels: String = (0..8)
        .map(|l| format!(r#""app.kubernetes.io/part-{l}":"service-{}","#, i % 7 + l))
        .collect();
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"config-{i}","namespace":"default","uid":"{i:08x}-2b5c-4c1d-9e7f-{:012x}","resourceVersion":"{}","labels":{{{labels}"tier":"edge"}},"managedFields":[{{"manager":"kubectl-client-side-apply","operation":"Update","apiVersion":"v1","fieldsType":"FieldsV1","fieldsV1":{{"f:data":{{".":{{}},"f:config.yaml":{{}}}},"f:metadata":{{"f:labels":{{".":{{}}}}}}}}}}]}},"data":{{"config.yaml":"replicas: {}\nimage: registry.example/app:{i}\n"}}}}"#,
        i as u64 * 7919,
        1000 + i,
        i % 5
    )
    .into_bytes()
}

/// Bytes that do not compress (xorshift from a fixed start: the same every run).
fn incompressible(len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn put_bytes(key: &str, value: Vec<u8>) -> Op {
    Op::Put(PbPutRequest {
        key: key.into(),
        value,
        ..Default::default()
    })
}

/// The bytes of every `values` row in the file at `path` (closed), in number order.
fn value_row_bytes(path: &Path) -> Vec<Vec<u8>> {
    let db = redb::Database::open(path).unwrap();
    let tx = db.begin_read().unwrap();
    let values = tx.open_table(record::VALUES).unwrap();
    values
        .iter()
        .unwrap()
        .map(|r| r.unwrap().1.value().to_vec())
        .collect()
}

/// Values that compress are stored compressed (format 6) and read back whole by every reader
/// of the key space: ranges, HashKV (of the records as format 2 stored them), a dump restored
/// elsewhere; values that do not compress, and short ones, are stored as they are.
#[test]
fn compressible_values_are_stored_compressed_and_read_back_whole() {
    let mut f = fixture();
    let objects: Vec<Vec<u8>> = (0..200).map(object_like).collect();
    for (i, v) in objects.iter().enumerate() {
        f.apply(put_bytes(&format!("o{i:03}"), v.clone())).unwrap();
    }
    let random = incompressible(256);
    f.apply(put_bytes("r", random.clone())).unwrap();
    f.apply(put("s", "short")).unwrap();
    // (compared by checksum: a failure prints two numbers, not the values)
    let read = |m: &Mvcc| -> Vec<u32> {
        m.range(&get("\0", "\0"))
            .unwrap()
            .unwrap()
            .kvs
            .iter()
            .map(|kv| crc32c::crc32c(&kv.value))
            .collect()
    };
    let mut whole = objects.clone();
    whole.push(random.clone());
    whole.push(b"short".to_vec());
    let want: Vec<u32> = whole.iter().map(|v| crc32c::crc32c(v)).collect();
    assert_eq!(read(&f.mvcc), want);
    let (hash, _, _) = f.mvcc.hash_kv(0).unwrap().unwrap();
    let dump = f.mvcc.dump().unwrap();
    let mut crc = 0u32;
    for e in &PbDump::decode(dump.as_slice()).unwrap().history {
        let record = decode_kv(&e.key, &e.record).unwrap();
        assert!(whole.contains(&record.value), "a dump carries whole values");
        crc = crc32c::crc32c_append(crc, &e.key);
        crc = crc32c::crc32c_append(crc, &e.revision.to_le_bytes());
        crc = crc32c::crc32c_append(crc, &e.record);
    }
    assert_eq!(hash, crc, "HashKV is of the whole values");
    let g = fixture();
    g.mvcc
        .restore(dump.as_slice(), f.index, Commits::One)
        .unwrap();
    assert_eq!(read(&g.mvcc), want, "a restored dump reads the same");
    // (in transactions of 7 rows under test: the dump's rows cross several)
    let h = fixture();
    h.mvcc
        .restore(dump.as_slice(), f.index, Commits::Chunked)
        .unwrap();
    assert_eq!(
        read(&h.mvcc),
        want,
        "a dump restored in chunks reads the same"
    );
    assert_eq!(g.mvcc.hash_kv(0).unwrap().unwrap().0, hash);

    let path = f._dir.path().join("kv.redb");
    drop(f.mvcc);
    let rows = value_row_bytes(&path);
    let (stored, whole): (usize, usize) = (
        rows[..200].iter().map(Vec::len).sum(),
        objects.iter().map(Vec::len).sum(),
    );
    assert!(
        stored * 4 < whole * 3,
        "the objects' rows hold {stored} bytes for {whole}"
    );
    assert!(
        rows[200] == random,
        "a value that does not compress is kept as it is"
    );
    assert_eq!(rows[201], b"short", "so is a short one");
}

/// A flipped bit in a compressed value is found by the value's checksum (of the bytes stored)
/// before it is decompressed: the read fails naming the key and the recovery.
#[test]
fn a_flipped_bit_in_a_compressed_value_is_damage() {
    for bit in [0x01, 0x10, 0x80] {
        let mut f = fixture();
        f.apply(put_bytes("obj", object_like(1))).unwrap();
        let path = f._dir.path().join("kv.redb");
        drop(f.mvcc);
        assert!(value_row_bytes(&path)[0].len() < object_like(1).len());
        assert!(flip_row(&path, record::VALUES, 0, false, bit));
        let mvcc = Mvcc::open(&path).unwrap();
        let err = mvcc.range(&get("obj", "")).unwrap_err().to_string();
        assert!(
            err.contains("\"obj\"") || err.contains("[111, 98, 106]"),
            "names the key: {err}"
        );
        assert!(
            err.contains("fails its checksum") && err.contains("replace"),
            "{err}"
        );
    }
}

/// A file of format 5 (values never compressed) opens as format 6 with every row as it was;
/// from then on a binary of format 5 refuses it (`a_file_of_a_newer_format_is_refused...`).
#[test]
fn a_format5_file_becomes_format6_with_nothing_changed() {
    let mut f = fixture();
    f.apply(put_bytes("r", incompressible(300))).unwrap();
    f.apply(put("k", "v")).unwrap();
    let path = f._dir.path().join("kv.redb");
    let (before, position) = (f.mvcc.dump().unwrap(), f.mvcc.position().unwrap());
    drop(f.mvcc);
    {
        let db = redb::Database::open(&path).unwrap();
        let tx = db.begin_write().unwrap();
        meta_set(&mut tx.open_table(META).unwrap(), "format", 5).unwrap();
        tx.commit().unwrap();
    }
    let mvcc = Mvcc::open(&path).unwrap();
    assert_eq!(mvcc.dump().unwrap(), before, "every table as it was");
    assert_eq!(mvcc.position().unwrap(), position);
    drop(mvcc);
    let db = redb::Database::open(&path).unwrap();
    let tx = db.begin_read().unwrap();
    let format = sealed::stored_format(&tx.open_table(META).unwrap()).unwrap();
    assert_eq!((format, FORMAT), (6, 6));
}

/// A process that dies while redb creates a file leaves it sized but without its magic number,
/// and no later open accepts it. The key-space file is created beside its path and renamed
/// into place: such a leftover is replaced, and a file already at the path is never touched.
#[test]
fn an_interrupted_creation_of_the_key_space_file_is_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv.redb");
    let aside = dir.path().join("kv.redb.creating");
    // What redb 4.5 leaves between sizing a new file and writing its header.
    std::fs::write(&aside, vec![0u8; 1 << 20]).unwrap();
    let mvcc = Mvcc::open(&path).unwrap();
    assert!(!aside.exists(), "the leftover is still there");
    assert_eq!(mvcc.position().unwrap().revision, 1);
    drop(mvcc);
    Mvcc::open(&path).unwrap();

    // The same bytes at the key space's own path are refused, and left as they are.
    let other = dir.path().join("other.redb");
    std::fs::write(&other, vec![0u8; 1 << 20]).unwrap();
    let e = Mvcc::open(&other).unwrap_err();
    assert!(e.to_string().contains("magic number"), "{e}");
    assert!(e.damaged, "a file that is not a database is damaged: {e}");
    assert_eq!(std::fs::read(&other).unwrap(), vec![0u8; 1 << 20]);
}
