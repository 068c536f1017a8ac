//! A witness whose storage is lost (wiped and initialised again, or restored from an older copy)
//! is a voter that forgot its votes. These simulations run the fault campaign's sequence that
//! lost acknowledged writes (issue 13, part 1):
//! 1. two members and a witness under writes; the follower F is killed, the leader L writes the
//!    witness once and goes on committing alone;
//! 2. the witness's storage is wiped and initialised again (or put back to an older copy);
//! 3. L commits more, then is killed; F starts alone;
//! 4. F must not be elected: the witness is refused, nothing committed is lost, and once L is
//!    back the two elect a leader without it.
//!
//! With the identity check taken out (`Mutation::ForgetWitnessIdentity`, feature `mutations`),
//! F is elected and the simulator's invariants report the loss.

use etcd_node::raft::{NodeId, Role};
use etcd_node::sim::{Cluster, Violation};
use witness_core::WitnessState;

const WITNESS: NodeId = 3;

/// How the witness's storage loses its state.
#[derive(Debug, Clone, Copy)]
enum Loss {
    /// Wiped and initialised again: a new generation.
    Wiped,
    /// Put back to the copy taken before the leader first wrote it.
    Restored,
}

/// Ticks `c` until `done`, failing the test if it takes longer than `max` ticks.
fn until(c: &mut Cluster, max: u64, what: &str, done: impl FnMut(&Cluster) -> bool) {
    match c.run_until(max, done) {
        Ok(true) => {}
        Ok(false) => panic!("{what}: not within {max} ticks\n{}", c.describe()),
        Err(v) => panic!("{what}: invariant violated: {v}\n{}", c.describe()),
    }
}

fn writes(c: &mut Cluster, from: u64, n: u64) -> u64 {
    let mut last = 0;
    for i in from..from + n {
        if let Some(index) = c.propose(i.to_le_bytes().to_vec()) {
            last = index;
        }
        let _ = c.tick();
    }
    last
}

/// Steps 1-3 of the campaign. Returns the cluster (L down, F up) and F's id.
fn lose_the_witness(c: &mut Cluster, loss: Loss) -> (NodeId, NodeId) {
    until(c, 500, "a first leader", |c| c.leader().is_some());
    let l = c.leader().expect("leader");
    let f = if l == 1 { 2 } else { 1 };
    writes(c, 0, 20);
    let before = c.witness_state(WITNESS).expect("a witness").clone();
    // 1. F dies; L writes the witness once and commits alone.
    c.crash(f);
    let last = writes(c, 100, 30);
    until(c, 500, "L commits alone with the witness", |c| {
        c.raft(l).is_some_and(|r| r.commit() >= last)
    });
    let used = c.witness_state(WITNESS).expect("a witness").clone();
    assert!(
        used.last_log_position() > before.last_log_position(),
        "L wrote the witness\n{}",
        c.describe()
    );
    // 2. The storage loses its state.
    match loss {
        Loss::Wiped => c.wipe_witness(WITNESS),
        Loss::Restored => c.revert_witness(WITNESS, WitnessState { ..before }),
    }
    // 3. L commits more (the shortcut: no witness I/O), then dies; F starts alone.
    let last = writes(c, 200, 30);
    until(c, 500, "L commits after the loss", |c| {
        c.raft(l).is_some_and(|r| r.commit() >= last)
    });
    c.crash(l);
    c.restart(f);
    (l, f)
}

/// Step 4 with the check: F is never elected; with L back, the two elect a leader and every
/// committed entry is there (the simulator's checker holds them to it).
fn survives(loss: Loss, seed: u64) {
    let mut c = Cluster::new(2, true, seed);
    let (l, f) = lose_the_witness(&mut c, loss);
    let committed = c.committed().len();
    for _ in 0..2_000 {
        c.tick()
            .unwrap_or_else(|v| panic!("seed {seed}: {v}\n{}", c.describe()));
        assert_ne!(
            c.raft(f).map(|r| r.role()),
            Some(Role::Leader),
            "seed {seed}: F was elected with a witness that lost its state\n{}",
            c.describe()
        );
    }
    assert!(
        c.stats.witness_refusals > 0,
        "seed {seed}: F asked the witness and was refused\n{}",
        c.describe()
    );
    c.restart(l);
    until(&mut c, 2_000, "a leader once L is back", |c| {
        c.leader().is_some()
    });
    let next = writes(&mut c, 300, 5);
    until(&mut c, 1_000, "the survivors commit", |c| {
        c.leader()
            .and_then(|l| c.raft(l))
            .is_some_and(|r| r.commit() >= next)
    });
    assert!(c.committed().len() > committed, "seed {seed}: writes go on");
}

#[test]
fn a_wiped_witness_is_refused_and_nothing_committed_is_lost() {
    for seed in 0..20 {
        survives(Loss::Wiped, seed);
    }
}

#[test]
fn a_witness_restored_from_an_older_copy_is_refused() {
    for seed in 0..20 {
        survives(Loss::Restored, seed);
    }
}

/// Without the check the same sequence elects F, and the loss is reported.
#[cfg(feature = "mutations")]
fn lost_without_the_check(loss: Loss) {
    use etcd_node::raft::Mutation;
    let mut caught = 0;
    for seed in 0..20 {
        let mut c = Cluster::with_config(2, true, seed, |cfg| {
            cfg.mutation = Some(Mutation::ForgetWitnessIdentity);
        });
        let (l, _) = lose_the_witness(&mut c, loss);
        let mut run = || -> Result<(), Violation> {
            c.run_until(2_000, |c| c.leader().is_some())?;
            writes_checked(&mut c)?;
            c.restart(l);
            c.run_until(2_000, |_| false)?;
            Ok(())
        };
        if let Err(v) = run() {
            println!("seed {seed}, {loss:?}, without the check: {v}");
            assert!(
                [
                    "leader completeness",
                    "state machine safety",
                    "log matching"
                ]
                .iter()
                .any(|w| v.what.contains(w)),
                "{v}"
            );
            caught += 1;
        }
    }
    assert!(
        caught > 0,
        "{loss:?}: the simulator never saw the loss without the identity check"
    );
}

#[cfg(feature = "mutations")]
fn writes_checked(c: &mut Cluster) -> Result<(), Violation> {
    for i in 0..20u64 {
        c.propose((900 + i).to_le_bytes().to_vec());
        c.tick()?;
    }
    Ok(())
}

#[cfg(feature = "mutations")]
#[test]
fn without_the_identity_check_a_wiped_witness_loses_committed_entries() {
    lost_without_the_check(Loss::Wiped);
}

#[cfg(feature = "mutations")]
#[test]
fn without_the_identity_check_a_restored_witness_loses_committed_entries() {
    lost_without_the_check(Loss::Restored);
}
