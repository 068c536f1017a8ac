//! The Raft core's data: entries (with subterms), hard state, membership, messages between
//! regular nodes, witness requests, and the `Ready` batch a host processes.
//!
//! Invariants: entry indexes start at 1 and are contiguous in a log; every entry carries the term
//! AND subterm in which its leader appended it; the witness never appears as the sender or
//! receiver of a [`Message`] (it is reached only through [`WitnessRequest`]).

use std::collections::BTreeSet;

use witness_core::rules::{AppendReply, AppendRequest, VoteReply, VoteRequest};

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
}

/// The voters: regular members and at most one witness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    pub regular: BTreeSet<NodeId>,
    pub witness: Option<NodeId>,
}

impl Membership {
    /// A configuration; the error names what is wrong.
    ///
    /// A witness needs at least two regular voters: R always holds the leader and has as many
    /// members as there are regular voters, so beside a single regular voter the witness could
    /// never enter R, never acknowledge, and the two-voter quorum could never commit.
    pub fn new(
        regular: impl IntoIterator<Item = NodeId>,
        witness: Option<NodeId>,
    ) -> Result<Self, String> {
        let regular: BTreeSet<NodeId> = regular.into_iter().collect();
        if regular.is_empty() {
            return Err("a configuration needs at least one regular voter".into());
        }
        if regular.contains(&NONE) || witness == Some(NONE) {
            return Err("member id 0 is reserved".into());
        }
        if let Some(w) = witness {
            if regular.contains(&w) {
                return Err(format!(
                    "member {w:x} cannot be both a regular voter and the witness"
                ));
            }
            if regular.len() < 2 {
                return Err("a witness needs at least two regular voters (with one, it could never acknowledge anything); add a regular member or drop the witness".into());
            }
        }
        Ok(Membership { regular, witness })
    }

    /// Number of voters, the witness included.
    pub fn voters(&self) -> usize {
        self.regular.len() + usize::from(self.witness.is_some())
    }

    /// Votes (or acknowledgements) that make a majority of all voters.
    pub fn quorum(&self) -> usize {
        self.voters() / 2 + 1
    }

    pub fn is_voter(&self, id: NodeId) -> bool {
        self.regular.contains(&id) || self.witness == Some(id)
    }
}

/// A message between regular nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub from: NodeId,
    pub to: NodeId,
    /// The sender's term (for a granted pre-vote response: the term asked about).
    pub term: u64,
    pub body: Body,
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
    /// Leader -> follower: I am alive; the commit index the follower may use (bounded by its match).
    Heartbeat {
        commit: u64,
    },
    HeartbeatResp,
    /// Candidate -> voter (for a pre-vote, `term` is the term the candidate would campaign in).
    Vote {
        pre: bool,
        last_index: u64,
        last_term: u64,
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
}

/// The witness's answer, stepped back into the node by the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WitnessResponse {
    Append {
        request: AppendRequest,
        reply: AppendReply,
    },
    Vote {
        pre: bool,
        request: VoteRequest,
        reply: VoteReply,
    },
    /// The step failed (storage unavailable, corrupt, another cluster...): nothing is known.
    Failed { request: WitnessRequest },
}

/// What the host must do, in this order: persist `entries` and `hard_state`; then send
/// `messages` and run `witness_requests`; then apply `committed`; then call `advance`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ready {
    pub hard_state: Option<HardState>,
    /// Entries to persist, replacing any persisted entries at the same indexes and after.
    pub entries: Vec<Entry>,
    pub messages: Vec<Message>,
    pub witness_requests: Vec<WitnessRequest>,
    pub committed: Vec<Entry>,
}

impl Ready {
    pub fn is_empty(&self) -> bool {
        self.hard_state.is_none()
            && self.entries.is_empty()
            && self.messages.is_empty()
            && self.witness_requests.is_empty()
            && self.committed.is_empty()
    }
}
