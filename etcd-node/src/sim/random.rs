//! Random runs: one seed drives proposals, crashes, restarts, partitions and network faults,
//! then a liveness phase heals everything and requires a leader to commit a new proposal.

use rand::Rng;

use super::cluster::{Cluster, Faults, Stats};
use crate::raft::EntryData;

/// The shape of a random run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RandomRun {
    pub regular: u64,
    pub witness: bool,
    /// Ticks of chaos.
    pub ticks: u64,
    /// Ticks allowed, after healing, for a leader to commit a new proposal.
    pub liveness_ticks: u64,
    /// A deliberate bug on every node and the witness (tests of the simulator only).
    #[cfg(feature = "mutations")]
    pub mutation: Option<crate::raft::Mutation>,
}

impl RandomRun {
    /// 2,000 ticks of faults, 2,000 ticks for liveness.
    pub fn new(regular: u64, witness: bool) -> Self {
        RandomRun {
            regular,
            witness,
            ticks: 2000,
            liveness_ticks: 2000,
            #[cfg(feature = "mutations")]
            mutation: None,
        }
    }

    /// The command that replays `seed`.
    pub fn replay_command(&self, seed: u64) -> String {
        let command = format!(
            "cargo run --release -p etcd-node --bin raft-sim -- --start {seed} --seeds 1 --regular {}{} --ticks {}",
            self.regular,
            if self.witness { " --witness" } else { "" },
            self.ticks
        );
        #[cfg(feature = "mutations")]
        if let Some(m) = self.mutation {
            return format!(
                "{command} (with the deliberate bug {m:?}: replay it through etcd-node/tests/mutations.rs)"
            );
        }
        command
    }
}

/// Runs one seed. On a violation, the error names the seed and the replay command.
pub fn run_seed(seed: u64, run: &RandomRun) -> Result<Stats, String> {
    let fail = |what: String| {
        format!(
            "seed {seed} ({run:?}): {what}\nreplay: {}",
            run.replay_command(seed)
        )
    };
    #[cfg(feature = "mutations")]
    let mut c = {
        let mut c = Cluster::with_config(run.regular, run.witness, seed, |cfg| {
            cfg.mutation = run.mutation
        });
        c.witness_mutation = run.mutation;
        c
    };
    #[cfg(not(feature = "mutations"))]
    let mut c = Cluster::new(run.regular, run.witness, seed);
    c.faults = Faults {
        drop: 0.05,
        duplicate: 0.02,
        min_delay: 1,
        max_delay: 4,
    };
    let ids: Vec<u64> = c.membership().regular.iter().copied().collect();
    let mut payload = 0u64;
    for _ in 0..run.ticks {
        let roll: f64 = c.rng().random();
        let pick = ids[c.rng().random_range(0..ids.len())];
        let other = ids[c.rng().random_range(0..ids.len())];
        match roll {
            r if r < 0.30 => {
                payload += 1;
                c.propose(payload.to_le_bytes().to_vec());
            }
            r if r < 0.303 => c.crash(pick),
            r if r < 0.33 => c.restart(pick),
            r if r < 0.334 && pick != other => c.partition(pick, other),
            r if r < 0.337 => c.cut_witness(pick),
            r if r < 0.347 => c.heal(),
            _ => {}
        }
        c.tick().map_err(|v| fail(v.to_string()))?;
    }
    // Liveness: heal, restart, stop faults; a leader must commit a new proposal.
    c.heal();
    c.faults = Faults::none();
    for &id in &ids {
        c.restart(id);
    }
    let marker = EntryData::Normal(b"liveness".to_vec());
    // (leader, index) of the marker's latest proposal.
    let mut proposed: Option<(u64, u64)> = None;
    for _ in 0..run.liveness_ticks {
        if c.committed().values().any(|e| e.data == marker) {
            return Ok(c.stats.clone());
        }
        let leader = c.leader();
        let pending = proposed.is_some_and(|(l, i)| {
            Some(l) == leader
                && c.raft(l).is_some_and(|r| {
                    r.log()
                        .get(i as usize - 1)
                        .is_some_and(|e| e.data == marker)
                })
        });
        if !pending && let (Some(l), EntryData::Normal(data)) = (leader, &marker) {
            proposed = c.propose(data.clone()).map(|i| (l, i));
        }
        c.tick().map_err(|v| fail(v.to_string()))?;
    }
    Err(fail(format!(
        "liveness: no leader committed a new proposal within {} ticks after healing",
        run.liveness_ticks
    )))
}
