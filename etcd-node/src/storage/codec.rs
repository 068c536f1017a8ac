//! Protobuf encodings of what the node persists and sends: entries, hard state, snapshot
//! metadata with its configuration, defined in `proto/raft.proto` (field numbers are part of
//! the on-disk format, `docs/formats.md`: never renumber). Decoding validates: a record that
//! does not describe a valid entry or configuration is an error, never a panic.

use prost::Message;

/// The messages of `proto/raft.proto`.
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/etcdnode.raft.rs"));
}
pub use pb::{
    Change as PbChange, Entry as PbEntry, HardState as PbHardState, KnownWitness as PbKnownWitness,
    SnapshotMeta as PbSnapshotMeta, Voters as PbVoters,
};

use crate::raft::{
    Change, ChangeKind, ConfChange, Entry, EntryData, HardState, KnownWitness, Membership,
    SnapshotMeta, Voters,
};

impl From<KnownWitness> for PbKnownWitness {
    fn from(k: KnownWitness) -> Self {
        PbKnownWitness {
            id: k.id,
            generation: k.seen.generation,
            term: k.seen.term,
            log_term: k.seen.log_term,
            log_subterm: k.seen.log_subterm,
        }
    }
}

impl From<PbKnownWitness> for KnownWitness {
    fn from(p: PbKnownWitness) -> Self {
        KnownWitness {
            id: p.id,
            seen: witness_core::Seen {
                generation: p.generation,
                term: p.term,
                log_term: p.log_term,
                log_subterm: p.log_subterm,
            },
        }
    }
}

/// A record that does not decode into a valid value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

fn kind_code(kind: ChangeKind) -> u32 {
    match kind {
        ChangeKind::AddVoter => 1,
        ChangeKind::AddLearner => 2,
        ChangeKind::AddWitness => 3,
        ChangeKind::Remove => 4,
    }
}

impl From<&Entry> for PbEntry {
    fn from(e: &Entry) -> Self {
        let witness_generation = match &e.data {
            EntryData::ConfChange(cc) => cc.witness_generation,
            _ => 0,
        };
        let (kind, data, changes) = match &e.data {
            EntryData::Empty => (0, Vec::new(), Vec::new()),
            EntryData::Normal(d) => (1, d.clone(), Vec::new()),
            EntryData::ConfChange(cc) => (
                2,
                cc.context.clone(),
                cc.changes
                    .iter()
                    .map(|c| PbChange {
                        kind: kind_code(c.kind),
                        node: c.node,
                    })
                    .collect(),
            ),
        };
        PbEntry {
            term: e.term,
            subterm: e.subterm,
            index: e.index,
            kind,
            data,
            changes,
            witness_generation,
        }
    }
}

impl TryFrom<PbEntry> for Entry {
    type Error = Invalid;
    fn try_from(p: PbEntry) -> Result<Self, Invalid> {
        let data = match p.kind {
            0 => EntryData::Empty,
            1 => EntryData::Normal(p.data),
            2 => EntryData::ConfChange(ConfChange {
                changes: p
                    .changes
                    .iter()
                    .map(|c| {
                        let kind = match c.kind {
                            1 => ChangeKind::AddVoter,
                            2 => ChangeKind::AddLearner,
                            3 => ChangeKind::AddWitness,
                            4 => ChangeKind::Remove,
                            k => return Err(Invalid(format!("unknown change kind {k}"))),
                        };
                        Ok(Change { kind, node: c.node })
                    })
                    .collect::<Result<_, _>>()?,
                context: p.data,
                witness_generation: p.witness_generation,
            }),
            k => return Err(Invalid(format!("entry {}: unknown kind {k}", p.index))),
        };
        if p.index == 0 {
            return Err(Invalid("entry with index 0".into()));
        }
        Ok(Entry {
            term: p.term,
            subterm: p.subterm,
            index: p.index,
            data,
        })
    }
}

impl From<HardState> for PbHardState {
    fn from(h: HardState) -> Self {
        PbHardState {
            term: h.term,
            vote: h.vote,
            commit: h.commit,
            witness: h.witness.map(PbKnownWitness::from),
        }
    }
}

impl From<PbHardState> for HardState {
    fn from(p: PbHardState) -> Self {
        HardState {
            term: p.term,
            vote: p.vote,
            commit: p.commit,
            witness: p.witness.map(KnownWitness::from),
        }
    }
}

fn pb_voters(v: &Voters) -> PbVoters {
    PbVoters {
        regular: v.regular.iter().copied().collect(),
        witness: v.witness.unwrap_or(0),
    }
}

fn voters(p: &PbVoters) -> Voters {
    Voters {
        regular: p.regular.iter().copied().collect(),
        witness: (p.witness != 0).then_some(p.witness),
    }
}

impl From<&SnapshotMeta> for PbSnapshotMeta {
    fn from(m: &SnapshotMeta) -> Self {
        PbSnapshotMeta {
            index: m.index,
            term: m.term,
            subterm: m.subterm,
            voters: Some(pb_voters(&m.membership.voters)),
            outgoing: m.membership.outgoing.as_ref().map(pb_voters),
            learners: m.membership.learners.iter().copied().collect(),
        }
    }
}

impl TryFrom<PbSnapshotMeta> for SnapshotMeta {
    type Error = Invalid;
    fn try_from(p: PbSnapshotMeta) -> Result<Self, Invalid> {
        let incoming = p
            .voters
            .as_ref()
            .ok_or_else(|| Invalid("snapshot metadata without voters".into()))?;
        Ok(SnapshotMeta {
            index: p.index,
            term: p.term,
            subterm: p.subterm,
            membership: Membership {
                voters: voters(incoming),
                outgoing: p.outgoing.as_ref().map(voters),
                learners: p.learners.iter().copied().collect(),
            },
        })
    }
}

/// Encodes a prost message to bytes.
pub fn encode<M: Message>(m: &M) -> Vec<u8> {
    m.encode_to_vec()
}

/// Decodes a prost message, naming `what` in the error.
pub fn decode<M: Message + Default>(what: &str, bytes: &[u8]) -> Result<M, Invalid> {
    M::decode(bytes).map_err(|e| Invalid(format!("{what}: {e}")))
}

/// What a member saw of its witness, for the encoding tests here and of the peer messages.
#[cfg(test)]
pub(crate) fn sample_known_witness() -> KnownWitness {
    KnownWitness {
        id: 3,
        seen: witness_core::Seen {
            generation: 0xfeed,
            term: 6,
            log_term: 6,
            log_subterm: 2,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_metadata_round_trip() {
        let entries = [
            Entry {
                term: 3,
                subterm: 2,
                index: 9,
                data: EntryData::Empty,
            },
            Entry {
                term: 3,
                subterm: 2,
                index: 10,
                data: EntryData::Normal(b"put".to_vec()),
            },
            Entry {
                term: 3,
                subterm: 2,
                index: 11,
                data: EntryData::ConfChange(ConfChange::single(ChangeKind::AddWitness, 7)),
            },
        ];
        for e in entries {
            let bytes = encode(&PbEntry::from(&e));
            let back: Entry = decode::<PbEntry>("entry", &bytes)
                .unwrap()
                .try_into()
                .unwrap();
            assert_eq!(back, e);
        }
        let meta = SnapshotMeta {
            index: 5,
            term: 2,
            subterm: 1,
            membership: Membership::new([1, 2], Some(3)).unwrap(),
        };
        let bytes = encode(&PbSnapshotMeta::from(&meta));
        let back: SnapshotMeta = decode::<PbSnapshotMeta>("meta", &bytes)
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(back, meta);
        let bad = PbEntry {
            kind: 9,
            index: 1,
            ..Default::default()
        };
        assert!(Entry::try_from(bad).is_err());
    }

    /// The bytes of the WAL's records and of snapshot metadata are those earlier releases wrote
    /// (an existing data directory must still read): a change of the definitions that changes
    /// the encoding fails here.
    #[test]
    fn the_encoding_is_that_of_earlier_releases() {
        let witness = sample_known_witness();
        let mut change = ConfChange::single(ChangeKind::AddWitness, 7);
        change.witness_generation = 0xfeed;
        change.context = b"member".to_vec();
        let entry = Entry {
            term: 3,
            subterm: 2,
            index: 11,
            data: EntryData::ConfChange(change),
        };
        let hard_state = HardState {
            term: 4,
            vote: 1,
            commit: 9,
            witness: Some(witness),
        };
        let mut membership = Membership::new([1, 2], Some(3)).unwrap();
        membership.learners.insert(5);
        membership.outgoing = Some(Membership::new([1, 2, 4], None).unwrap().voters);
        let meta = SnapshotMeta {
            index: 5,
            term: 2,
            subterm: 1,
            membership,
        };
        let mut all = encode(&PbEntry::from(&entry));
        all.extend(encode(&PbHardState::from(hard_state)));
        all.extend(encode(&PbSnapshotMeta::from(&meta)));
        assert_eq!((all.len(), crc32c::crc32c(&all)), (70, 2730460092));
    }
}
