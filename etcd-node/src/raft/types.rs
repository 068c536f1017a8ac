//! The Raft core's data: entries (with subterms), hard state, membership, messages between
//! regular nodes, witness requests, and the `Ready` batch a host processes.
//!
//! Invariants: entry indexes start at 1 and are contiguous in a log; every entry carries the term
//! AND subterm in which its leader appended it; the witness never appears as the sender or
//! receiver of a [`Message`] (it is reached only through [`WitnessRequest`]).

use witness_core::Seen;
use witness_core::rules::{AppendReply, AppendRequest, Caller, VoteReply, VoteRequest};

use super::membership::{ConfChange, Membership};

/// A member id; 0 means none.
pub type NodeId = u64;
/// "No node".
pub const NONE: NodeId = 0;

/// What an entry carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryData {
    /// The entry a leader appends when it takes office and at every subterm change.
    Empty,
    /// An application command.
    Normal(Vec<u8>),
    /// A configuration change, in effect once applied.
    ConfChange(ConfChange),
}

/// A log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub term: u64,
    pub subterm: u64,
    pub index: u64,
    pub data: EntryData,
}

/// What must survive a crash besides the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HardState {
    pub term: u64,
    pub vote: NodeId,
    pub commit: u64,
    /// What this member knows of its witness (none: no witness seen yet).
    pub witness: Option<KnownWitness>,
}

/// What a member knows of witness member `id`: the generation it is bound to and the newest term
/// and log position it (or its leader) saw the witness hold. Every witness step carries it, and
/// the witness rules refuse a witness that is not that one or is older (`witness_core::Seen`).
/// Kept in the hard state; a leader sends it with its appends, heartbeats and snapshots, so a
/// member that was down while the leader used the witness learns it once it follows again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KnownWitness {
    pub id: NodeId,
    pub seen: Seen,
}

impl KnownWitness {
    /// This knowledge updated with `other`: another witness replaces it; the same witness merges
    /// (see [`Seen::merge`]: the newest history, never another generation).
    pub fn learn(current: Option<KnownWitness>, other: KnownWitness) -> KnownWitness {
        match current {
            Some(k) if k.id == other.id => KnownWitness {
                id: k.id,
                seen: k.seen.merge(other.seen),
            },
            _ => other,
        }
    }
}

/// A snapshot's description: the last entry it covers and the configuration at that entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotMeta {
    pub index: u64,
    pub term: u64,
    /// The subterm of the entry at `index` (the log's position survives compaction).
    pub subterm: u64,
    pub membership: Membership,
}

/// A snapshot: the state machine's data at `meta.index`, opaque to Raft. The data is shared,
/// not copied, when a snapshot is cloned (into a message, into storage): a key space of
/// hundreds of MB exists once in memory however many messages carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub meta: SnapshotMeta,
    pub data: bytes::Bytes,
}

/// A linearizable read may be served once the state machine has applied `index`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadState {
    pub index: u64,
    /// The context the host passed to `read_index`.
    pub ctx: Vec<u8>,
}

/// A message between regular nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub from: NodeId,
    pub to: NodeId,
    /// The sender's term (for a granted pre-vote response: the term asked about).
    pub term: u64,
    pub body: Body,
    /// A leader's knowledge of its witness, for the follower to learn (see [`KnownWitness`]).
    pub witness: Option<KnownWitness>,
}

/// What a [`Message`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Leader -> follower: entries after `(prev_index, prev_term)`, and the leader's commit.
    Append {
        prev_index: u64,
        prev_term: u64,
        entries: Vec<Entry>,
        commit: u64,
    },
    /// Follower -> leader. On success `index` is the follower's last matching index; on reject,
    /// a hint: the follower's last index.
    AppendResp {
        index: u64,
        reject: bool,
    },
    /// Leader -> follower: I am alive; the commit index the follower may use (bounded by its
    /// match); `read`: the ReadIndex round this heartbeat confirms (0: none); `held`: an index
    /// every regular member holds (the follower may drop the entries up to it from memory; 0
    /// from a release before it said so).
    Heartbeat {
        commit: u64,
        read: u64,
        held: u64,
    },
    /// Echoes the heartbeat's read round.
    HeartbeatResp {
        read: u64,
    },
    /// Leader -> follower behind the compacted log: install this snapshot. Answered with
    /// `AppendResp`.
    Snapshot {
        snapshot: Snapshot,
    },
    /// Leader -> transfer target: campaign now (leader transfer).
    TimeoutNow,
    /// Candidate -> voter (for a pre-vote, `term` is the term the candidate would campaign in).
    /// `transfer`: the campaign was asked for by the leader, so voters need not wait out their
    /// leader lease.
    Vote {
        pre: bool,
        last_index: u64,
        last_term: u64,
        transfer: bool,
    },
    VoteResp {
        pre: bool,
        granted: bool,
    },
}

/// A step the host performs against the witness's storage on this node's behalf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WitnessRequest {
    /// AppendToWitness (leader).
    Append(AppendRequest),
    /// RequestVote or pre-vote to the witness (candidate one vote short).
    Vote { pre: bool, request: VoteRequest },
    /// Read the witness's term, so a leader may count it toward ReadIndex round `round`.
    ReadTerm {
        caller: Caller,
        term: u64,
        round: u64,
    },
}

impl WitnessRequest {
    /// The witness member the request is for (its storage is the one to step).
    pub fn witness_id(&self) -> NodeId {
        self.caller().witness_id
    }

    /// Who asks, and what it saw of the witness.
    pub fn caller(&self) -> &Caller {
        match self {
            WitnessRequest::Append(r) => &r.caller,
            WitnessRequest::Vote { request, .. } => &request.caller,
            WitnessRequest::ReadTerm { caller, .. } => caller,
        }
    }
}

/// The witness's answer, stepped back into the node by the host. Every answer carries what the
/// step saw of the witness (the state it answered from, or wrote).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WitnessResponse {
    Append {
        request: AppendRequest,
        reply: AppendReply,
        seen: Seen,
    },
    Vote {
        pre: bool,
        request: VoteRequest,
        reply: VoteReply,
        seen: Seen,
    },
    ReadTerm {
        seen: Seen,
        /// The witness member that was read.
        witness: NodeId,
        /// The leader's term and read round the request carried.
        term: u64,
        round: u64,
        /// The witness's stored term.
        witness_term: u64,
    },
    /// The step failed (storage unavailable, corrupt, another cluster...): nothing is known.
    Failed { request: WitnessRequest },
}

impl WitnessResponse {
    /// The witness member that answered.
    pub fn witness_id(&self) -> NodeId {
        match self {
            WitnessResponse::Append { request, .. } => request.caller.witness_id,
            WitnessResponse::Vote { request, .. } => request.caller.witness_id,
            WitnessResponse::ReadTerm { witness, .. } => *witness,
            WitnessResponse::Failed { request } => request.witness_id(),
        }
    }
}

/// What the host must do, in this order: send `early_messages` (it may, and should, do so
/// before or while it persists); persist `snapshot`, `entries` and `hard_state`; then send
/// `messages` and run `witness_requests`; then apply `snapshot` to the state machine, then
/// `committed`; serve `read_states` once their index is applied; then call `advance`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ready {
    /// A snapshot received from the leader: it replaces the log and the state machine.
    pub snapshot: Option<Snapshot>,
    pub hard_state: Option<HardState>,
    /// Entries to persist, replacing any persisted entries at the same indexes and after.
    pub entries: Vec<Entry>,
    /// A leader's appends and heartbeats, which promise nothing about this node's disk: sending
    /// them while the leader's own fsync runs overlaps the two members' fsyncs (the leader counts
    /// itself toward commit only once `advance` says its entries are persisted). Only a leader
    /// whose term and vote are already persisted has any.
    pub early_messages: Vec<Message>,
    /// Messages that may leave only after this Ready is persisted (votes, append responses...).
    pub messages: Vec<Message>,
    pub witness_requests: Vec<WitnessRequest>,
    pub committed: Vec<Entry>,
    pub read_states: Vec<ReadState>,
}

impl Ready {
    pub fn is_empty(&self) -> bool {
        self.snapshot.is_none()
            && self.read_states.is_empty()
            && self.hard_state.is_none()
            && self.entries.is_empty()
            && self.early_messages.is_empty()
            && self.messages.is_empty()
            && self.witness_requests.is_empty()
            && self.committed.is_empty()
    }
}
