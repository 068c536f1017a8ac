//! The replication set R and its adjustment (design note "Subterms and the replication set";
//! paper §2.4 "Replication Set Adjustment", §4.4 "Catching up upon replication set adjustment").
//!
//! Invariants of every set this module returns, for a configuration with regular voters V and
//! an optional witness W:
//! - |R| = |V| (with a witness, R is all voters minus exactly one member; without, R = V);
//! - the leader is in R;
//! - R ⊆ V ∪ {W};
//! - a regular voter enters R only if it is eligible (reachable and caught up with the leader's
//!   last index); a reachable member already in R is never removed.

use std::collections::BTreeSet;

use super::types::NodeId;

/// What the leader knows about a regular voter when it adjusts R.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    /// Heard from within the liveness window.
    pub reachable: bool,
    /// Its match index equals the leader's last index.
    pub caught_up: bool,
}

impl Liveness {
    fn eligible(self) -> bool {
        self.reachable && self.caught_up
    }
}

/// The replication set after adjustment: R unchanged when nothing needs to change.
///
/// `regular` lists every regular voter (the leader included, always reachable and caught up);
/// `liveness(v)` reports on a regular voter.
pub fn adjust(
    current: &BTreeSet<NodeId>,
    regular: &BTreeSet<NodeId>,
    witness: Option<NodeId>,
    leader: NodeId,
    liveness: impl Fn(NodeId) -> Liveness,
) -> BTreeSet<NodeId> {
    let live = |v: NodeId| {
        if v == leader {
            Liveness {
                reachable: true,
                caught_up: true,
            }
        } else {
            liveness(v)
        }
    };
    // Everyone healthy: back to the regular voters (drops the witness).
    if regular.iter().all(|&v| live(v).eligible()) {
        return regular.clone();
    }
    let mut next = current.clone();
    let unreachable: Vec<NodeId> = next
        .iter()
        .copied()
        .filter(|&m| Some(m) != witness && !live(m).reachable)
        .collect();
    for gone in unreachable {
        let replacement = regular
            .iter()
            .copied()
            .find(|&v| !next.contains(&v) && live(v).eligible())
            .or(witness.filter(|w| !next.contains(w)));
        if let Some(r) = replacement {
            next.remove(&gone);
            next.insert(r);
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[NodeId]) -> BTreeSet<NodeId> {
        v.iter().copied().collect()
    }

    const UP: Liveness = Liveness {
        reachable: true,
        caught_up: true,
    };
    const DOWN: Liveness = Liveness {
        reachable: false,
        caught_up: false,
    };
    const BEHIND: Liveness = Liveness {
        reachable: true,
        caught_up: false,
    };

    #[test]
    fn two_nodes_and_a_witness() {
        let regular = set(&[1, 2]);
        let w = Some(3);
        // Paper "follower down": B unreachable -> the witness replaces it.
        assert_eq!(
            adjust(&set(&[1, 2]), &regular, w, 1, |_| DOWN),
            set(&[1, 3])
        );
        // B back but behind: stays out (catch-up rule, §4.4).
        assert_eq!(
            adjust(&set(&[1, 3]), &regular, w, 1, |_| BEHIND),
            set(&[1, 3])
        );
        // B caught up: the witness is dropped.
        assert_eq!(adjust(&set(&[1, 3]), &regular, w, 1, |_| UP), set(&[1, 2]));
        // Healthy: unchanged.
        assert_eq!(adjust(&set(&[1, 2]), &regular, w, 1, |_| UP), set(&[1, 2]));
    }

    #[test]
    fn a_reachable_member_behind_is_not_removed() {
        let regular = set(&[1, 2, 4, 5]);
        let r = set(&[1, 2, 4, 5]);
        let live = |v| {
            if v == 2 {
                BEHIND
            } else if v == 5 {
                DOWN
            } else {
                UP
            }
        };
        assert_eq!(adjust(&r, &regular, Some(3), 1, live), set(&[1, 2, 3, 4]));
    }

    #[test]
    fn an_eligible_regular_voter_is_preferred_to_the_witness() {
        let regular = set(&[1, 2, 4, 5]);
        let r = set(&[1, 2, 3, 4]); // witness in, 5 out
        let live = |v| if v == 2 { DOWN } else { UP };
        assert_eq!(adjust(&r, &regular, Some(3), 1, live), set(&[1, 3, 4, 5]));
    }

    #[test]
    fn without_a_witness_nothing_can_replace_a_down_member() {
        let regular = set(&[1, 2, 3]);
        let live = |v| if v == 2 { DOWN } else { UP };
        assert_eq!(
            adjust(&set(&[1, 2, 3]), &regular, None, 1, live),
            set(&[1, 2, 3])
        );
    }

    #[test]
    fn shape_invariants_hold_for_every_liveness_pattern() {
        let regular = set(&[1, 2, 4, 5]);
        let witness = Some(3);
        let patterns = [UP, DOWN, BEHIND];
        let starts = [
            set(&[1, 2, 4, 5]),
            set(&[1, 2, 3, 4]),
            set(&[1, 3, 4, 5]),
            set(&[1, 2, 3, 5]),
        ];
        for start in &starts {
            for a in patterns {
                for b in patterns {
                    for c in patterns {
                        let live = |v| match v {
                            2 => a,
                            4 => b,
                            _ => c,
                        };
                        let next = adjust(start, &regular, witness, 1, live);
                        assert_eq!(next.len(), regular.len(), "{start:?} -> {next:?}");
                        assert!(next.contains(&1));
                        for v in &next {
                            assert!(regular.contains(v) || Some(*v) == witness);
                            if !start.contains(v) && Some(*v) != witness {
                                assert!(
                                    live(*v).eligible(),
                                    "{v} entered R without being eligible"
                                );
                            }
                        }
                        for v in start {
                            if regular.contains(v) && live(*v).reachable {
                                assert!(next.contains(v), "reachable {v} was removed");
                            }
                        }
                    }
                }
            }
        }
    }
}
