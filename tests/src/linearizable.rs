//! A linearizability checker for histories of one register (one key): Wing and Gong's search,
//! with the memoisation of Lowe (as Knossos and Porcupine do). The fault campaign splits its
//! history by key and checks each key on its own (linearizability is compositional).
//!
//! An operation whose outcome is unknown (a write that timed out, a connection reset) may have
//! taken effect at any point after it was called, or never: it has no return time and may be
//! left out. Reads with an unknown outcome carry no information and are not recorded.

use std::collections::HashSet;

/// What a client asked, with what it was told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Put `value`.
    Put(u64),
    /// A read that returned this value (None: the key did not exist).
    Get(Option<u64>),
    /// Delete the key (a lease revoke deleting the key attached to it).
    Delete,
    /// Put `new` if the value is `expect`; `ok` says whether it did (unknown outcome: either).
    Cas {
        expect: Option<u64>,
        new: u64,
        ok: bool,
    },
}

/// One operation of the history: called at `call`, answered at `ret` (None: unknown outcome).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub op: Op,
    pub call: u64,
    pub ret: Option<u64>,
}

/// Operations per key the search accepts (its memory grows with the number of operations
/// times the states it visits; the campaign keeps each key's history well below this).
pub const MAX_OPS: usize = 4096;

/// The set of linearized operations.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Done(Vec<u64>);

impl Done {
    fn new(n: usize) -> Self {
        Done(vec![0; n.div_ceil(64)])
    }
    fn has(&self, i: usize) -> bool {
        self.0[i / 64] & (1 << (i % 64)) != 0
    }
    fn with(&self, i: usize) -> Self {
        let mut d = self.clone();
        d.0[i / 64] |= 1 << (i % 64);
        d
    }
}

/// The register after `op` from `state`, None if `op` cannot take effect there.
fn step(state: Option<u64>, e: &Event) -> Option<Option<u64>> {
    match e.op {
        Op::Put(v) => Some(Some(v)),
        Op::Delete => Some(None),
        Op::Get(seen) => (seen == state).then_some(state),
        Op::Cas { expect, new, .. } if e.ret.is_none() => {
            // Unknown outcome: it applies only if the value matched (else it is a no-op,
            // which leaving it out covers).
            (expect == state).then_some(Some(new))
        }
        Op::Cas { expect, new, ok } => match (ok, expect == state) {
            (true, true) => Some(Some(new)),
            (false, false) => Some(state),
            _ => None,
        },
    }
}

/// Checks that `history` (at most [`MAX_OPS`] events) of a register starting at `initial` is
/// linearizable. On failure, the error lists the history in call order.
pub fn check(history: &[Event], initial: Option<u64>) -> Result<(), String> {
    if history.len() > MAX_OPS {
        return Err(format!(
            "{} operations on one key: the checker handles {MAX_OPS}",
            history.len()
        ));
    }
    let mut ops: Vec<Event> = history.to_vec();
    ops.sort_by_key(|e| e.call);
    let known: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].ret.is_some()).collect();
    let mut seen = HashSet::new();
    // Depth-first over (linearized set, register value).
    let mut stack = vec![(Done::new(ops.len()), initial)];
    while let Some((done, state)) = stack.pop() {
        if known.iter().all(|&i| done.has(i)) {
            return Ok(());
        }
        if seen.contains(&(done.clone(), state)) {
            continue;
        }
        // Only an operation called before every pending operation's return can go next.
        let horizon = known
            .iter()
            .filter(|&&i| !done.has(i))
            .filter_map(|&i| ops[i].ret)
            .min()
            .unwrap_or(u64::MAX);
        for (i, e) in ops.iter().enumerate() {
            if e.call > horizon {
                break; // (sorted by call)
            }
            if done.has(i) {
                continue;
            }
            if let Some(next) = step(state, e) {
                stack.push((done.with(i), next));
            }
        }
        seen.insert((done, state));
    }
    let lines: Vec<String> = ops
        .iter()
        .map(|e| match e.ret {
            Some(r) => format!("  [{} .. {}] {:?}", e.call, r, e.op),
            None => format!("  [{} .. ?] {:?}", e.call, e.op),
        })
        .collect();
    Err(format!(
        "not linearizable (initial value {initial:?}):\n{}",
        lines.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(op: Op, call: u64, ret: Option<u64>) -> Event {
        Event { op, call, ret }
    }

    #[test]
    fn concurrent_operations_may_take_either_order() {
        let h = [
            ev(Op::Put(1), 0, Some(10)),
            ev(Op::Get(Some(1)), 1, Some(3)),
            ev(Op::Get(None), 2, Some(4)),
        ];
        check(&h, None).expect("the put may land between the two reads");
    }

    #[test]
    fn a_lost_acknowledged_write_is_reported() {
        let h = [
            ev(Op::Put(1), 0, Some(1)),
            ev(Op::Put(2), 2, Some(3)),
            ev(Op::Get(Some(1)), 4, Some(5)),
        ];
        let err = check(&h, None).expect_err("put 2 was acknowledged before the read began");
        assert!(err.contains("not linearizable"), "{err}");
    }

    #[test]
    fn an_unknown_write_may_apply_late_or_never() {
        let late = [
            ev(Op::Put(7), 0, None),
            ev(Op::Get(None), 5, Some(6)),
            ev(Op::Get(Some(7)), 8, Some(9)),
        ];
        check(&late, None).expect("the timed-out put applied after the first read");
        let never = [ev(Op::Put(7), 0, None), ev(Op::Get(None), 8, Some(9))];
        check(&never, None).expect("the timed-out put never applied");
        let back = [
            ev(Op::Put(7), 0, None),
            ev(Op::Get(Some(7)), 2, Some(3)),
            ev(Op::Get(None), 4, Some(5)),
        ];
        check(&back, None).expect_err("a value cannot disappear");
    }

    #[test]
    fn a_delete_empties_the_register() {
        let h = [
            ev(Op::Put(1), 0, Some(1)),
            ev(Op::Delete, 2, Some(3)),
            ev(Op::Get(None), 4, Some(5)),
        ];
        check(&h, None).expect("deleted");
        let back = [
            ev(Op::Put(1), 0, Some(1)),
            ev(Op::Delete, 2, Some(3)),
            ev(Op::Get(Some(1)), 4, Some(5)),
        ];
        check(&back, None).expect_err("the value came back after an acknowledged delete");
    }

    #[test]
    fn compare_and_swap_outcomes_are_checked() {
        let h = [
            ev(Op::Put(1), 0, Some(1)),
            ev(
                Op::Cas {
                    expect: Some(1),
                    new: 2,
                    ok: true,
                },
                2,
                Some(3),
            ),
            ev(Op::Get(Some(2)), 4, Some(5)),
        ];
        check(&h, None).expect("a successful swap");
        let wrong = [
            ev(Op::Put(1), 0, Some(1)),
            ev(
                Op::Cas {
                    expect: Some(1),
                    new: 2,
                    ok: false,
                },
                2,
                Some(3),
            ),
        ];
        check(&wrong, None).expect_err("the swap had to succeed: the value was 1");
    }
}
