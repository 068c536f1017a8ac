//! The witness probe: every `--witness-probe-interval` each member reads its witness, so that a
//! witness that is gone (a deleted directory, a dead share, an expired SAS) or that lost its
//! state (wiped, re-initialised, restored from an old copy) shows while both members are up, not
//! first when a member fails and the witness is needed.
//!
//! Invariants: a probe only reads (one load, then the pure identity and history check of the
//! witness rules, which writes nothing); its findings go to `/health`, Status errors, the
//! `etcd_witness_healthy` metric and the log (a WARN line when a failure starts or changes, and
//! once a minute while it lasts; an INFO line when it clears).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use witness_core::rules::{self, Caller};
use witness_core::{Error, WitnessStore};

use super::contract::Status;
use super::metrics::Metrics;
use super::witness_slot::{WitnessProblem, WitnessSlot};

/// A failure that lasts is logged again this often.
const REPEAT_WARNING: Duration = Duration::from_secs(60);

/// Probes until the runtime ends.
pub async fn run(
    witness: Arc<WitnessSlot>,
    status: watch::Receiver<Status>,
    metrics: Arc<Metrics>,
    every: Duration,
) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned: Option<Instant> = None;
    loop {
        ticker.tick().await;
        let Some(caller) = status.borrow().witness else {
            continue;
        };
        let limit = every.max(Duration::from_secs(1));
        let id = caller.witness_id;
        let io = match witness.begin_io() {
            Ok(permit) => permit,
            Err(why) => {
                report(&metrics, &mut warned, format!("{id:x}"), Err(why));
                continue;
            }
        };
        // The probe runs as a task of its own holding its permit: one that a hung share holds
        // past `limit` is reported, and goes on holding the permit until it returns.
        let slot = witness.clone();
        let probing = tokio::spawn(async move {
            let _io = io;
            // (opening the storage may block: a stat of a hung mount)
            match tokio::task::spawn_blocking(move || slot.get()).await {
                Ok(Some((w, Ok(client)))) if w == id => Some((
                    client.store().location(),
                    probe(client.store(), caller, every).await,
                )),
                Ok(Some((w, Err(why)))) if w == id => Some((format!("{id:x}"), Err(why))),
                // The slot and the applied configuration disagree for a moment during a change.
                _ => None,
            }
        });
        let (location, result) = match tokio::time::timeout(limit, probing).await {
            Err(_) => (
                format!("{id:x}"),
                Err(WitnessProblem::ProbeTimedOut { limit }),
            ),
            Ok(Ok(Some(found))) => found,
            Ok(_) => continue,
        };
        report(&metrics, &mut warned, location, result);
    }
}

/// Publishes a probe's finding and logs it (a WARN when a failure starts or changes, and once
/// a minute while it lasts; an INFO when it clears).
fn report(
    metrics: &Metrics,
    warned: &mut Option<Instant>,
    location: String,
    result: Result<(), WitnessProblem>,
) {
    let failed = result.err().map(|e| e.to_string());
    let before = metrics.witness_probed(failed.clone());
    match (failed, before) {
        (None, Some(_)) => {
            *warned = None;
            tracing::info!(witness = %location, "the witness is well again");
        }
        (None, None) => {}
        (Some(why), before) => {
            let again = before.as_deref() != Some(why.as_str())
                || warned.is_none_or(|at| at.elapsed() >= REPEAT_WARNING);
            if again {
                *warned = Some(Instant::now());
                tracing::warn!("witness probe failed: {why}");
            }
        }
    }
}

/// One probe: load, then the checks every witness step makes first.
pub async fn probe(
    store: &Arc<dyn WitnessStore>,
    caller: Caller,
    every: Duration,
) -> Result<(), WitnessProblem> {
    let location = store.location();
    let limit = every.max(Duration::from_secs(1));
    let loaded = tokio::time::timeout(limit, store.load())
        .await
        .map_err(|_| WitnessProblem::LoadTimedOut {
            location: location.clone(),
            limit,
        })?;
    let outcome = match loaded {
        Ok(Some(l)) => rules::read_term(&l.state, caller, &location).map(drop),
        Ok(None) => Err(Error::NotInitialised { location }.for_member(&caller.seen)),
        Err(e) => Err(e),
    };
    outcome.map_err(|e| WitnessProblem::Witness(e.to_string()))
}
