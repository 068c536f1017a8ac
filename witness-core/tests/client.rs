//! The retrying client and the in-memory store: conformance, fault injection, contention.

use std::sync::Arc;
use std::time::Duration;

use witness_core::conformance::{self, Backend, Location};
use witness_core::{
    AppendReply, AppendRequest, Caller, CasOutcome, Error, Fault, MemoryStore, RetryPolicy,
    Witness, WitnessState, WitnessStore, codec,
};

#[derive(Debug, Default)]
struct MemLocation(Arc<MemoryStore>);

#[async_trait::async_trait]
impl Location for MemLocation {
    async fn client(&self) -> Arc<dyn WitnessStore> {
        self.0.clone()
    }
    async fn read_raw(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.0.corrupt_latest(|b| out = b.clone());
        out
    }
    async fn write_raw(&self, bytes: &[u8]) {
        self.0.corrupt_latest(|b| *b = bytes.to_vec());
    }
    async fn stored_versions(&self) -> usize {
        1
    }
    fn retention(&self) -> Option<usize> {
        None
    }
}

struct Memory;

#[async_trait::async_trait]
impl Backend for Memory {
    async fn fresh(&self) -> Arc<dyn Location> {
        Arc::new(MemLocation::default())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn memory_store_passes_the_conformance_suite() {
    conformance::run_all(&Memory).await;
}

const CALLER: Caller = Caller {
    cluster_id: 1,
    witness_id: 3,
    seen: witness_core::Seen::NOTHING,
};

fn req(subterm: u64) -> AppendRequest {
    AppendRequest {
        caller: CALLER,
        term: 1,
        leader: 1,
        entry_term: 1,
        entry_subterm: subterm,
        index: subterm + 1,
        replication_set: vec![1, 3],
        replication_set_outgoing: vec![],
    }
}

async fn initialised() -> Arc<MemoryStore> {
    let store = Arc::new(MemoryStore::new());
    store.create(&WitnessState::new(0, "w", "x")).await.unwrap();
    store
}

fn quick() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        initial_backoff: Duration::from_micros(10),
        max_backoff: Duration::from_micros(100),
    }
}

#[tokio::test]
async fn conflicts_are_retried_and_counted() {
    let store = initialised().await;
    store.inject(Fault::Conflict);
    store.inject(Fault::Conflict);
    let w = Witness::with_policy(store.clone(), quick());
    let s = w.append(&req(1)).await.unwrap();
    assert_eq!(s.reply, AppendReply::Ack { term: 1, index: 2 });
    assert_eq!((s.attempts, s.conflicts, s.wrote), (3, 2, true));
    assert_eq!(store.counts().1, 2, "create + exactly one successful write");
    assert_eq!(
        w.counters()
            .conflicts
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[tokio::test]
async fn transient_errors_are_retried() {
    let store = initialised().await;
    store.inject(Fault::Error); // the load fails
    store.inject(Fault::Delay(Duration::from_millis(5)));
    store.inject(Fault::Error); // the first CAS fails without effect
    let w = Witness::with_policy(store.clone(), quick());
    let s = w.append(&req(1)).await.unwrap();
    assert!(s.wrote);
    assert_eq!(s.attempts, 3);
}

/// Each written state names the state it was computed from: a mount store tells by it whether
/// others built on a write whose predecessor was cleaned up.
#[tokio::test]
async fn a_written_state_names_the_nonce_of_the_one_it_replaced() {
    let store = initialised().await;
    let w = Witness::with_policy(store.clone(), quick());
    let mut previous = store.load().await.unwrap().unwrap().state;
    for subterm in 1..4 {
        assert!(w.append(&req(subterm)).await.unwrap().wrote);
        let now = store.load().await.unwrap().unwrap().state;
        assert_eq!(now.previous_nonce, previous.writer_nonce);
        assert_ne!(now.writer_nonce, previous.writer_nonce);
        previous = now;
    }
}

#[tokio::test]
async fn lost_reply_is_not_written_twice() {
    let store = initialised().await;
    store.inject(Fault::LostReply);
    let w = Witness::with_policy(store.clone(), quick());
    let s = w.append(&req(1)).await.unwrap();
    assert_eq!(s.reply, AppendReply::Ack { term: 1, index: 2 });
    assert!(
        !s.wrote,
        "the second attempt saw our write and acknowledged without writing"
    );
    assert_eq!(store.counts().1, 2, "create + one write, not two");
}

#[tokio::test]
async fn attempts_are_bounded() {
    let store = initialised().await;
    for _ in 0..10 {
        store.inject(Fault::Conflict);
    }
    let w = Witness::with_policy(store.clone(), quick());
    let err = w.append(&req(1)).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::TooManyConflicts {
                attempts: 5,
                conflicts: 5,
                ..
            }
        ),
        "{err}"
    );
    let store = initialised().await;
    for _ in 0..10 {
        store.inject(Fault::Error);
    }
    let w = Witness::with_policy(store.clone(), quick());
    let err = w.append(&req(2)).await.unwrap_err();
    assert!(
        err.is_transient(),
        "gives up with the last transient error: {err}"
    );
}

#[tokio::test]
async fn corrupt_state_is_an_error_and_untouched() {
    let store = initialised().await;
    store.corrupt_latest(|b| {
        let n = b.len();
        b[n - 1] ^= 1
    });
    let w = Witness::new(store.clone());
    let err = w.append(&req(1)).await.unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err}");
    assert!(
        err.to_string().contains("replace the witness at runtime")
            && !err.to_string().contains("--force"),
        "points to the safe recovery, never to --force: {err}"
    );
    assert_eq!(
        store.counts().1,
        1,
        "nothing written on top of a corrupt record"
    );
}

#[tokio::test]
async fn wrong_cluster_is_refused_and_state_unchanged() {
    let store = initialised().await;
    let w = Witness::new(store.clone());
    w.append(&req(1)).await.unwrap();
    let before = store.load().await.unwrap().unwrap();
    let mut other = req(2);
    other.caller.cluster_id = 99;
    let err = w.append(&other).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongCluster {
                stored: 1,
                requested: 99,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(store.load().await.unwrap().unwrap(), before);
}

#[tokio::test]
async fn create_does_not_overwrite() {
    let store = initialised().await;
    assert_eq!(
        store
            .create(&WitnessState::new(0, "other", "y"))
            .await
            .unwrap(),
        CasOutcome::Conflict
    );
    assert_eq!(store.load().await.unwrap().unwrap().state.name, "w");
    let bytes = codec::encode(&store.load().await.unwrap().unwrap().state);
    assert!(codec::decode(&bytes).is_ok());
}

/// What a member that saw `state` knows of it.
fn seen_after(state: &WitnessState) -> Caller {
    Caller {
        seen: witness_core::Seen::of(state),
        ..CALLER
    }
}

#[tokio::test]
async fn a_stale_load_loses_its_write_and_the_step_loads_again() {
    let store = initialised().await;
    let w = Witness::with_policy(store.clone(), quick());
    w.append(&req(1)).await.unwrap();
    w.append(&req(2)).await.unwrap();
    store.inject(Fault::StaleLoad(1));
    let s = w.append(&req(3)).await.unwrap();
    assert_eq!(s.reply, AppendReply::Ack { term: 1, index: 4 });
    assert_eq!((s.attempts, s.conflicts, s.wrote), (2, 1, true));
    let states = store.states();
    assert_eq!(states.len(), 4, "create and three appends, none lost");
    assert_eq!(states[3].last_log_subterm, 3);
}

#[tokio::test]
async fn a_stale_load_is_not_taken_for_a_reverted_witness() {
    let store = initialised().await;
    let w = Witness::with_policy(store.clone(), quick());
    w.append(&req(1)).await.unwrap();
    let newest = w.append(&req(2)).await.unwrap();
    assert!(newest.wrote);
    let caller = seen_after(&store.states()[2]);
    // The member saw subterm 2; a cache serves the state of subterm 1: it looks reverted.
    store.inject(Fault::StaleLoad(1));
    let s = w.read_term(caller).await.unwrap();
    assert_eq!(s.reply, 1);
    assert_eq!(s.attempts, 2, "answered from the second, fresh load");
    // Two stale loads in a row are still not a verdict.
    store.inject(Fault::StaleLoad(2));
    store.inject(Fault::StaleLoad(1));
    assert_eq!(w.read_term(caller).await.unwrap().attempts, 3);
}

#[tokio::test]
async fn a_reverted_witness_is_reported_after_loading_again() {
    let store = initialised().await;
    let w = Witness::with_policy(store.clone(), quick());
    w.append(&req(1)).await.unwrap();
    let mut ahead = store.states()[1].clone();
    ahead.last_log_subterm = 5;
    let caller = seen_after(&ahead);
    let (loads, _) = store.counts();
    let err = w.read_term(caller).await.unwrap_err();
    assert!(matches!(err, Error::Reverted { .. }), "{err}");
    assert_eq!(
        store.counts().0 - loads,
        u64::from(witness_core::LOST_STATE_LOADS),
        "loaded again before the verdict"
    );
}
