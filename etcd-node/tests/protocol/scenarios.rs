//! Scenario tests as data: each `scenarios/*.txt` file is a readable script run against the
//! simulated cluster (with every invariant checked after every tick). Commands, one per line
//! (`#` starts a comment):
//!
//! ```text
//! cluster N [witness] [no-check-quorum]
//!                              N regular nodes (ids 1..N), witness id N+1; check-quorum off:
//!                              a leader cut off from its quorum goes on believing it leads
//! campaign ID                  node ID starts an election now
//! run TICKS                    advance time
//! run-loaded TICKS             advance time with one proposal per tick, held while the
//!                              leader asks for it (as the server does)
//! run-until leader IDS|any MAX tick until one of IDS (`3` or `3,4,5`; or anyone) leads, failing
//!                              after MAX ticks
//! propose N                    N proposals on the current leader
//! run-until committed MAX      tick until everything proposed so far is applied somewhere
//! crash ID | restart ID        stop a node (losing nothing persisted) | start it again
//! report-down ID               the others learn that ID is down (its connections closed)
//! partition A B | cut-witness ID | restore-witness ID | heal
//! conf KIND ID [KIND ID...]    a configuration change on the leader (KIND: add-voter,
//!                              add-learner, add-witness, remove); several: a joint change
//! conf-refused KIND ID [...]   the leader refuses that change
//! transfer ID | transfer-refused ID   leader transfer to ID (refused: must be refused)
//! compact ID                   node ID snapshots its state machine and compacts its log
//! read N                       N linearizable reads on any live node
//! read-on ID N                 N linearizable reads on node ID (say, a deposed leader)
//! run-until reads MAX          tick until every read started is answered (served or refused)
//! expect reads-refused N       reads answered with an error so far
//! run-until caught-up ID MAX   tick until node ID holds the leader's whole log
//! mark                         remember the witness step and write counters
//! expect leader ID|none        the current leader (the newest term's)
//! expect leads ID yes|no       node ID believes it leads (or not)
//! expect witness-writes N      witness writes since `mark`
//! expect witness-steps N       witness steps (reads and writes) since `mark`
//! expect rset IDS              the leader's replication set, e.g. `1,3`
//! expect regular IDS | expect witness ID|none | expect learners IDS|none
//!                              the leader's configuration
//! expect snapshots N           snapshots installed by followers so far
//! ```

use std::path::Path;

use etcd_node::raft::{Change, ChangeKind, ConfChange, EntryData, Mutation};
use etcd_node::sim::Cluster;

struct Script {
    /// A deliberate bug every node of the cluster runs with (`mutations.rs`).
    mutation: Option<Mutation>,
    cluster: Option<Cluster>,
    proposed: Vec<Vec<u8>>,
    reads: u64,
    mark: (u64, u64),
}

fn ids(list: &str, line: &str) -> Vec<u64> {
    if list == "none" {
        return Vec::new();
    }
    list.split(',').map(|v| num(Some(v), line)).collect()
}

fn conf_change(words: &[&str], line: &str) -> ConfChange {
    let changes = words
        .chunks(2)
        .map(|pair| {
            let kind = match pair[0] {
                "add-voter" => ChangeKind::AddVoter,
                "add-learner" => ChangeKind::AddLearner,
                "add-witness" => ChangeKind::AddWitness,
                "remove" => ChangeKind::Remove,
                other => panic!("{line}: unknown change {other:?}"),
            };
            Change {
                kind,
                node: num(pair.get(1).copied(), line),
            }
        })
        .collect();
    ConfChange {
        changes,
        context: Vec::new(),
        witness_generation: 0,
    }
}

fn num(s: Option<&str>, line: &str) -> u64 {
    s.and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("expected a number in {line:?}"))
}

impl Script {
    fn c(&mut self) -> &mut Cluster {
        self.cluster.as_mut().expect("`cluster` must come first")
    }

    fn all_committed(&self) -> bool {
        let c = self.cluster.as_ref().expect("cluster");
        let applied: std::collections::BTreeSet<&[u8]> = c
            .committed()
            .values()
            .filter_map(|e| match &e.data {
                EntryData::Normal(d) => Some(d.as_slice()),
                EntryData::Empty | EntryData::ConfChange(_) => None,
            })
            .collect();
        self.proposed.iter().all(|p| applied.contains(p.as_slice()))
    }

    fn run_until(&mut self, max: u64, line: &str, done: impl Fn(&Script) -> bool) {
        for _ in 0..max {
            if done(self) {
                return;
            }
            if let Err(v) = self.c().tick() {
                panic!("{line}: invariant violated {v}");
            }
        }
        assert!(done(self), "{line}: not reached within {max} ticks");
    }

    /// Runs one command; `line` is `file:number: command`, shown whole in any failure.
    fn exec(&mut self, line: &str) {
        let command = line.rsplit(": ").next().unwrap_or(line);
        if let Some(c) = self.cluster.as_mut() {
            let now = c.now();
            if let Some(t) = c.trace.as_mut() {
                t.note(now, command);
            }
        }
        let words: Vec<&str> = command.split_whitespace().collect();
        let mut w = words.iter().copied();
        match (w.next(), w.next()) {
            (Some("cluster"), n) => {
                let witness = words.contains(&"witness");
                let check_quorum = !words.contains(&"no-check-quorum");
                let mutation = self.mutation;
                let mut c = Cluster::with_config(num(n, line), witness, 7, |cfg| {
                    cfg.mutation = mutation;
                    cfg.check_quorum = check_quorum;
                });
                c.record_trace();
                if let Some(t) = c.trace.as_mut() {
                    t.note(0, command);
                }
                self.cluster = Some(c);
            }
            (Some("campaign"), id) => {
                let id = num(id, line);
                self.c().campaign(id);
            }
            (Some("run-until"), _) => {
                let what = words[1];
                let max = num(words.last().copied(), line);
                match what {
                    "leader" => {
                        let want = match words[2] {
                            "any" => None,
                            list => Some(ids(list, line)),
                        };
                        self.run_until(max, line, |s| {
                            let leader = s.cluster.as_ref().expect("cluster").leader();
                            match (&want, leader) {
                                (None, _) => leader.is_some(),
                                (Some(ids), Some(id)) => ids.contains(&id),
                                (Some(_), None) => false,
                            }
                        });
                    }
                    "committed" => self.run_until(max, line, Script::all_committed),
                    "reads" => self.run_until(max, line, |s| {
                        let stats = &s.cluster.as_ref().expect("cluster").stats;
                        stats.reads_served + stats.reads_refused == s.reads
                    }),
                    "caught-up" => {
                        let id = num(words.get(2).copied(), line);
                        self.run_until(max, line, |s| {
                            let c = s.cluster.as_ref().expect("cluster");
                            let last = |n| c.raft(n).map(|r| r.log().last_index());
                            let leader = c.leader();
                            leader.is_some() && last(id) == leader.and_then(last)
                        });
                    }
                    other => panic!("{line}: unknown run-until target {other:?}"),
                }
            }
            (Some("run"), t) => {
                let t = num(t, line);
                for _ in 0..t {
                    if let Err(v) = self.c().tick() {
                        panic!("{line}: invariant violated {v}");
                    }
                }
            }
            (Some("propose"), n) => {
                for _ in 0..num(n, line) {
                    let data = format!("p{}", self.proposed.len()).into_bytes();
                    assert!(
                        self.c().propose(data.clone()).is_some(),
                        "{line}: no leader took the proposal"
                    );
                    self.proposed.push(data);
                }
            }
            (Some("run-loaded"), t) => {
                // One proposal per tick, faster than a round trip, held (as the server holds
                // them) while the leader asks for it.
                let mut held = 0;
                for _ in 0..num(t, line) {
                    let c = self.c();
                    let holding = c
                        .leader()
                        .and_then(|l| c.raft(l))
                        .is_some_and(|r| r.proposals_held());
                    held += 1;
                    while held > 0 && !holding {
                        let data = format!("p{}", self.proposed.len()).into_bytes();
                        if self.c().propose(data.clone()).is_some() {
                            self.proposed.push(data);
                        }
                        held -= 1;
                    }
                    if let Err(v) = self.c().tick() {
                        panic!("{line}: invariant violated {v}");
                    }
                }
            }
            (Some("crash"), id) => {
                let id = num(id, line);
                self.c().crash(id);
            }
            (Some("restart"), id) => {
                let id = num(id, line);
                self.c().restart(id);
            }
            (Some("partition"), a) => {
                let b = num(words.get(2).copied(), line);
                let a = num(a, line);
                self.c().partition(a, b);
            }
            (Some("cut-witness"), id) => {
                let id = num(id, line);
                self.c().cut_witness(id);
            }
            (Some("report-down"), id) => {
                let id = num(id, line);
                self.c().report_down(id);
            }
            (Some("restore-witness"), id) => {
                let id = num(id, line);
                self.c().restore_witness(id);
            }
            (Some("heal"), _) => self.c().heal(),
            (Some("conf"), _) => {
                let cc = conf_change(&words[1..], line);
                if let Err(e) = self.c().propose_conf_change(cc) {
                    panic!("{line}: refused: {e}");
                }
            }
            (Some("conf-refused"), _) => {
                let cc = conf_change(&words[1..], line);
                let got = self.c().propose_conf_change(cc);
                assert!(got.is_err(), "{line}: accepted at index {got:?}");
            }
            (Some("transfer"), id) => {
                let id = num(id, line);
                if let Err(e) = self.c().transfer_leader(id) {
                    panic!("{line}: refused: {e}");
                }
            }
            (Some("transfer-refused"), id) => {
                let id = num(id, line);
                assert!(self.c().transfer_leader(id).is_err(), "{line}: accepted");
            }
            (Some("compact"), id) => {
                let id = num(id, line);
                self.c().compact(id);
            }
            (Some("read"), n) => {
                for _ in 0..num(n, line) {
                    if let Err(e) = self.c().read() {
                        panic!("{line}: refused: {e}");
                    }
                    self.reads += 1;
                }
            }
            (Some("read-on"), id) => {
                let id = num(id, line);
                for _ in 0..num(words.get(2).copied(), line) {
                    self.c().read_on(id);
                    self.reads += 1;
                }
            }
            (Some("expect"), Some("reads-refused")) => {
                let got = self.c().stats.reads_refused;
                assert_eq!(got, num(words.get(2).copied(), line), "{line}");
            }
            (Some("expect"), Some("leads")) => {
                let got = self.c().believes_it_leads(num(words.get(2).copied(), line));
                assert_eq!(got, words.get(3) == Some(&"yes"), "{line}");
            }
            (Some("mark"), _) => {
                let s = &self.c().stats;
                self.mark = (s.witness_steps, s.witness_writes);
            }
            (Some("expect"), Some("leader")) => {
                let got = self.c().leader();
                let want = match words[2] {
                    "none" => None,
                    id => Some(num(Some(id), line)),
                };
                assert_eq!(got, want, "{line}");
            }
            (Some("expect"), Some("witness-writes")) => {
                let got = self.c().stats.witness_writes - self.mark.1;
                assert_eq!(got, num(words.get(2).copied(), line), "{line}");
            }
            (Some("expect"), Some("witness-steps")) => {
                let got = self.c().stats.witness_steps - self.mark.0;
                assert_eq!(got, num(words.get(2).copied(), line), "{line}");
            }
            (Some("expect"), Some("rset")) => {
                let leader = self
                    .c()
                    .leader()
                    .unwrap_or_else(|| panic!("{line}: no leader"));
                let raft = self.c().raft(leader).expect("leader is up");
                let got: Vec<u64> = raft
                    .leader_view()
                    .expect("leader")
                    .1
                    .iter()
                    .copied()
                    .collect();
                assert_eq!(got, ids(words[2], line), "{line}");
            }
            (Some("expect"), Some(what @ ("regular" | "witness" | "learners"))) => {
                let m = self.c().membership();
                let got: Vec<u64> = match what {
                    "regular" => m.voters.regular.iter().copied().collect(),
                    "witness" => m.voters.witness.into_iter().collect(),
                    _ => m.learners.iter().copied().collect(),
                };
                assert_eq!(got, ids(words[2], line), "{line}");
            }
            (Some("expect"), Some("snapshots")) => {
                let got = self.c().stats.snapshots_installed;
                assert_eq!(got, num(words.get(2).copied(), line), "{line}");
            }
            _ => panic!("unknown scenario command {line:?}"),
        }
    }
}

fn run_file(path: &Path) {
    run_file_with(path, None);
}

/// Runs a scenario file with every node running `mutation`; panics on the first failure.
pub fn run_file_with(path: &Path, mutation: Option<Mutation>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut script = Script {
        mutation,
        cluster: None,
        proposed: Vec::new(),
        reads: 0,
        mark: (0, 0),
    };
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        script.exec(&format!("{}:{}: {line}", path.display(), n + 1));
    }
    let trace = script
        .cluster
        .as_mut()
        .and_then(|c| c.trace.as_mut())
        .map(|t| t.take())
        .unwrap_or_default();
    compare_with_golden(&path.with_extension("trace"), &trace);
}

/// Compares a scenario's trace with its golden file, or rewrites the file when
/// `SCENARIO_REWRITE` is set (then review the diff: it is the change in behaviour).
fn compare_with_golden(golden: &Path, trace: &[String]) {
    let text = format!("{}\n", trace.join("\n"));
    if std::env::var_os("SCENARIO_REWRITE").is_some() {
        std::fs::write(golden, text).unwrap_or_else(|e| panic!("{}: {e}", golden.display()));
        return;
    }
    let rewrite = "SCENARIO_REWRITE=1 cargo test -p etcd-node --test protocol scenarios writes \
                   the traces anew; review the diff";
    let want = std::fs::read_to_string(golden)
        .unwrap_or_else(|e| panic!("{}: {e} ({rewrite})", golden.display()));
    if want == text {
        return;
    }
    let (want_lines, got_lines): (Vec<&str>, Vec<&str>) =
        (want.lines().collect(), text.lines().collect());
    let at = want_lines
        .iter()
        .zip(&got_lines)
        .position(|(a, b)| a != b)
        .unwrap_or(want_lines.len().min(got_lines.len()));
    let around = |lines: &[&str]| lines[at.saturating_sub(3)..(at + 3).min(lines.len())].join("\n");
    panic!(
        "{}: the trace differs from the golden file at line {}:\n--- golden\n{}\n--- now\n{}\n\
         If the change is intended: {rewrite}",
        golden.display(),
        at + 1,
        around(&want_lines),
        around(&got_lines)
    );
}

#[test]
fn every_scenario_file_passes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/scenarios")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "txt"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 6,
        "expected the scenario files, found {files:?}"
    );
    for f in files {
        println!("scenario {}", f.display());
        run_file(&f);
    }
}
