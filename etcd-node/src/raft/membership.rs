//! Configurations: voters (regular members and at most one witness), learners, the joint
//! configuration during a multi-voter change, and the configuration changes that move between
//! them.
//!
//! Invariants of every [`Membership`] this module builds (a joining node's [`Membership::empty`]
//! aside):
//! - each half has at least one regular voter, and a half with a witness has at least two;
//! - a member is at most one of: regular voter, witness, learner; the witness is never a learner;
//! - during a joint configuration both halves name the same witness, or only one half has one
//!   (replacing the witness takes two single changes: remove, then add);
//! - a change that alters more than one voter goes through a joint configuration; a change of at
//!   most one voter is applied directly (single-server change).

use std::collections::BTreeSet;

use super::errors::MembershipError;
use super::types::{NONE, NodeId};

/// The voters of one configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Voters {
    pub regular: BTreeSet<NodeId>,
    pub witness: Option<NodeId>,
}

impl Voters {
    /// Number of voters, the witness included.
    pub fn len(&self) -> usize {
        self.regular.len() + usize::from(self.witness.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Votes (or acknowledgements) that make a majority.
    pub fn quorum(&self) -> usize {
        self.len() / 2 + 1
    }

    pub fn contains(&self, id: NodeId) -> bool {
        self.regular.contains(&id) || self.witness == Some(id)
    }

    /// Does a majority of these voters satisfy `yes`?
    pub fn majority(&self, yes: impl Fn(NodeId) -> bool) -> bool {
        let count = self
            .regular
            .iter()
            .chain(&self.witness)
            .filter(|&&v| yes(v));
        count.count() >= self.quorum()
    }

    /// The highest index a majority has reached, given each voter's index.
    pub fn committed(&self, index_of: impl Fn(NodeId) -> u64) -> u64 {
        let mut indexes: Vec<u64> = self
            .regular
            .iter()
            .chain(&self.witness)
            .map(|&v| index_of(v))
            .collect();
        indexes.sort_unstable_by(|a, b| b.cmp(a));
        indexes.get(self.quorum() - 1).copied().unwrap_or(0)
    }

    fn validate(&self) -> Result<(), MembershipError> {
        if self.regular.is_empty() {
            return Err(MembershipError::NoRegularVoter);
        }
        if self.regular.contains(&NONE) || self.witness == Some(NONE) {
            return Err(MembershipError::ReservedId);
        }
        if let Some(w) = self.witness {
            if self.regular.contains(&w) {
                return Err(MembershipError::WitnessIsRegular(w));
            }
            if self.regular.len() < 2 {
                return Err(MembershipError::WitnessWithOneVoter);
            }
        }
        Ok(())
    }
}

/// A node's view of the cluster configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The (incoming) voters.
    pub voters: Voters,
    /// The outgoing voters while a joint configuration is in effect.
    pub outgoing: Option<Voters>,
    /// Non-voting members that receive the log.
    pub learners: BTreeSet<NodeId>,
}

/// What one configuration change does to one member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Add a regular voter, or promote a learner.
    AddVoter,
    AddLearner,
    AddWitness,
    /// Remove a voter, the witness or a learner.
    Remove,
}

/// One member's change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub kind: ChangeKind,
    pub node: NodeId,
}

/// A configuration change, replicated as a log entry and applied when committed. No changes
/// means "leave the joint configuration" (the leader proposes it by itself).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConfChange {
    pub changes: Vec<Change>,
    /// The host's data about the change (who asked, the member's name and URLs); opaque here.
    pub context: Vec<u8>,
    /// For a change that adds a witness: the generation of the initialised witness storage (read
    /// by the proposer), which every member is bound to once the change applies. 0: none.
    pub witness_generation: u64,
}

impl ConfChange {
    /// A single change.
    pub fn single(kind: ChangeKind, node: NodeId) -> Self {
        ConfChange {
            changes: vec![Change { kind, node }],
            context: Vec::new(),
            witness_generation: 0,
        }
    }
}

impl Membership {
    /// A configuration without learners; the error names what is wrong.
    pub fn new(
        regular: impl IntoIterator<Item = NodeId>,
        witness: Option<NodeId>,
    ) -> Result<Self, MembershipError> {
        let voters = Voters {
            regular: regular.into_iter().collect(),
            witness,
        };
        voters.validate()?;
        Ok(Membership {
            voters,
            outgoing: None,
            learners: BTreeSet::new(),
        })
    }

    /// What a node that joins an existing cluster knows before the leader's snapshot reaches it.
    pub fn empty() -> Self {
        Membership {
            voters: Voters {
                regular: BTreeSet::new(),
                witness: None,
            },
            outgoing: None,
            learners: BTreeSet::new(),
        }
    }

    pub fn is_joint(&self) -> bool {
        self.outgoing.is_some()
    }

    /// The voter sets a decision needs a majority of: one, or both halves of a joint configuration.
    pub fn halves(&self) -> impl Iterator<Item = &Voters> {
        std::iter::once(&self.voters).chain(&self.outgoing)
    }

    /// The witness of either half.
    pub fn witness(&self) -> Option<NodeId> {
        self.halves().find_map(|h| h.witness)
    }

    /// Is `id` a regular voter of either half (a node that may campaign)?
    pub fn is_regular_voter(&self, id: NodeId) -> bool {
        self.halves().any(|h| h.regular.contains(&id))
    }

    /// Every node that stores the log: regular voters of both halves and learners.
    pub fn replicas(&self) -> BTreeSet<NodeId> {
        self.halves()
            .flat_map(|h| h.regular.iter().copied())
            .chain(self.learners.iter().copied())
            .collect()
    }

    /// Does every half have a majority satisfying `yes`?
    pub fn majority(&self, yes: impl Fn(NodeId) -> bool) -> bool {
        self.halves().all(|h| h.majority(&yes))
    }

    /// The highest index a majority of every half has reached.
    pub fn committed(&self, index_of: impl Fn(NodeId) -> u64) -> u64 {
        self.halves()
            .map(|h| h.committed(&index_of))
            .min()
            .unwrap_or(0)
    }

    /// The configuration after `cc`, or why `cc` cannot apply to this one.
    pub fn apply(&self, cc: &ConfChange) -> Result<Membership, MembershipError> {
        if cc.changes.is_empty() {
            if !self.is_joint() {
                return Err(MembershipError::NotJoint);
            }
            return Ok(Membership {
                voters: self.voters.clone(),
                outgoing: None,
                learners: self.learners.clone(),
            });
        }
        if self.is_joint() {
            return Err(MembershipError::StillJoint);
        }
        let mut voters = self.voters.clone();
        let mut learners = self.learners.clone();
        for &Change { kind, node } in &cc.changes {
            if node == NONE {
                return Err(MembershipError::ReservedId);
            }
            let was_witness = self.voters.witness == Some(node);
            if was_witness && matches!(kind, ChangeKind::AddVoter | ChangeKind::AddLearner) {
                return Err(MembershipError::WitnessCannotBecomeMember(node));
            }
            match kind {
                ChangeKind::AddVoter => {
                    if voters.witness == Some(node) {
                        return Err(MembershipError::IsTheWitness(node));
                    }
                    learners.remove(&node);
                    voters.regular.insert(node);
                }
                ChangeKind::AddLearner => {
                    if voters.contains(node) {
                        return Err(MembershipError::VoterAsLearner(node));
                    }
                    learners.insert(node);
                }
                ChangeKind::AddWitness => match voters.witness {
                    Some(w) if w == node => {}
                    Some(w) => {
                        return Err(MembershipError::SecondWitness(w));
                    }
                    None if voters.regular.contains(&node) || learners.contains(&node) => {
                        return Err(MembershipError::RegularAsWitness(node));
                    }
                    None => voters.witness = Some(node),
                },
                ChangeKind::Remove => {
                    let known = voters.regular.remove(&node)
                        | learners.remove(&node)
                        | (voters.witness == Some(node));
                    if voters.witness == Some(node) {
                        voters.witness = None;
                    }
                    if !known {
                        return Err(MembershipError::NotAMember(node));
                    }
                }
            }
        }
        voters.validate()?;
        let old: BTreeSet<NodeId> = self
            .voters
            .regular
            .iter()
            .chain(&self.voters.witness)
            .copied()
            .collect();
        let new: BTreeSet<NodeId> = voters
            .regular
            .iter()
            .chain(&voters.witness)
            .copied()
            .collect();
        let changed = old.symmetric_difference(&new).count();
        if changed <= 1 {
            return Ok(Membership {
                voters,
                outgoing: None,
                learners,
            });
        }
        if let (Some(a), Some(b)) = (self.voters.witness, voters.witness)
            && a != b
        {
            return Err(MembershipError::WitnessReplacedAtOnce);
        }
        if voters.witness.is_some() && self.voters.witness.is_none() {
            return Err(MembershipError::WitnessAddedWithOthers);
        }
        Ok(Membership {
            voters,
            outgoing: Some(self.voters.clone()),
            learners,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(regular: &[u64], witness: Option<u64>) -> Membership {
        Membership::new(regular.iter().copied(), witness).unwrap()
    }

    #[test]
    fn single_changes_apply_directly() {
        let two = m(&[1, 2], None);
        let with_w = two
            .apply(&ConfChange::single(ChangeKind::AddWitness, 3))
            .unwrap();
        assert_eq!(with_w, m(&[1, 2], Some(3)));
        let back = with_w
            .apply(&ConfChange::single(ChangeKind::Remove, 3))
            .unwrap();
        assert_eq!(back, two);
        let learner = two
            .apply(&ConfChange::single(ChangeKind::AddLearner, 4))
            .unwrap();
        assert!(learner.learners.contains(&4) && !learner.is_joint());
        let promoted = learner
            .apply(&ConfChange::single(ChangeKind::AddVoter, 4))
            .unwrap();
        assert_eq!(promoted, m(&[1, 2, 4], None));
    }

    #[test]
    fn two_voter_changes_go_through_a_joint_configuration() {
        let cc = ConfChange {
            changes: vec![
                Change {
                    kind: ChangeKind::AddVoter,
                    node: 4,
                },
                Change {
                    kind: ChangeKind::Remove,
                    node: 2,
                },
            ],
            context: Vec::new(),
            witness_generation: 0,
        };
        let joint = m(&[1, 2, 3], None).apply(&cc).unwrap();
        assert!(joint.is_joint());
        assert_eq!(joint.outgoing, Some(m(&[1, 2, 3], None).voters));
        assert!(joint.apply(&cc).unwrap_err().to_string().contains("joint"));
        let left = joint.apply(&ConfChange::default()).unwrap();
        assert_eq!(left, m(&[1, 3, 4], None));
        // 1 and 3 are a majority of both halves; 1 and 4 only of the incoming one.
        assert!(joint.majority(|v| v == 1 || v == 3));
        assert!(!joint.majority(|v| v == 1 || v == 4));
    }

    #[test]
    fn refusals_name_the_fix() {
        let cluster = m(&[1, 2], Some(3));
        let e = cluster
            .apply(&ConfChange::single(ChangeKind::Remove, 2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("remove the witness first"), "{e}");
        let e = cluster
            .apply(&ConfChange::single(ChangeKind::AddWitness, 9))
            .unwrap_err()
            .to_string();
        assert!(e.contains("remove it first"), "{e}");
        let e = cluster
            .apply(&ConfChange::single(ChangeKind::AddLearner, 3))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is the witness"), "{e}");
        let e = cluster
            .apply(&ConfChange::single(ChangeKind::AddLearner, 2))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is a voter"), "{e}");
        let e = cluster
            .apply(&ConfChange::single(ChangeKind::Remove, 7))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not in the configuration"), "{e}");
        let swap = ConfChange {
            changes: vec![
                Change {
                    kind: ChangeKind::Remove,
                    node: 3,
                },
                Change {
                    kind: ChangeKind::AddWitness,
                    node: 9,
                },
            ],
            context: Vec::new(),
            witness_generation: 0,
        };
        let e = cluster.apply(&swap).unwrap_err().to_string();
        assert!(e.contains("two changes"), "{e}");
        let promote_witness = ConfChange {
            changes: vec![
                Change {
                    kind: ChangeKind::Remove,
                    node: 3,
                },
                Change {
                    kind: ChangeKind::AddVoter,
                    node: 3,
                },
            ],
            context: Vec::new(),
            witness_generation: 0,
        };
        let e = cluster.apply(&promote_witness).unwrap_err().to_string();
        assert!(e.contains("never becomes a regular member"), "{e}");
    }

    #[test]
    fn committed_index_needs_every_half() {
        let joint = Membership {
            voters: m(&[1, 3, 4], None).voters,
            outgoing: Some(m(&[1, 2, 3], None).voters),
            learners: BTreeSet::new(),
        };
        let idx = |v: NodeId| [0, 10, 9, 8, 2][v as usize];
        // incoming {1:10, 3:8, 4:2} -> 8; outgoing {1:10, 2:9, 3:8} -> 9; both -> 8.
        assert_eq!(joint.committed(idx), 8);
    }
}
