//! The dump of a key space (the data of a Raft snapshot and of a snapshot file), read and
//! written a part at a time, so that nothing that handles one holds it whole: restoring it,
//! summarising it, rewriting it for a restored cluster.
//!
//! A dump is the protobuf encoding of `PbDump`. Its parts may come in any order (protobuf
//! allows it; [`super::View::dump_to`] writes the small ones first, then the history, an older
//! release wrote the history first); history rows come in (key, revision) order. Unknown fields
//! are skipped, as a protobuf decoder does.

use std::io::{self, Read, Write};

use etcd_client::proto::{PbAlarmMember, PbKeyValue, PbMember};
use prost::Message;
use prost::encoding::decode_varint;

use super::{ClusterParamsSet, DumpSummary};

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbDumpEntry {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(uint64, tag = "2")]
    pub revision: u64,
    #[prost(bytes = "vec", tag = "3")]
    pub record: Vec<u8>,
    /// The change's sub-revision, when the row knows it (see `record`).
    #[prost(uint64, optional, tag = "4")]
    pub sub: Option<u64>,
}

/// The whole key space: the state-machine part of a Raft snapshot.
#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbDump {
    #[prost(uint64, tag = "1")]
    pub revision: u64,
    #[prost(uint64, tag = "2")]
    pub compacted: u64,
    #[prost(message, repeated, tag = "3")]
    pub history: Vec<PbDumpEntry>,
    #[prost(message, repeated, tag = "4")]
    pub members: Vec<PbMember>,
    #[prost(message, repeated, tag = "5")]
    pub leases: Vec<PbDumpLease>,
    #[prost(message, repeated, tag = "6")]
    pub alarms: Vec<PbAlarmMember>,
    #[prost(message, repeated, tag = "7")]
    pub auth: Vec<PbDumpAuthRow>,
    /// The members removed from the cluster (one varint field each: a reader from before
    /// skips them).
    #[prost(uint64, repeated, packed = "false", tag = "8")]
    pub removed: Vec<u64>,
    /// The cluster's version and features, once the leader recorded them.
    #[prost(message, optional, tag = "9")]
    pub cluster_params: Option<ClusterParamsSet>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbDumpAuthRow {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(super) struct PbDumpLease {
    #[prost(int64, tag = "1")]
    pub id: i64,
    #[prost(int64, tag = "2")]
    pub ttl: i64,
}

/// One field of a dump.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Part {
    Revision(u64),
    Compacted(u64),
    History(PbDumpEntry),
    Member(PbMember),
    Lease(PbDumpLease),
    Alarm(PbAlarmMember),
    Auth(PbDumpAuthRow),
    Removed(u64),
    ClusterParams(ClusterParamsSet),
}

/// Why a dump cannot be read, or rewritten.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The dump is damaged, cut short or not a dump.
    #[error("the key space in the snapshot does not decode (at byte {at}): {why}")]
    Undecodable { at: u64, why: String },
    /// A history row's record is not a `KeyValue`.
    #[error("a record in the snapshot does not decode: {0}")]
    Record(prost::DecodeError),
    /// `--bump-revision` would take the revision past [`MAX_BUMPED`].
    #[error(
        "--bump-revision {bump} takes the snapshot's revision {revision} past {MAX_BUMPED} (2^62, \
         half of what etcd's int64 revisions can carry, the rest kept for the writes to come); \
         give a smaller --bump-revision (etcd's runbook uses 1000000000)"
    )]
    BumpTooLarge { bump: u64, revision: u64 },
    /// The rewritten dump could not be written.
    #[error("writing the restored key space: {0}")]
    Write(io::Error),
}

/// The largest field a dump may hold: a record is at most a request (a few MiB); a larger
/// length means a damaged dump, and must not be allocated.
const MAX_FIELD: u64 = 256 << 20;

/// The parts of the dump `input` holds, in the order they come.
pub(super) struct Parts<R> {
    input: R,
    /// Bytes read so far (for messages).
    at: u64,
}

impl<R: Read> Parts<R> {
    pub fn new(input: R) -> Self {
        Parts { input, at: 0 }
    }

    fn bad(&self, why: impl std::fmt::Display) -> DumpError {
        DumpError::Undecodable {
            at: self.at,
            why: why.to_string(),
        }
    }

    fn fill(&mut self, buf: &mut [u8]) -> Result<(), DumpError> {
        self.input
            .read_exact(buf)
            .map_err(|e| self.bad(format!("reading: {e}")))?;
        self.at += buf.len() as u64;
        Ok(())
    }

    /// A varint; None at a clean end of the input (only where `may_end`).
    fn varint(&mut self, may_end: bool) -> Result<Option<u64>, DumpError> {
        let mut bytes = Vec::with_capacity(10);
        loop {
            let mut b = [0u8];
            match self.input.read(&mut b) {
                Ok(0) if may_end && bytes.is_empty() => return Ok(None),
                Ok(0) => return Err(self.bad("it ends inside a field")),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.bad(format!("reading: {e}"))),
            }
            self.at += 1;
            bytes.push(b[0]);
            if b[0] < 0x80 {
                return decode_varint(&mut bytes.as_slice())
                    .map(Some)
                    .map_err(|e| self.bad(e));
            }
            if bytes.len() == 10 {
                return Err(self.bad("a varint longer than 10 bytes"));
            }
        }
    }

    /// The next part; None at the end.
    pub fn next_part(&mut self) -> Result<Option<Part>, DumpError> {
        loop {
            let Some(key) = self.varint(true)? else {
                return Ok(None);
            };
            let (field, wire) = (key >> 3, key & 7);
            match (field, wire) {
                (1 | 2, 0) => {
                    let v = self.varint(false)?.unwrap_or_default();
                    return Ok(Some(if field == 1 {
                        Part::Revision(v)
                    } else {
                        Part::Compacted(v)
                    }));
                }
                (8, 0) => {
                    return Ok(Some(Part::Removed(self.varint(false)?.unwrap_or_default())));
                }
                (1..=9, _) if field <= 2 || field == 8 || wire != 2 => {
                    return Err(self.bad(format!("field {field} has wire type {wire}")));
                }
                (_, 0) => {
                    self.varint(false)?;
                }
                (_, 1) => self.fill(&mut [0u8; 8])?,
                (_, 5) => self.fill(&mut [0u8; 4])?,
                (_, 2) => {
                    let len = self.varint(false)?.unwrap_or_default();
                    if len > MAX_FIELD {
                        return Err(self.bad(format!("a field of {len} bytes")));
                    }
                    let mut buf = vec![0u8; len as usize];
                    self.fill(&mut buf)?;
                    let bytes = buf.as_slice();
                    let part = match field {
                        3 => PbDumpEntry::decode(bytes).map(Part::History),
                        4 => PbMember::decode(bytes).map(Part::Member),
                        5 => PbDumpLease::decode(bytes).map(Part::Lease),
                        6 => PbAlarmMember::decode(bytes).map(Part::Alarm),
                        7 => PbDumpAuthRow::decode(bytes).map(Part::Auth),
                        9 => ClusterParamsSet::decode(bytes).map(Part::ClusterParams),
                        _ => continue,
                    };
                    return part.map(Some).map_err(|e| self.bad(e));
                }
                _ => return Err(self.bad(format!("field {field} has wire type {wire}"))),
            }
        }
    }
}

/// Writes `part` to `out` as a field of a dump.
pub(super) fn write_part(out: &mut dyn Write, part: &Part) -> io::Result<()> {
    use prost::encoding::{message, uint64};
    let mut buf = Vec::new();
    match part {
        Part::Revision(v) => uint64::encode(1, v, &mut buf),
        Part::Compacted(v) => uint64::encode(2, v, &mut buf),
        Part::History(e) => message::encode(3, e, &mut buf),
        Part::Member(m) => message::encode(4, m, &mut buf),
        Part::Lease(l) => message::encode(5, l, &mut buf),
        Part::Alarm(a) => message::encode(6, a, &mut buf),
        Part::Auth(r) => message::encode(7, r, &mut buf),
        Part::Removed(id) => uint64::encode(8, id, &mut buf),
        Part::ClusterParams(p) => message::encode(9, p, &mut buf),
    }
    out.write_all(&buf)
}

/// Whether a stored record is a tombstone (version 0).
pub(super) fn is_tombstone(record: &[u8]) -> Result<bool, DumpError> {
    PbKeyValue::decode(record)
        .map(|kv| kv.version == 0)
        .map_err(DumpError::Record)
}

/// Follows history rows in (key, revision) order and hands back the newest row of each key
/// once the next key starts: `push` returns the finished key's newest row.
#[derive(Default)]
struct Newest {
    last: Option<PbDumpEntry>,
}

impl Newest {
    fn push(&mut self, e: PbDumpEntry) -> Option<PbDumpEntry> {
        match &mut self.last {
            Some(last) if last.key == e.key => {
                *last = e;
                None
            }
            _ => self.last.replace(e),
        }
    }

    fn finish(&mut self) -> Option<PbDumpEntry> {
        self.last.take()
    }
}

/// Counts what a dump holds as its parts pass.
#[derive(Default)]
struct Tally {
    summary: DumpSummary,
    /// The key of the last history row, and whether that row is live.
    last: Option<(Vec<u8>, bool)>,
}

impl Tally {
    fn see(&mut self, part: &Part) -> Result<(), DumpError> {
        let s = &mut self.summary;
        match part {
            Part::Revision(r) => s.revision = *r,
            Part::Compacted(c) => s.compacted = *c,
            Part::History(e) => {
                s.versions += 1;
                let live = !is_tombstone(&e.record)?;
                match &mut self.last {
                    Some((key, was)) if *key == e.key => *was = live,
                    last => {
                        if let Some((_, true)) = last.replace((e.key.clone(), live)) {
                            s.keys += 1;
                        }
                    }
                }
            }
            Part::Lease(_) => s.leases += 1,
            Part::Member(_)
            | Part::Alarm(_)
            | Part::Auth(_)
            | Part::Removed(_)
            | Part::ClusterParams(_) => {}
        }
        Ok(())
    }

    fn finish(mut self) -> DumpSummary {
        if let Some((_, true)) = self.last {
            self.summary.keys += 1;
        }
        self.summary
    }
}

/// Summarises the dump `input` holds.
pub fn summarize(input: impl Read) -> Result<DumpSummary, DumpError> {
    let mut parts = Parts::new(input);
    let mut tally = Tally::default();
    while let Some(part) = parts.next_part()? {
        tally.see(&part)?;
    }
    Ok(tally.finish())
}

/// Revisions travel as int64 in etcd's API; a bumped revision must leave room for the writes
/// to come (2^62 of them: enough for ever).
const MAX_BUMPED: u64 = 1 << 62;

/// Writes to `out` the dump `input` holds, for a restored cluster (`etcdutl snapshot
/// restore`): its members replaced by `members`; the revision raised by `bump`; with
/// `mark_compacted`, everything before the (bumped) revision compacted away, so watchers and
/// readers of an older revision are told to start over instead of silently missing what
/// happened after the snapshot. The auth token secret is replaced by one derived from it and
/// the new members' ids (the same on every restored member), so no token of the old cluster is
/// accepted by the restored one. The old members' alarms are dropped: the new cluster raises
/// its own. Returns the summary of what it wrote.
///
/// The output is deterministic for a given input: the members first, the other parts in the
/// order they come, the revision and compaction last.
pub fn rewrite(
    input: impl Read,
    out: &mut dyn Write,
    members: &[PbMember],
    bump: u64,
    mark_compacted: bool,
) -> Result<DumpSummary, DumpError> {
    let mut parts = Parts::new(input);
    let mut tally = Tally::default();
    let mut put = |part: Part| -> Result<(), DumpError> {
        tally.see(&part)?;
        write_part(out, &part).map_err(DumpError::Write)
    };
    for m in members {
        put(Part::Member(m.clone()))?;
    }
    // (with `mark_compacted`, a key's newest row is written once the next key starts)
    let mut newest = Newest::default();
    let (mut revision, mut compacted) = (0, 0);
    while let Some(part) = parts.next_part()? {
        match part {
            Part::Revision(r) => revision = r,
            Part::Compacted(c) => compacted = c,
            // (a restored cluster has new members: the old ones' removals mean nothing there)
            // (nor its parameters: its leader decides them from its members)
            Part::Member(_) | Part::Alarm(_) | Part::Removed(_) | Part::ClusterParams(_) => {}
            Part::Auth(mut row) => {
                if row.key == "secret" {
                    use sha2::{Digest, Sha256};
                    let mut next = Sha256::new()
                        .chain_update(b"restored\0")
                        .chain_update(&row.value);
                    for m in members {
                        next.update(m.id.to_be_bytes());
                    }
                    row.value = next.finalize().to_vec();
                }
                put(Part::Auth(row))?;
            }
            Part::History(e) if mark_compacted => {
                if let Some(done) = newest.push(e)
                    && !is_tombstone(&done.record)?
                {
                    put(Part::History(done))?;
                }
            }
            other => put(other)?,
        }
    }
    if let Some(done) = newest.finish()
        && !is_tombstone(&done.record)?
    {
        put(Part::History(done))?;
    }
    let revision = revision
        .checked_add(bump)
        .filter(|&r| r <= MAX_BUMPED)
        .ok_or(DumpError::BumpTooLarge { bump, revision })?;
    if mark_compacted {
        compacted = revision;
    }
    put(Part::Revision(revision))?;
    put(Part::Compacted(compacted))?;
    Ok(tally.finish())
}

/// A writer that passes bytes on and hashes them with SHA-256.
#[derive(Debug)]
pub struct Hashing<W> {
    pub out: W,
    pub sha: sha2::Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        use sha2::Digest;
        let n = self.out.write(buf)?;
        self.sha.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use prost::encoding::encode_varint;

    use super::*;

    fn kv(version: i64) -> Vec<u8> {
        PbKeyValue {
            version,
            value: b"v".to_vec(),
            ..Default::default()
        }
        .encode_to_vec()
    }

    fn row(key: &str, revision: u64, version: i64) -> PbDumpEntry {
        PbDumpEntry {
            key: key.into(),
            revision,
            record: kv(version),
            sub: None,
        }
    }

    #[test]
    fn parts_read_back_what_prost_wrote_in_any_order_and_skip_unknown_fields() {
        let dump = PbDump {
            revision: 9,
            compacted: 3,
            history: vec![row("a", 2, 1), row("a", 4, 0), row("b", 5, 1)],
            members: vec![PbMember {
                id: 7,
                name: "m".into(),
                ..Default::default()
            }],
            leases: vec![PbDumpLease { id: 1, ttl: 60 }],
            alarms: vec![PbAlarmMember {
                member_id: 7,
                alarm: 1,
            }],
            auth: vec![PbDumpAuthRow {
                key: "secret".into(),
                value: vec![1, 2],
            }],
            removed: vec![5, 6],
            cluster_params: Some(ClusterParamsSet {
                version: "0.1.0".into(),
                features: vec!["SnapshotCompression".into()],
            }),
        };
        let mut bytes = dump.encode_to_vec();
        // An unknown varint, fixed64, length-delimited and fixed32 field.
        for (key, extra) in [
            (12 << 3, vec![0x96, 0x01]),
            ((13 << 3) | 1, vec![0; 8]),
            ((14 << 3) | 2, vec![2, 0xaa, 0xbb]),
            ((15 << 3) | 5, vec![0; 4]),
        ] {
            encode_varint(key, &mut bytes);
            bytes.extend(extra);
        }
        let mut parts = Parts::new(bytes.as_slice());
        let mut back = PbDump::default();
        while let Some(p) = parts.next_part().unwrap() {
            match p {
                Part::Revision(r) => back.revision = r,
                Part::Compacted(c) => back.compacted = c,
                Part::History(e) => back.history.push(e),
                Part::Member(m) => back.members.push(m),
                Part::Lease(l) => back.leases.push(l),
                Part::Alarm(a) => back.alarms.push(a),
                Part::Auth(r) => back.auth.push(r),
                Part::Removed(id) => back.removed.push(id),
                Part::ClusterParams(p) => back.cluster_params = Some(p),
            }
        }
        assert_eq!(back, dump);
        let s = summarize(bytes.as_slice()).unwrap();
        assert_eq!(
            s,
            DumpSummary {
                revision: 9,
                compacted: 3,
                keys: 1,
                versions: 3,
                leases: 1
            }
        );
        // Parts written one by one decode as the same dump.
        let mut again = Vec::new();
        for p in [
            Part::History(row("a", 2, 1)),
            Part::Revision(9),
            Part::Lease(PbDumpLease { id: 1, ttl: 60 }),
        ] {
            write_part(&mut again, &p).unwrap();
        }
        let d = PbDump::decode(again.as_slice()).unwrap();
        assert_eq!((d.revision, d.history.len(), d.leases.len()), (9, 1, 1));
    }

    #[test]
    fn a_damaged_dump_is_an_error_never_a_panic_nor_a_huge_allocation() {
        let good = PbDump {
            revision: 3,
            history: vec![row("k", 2, 1)],
            ..Default::default()
        }
        .encode_to_vec();
        // (a cut between two fields leaves a shorter dump: the snapshot files' checksums
        // catch those; a cut inside a field is an error here)
        let revision_field = 2;
        for len in (1..good.len()).filter(|&l| l != revision_field) {
            assert!(summarize(&good[..len]).is_err(), "truncated to {len}");
        }
        // A length of 2^40 bytes.
        let mut huge = Vec::new();
        encode_varint(3 << 3 | 2, &mut huge);
        encode_varint(1 << 40, &mut huge);
        let err = summarize(huge.as_slice()).unwrap_err();
        assert!(err.to_string().contains("a field of"), "{err}");
        // A known field with another wire type.
        let err = summarize([3 << 3, 1].as_slice()).unwrap_err();
        assert!(err.to_string().contains("wire type"), "{err}");
        let err = summarize([0xff; 12].as_slice()).unwrap_err();
        assert!(err.to_string().contains("varint"), "{err}");
    }

    #[test]
    fn a_rewrite_marked_compacted_keeps_each_live_keys_newest_row() {
        let dump = PbDump {
            revision: 6,
            compacted: 1,
            history: vec![
                row("a", 2, 1),
                row("a", 3, 2),
                row("b", 4, 1),
                row("b", 5, 0),
                row("c", 6, 1),
            ],
            alarms: vec![PbAlarmMember {
                member_id: 1,
                alarm: 1,
            }],
            ..Default::default()
        }
        .encode_to_vec();
        let members = [PbMember {
            id: 5,
            ..Default::default()
        }];
        let mut out = Vec::new();
        let s = rewrite(dump.as_slice(), &mut out, &members, 10, true).unwrap();
        let d = PbDump::decode(out.as_slice()).unwrap();
        assert_eq!((d.revision, d.compacted), (16, 16));
        assert_eq!(d.history, vec![row("a", 3, 2), row("c", 6, 1)]);
        assert_eq!(d.members, members.to_vec());
        assert!(d.alarms.is_empty());
        assert_eq!((s.revision, s.keys, s.versions), (16, 2, 2));
        let err = rewrite(dump.as_slice(), &mut Vec::new(), &members, 1 << 62, true).unwrap_err();
        assert!(
            matches!(err, DumpError::BumpTooLarge { .. })
                && err.to_string().contains("--bump-revision"),
            "{err}"
        );
    }
}
