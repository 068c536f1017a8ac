//! Configuration of one Raft node, in ticks (the host turns milliseconds into ticks).

use super::errors::ConfigError;
use super::types::{NONE, NodeId};

/// How a node behaves. Validated once by [`Config::validate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub id: NodeId,
    /// The cluster id, sent to the witness (which binds to it).
    pub cluster_id: u64,
    /// Ticks without a leader before a follower campaigns (randomized in [n, 2n), or in
    /// [n, n + max(2, n/5)) with at most two regular voters and a witness).
    pub election_tick: u64,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_tick: u64,
    pub pre_vote: bool,
    pub check_quorum: bool,
    /// Append messages in flight to one follower in the replicate state.
    pub max_inflight: usize,
    /// Entries per Append message.
    pub max_batch: usize,
    /// Seed of the node's only randomness (election timeouts).
    pub seed: u64,
    /// A deliberate bug (tests of the simulator only).
    #[cfg(feature = "mutations")]
    pub mutation: Option<super::mutation::Mutation>,
}

impl Config {
    pub fn new(id: NodeId) -> Self {
        Config {
            id,
            cluster_id: 0x1,
            election_tick: 10,
            heartbeat_tick: 1,
            pre_vote: true,
            check_quorum: true,
            max_inflight: 256,
            max_batch: 64,
            seed: id,
            #[cfg(feature = "mutations")]
            mutation: None,
        }
    }

    /// A leader adjusts the replication set when a member has been silent this long: faster than
    /// a follower's election timeout, slower than a few heartbeats.
    pub fn liveness_ticks(&self) -> u64 {
        (self.election_tick / 2).max(2 * self.heartbeat_tick)
    }

    /// Checks the settings; the message names the setting and the fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.id == NONE {
            return Err(ConfigError::ZeroId);
        }
        if self.heartbeat_tick == 0 {
            return Err(ConfigError::ZeroHeartbeat);
        }
        if self.election_tick <= self.liveness_ticks()
            || self.election_tick < 3 * self.heartbeat_tick
        {
            return Err(ConfigError::ElectionTooShort {
                election: self.election_tick,
                heartbeat: self.heartbeat_tick,
            });
        }
        if self.max_inflight == 0 || self.max_batch == 0 {
            return Err(ConfigError::ZeroFlowControl);
        }
        Ok(())
    }
}
