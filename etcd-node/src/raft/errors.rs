//! Why the Raft core refuses a node's configuration or a cluster configuration. Each message is
//! what the operator reads (etcd-node adds the flag or the request it came from).

use super::NodeId;

/// A node's [`Config`](super::Config) that cannot run ([`Raft::new`](super::Raft::new)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("raft id must not be 0")]
    ZeroId,
    #[error("heartbeat tick must be at least 1")]
    ZeroHeartbeat,
    #[error(
        "election timeout ({election} ticks) must be at least 3 heartbeats ({heartbeat} ticks each) so the leader can adjust its replication set before followers time out"
    )]
    ElectionTooShort { election: u64, heartbeat: u64 },
    #[error("max inflight messages and max batch entries must be at least 1")]
    ZeroFlowControl,
}

/// A configuration of voters that cannot be, or a change that cannot apply to the current one
/// ([`Membership::new`](super::Membership::new), [`Membership::apply`](super::Membership::apply)).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    #[error("a configuration needs at least one regular voter")]
    NoRegularVoter,
    #[error("member id 0 is reserved")]
    ReservedId,
    #[error("member {0:x} cannot be both a regular voter and the witness")]
    WitnessIsRegular(NodeId),
    #[error(
        "a witness needs at least two regular voters (with one, it could never acknowledge anything); add a regular member or remove the witness first"
    )]
    WitnessWithOneVoter,
    #[error("not in a joint configuration: nothing to leave")]
    NotJoint,
    #[error("a joint configuration is still in effect; wait until it is left")]
    StillJoint,
    #[error(
        "member {0:x} is the witness; a witness never becomes a regular member or learner (add the machine under a new member id)"
    )]
    WitnessCannotBecomeMember(NodeId),
    #[error("member {0:x} is the witness")]
    IsTheWitness(NodeId),
    #[error("member {0:x} is a voter; remove it before adding it as a learner")]
    VoterAsLearner(NodeId),
    #[error(
        "the cluster already has a witness ({0:x}); remove it first (one witness per configuration)"
    )]
    SecondWitness(NodeId),
    #[error("member {0:x} is a regular member; a witness needs its own member id")]
    RegularAsWitness(NodeId),
    #[error("member {0:x} is not in the configuration")]
    NotAMember(NodeId),
    #[error("replace the witness in two changes: remove the old one, then add the new one")]
    WitnessReplacedAtOnce,
    #[error("add the witness in a change of its own")]
    WitnessAddedWithOthers,
}
