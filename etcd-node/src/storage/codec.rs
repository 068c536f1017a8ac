//! Protobuf encodings (prost) of what the node persists and sends: entries, hard state,
//! snapshot metadata with its configuration. Field numbers are part of the on-disk format
//! (`docs/formats.md`); never renumber. Decoding validates: a record that does not describe a
//! valid entry or configuration is an error, never a panic.

use prost::Message;

use crate::raft::{
    Change, ChangeKind, ConfChange, Entry, EntryData, HardState, KnownWitness, Membership,
    SnapshotMeta, Voters,
};

#[derive(Clone, PartialEq, prost::Message)]
pub struct PbChange {
    /// 1 add voter, 2 add learner, 3 add witness, 4 remove.
    #[prost(uint32, tag = "1")]
    pub kind: u32,
    #[prost(uint64, tag = "2")]
    pub node: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PbEntry {
    #[prost(uint64, tag = "1")]
    pub term: u64,
    #[prost(uint64, tag = "2")]
    pub subterm: u64,
    #[prost(uint64, tag = "3")]
    pub index: u64,
    /// 0 empty, 1 normal, 2 configuration change.
    #[prost(uint32, tag = "4")]
    pub kind: u32,
    #[prost(bytes = "vec", tag = "5")]
    pub data: Vec<u8>,
    #[prost(message, repeated, tag = "6")]
    pub changes: Vec<PbChange>,
    /// A configuration change's witness generation (see `ConfChange::witness_generation`).
    #[prost(uint64, tag = "7")]
    pub witness_generation: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PbHardState {
    #[prost(uint64, tag = "1")]
    pub term: u64,
    #[prost(uint64, tag = "2")]
    pub vote: u64,
    #[prost(uint64, tag = "3")]
    pub commit: u64,
    /// What the member knows of its witness (absent: nothing).
    #[prost(message, optional, tag = "4")]
    pub witness: Option<PbKnownWitness>,
}

/// A [`KnownWitness`]: in the hard state, and on a leader's messages.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PbKnownWitness {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub generation: u64,
    #[prost(uint64, tag = "3")]
    pub term: u64,
    #[prost(uint64, tag = "4")]
    pub log_term: u64,
    #[prost(uint64, tag = "5")]
    pub log_subterm: u64,
}

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

#[derive(Clone, PartialEq, prost::Message)]
pub struct PbVoters {
    #[prost(uint64, repeated, tag = "1")]
    pub regular: Vec<u64>,
    /// 0: no witness.
    #[prost(uint64, tag = "2")]
    pub witness: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PbSnapshotMeta {
    #[prost(uint64, tag = "1")]
    pub index: u64,
    #[prost(uint64, tag = "2")]
    pub term: u64,
    #[prost(uint64, tag = "3")]
    pub subterm: u64,
    #[prost(message, optional, tag = "4")]
    pub voters: Option<PbVoters>,
    #[prost(message, optional, tag = "5")]
    pub outgoing: Option<PbVoters>,
    #[prost(uint64, repeated, tag = "6")]
    pub learners: Vec<u64>,
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
}
