//! The `Witness` client: load -> rule -> compare-and-swap, retried.
//!
//! Invariants:
//! - every reply is computed by a pure rule from a state loaded in the same attempt, never from
//!   a cache (a stale state could acknowledge what the witness has since moved past);
//! - a write is attempted only with the version it was computed from; losing the race means
//!   load again and re-run the rule;
//! - after a transient failure of a write (the reply may have been lost), the next attempt
//!   re-reads and re-runs the rule: the rules are idempotent, so if our write took effect the
//!   rule now answers the same without writing, and if another writer came after us the answer
//!   is computed from the newer state, which is always safe;
//! - a state that says the witness lost its state (replaced, reverted) is loaded again, up to
//!   [`LOST_STATE_LOADS`] loads in all, before the step reports it: a mount's attribute or directory
//!   cache can serve an older version, which looks reverted to a member that saw a newer one;
//! - attempts are bounded ([`RetryPolicy::max_attempts`]); backoff is exponential with jitter.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;

use crate::error::{Error, Result};
use crate::rules::{self, AppendReply, AppendRequest, Caller, Outcome, VoteReply, VoteRequest};
use crate::state::WitnessState;
use crate::store::{CasOutcome, Loaded, Version, WitnessStore};

/// Loads in one step that must all find the witness's state lost before the step says so
/// (the first one and the re-reads of a possibly cached version).
pub const LOST_STATE_LOADS: u32 = 3;

/// How hard the client tries before giving up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Load/compare-and-swap rounds per step, conflicts and transient errors included.
    pub max_attempts: u32,
    /// Backoff before the second attempt; doubles up to `max_backoff`, with full jitter.
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 64,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(100),
        }
    }
}

/// The reply of a step and what it cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stepped<R> {
    pub reply: R,
    /// The storage version the reply was computed from, or the one written.
    pub version: Version,
    /// True when this step stored a new version.
    pub wrote: bool,
    /// Load/CAS rounds used (1 when uncontended).
    pub attempts: u32,
    /// Compare-and-swap races lost.
    pub conflicts: u32,
}

/// Counters over the life of a client (for metrics).
#[derive(Debug, Default)]
pub struct WitnessCounters {
    pub steps: AtomicU64,
    pub loads: AtomicU64,
    pub writes: AtomicU64,
    pub conflicts: AtomicU64,
    pub transient_errors: AtomicU64,
    /// Sum of step latencies in microseconds.
    pub latency_micros: AtomicU64,
}

/// Performs witness steps against a store.
#[derive(Debug)]
pub struct Witness<S> {
    store: S,
    policy: RetryPolicy,
    counters: WitnessCounters,
}

impl<S: WitnessStore> Witness<S> {
    pub fn new(store: S) -> Self {
        Self::with_policy(store, RetryPolicy::default())
    }

    pub fn with_policy(store: S, policy: RetryPolicy) -> Self {
        assert!(
            policy.max_attempts > 0,
            "RetryPolicy::max_attempts must be at least 1"
        );
        Witness {
            store,
            policy,
            counters: WitnessCounters::default(),
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn counters(&self) -> &WitnessCounters {
        &self.counters
    }

    /// AppendToWitness (see [`rules::append`]).
    pub async fn append(&self, req: &AppendRequest) -> Result<Stepped<AppendReply>> {
        self.step("append", |s, loc| rules::append(s, req, loc))
            .await
    }

    /// RequestVote to the witness (see [`rules::vote`]).
    pub async fn vote(&self, req: &VoteRequest) -> Result<Stepped<VoteReply>> {
        self.step("vote", |s, loc| rules::vote(s, req, loc)).await
    }

    /// Pre-vote (see [`rules::pre_vote`]): one load, never a write.
    pub async fn pre_vote(&self, req: &VoteRequest) -> Result<Stepped<VoteReply>> {
        self.step("pre-vote", |s, loc| {
            rules::pre_vote(s, req, loc).map(|reply| Outcome { reply, write: None })
        })
        .await
    }

    /// A fresh read of the witness term (see [`rules::read_term`]).
    pub async fn read_term(&self, caller: Caller) -> Result<Stepped<u64>> {
        self.step("read-term", |s, loc| {
            rules::read_term(s, caller, loc).map(|reply| Outcome { reply, write: None })
        })
        .await
    }

    /// Runs `rule` on the newest state and stores what it asks to store, retrying lost races and
    /// transient failures.
    pub async fn step<R>(
        &self,
        op: &'static str,
        rule: impl Fn(&WitnessState, &str) -> Result<Outcome<R>>,
    ) -> Result<Stepped<R>> {
        let started = Instant::now();
        let location = self.store.location();
        let mut conflicts = 0u32;
        let mut pending_nonce: Option<u64> = None;
        let mut last_transient: Option<Error> = None;
        let mut lost_verdicts = 0u32;
        for attempt in 1..=self.policy.max_attempts {
            if attempt > 1 {
                let pause = self.backoff(attempt - 1);
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            let loaded = match self.load(&location).await {
                Ok(l) => l,
                Err(e) if e.is_transient() => {
                    last_transient = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(nonce) = pending_nonce.take() {
                let ours = loaded.state.writer_nonce == nonce;
                tracing::info!(op, %location, ours, "re-read after an unknown write outcome");
            }
            let Outcome { reply, write } = match rule(&loaded.state, &location) {
                Ok(outcome) => outcome,
                Err(e) if e.is_lost_state() && lost_verdicts + 1 < LOST_STATE_LOADS => {
                    lost_verdicts += 1;
                    tracing::info!(op, %location, error = %e, "the witness looks reset; loading again in case the load was served from a cache");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let Some(next) = write else {
                let stepped = Stepped {
                    reply,
                    version: loaded.version,
                    wrote: false,
                    attempts: attempt,
                    conflicts,
                };
                return Ok(self.finish(op, started, stepped));
            };
            let next = next.succeeding(&loaded.state);
            match self.store.compare_and_swap(&loaded.version, &next).await {
                Ok(CasOutcome::Written(version)) => {
                    self.counters.writes.fetch_add(1, Ordering::Relaxed);
                    let stepped = Stepped {
                        reply,
                        version,
                        wrote: true,
                        attempts: attempt,
                        conflicts,
                    };
                    return Ok(self.finish(op, started, stepped));
                }
                Ok(CasOutcome::Conflict) => {
                    conflicts += 1;
                    self.counters.conflicts.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(op, %location, attempt, "lost a compare-and-swap race");
                }
                Err(e) if e.is_transient() => {
                    pending_nonce = Some(next.writer_nonce);
                    self.counters
                        .transient_errors
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(op, %location, attempt, error = %e, "witness write outcome unknown; re-reading");
                    last_transient = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        let attempts = self.policy.max_attempts;
        Err(match last_transient {
            Some(e) if conflicts < attempts => e,
            _ => Error::TooManyConflicts {
                location,
                attempts,
                conflicts,
            },
        })
    }

    async fn load(&self, location: &str) -> Result<Loaded> {
        self.counters.loads.fetch_add(1, Ordering::Relaxed);
        match self.store.load().await {
            Ok(Some(loaded)) => Ok(loaded),
            Ok(None) => Err(Error::NotInitialised {
                location: location.to_string(),
            }),
            Err(e) => {
                if e.is_transient() {
                    self.counters
                        .transient_errors
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%location, error = %e, "witness load failed; retrying");
                }
                Err(e)
            }
        }
    }

    fn finish<R>(&self, op: &'static str, started: Instant, stepped: Stepped<R>) -> Stepped<R> {
        let micros = started.elapsed().as_micros() as u64;
        self.counters.steps.fetch_add(1, Ordering::Relaxed);
        self.counters
            .latency_micros
            .fetch_add(micros, Ordering::Relaxed);
        let Stepped {
            version,
            wrote,
            attempts,
            conflicts,
            ..
        } = &stepped;
        tracing::debug!(op, %version, wrote, attempts, conflicts, micros, "witness step");
        stepped
    }

    fn backoff(&self, retry: u32) -> Duration {
        let cap = self
            .policy
            .initial_backoff
            .saturating_mul(1u32 << retry.min(16))
            .min(self.policy.max_backoff);
        if cap.is_zero() {
            // (a policy without backoff: the simulator's, whose clock is not this one)
            return Duration::ZERO;
        }
        let micros = cap.as_micros().max(1) as u64;
        Duration::from_micros(rand::rng().random_range(0..=micros))
    }
}
