//! The conformance suite every [`WitnessStore`] passes (design note "One conformance suite for
//! every backend"; modelled on object_store's `integration.rs`).
//!
//! A backend's tests implement [`Backend`] (fresh, empty locations) and [`Location`] (clients
//! of one location, raw access to its newest record) and call [`run_all`]; the multi-process
//! race is [`increments_in_processes`]. Every check asserts exact outcomes, so a store that
//! loses, duplicates or reorders a write fails it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::client::{RetryPolicy, Witness};
use crate::error::{Error, Result};
use crate::rules::{AppendReply, AppendRequest, Caller, Outcome, VoteRequest};
use crate::state::WitnessState;
use crate::store::{CasOutcome, Loaded, Version, WitnessStore};

/// A kind of storage under test.
#[async_trait]
pub trait Backend: Send + Sync {
    /// A new, empty witness location.
    async fn fresh(&self) -> Arc<dyn Location>;
}

/// One witness location (a directory, a blob) under test.
#[async_trait]
pub trait Location: Send + Sync {
    /// A new, independent client of this location (as another node would open it).
    async fn client(&self) -> Arc<dyn WitnessStore>;
    /// The newest record's bytes, read behind the store's back.
    async fn read_raw(&self) -> Vec<u8>;
    /// Replaces the newest record's bytes behind the store's back (to damage it).
    async fn write_raw(&self, bytes: &[u8]);
    /// How many versions are stored now (1 for single-record stores).
    async fn stored_versions(&self) -> usize;
    /// How many versions the store promises to keep at most, if it keeps history.
    fn retention(&self) -> Option<usize>;
}

const CALLER: Caller = Caller {
    cluster_id: 0xc1,
    witness_id: 0x3,
    seen: crate::Seen::NOTHING,
};

/// A policy that outlasts heavy contention in the counter tests.
pub fn patient() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 100_000,
        initial_backoff: Duration::from_micros(200),
        max_backoff: Duration::from_millis(20),
    }
}

/// A fixed generation, so that two states built by these checks compare equal.
fn initial() -> WitnessState {
    WitnessState {
        generation: 0x5eed,
        ..WitnessState::new(0, "w", "witness:mount?path=%2Fw")
    }
}

fn with_term(term: u64) -> WitnessState {
    WitnessState {
        term,
        writer_nonce: term + 1,
        ..initial()
    }
}

async fn load(store: &dyn WitnessStore) -> Loaded {
    store.load().await.expect("load").expect("a stored state")
}

/// Runs every single-process check, each on a fresh location.
pub async fn run_all(backend: &dyn Backend) {
    empty_location(backend.fresh().await).await;
    exclusive_create(backend.fresh().await).await;
    compare_and_swap(backend.fresh().await).await;
    increments_in_tasks(backend.fresh().await, 4, 25).await;
    lost_reply_is_resolved_by_rereading(backend.fresh().await).await;
    corruption_is_rejected(backend.fresh().await).await;
    retention_keeps_newest(backend.fresh().await).await;
}

/// Nothing stored: `load` is `None`, a step says "not initialised", nothing gets written.
pub async fn empty_location(loc: Arc<dyn Location>) {
    let store = loc.client().await;
    assert!(store.load().await.expect("load").is_none());
    let w = Witness::new(store.clone());
    let err = w.read_term(CALLER).await.unwrap_err();
    assert!(matches!(err, Error::NotInitialised { .. }), "{err}");
    assert!(store.load().await.expect("load").is_none());
}

/// Of many racing creators exactly one wins, and its state is what is stored.
pub async fn exclusive_create(loc: Arc<dyn Location>) {
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let store = loc.client().await;
        tasks.push(tokio::spawn(async move {
            let outcome = store.create(&with_term(i)).await.expect("create");
            (i, outcome)
        }));
    }
    let mut winners = Vec::new();
    for t in tasks {
        let (i, outcome) = t.await.expect("task");
        if let CasOutcome::Written(v) = outcome {
            winners.push((i, v));
        }
    }
    assert_eq!(winners.len(), 1, "exactly one create wins: {winners:?}");
    let store = loc.client().await;
    let loaded = load(&*store).await;
    assert_eq!(loaded.state, with_term(winners[0].0));
    assert_eq!(loaded.version, winners[0].1);
    assert_eq!(
        store.create(&with_term(99)).await.expect("create"),
        CasOutcome::Conflict
    );
    assert_eq!(
        load(&*store).await,
        loaded,
        "a losing create changes nothing"
    );
}

/// CAS succeeds on the current version, fails on a stale one, and a failure changes nothing.
pub async fn compare_and_swap(loc: Arc<dyn Location>) {
    let store = loc.client().await;
    let CasOutcome::Written(v0) = store.create(&with_term(0)).await.expect("create") else {
        panic!("create on an empty location must succeed");
    };
    assert_eq!(load(&*store).await.version, v0);
    let CasOutcome::Written(v1) = store
        .compare_and_swap(&v0, &with_term(1))
        .await
        .expect("cas")
    else {
        panic!("CAS on the current version must succeed");
    };
    assert_ne!(v0, v1);
    let after = load(&*store).await;
    assert_eq!(
        (after.state.clone(), after.version.clone()),
        (with_term(1), v1.clone())
    );
    // A second client sees the same.
    assert_eq!(load(&*loc.client().await).await, after);
    assert_eq!(
        store
            .compare_and_swap(&v0, &with_term(2))
            .await
            .expect("cas"),
        CasOutcome::Conflict
    );
    assert_eq!(load(&*store).await, after, "a failed CAS changes nothing");
    let CasOutcome::Written(v2) = store
        .compare_and_swap(&v1, &with_term(2))
        .await
        .expect("cas")
    else {
        panic!("CAS on the current version must succeed");
    };
    assert_eq!(
        load(&*store).await,
        Loaded {
            state: with_term(2),
            version: v2
        }
    );
}

/// Increments `term` once through the retrying client; returns the term written. (A counter
/// for races and benchmarks; not a witness rule.)
pub async fn increment<S: WitnessStore>(w: &Witness<S>) -> Result<u64> {
    let stepped = w
        .step("increment", |s, _| {
            let next = WitnessState {
                term: s.term + 1,
                ..s.clone()
            };
            Ok(Outcome {
                reply: next.term,
                write: Some(next),
            })
        })
        .await?;
    assert!(stepped.wrote);
    Ok(stepped.reply)
}

/// `tasks` concurrent writers, each with its own client, each incrementing `per_task` times:
/// every increment is counted exactly once (see [`assert_counted`]).
pub async fn increments_in_tasks(loc: Arc<dyn Location>, tasks: u64, per_task: u64) {
    let store = loc.client().await;
    store.create(&initial()).await.expect("create");
    let unknown = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let w = Witness::with_policy(counting(loc.client().await, &unknown), patient());
        handles.push(tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..per_task {
                seen.push(increment(&w).await.expect("increment"));
            }
            seen
        }));
    }
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.expect("task"));
    }
    all.sort_unstable();
    all.dedup();
    assert_eq!(
        all.len() as u64,
        tasks * per_task,
        "every increment wrote a distinct next value"
    );
    let last = load(&*store).await.state.term;
    assert!(all.iter().all(|v| (1..=last).contains(v)));
    assert_counted(
        last,
        tasks * per_task,
        unknown.load(Ordering::SeqCst),
        "tasks",
    );
}

/// The final count of a race of increments: never below `expected` (a lost update), and above
/// it by at most the number of writes whose outcome was unknown. A write whose reply was lost
/// is re-read and its step run again; the witness rules are idempotent so that changes nothing,
/// but the counter is not, and when another writer came in between, the retry counts again.
/// Any other surplus is a write stored twice.
fn assert_counted(last: u64, expected: u64, unknown: u64, what: &str) {
    assert!(
        last >= expected,
        "{what}: {expected} increments but the count is {last}: updates were lost"
    );
    assert!(
        last - expected <= unknown,
        "{what}: {expected} increments and {unknown} writes of unknown outcome, but the count is {last}: a write was stored twice"
    );
    if unknown > 0 {
        eprintln!(
            "{what}: {unknown} writes of unknown outcome, {} counted twice",
            last - expected
        );
    }
}

const CHILD_ENV: &str = "WITNESS_CONFORMANCE_CHILD";
const LOCATION_ENV: &str = "WITNESS_CONFORMANCE_LOCATION";

/// In a child process of [`increments_in_processes`]: the location it must use. Call this
/// before any parent-only set-up (such as starting a server), and pass the result on.
pub fn child_location() -> Option<String> {
    std::env::var(CHILD_ENV)
        .ok()
        .and(std::env::var(LOCATION_ENV).ok())
}

/// The multi-process race: `processes` OS processes (this test binary re-run as children with
/// `test_name`) each increment `per_process` times through `open(location)`; the final count is
/// exact. In a child, does its share of increments and returns.
///
/// Call it from a test named `test_name` that does nothing else.
pub async fn increments_in_processes<F>(
    test_name: &str,
    location: &str,
    open: F,
    processes: u64,
    per_process: u64,
) where
    F: Fn(&str) -> Arc<dyn WitnessStore>,
{
    if let Some(child_location) = child_location() {
        let unknown = Arc::new(AtomicU64::new(0));
        let w = Witness::with_policy(counting(open(&child_location), &unknown), patient());
        for _ in 0..per_process {
            increment(&w).await.expect("increment in child process");
        }
        println!("{UNKNOWN_PREFIX}{}", unknown.load(Ordering::SeqCst));
        return;
    }
    let store = open(location);
    store.create(&initial()).await.expect("create");
    let exe = std::env::current_exe().expect("current test binary");
    let mut children = Vec::new();
    let mut unknown = 0;
    for _ in 0..processes {
        let child = tokio::process::Command::new(&exe)
            .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .env(LOCATION_ENV, location)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn child test process");
        children.push(child);
    }
    for c in children {
        let out = c.wait_with_output().await.expect("wait for child");
        assert!(
            out.status.success(),
            "child process failed: {}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let reported = stdout
            .lines()
            .find_map(|l| l.split(UNKNOWN_PREFIX).nth(1))
            .and_then(|n| n.trim().parse::<u64>().ok());
        unknown += reported.unwrap_or_else(|| {
            panic!("child process did not report its unknown outcomes:\n{stdout}")
        });
    }
    assert_counted(
        load(&*store).await.state.term,
        processes * per_process,
        unknown,
        &format!("{processes} processes x {per_process} increments"),
    );
}

/// How a child process of [`increments_in_processes`] reports its writes of unknown outcome
/// (anywhere in a line: the test harness prints the test's name on the same line).
const UNKNOWN_PREFIX: &str = "witness-conformance-unknown-outcomes=";

fn counting(inner: Arc<dyn WitnessStore>, unknown: &Arc<AtomicU64>) -> Intercepted {
    Intercepted {
        inner,
        lose_next_reply: AtomicBool::new(false),
        unknown: unknown.clone(),
    }
}

/// Wraps a store so that the first compare-and-swap takes effect but reports a transient error.
fn losing_first_reply(inner: Arc<dyn WitnessStore>) -> Intercepted {
    Intercepted {
        inner,
        lose_next_reply: AtomicBool::new(true),
        unknown: Arc::default(),
    }
}

/// A store seen through the test: it can lose the reply of the next write that takes effect,
/// and it counts the compare-and-swaps that failed with a transient error (the write may or may
/// not have taken effect).
#[derive(Debug)]
struct Intercepted {
    inner: Arc<dyn WitnessStore>,
    lose_next_reply: AtomicBool,
    unknown: Arc<AtomicU64>,
}

#[async_trait]
impl WitnessStore for Intercepted {
    fn location(&self) -> String {
        self.inner.location()
    }
    async fn load(&self) -> Result<Option<Loaded>> {
        self.inner.load().await
    }
    async fn create(&self, state: &WitnessState) -> Result<CasOutcome> {
        self.inner.create(state).await
    }
    async fn compare_and_swap(
        &self,
        expected: &Version,
        state: &WitnessState,
    ) -> Result<CasOutcome> {
        let mut outcome = self.inner.compare_and_swap(expected, state).await;
        if matches!(outcome, Ok(CasOutcome::Written(_)))
            && self.lose_next_reply.swap(false, Ordering::SeqCst)
        {
            outcome = Err(Error::Remote {
                op: "compare-and-swap",
                location: self.inner.location(),
                message: "reply lost (injected)".into(),
                transient: true,
            });
        }
        if matches!(&outcome, Err(e) if e.is_transient()) {
            self.unknown.fetch_add(1, Ordering::SeqCst);
        }
        outcome
    }
}

fn append_request(term: u64, subterm: u64, index: u64) -> AppendRequest {
    AppendRequest {
        caller: CALLER,
        term,
        leader: 1,
        entry_term: term,
        entry_subterm: subterm,
        index,
        replication_set: vec![1, 3],
        replication_set_outgoing: vec![],
    }
}

/// A write whose reply was lost is found by re-reading: the step answers as if the reply had
/// arrived, and writes nothing twice.
pub async fn lost_reply_is_resolved_by_rereading(loc: Arc<dyn Location>) {
    let store = loc.client().await;
    store.create(&initial()).await.expect("create");
    let w = Witness::new(losing_first_reply(store.clone()));
    let before = load(&*store).await.version;
    let stepped = w.append(&append_request(2, 1, 10)).await.expect("append");
    assert_eq!(stepped.reply, AppendReply::Ack { term: 2, index: 10 });
    assert!(
        !stepped.wrote,
        "the retry found the write done and wrote nothing"
    );
    assert_eq!(stepped.attempts, 2);
    let after = load(&*store).await;
    assert_ne!(after.version, before);
    assert_eq!(after.version, stepped.version);
    assert_eq!(after.state.last_log_position(), (2, 1));

    let w = Witness::new(losing_first_reply(store.clone()));
    let vote = VoteRequest {
        caller: CALLER,
        term: 3,
        candidate: 1,
        last_log_term: 2,
        last_log_subterm: 1,
        granted: vec![1],
        granted_outgoing: vec![],
    };
    let stepped = w.vote(&vote).await.expect("vote");
    assert!(stepped.reply.granted);
    assert!(!stepped.wrote);
    let after = load(&*store).await.state;
    assert_eq!((after.term, after.voted_for), (3, 1));
}

/// Damaged records are errors (never a fallback), and a failing step leaves the bytes alone.
pub async fn corruption_is_rejected(loc: Arc<dyn Location>) {
    let store = loc.client().await;
    store.create(&initial()).await.expect("create");
    let w = Witness::new(store.clone());
    w.append(&append_request(1, 0, 1)).await.expect("append");
    w.append(&append_request(1, 1, 2)).await.expect("append");
    let good = loc.read_raw().await;
    let damages: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", good[..good.len() / 2].to_vec()),
        ("empty", Vec::new()),
        ("bit flip", {
            let mut b = good.clone();
            let at = b.len() - 6;
            b[at] ^= 0x10;
            b
        }),
        ("bad magic", {
            let mut b = good.clone();
            b[0] = b'X';
            b
        }),
    ];
    for (what, bytes) in damages {
        loc.write_raw(&bytes).await;
        let err = store.load().await.expect_err(what);
        assert!(matches!(err, Error::Corrupt { .. }), "{what}: {err}");
        let err = w.append(&append_request(1, 2, 3)).await.expect_err(what);
        assert!(matches!(err, Error::Corrupt { .. }), "{what}: {err}");
        assert_eq!(
            loc.read_raw().await,
            bytes,
            "{what}: a failed step changed the record"
        );
    }
    loc.write_raw(&good).await;
    assert_eq!(load(&*store).await.state.last_log_position(), (1, 1));
}

/// After many writes, at most `retention` versions are kept, and the newest is intact.
pub async fn retention_keeps_newest(loc: Arc<dyn Location>) {
    let store = loc.client().await;
    store.create(&initial()).await.expect("create");
    let w = Witness::new(store.clone());
    let writes = loc.retention().unwrap_or(1) as u64 * 3 + 2;
    for i in 1..=writes {
        w.append(&append_request(1, i, i)).await.expect("append");
    }
    let kept = loc.stored_versions().await;
    assert!(kept >= 1, "the newest version is always kept");
    if let Some(retention) = loc.retention() {
        assert!(
            kept <= retention,
            "kept {kept} versions, retention is {retention}"
        );
    }
    assert_eq!(load(&*store).await.state.last_log_position(), (1, writes));
}
