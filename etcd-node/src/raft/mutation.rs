//! Deliberate protocol bugs, so tests can prove the simulator reports each one. They can only be
//! switched on through `Config::mutation`, which exists only with the `mutations` feature (tests;
//! a server built with it takes one from `ETCD_NODE_MUTATION=<name>`, for the fault campaign).

/// A bug to inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// The witness grants a vote without the log rule (simulated witness).
    WitnessVoteWithoutLogRule,
    /// The witness ignores terms: no term check and no record of its vote (simulated witness).
    WitnessIgnoresTerm,
    /// The leader credits the witness (shortcut) without a witness write in the subterm.
    CreditWitnessWithoutWrite,
    /// The leader lets a reachable follower re-enter R before it has caught up.
    ReenterBeforeCatchUp,
    /// The leader answers linearizable reads without confirming its leadership.
    ReadWithoutConfirmation,
    /// Every node sends every message before persisting (votes and append acknowledgements
    /// too), not only a leader's appends and heartbeats.
    SendBeforePersist,
    /// Nodes forget what they saw of the witness: every witness step goes out without the
    /// generation and history to check, so a wiped or reverted witness is trusted.
    ForgetWitnessIdentity,
    /// A node sends its vote replies before its vote is persisted (everything else in order).
    VoteBeforePersist,
    /// The leader counts its own entries toward commit before they are persisted.
    CommitBeforePersist,
    /// The leader credits a witness acknowledgement from an older subterm to the current one.
    CreditStaleSubtermAck,
    /// The host's loop (`server::reads`) answers reads on a leader with its commit index at
    /// once, without a ReadIndex round (a host bug; the core is not changed).
    ReadsWithoutRound,
    /// The host's loop (`server::proposals`) forwards a follower's proposal to the leader twice.
    ForwardTwice,
    /// The host's loop answers a waiting client write "leader changed" as soon as its member
    /// knows of a later term, though the write may still commit under the next leader.
    FailPendingOnNewTerm,
    /// The host's loop appends a forwarded proposal whatever term the follower named.
    ForwardInAnyTerm,
    /// The leader never lets the witness into R: with a regular member down it cannot commit
    /// (an availability bug: only a check made during the fault sees it).
    WitnessKeptOutOfR,
    /// A leader's read of the witness's term confirms its read round whatever term the witness
    /// holds: a deposed leader serves reads at its old commit index.
    WitnessTermReadTrusted,
    /// The leader answers a read forwarded by any other voter at once, whatever the
    /// configuration, as it may only when the voters are itself and the asker (and a witness).
    ForwardedReadFromAnyVoter,
}

impl Mutation {
    /// Every mutation.
    pub const ALL: [Mutation; 17] = [
        Mutation::WitnessVoteWithoutLogRule,
        Mutation::WitnessIgnoresTerm,
        Mutation::CreditWitnessWithoutWrite,
        Mutation::ReenterBeforeCatchUp,
        Mutation::ReadWithoutConfirmation,
        Mutation::SendBeforePersist,
        Mutation::ForgetWitnessIdentity,
        Mutation::VoteBeforePersist,
        Mutation::CommitBeforePersist,
        Mutation::CreditStaleSubtermAck,
        Mutation::ReadsWithoutRound,
        Mutation::ForwardTwice,
        Mutation::FailPendingOnNewTerm,
        Mutation::ForwardInAnyTerm,
        Mutation::WitnessKeptOutOfR,
        Mutation::WitnessTermReadTrusted,
        Mutation::ForwardedReadFromAnyVoter,
    ];

    /// The mutation named `name` (as written in the enum).
    pub fn named(name: &str) -> Option<Mutation> {
        Self::ALL.into_iter().find(|m| format!("{m:?}") == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` must list every mutation once: the match below stops compiling when a mutation is
    /// added, and whoever updates it updates the count of distinct entries too.
    #[test]
    fn all_lists_every_mutation_and_names_find_them() {
        let _exhaustive = |m: Mutation| match m {
            Mutation::WitnessVoteWithoutLogRule
            | Mutation::WitnessIgnoresTerm
            | Mutation::CreditWitnessWithoutWrite
            | Mutation::ReenterBeforeCatchUp
            | Mutation::ReadWithoutConfirmation
            | Mutation::SendBeforePersist
            | Mutation::ForgetWitnessIdentity
            | Mutation::VoteBeforePersist
            | Mutation::CommitBeforePersist
            | Mutation::CreditStaleSubtermAck
            | Mutation::ReadsWithoutRound
            | Mutation::ForwardTwice
            | Mutation::FailPendingOnNewTerm
            | Mutation::ForwardInAnyTerm
            | Mutation::WitnessKeptOutOfR
            | Mutation::WitnessTermReadTrusted
            | Mutation::ForwardedReadFromAnyVoter => (),
        };
        let distinct: std::collections::BTreeSet<String> =
            Mutation::ALL.iter().map(|m| format!("{m:?}")).collect();
        assert_eq!(
            distinct.len(),
            17,
            "the 17 mutations of the match above, once each"
        );
        for m in Mutation::ALL {
            assert_eq!(Mutation::named(&format!("{m:?}")), Some(m));
        }
        assert_eq!(Mutation::named("NoSuchBug"), None);
    }
}
