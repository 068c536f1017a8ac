//! The leader decides the cluster's version and features (`crate::version::decide`) from
//! what every regular member, learners included, announces on its peer links, and records them
//! through Raft when they change, so every member reads the same parameters from its key
//! space. A learner counts: it receives what the leader sends (snapshots), so a feature it does
//! not know must stay off.
//!
//! A member not heard from yet (added, not started) leaves the parameters as recorded until it
//! announces itself; one that comes back with an older binary announces that at once, and the
//! next round turns off what it does not know.

use std::time::Duration;

use super::handle::Api;
use crate::mvcc::{ClusterParamsSet, Op};
use crate::server::contract::regular_peer_url;
use crate::version::{ClusterParams, decide};

/// How often the leader looks.
pub const EVERY: Duration = Duration::from_secs(1);

/// Runs until the task is dropped.
pub async fn run(api: Api) {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if api.status.borrow().leader != api.member_id {
            continue;
        }
        let Some(wanted) = wanted(&api) else {
            continue;
        };
        if api.mvcc.cluster_params().as_ref() == Some(&wanted) {
            continue;
        }
        let set = ClusterParamsSet {
            version: wanted.version.clone(),
            features: wanted.features.iter().cloned().collect(),
        };
        match api.propose(Op::ClusterParams(set)).await {
            Ok(_) => tracing::info!(
                version = %wanted.version,
                features = ?wanted.features,
                "recorded the cluster's version and features"
            ),
            Err(e) => {
                tracing::warn!(error = %e.message(), "could not record the cluster's version")
            }
        }
    }
}

/// The parameters the regular members' announcements give now (None: one not heard from).
fn wanted(api: &Api) -> Option<ClusterParams> {
    let members = api.mvcc.members().ok()?;
    let heard = api.client_urls.lock().ok()?.clone();
    let regular = members.iter().filter(|m| regular_peer_url(m).is_some());
    decide(regular.map(|m| {
        if m.id == api.member_id {
            Some(&api.own.attributes)
        } else {
            heard.get(&m.id).map(|a| &a.attributes)
        }
    }))
}
