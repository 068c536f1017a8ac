//! Random runs: one seed drives proposals, linearizable reads, configuration changes (voters,
//! learners, the witness; single and joint), leader transfers, log compaction, crashes,
//! restarts, partitions, network faults and a wiped-and-reinitialised witness. Then the network
//! heals and a leader must commit a new proposal with every node up (liveness), and again with
//! one regular voter down and the witness healthy (availability during a fault).

use rand::Rng;

use super::cluster::{Cluster, Faults, Stats};
use crate::raft::{Change, ChangeKind, ConfChange, EntryData, NodeId};

/// Nodes a run may grow to (members, learners, removed nodes).
const MAX_NODES: usize = 7;

/// A random configuration change for the leader's current configuration (it may be refused:
/// the refusal is part of what is tested). New members get ids from `next_id`.
fn random_conf_change(c: &mut Cluster, next_id: &mut NodeId) -> ConfChange {
    let m = c.membership();
    let regular: Vec<NodeId> = m.voters.regular.iter().copied().collect();
    let learners: Vec<NodeId> = m.learners.iter().copied().collect();
    if regular.is_empty() {
        return ConfChange::default(); // no live member knows the configuration
    }
    let room = c.node_ids().len() < MAX_NODES;
    let rng = c.rng();
    let any = |rng: &mut rand::rngs::StdRng, v: &[NodeId]| v[rng.random_range(0..v.len())];
    let mut fresh = || {
        *next_id += 1;
        *next_id
    };
    let change = |kind, node| Change { kind, node };
    let changes = match rng.random_range(0..7) {
        0 if room => vec![change(ChangeKind::AddVoter, fresh())],
        1 if room => vec![change(ChangeKind::AddLearner, fresh())],
        2 if !learners.is_empty() => vec![change(ChangeKind::AddVoter, any(rng, &learners))],
        3 => vec![change(ChangeKind::Remove, any(rng, &regular))],
        4 => match m.voters.witness {
            Some(w) => vec![change(ChangeKind::Remove, w)],
            None => vec![change(ChangeKind::AddWitness, fresh())],
        },
        5 if !learners.is_empty() => vec![change(ChangeKind::Remove, any(rng, &learners))],
        6 if room => {
            let gone = any(rng, &regular);
            vec![
                change(ChangeKind::AddVoter, fresh()),
                change(ChangeKind::Remove, gone),
            ]
        }
        _ => Vec::new(),
    };
    ConfChange {
        changes,
        context: Vec::new(),
        witness_generation: 0,
    }
}

/// The shape of a random run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RandomRun {
    pub regular: u64,
    pub witness: bool,
    /// Ticks of chaos.
    pub ticks: u64,
    /// Ticks allowed, after healing, for a leader to commit a new proposal.
    pub liveness_ticks: u64,
    /// Check-quorum on the nodes. Off, a deposed leader keeps believing it leads until it hears
    /// a higher term, which makes reads on it a sharper test.
    pub check_quorum: bool,
    /// Now and then a node crashes inside a Ready: after sending its early messages and before
    /// persisting, or after persisting and before the rest (at a rate the seed picks). Off, runs
    /// follow the random sequence they had before that fault existed.
    pub crash_before_persist: bool,
    /// Timing faults: deliveries held 10-60 ticks (witness steps and replies too) and clocks
    /// that drift (each at a rate the seed picks).
    pub timing: bool,
    /// Witness loads that may return one of the register's last states (a cached mount), and
    /// witness writes whose reply is lost, at a rate the seed picks.
    pub stale_loads: bool,
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
            check_quorum: true,
            crash_before_persist: true,
            timing: true,
            stale_loads: true,
            #[cfg(feature = "mutations")]
            mutation: None,
        }
    }

    /// The command that replays `seed`.
    pub fn replay_command(&self, seed: u64) -> String {
        let command = format!(
            "cargo run --release -p etcd-node --bin raft-sim -- --start {seed} --seeds 1 --regular {}{}{} --ticks {}",
            self.regular,
            if self.witness { " --witness" } else { "" },
            if self.check_quorum {
                ""
            } else {
                " --no-check-quorum"
            },
            self.ticks
        );
        let command = if self.crash_before_persist {
            command
        } else {
            format!("{command} --no-crash-before-persist")
        };
        let command = if self.timing {
            command
        } else {
            format!("{command} --no-timing-faults")
        };
        let command = if self.stale_loads {
            command
        } else {
            format!("{command} --no-stale-loads")
        };
        #[cfg(feature = "mutations")]
        if let Some(m) = self.mutation {
            return format!(
                "{command} (with the deliberate bug {m:?}: replay it through etcd-node/tests/protocol/mutations.rs)"
            );
        }
        command
    }
}

/// A seed whose run broke a rule or panicked: what happened, the seed and the command that
/// replays it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SeedFailed(pub String);

/// Runs one seed. On a violation, or a panic in the node or the harness, the error names the
/// seed and the replay command.
pub fn run_seed(seed: u64, run: &RandomRun) -> Result<Stats, SeedFailed> {
    let fail = |what: String| {
        SeedFailed(format!(
            "seed {seed} ({run:?}): {what}\nreplay: {}",
            run.replay_command(seed)
        ))
    };
    // (the cluster is dropped with the panic: nothing of it is used afterwards)
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_checked(seed, run, &fail)
    }))
    .unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("(no message)");
        Err(fail(format!("panicked: {why}")))
    })
}

/// The environment variable naming a file where a failing seed's trace goes (one line per
/// event, as the scenario tests' golden files: `sim::trace`). Recording it slows a run down.
pub const TRACE_VAR: &str = "SIM_TRACE";

/// [`run_seed`]'s run, with its checks; `fail` words a violation. With [`TRACE_VAR`] set, a
/// failing run's trace is written to the file it names.
fn run_checked(
    seed: u64,
    run: &RandomRun,
    fail: &dyn Fn(String) -> SeedFailed,
) -> Result<Stats, SeedFailed> {
    let mut c = Cluster::with_config(run.regular, run.witness, seed, |cfg| {
        cfg.check_quorum = run.check_quorum;
        #[cfg(feature = "mutations")]
        {
            cfg.mutation = run.mutation;
        }
    });
    #[cfg(feature = "mutations")]
    {
        c.witness_mutation = run.mutation;
    }
    let trace_to = std::env::var_os(TRACE_VAR);
    if trace_to.is_some() {
        c.record_trace();
    }
    let result = drive(&mut c, run, fail);
    if let (Err(_), Some(path), Some(trace)) = (&result, trace_to, c.trace.as_mut()) {
        let mut text = trace.take().join("\n");
        text.push('\n');
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("{TRACE_VAR}: cannot write {}: {e}", path.display());
        }
    }
    result
}

/// The faults, then the liveness and availability checks, of [`run_checked`]'s run.
fn drive(
    c: &mut Cluster,
    run: &RandomRun,
    fail: &dyn Fn(String) -> SeedFailed,
) -> Result<Stats, SeedFailed> {
    // (no draw when a fault family is off: the random sequence stays as it was before it)
    let crash_in_ready = if run.crash_before_persist {
        [0.0005, 0.005, 0.03][c.rng().random_range(0..3)]
    } else {
        0.0
    };
    let (hold, drift) = if run.timing {
        let hold = [0.0, 0.001, 0.005][c.rng().random_range(0..3)];
        (hold, [0.0, 0.1, 0.3][c.rng().random_range(0..3)])
    } else {
        (0.0, 0.0)
    };
    let stale_loads = if run.stale_loads {
        [0.0, 0.05, 0.3][c.rng().random_range(0..3)]
    } else {
        0.0
    };
    c.faults = Faults {
        drop: 0.05,
        duplicate: 0.02,
        min_delay: 1,
        max_delay: 4,
        crash_in_ready,
        hold,
        drift,
        stale_loads,
        lost_replies: stale_loads,
    };
    let mut payload = 0u64;
    let mut next_id: NodeId = 10;
    // (a wiped witness is refused for good: the cluster may then need every regular member)
    let mut wiped = false;
    for _ in 0..run.ticks {
        let ids = c.node_ids();
        let roll: f64 = c.rng().random();
        let pick = ids[c.rng().random_range(0..ids.len())];
        let other = ids[c.rng().random_range(0..ids.len())];
        match roll {
            r if r < 0.30 => {
                payload += 1;
                c.submit(payload.to_le_bytes());
            }
            r if r < 0.303 => c.crash(pick),
            r if r < 0.33 => c.restart(pick),
            r if r < 0.334 && pick != other => c.partition(pick, other),
            r if r < 0.337 => c.cut_witness(pick),
            // (a partial heal: a node cut off from everything, a deposed leader say, reaches
            // the witness again first, and reads its term)
            r if r < 0.339 => c.restore_witness(pick),
            r if r < 0.347 => c.heal(),
            r if r < 0.40 => {
                let _ = c.read();
            }
            // (half of them as --snapshot-count's, which keep nothing to send; chosen by the
            // payload's parity, not drawn from the seed's stream)
            r if r < 0.41 && payload % 2 == 1 => c.compact_in_place(pick),
            r if r < 0.41 => c.compact(pick),
            r if r < 0.413 => {
                let cc = random_conf_change(c, &mut next_id);
                let _ = c.propose_conf_change(cc);
            }
            r if r < 0.414 => {
                let _ = c.transfer_leader(pick);
            }
            r if r < 0.4143 => {
                // The witness's storage is lost and initialised again: every member must refuse
                // it (no vote, no append), never elect a member that lacks committed entries.
                if let Some(w) = c.membership().voters.witness {
                    c.wipe_witness(w);
                    wiped = true;
                }
            }
            _ => {}
        }
        c.tick().map_err(|v| fail(v.to_string()))?;
    }
    // Liveness: heal, restart, stop faults; a leader must commit a new proposal.
    c.heal();
    c.faults = Faults::none();
    for id in c.node_ids() {
        c.restart(id);
    }
    if !commits_within(c, b"liveness", run.liveness_ticks, fail)? {
        return Err(fail(format!(
            "liveness: no leader committed a new proposal within {} ticks after healing\n{}",
            run.liveness_ticks,
            c.describe()
        )));
    }
    // Availability during a fault, not only after it: with a regular voter other than the
    // leader down and the witness healthy (never wiped), the leader must go on committing, with
    // the witness in R where it needs it. Only where the voters left are a quorum: a witness
    // beside at least two regular voters, or three regular voters. (The leader stays: a new
    // election may rightly fail here, when the member left outside R holds the same position
    // as the witness, clause (c) of the witness's vote rule.)
    let leader = c.leader();
    let m = c.membership();
    let one_may_fail =
        !m.is_joint() && m.voters.regular.len() >= if m.voters.witness.is_some() { 2 } else { 3 };
    let other = m
        .voters
        .regular
        .iter()
        .copied()
        .filter(|&id| Some(id) != leader)
        .max();
    if let (true, false, Some(down)) = (one_may_fail, wiped, other) {
        c.crash(down);
        if !commits_within(c, b"available", run.liveness_ticks, fail)? {
            return Err(fail(format!(
                "availability: with member {down} down and the witness healthy, no leader \
                 committed a new proposal within {} ticks\n{}",
                run.liveness_ticks,
                c.describe()
            )));
        }
    }
    Ok(c.stats.clone())
}

/// Proposes `marker` on the leader (again when a new leader lost it) until it commits: whether
/// it did within `ticks`.
fn commits_within(
    c: &mut Cluster,
    marker: &[u8],
    ticks: u64,
    fail: &dyn Fn(String) -> SeedFailed,
) -> Result<bool, SeedFailed> {
    let marker = EntryData::Normal(marker.to_vec());
    // (leader, index) of the marker's latest proposal.
    let mut proposed: Option<(u64, u64)> = None;
    for _ in 0..ticks {
        if c.committed().values().any(|e| e.data == marker) {
            return Ok(true);
        }
        let leader = c.leader();
        let pending = proposed.is_some_and(|(l, i)| {
            Some(l) == leader
                && c.raft(l)
                    .is_some_and(|r| r.log().entry(i).is_some_and(|e| e.data == marker))
        });
        if !pending && let (Some(l), EntryData::Normal(data)) = (leader, &marker) {
            proposed = c.propose(data.clone()).map(|i| (l, i));
        }
        c.tick().map_err(|v| fail(v.to_string()))?;
    }
    Ok(false)
}
