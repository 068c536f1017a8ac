//! What regular members send each other (`docs/formats.md`, "Peer messages"): Raft messages,
//! proposals forwarded to the leader, and ReadIndex requests and answers, as the messages of
//! `proto/peer.proto` carry them. Decoding validates; a malformed envelope is an error naming
//! what is wrong, never a panic.

use prost::Message as _;

use crate::raft::{Body, Entry, KnownWitness, Message, Snapshot, SnapshotMeta};
use crate::storage::codec::{Invalid, PbEntry, PbKnownWitness, PbSnapshotMeta};

/// The peer transport and its messages (`proto/peer.proto`).
#[allow(clippy::all, clippy::pedantic, missing_debug_implementations)]
pub mod pb {
    tonic::include_proto!("etcdnode.peer");
}
use pb::{Envelope as PbEnvelope, RaftMessage as PbMessage};

/// One thing a member sends another.
// Most envelopes are Raft messages: boxing them to shrink the rare others would add an
// allocation to nearly every envelope.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Envelope {
    Raft(Message),
    /// A proposal (encoded `mvcc::Proposal`) for the leader to append if it leads in `term`
    /// (0: from a member that names no term; appended in any).
    Forward {
        term: u64,
        data: Vec<u8>,
    },
    /// A follower's membership change (an encoded `MemberChange`) for the leader to propose.
    ForwardMember(Vec<u8>),
    /// A follower asks the leader for a read index; `ctx` comes back in the answer.
    ReadIndex {
        ctx: u64,
    },
    /// The leader's answer: reads started after the request may be served at `index`
    /// (0: refused, ask again).
    ReadIndexResp {
        ctx: u64,
        index: u64,
    },
    /// A follower's lease question for the leader: keep-alive when `renew`, else time-to-live.
    LeaseAsk {
        ctx: u64,
        id: i64,
        renew: bool,
    },
    /// The leader's answer: the remaining TTL in seconds (-1: no such lease) and the granted
    /// one; `leader` false: the asked member does not lead (ask again).
    LeaseAnswer {
        ctx: u64,
        leader: bool,
        ttl: i64,
        granted: i64,
    },
}

fn message_to_pb(m: &Message) -> PbMessage {
    let mut p = PbMessage {
        from: m.from,
        to: m.to,
        term: m.term,
        witness: m.witness.map(PbKnownWitness::from),
        ..Default::default()
    };
    match &m.body {
        Body::Append {
            prev_index,
            prev_term,
            entries,
            commit,
        } => {
            p.kind = 1;
            p.index = *prev_index;
            p.log_term = *prev_term;
            p.entries = entries.iter().map(PbEntry::from).collect();
            p.commit = *commit;
        }
        Body::AppendResp { index, reject } => {
            p.kind = 2;
            p.index = *index;
            p.flag = *reject;
        }
        Body::Heartbeat { commit, read, held } => {
            p.kind = 3;
            p.commit = *commit;
            p.read = *read;
            p.held = *held;
        }
        Body::HeartbeatResp { read } => {
            p.kind = 4;
            p.read = *read;
        }
        Body::Snapshot { snapshot } => {
            p.kind = 5;
            p.snapshot_meta = Some(PbSnapshotMeta::from(&snapshot.meta));
            p.snapshot_data = snapshot.data.clone();
        }
        Body::TimeoutNow => p.kind = 6,
        Body::Vote {
            pre,
            last_index,
            last_term,
            transfer,
        } => {
            p.kind = 7;
            p.index = *last_index;
            p.log_term = *last_term;
            p.flag = *pre;
            p.flag2 = *transfer;
        }
        Body::VoteResp { pre, granted } => {
            p.kind = 8;
            p.flag = *pre;
            p.flag2 = *granted;
        }
    }
    p
}

fn message_from_pb(p: PbMessage) -> Result<Message, Invalid> {
    let body = match p.kind {
        1 => Body::Append {
            prev_index: p.index,
            prev_term: p.log_term,
            entries: p
                .entries
                .into_iter()
                .map(Entry::try_from)
                .collect::<Result<_, _>>()?,
            commit: p.commit,
        },
        2 => Body::AppendResp {
            index: p.index,
            reject: p.flag,
        },
        3 => Body::Heartbeat {
            commit: p.commit,
            read: p.read,
            held: p.held,
        },
        4 => Body::HeartbeatResp { read: p.read },
        5 => {
            let meta = p
                .snapshot_meta
                .ok_or_else(|| Invalid("snapshot message without metadata".into()))?;
            Body::Snapshot {
                snapshot: Snapshot {
                    meta: SnapshotMeta::try_from(meta)?,
                    data: p.snapshot_data,
                },
            }
        }
        6 => Body::TimeoutNow,
        7 => Body::Vote {
            pre: p.flag,
            last_index: p.index,
            last_term: p.log_term,
            transfer: p.flag2,
        },
        8 => Body::VoteResp {
            pre: p.flag,
            granted: p.flag2,
        },
        k => return Err(Invalid(format!("unknown Raft message kind {k}"))),
    };
    Ok(Message {
        from: p.from,
        to: p.to,
        term: p.term,
        body,
        witness: p.witness.map(KnownWitness::from),
    })
}

impl Envelope {
    pub fn encode(&self) -> Vec<u8> {
        let p = match self {
            Envelope::Raft(m) => PbEnvelope {
                raft: Some(message_to_pb(m)),
                ..Default::default()
            },
            Envelope::Forward { term, data } => PbEnvelope {
                kind: 1,
                forward: data.clone(),
                term: *term,
                ..Default::default()
            },
            Envelope::ForwardMember(data) => PbEnvelope {
                kind: 4,
                forward: data.clone(),
                ..Default::default()
            },
            Envelope::ReadIndex { ctx } => PbEnvelope {
                kind: 2,
                ctx: *ctx,
                ..Default::default()
            },
            Envelope::ReadIndexResp { ctx, index } => PbEnvelope {
                kind: 3,
                ctx: *ctx,
                index: *index,
                ..Default::default()
            },
            Envelope::LeaseAsk { ctx, id, renew } => PbEnvelope {
                kind: 5,
                ctx: *ctx,
                lease: *id,
                flag: *renew,
                ..Default::default()
            },
            Envelope::LeaseAnswer {
                ctx,
                leader,
                ttl,
                granted,
            } => PbEnvelope {
                kind: 6,
                ctx: *ctx,
                flag: *leader,
                ttl: *ttl,
                granted: *granted,
                ..Default::default()
            },
        };
        p.encode_to_vec()
    }

    pub fn decode(bytes: &[u8]) -> Result<Envelope, Invalid> {
        let p = PbEnvelope::decode(bytes).map_err(|e| Invalid(format!("peer envelope: {e}")))?;
        Ok(match p.kind {
            0 => {
                Envelope::Raft(message_from_pb(p.raft.ok_or_else(|| {
                    Invalid("peer envelope without its Raft message".into())
                })?)?)
            }
            1 => Envelope::Forward {
                term: p.term,
                data: p.forward,
            },
            4 => Envelope::ForwardMember(p.forward),
            2 => Envelope::ReadIndex { ctx: p.ctx },
            3 => Envelope::ReadIndexResp {
                ctx: p.ctx,
                index: p.index,
            },
            5 => Envelope::LeaseAsk {
                ctx: p.ctx,
                id: p.lease,
                renew: p.flag,
            },
            6 => Envelope::LeaseAnswer {
                ctx: p.ctx,
                leader: p.flag,
                ttl: p.ttl,
                granted: p.granted,
            },
            k => return Err(Invalid(format!("unknown peer envelope kind {k}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::{EntryData, Membership};

    /// One envelope of every kind, every Raft message kind among them.
    fn every_envelope() -> Vec<Envelope> {
        let msg = |body| {
            Envelope::Raft(Message {
                from: 1,
                to: 2,
                term: 7,
                body,
                witness: Some(crate::storage::codec::sample_known_witness()),
            })
        };
        let entry = Entry {
            term: 7,
            subterm: 2,
            index: 10,
            data: EntryData::Normal(b"x".to_vec()),
        };
        vec![
            msg(Body::Append {
                prev_index: 9,
                prev_term: 6,
                entries: vec![entry],
                commit: 8,
            }),
            msg(Body::AppendResp {
                index: 10,
                reject: true,
            }),
            // (held 0: as members before it was sent, see the test below)
            msg(Body::Heartbeat {
                commit: 3,
                read: 4,
                held: 0,
            }),
            msg(Body::HeartbeatResp { read: 4 }),
            msg(Body::Snapshot {
                snapshot: Snapshot {
                    meta: SnapshotMeta {
                        index: 5,
                        term: 2,
                        subterm: 1,
                        membership: Membership::new([1, 2], Some(3)).unwrap(),
                    },
                    data: bytes::Bytes::from_static(b"data"),
                },
            }),
            msg(Body::TimeoutNow),
            msg(Body::Vote {
                pre: true,
                last_index: 4,
                last_term: 3,
                transfer: true,
            }),
            msg(Body::VoteResp {
                pre: false,
                granted: true,
            }),
            // Term 0: as members before the term was sent (see the test below).
            Envelope::Forward {
                term: 0,
                data: b"proposal".to_vec(),
            },
            Envelope::ForwardMember(b"member".to_vec()),
            Envelope::ReadIndex { ctx: 9 },
            Envelope::ReadIndexResp { ctx: 9, index: 12 },
            Envelope::LeaseAsk {
                ctx: 3,
                id: 77,
                renew: true,
            },
            Envelope::LeaseAnswer {
                ctx: 3,
                leader: true,
                ttl: 9,
                granted: 10,
            },
        ]
    }

    #[test]
    fn every_envelope_round_trips_and_garbage_is_an_error() {
        for e in every_envelope() {
            assert_eq!(Envelope::decode(&e.encode()).unwrap(), e);
        }
        assert!(Envelope::decode(b"\x18\x09").is_err(), "unknown kind");
        assert!(Envelope::decode(b"\xff\xff\xff").is_err());
        assert!(
            Envelope::decode(&[]).is_err(),
            "a Raft envelope needs its message"
        );
    }

    /// The bytes a member sends are those earlier releases send and expect (a member that was
    /// not upgraded yet must understand its peer): a change of the messages' definitions that
    /// changes the encoding fails here.
    #[test]
    fn the_encoding_is_that_of_earlier_releases() {
        let mut all = Vec::new();
        for e in every_envelope() {
            all.extend(e.encode());
        }
        assert_eq!((all.len(), crc32c::crc32c(&all)), (303, 2413197245));
    }

    /// A forwarded proposal names its term in a field earlier releases skip (they append it in
    /// any term, as before); one from an earlier release names none (0: appended in any term).
    #[test]
    fn a_forwarded_proposal_adds_its_term_as_a_new_field() {
        let data = b"proposal".to_vec();
        let old = Envelope::Forward {
            term: 0,
            data: data.clone(),
        }
        .encode();
        let new = Envelope::Forward { term: 7, data }.encode();
        assert_eq!(Envelope::decode(&new).unwrap().encode(), new);
        // Field 10, varint: tag (10 << 3) = 0x50, then 7.
        assert_eq!(new, [old.as_slice(), &[0x50, 7]].concat());
    }

    /// A heartbeat says what every member holds in a field earlier releases skip (they keep
    /// their log in memory, as before); one from an earlier release says 0 (keep everything).
    #[test]
    fn a_heartbeat_adds_what_every_member_holds_as_a_new_field() {
        let heartbeat = |held| {
            Envelope::Raft(Message {
                from: 1,
                to: 2,
                term: 3,
                body: Body::Heartbeat {
                    commit: 3,
                    read: 4,
                    held,
                },
                witness: None,
            })
            .encode()
        };
        let (old, new) = (heartbeat(0), heartbeat(7));
        assert_eq!(Envelope::decode(&new).unwrap().encode(), new);
        // The message is the envelope's last field: its length grows by the new field's two
        // bytes, field 15 as a varint (tag 15 << 3 = 0x78), then 7.
        assert_eq!(new.len(), old.len() + 2);
        assert!(new.ends_with(&[0x78, 7]), "{new:x?}");
    }
}
