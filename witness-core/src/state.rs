//! The witness state: everything the witness knows, persisted as one record.
//!
//! Invariants (see `shared/design/extended-raft.md`, "Witness state"):
//! - nothing here is volatile: a witness step is load -> rule -> compare-and-swap of this record;
//! - `term` never decreases, and `(last_log_term, last_log_subterm)` only grows;
//! - a term change clears `voted_for` but never the log position or the replication sets;
//! - `cluster_id == 0` means "not bound yet"; once bound it never changes;
//! - `generation` is made once, at `etcdutl witness init`, and never changes: storage that was
//!   wiped and initialised again is a different witness, however alike its files look. A member
//!   remembers the generation and the newest history it saw ([`Seen`]) and refuses a witness
//!   that does not match (`rules`).

/// Member id 0 is "none" (as in etcd and raft-rs): no vote, no member.
pub const NONE: u64 = 0;

/// The persisted witness state.
///
/// Encoded with prost (protobuf field numbers below are part of the on-disk format, see
/// `docs/witness-format.md`) inside the framed record of [`crate::codec`].
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct WitnessState {
    /// The cluster this witness belongs to; 0 until the first request from a cluster binds it.
    #[prost(uint64, tag = "1")]
    pub cluster_id: u64,
    /// The witness's own member id (derived by the cluster from its peer URL).
    #[prost(uint64, tag = "2")]
    pub member_id: u64,
    /// The witness member's name (`--name` given to `etcdutl witness init`).
    #[prost(string, tag = "3")]
    pub name: String,
    /// The witness's advertised peer URL (`witness:...`), for status output.
    #[prost(string, tag = "4")]
    pub peer_url: String,
    /// The latest term the witness has seen.
    #[prost(uint64, tag = "5")]
    pub term: u64,
    /// Whom the witness voted for in `term`, or [`NONE`].
    #[prost(uint64, tag = "6")]
    pub voted_for: u64,
    /// Term of the last entry the witness acknowledged.
    #[prost(uint64, tag = "7")]
    pub last_log_term: u64,
    /// Subterm of the last entry the witness acknowledged.
    #[prost(uint64, tag = "8")]
    pub last_log_subterm: u64,
    /// Index of the last entry the witness acknowledged (informational).
    #[prost(uint64, tag = "9")]
    pub last_log_index: u64,
    /// The replication set recorded with the last acknowledged entry (sorted member ids).
    #[prost(uint64, repeated, tag = "10")]
    pub replication_set: Vec<u64>,
    /// The outgoing half's replication set during a joint configuration, else empty.
    #[prost(uint64, repeated, tag = "11")]
    pub replication_set_outgoing: Vec<u64>,
    /// A random number chosen by the writer of this version; identifies who won a race
    /// whose reply was lost.
    #[prost(uint64, tag = "12")]
    pub writer_nonce: u64,
    /// Random, non-zero, made by `etcdutl witness init` and never changed after: which witness
    /// this is. 0 only in records written before generations existed.
    #[prost(uint64, tag = "13")]
    pub generation: u64,
    /// The writer nonce of the state this one was computed from (set by the witness client):
    /// on a mount, a writer whose predecessor was cleaned up tells from its successor's
    /// `previous_nonce` whether others built on its write. 0 when unknown (a first version, a
    /// record written before this field existed).
    #[prost(uint64, tag = "14")]
    pub previous_nonce: u64,
}

/// What a member has seen of its witness: the generation it is bound to and the newest term and
/// log position it saw the witness hold. A witness never goes back on these (its term and
/// position only grow), so a witness whose generation differs, or whose term or position is
/// older, lost its state: it was wiped and initialised again, or restored from an old copy, and
/// its votes can no longer be trusted.
///
/// All zero ([`Seen::NOTHING`]) means nothing is known: any witness is accepted (a member whose
/// data directory predates generations, until it first sees its witness).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Seen {
    pub generation: u64,
    pub term: u64,
    pub log_term: u64,
    pub log_subterm: u64,
}

impl Seen {
    /// Nothing known: every witness passes the check.
    pub const NOTHING: Seen = Seen {
        generation: 0,
        term: 0,
        log_term: 0,
        log_subterm: 0,
    };

    /// What `state` shows.
    pub fn of(state: &WitnessState) -> Seen {
        Seen {
            generation: state.generation,
            term: state.term,
            log_term: state.last_log_term,
            log_subterm: state.last_log_subterm,
        }
    }

    /// The log position seen, compared lexicographically.
    pub fn position(&self) -> (u64, u64) {
        (self.log_term, self.log_subterm)
    }

    /// This knowledge combined with a later sighting `other` of the same witness: the newest
    /// term and position of the two. A sighting of another generation changes nothing (the
    /// member keeps refusing the witness it does not know); one with a generation where none was
    /// known is adopted whole.
    pub fn merge(self, other: Seen) -> Seen {
        if self.generation == 0 && other.generation != 0 {
            return other.merge(Seen {
                generation: other.generation,
                ..self
            });
        }
        if other.generation != self.generation {
            return self;
        }
        Seen {
            generation: self.generation,
            term: self.term.max(other.term),
            log_term: self.position().max(other.position()).0,
            log_subterm: self.position().max(other.position()).1,
        }
    }
}

impl WitnessState {
    /// The state `etcdutl witness init` writes: identity only, term 0, no vote, empty log, and
    /// a new random generation.
    pub fn new(member_id: u64, name: impl Into<String>, peer_url: impl Into<String>) -> Self {
        use rand::Rng;
        WitnessState {
            member_id,
            name: name.into(),
            peer_url: peer_url.into(),
            generation: rand::rng().random_range(1..=u64::MAX),
            ..WitnessState::default()
        }
    }

    /// This state with a new random, non-zero writer nonce (call before every write).
    pub fn with_fresh_nonce(self) -> Self {
        use rand::Rng;
        WitnessState {
            writer_nonce: rand::rng().random_range(1..=u64::MAX),
            ..self
        }
    }

    /// This state, computed from `previous`, ready to replace it: a fresh writer nonce, and
    /// `previous`'s writer nonce as its `previous_nonce`.
    pub fn succeeding(self, previous: &WitnessState) -> Self {
        WitnessState {
            previous_nonce: previous.writer_nonce,
            ..self
        }
        .with_fresh_nonce()
    }

    /// The (term, subterm) of the last acknowledged entry, compared lexicographically.
    pub fn last_log_position(&self) -> (u64, u64) {
        (self.last_log_term, self.last_log_subterm)
    }

    /// True when the state differs from `other` in anything but the nonces of its writer and of
    /// the version it replaced.
    pub fn same_content(&self, other: &WitnessState) -> bool {
        let content = |s: &WitnessState| WitnessState {
            writer_nonce: 0,
            previous_nonce: 0,
            ..s.clone()
        };
        content(self) == content(other)
    }
}
