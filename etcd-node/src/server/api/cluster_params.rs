//! The leader decides the cluster's version and features (`crate::version::decide`) from
//! what every regular member, learners included, announces on its peer links, and records them
//! through Raft when they change, so every member reads the same parameters from its key
//! space. A learner counts: it receives what the leader sends (snapshots), so a feature it does
//! not know must stay off.
//!
//! A member not heard from yet (added, not started) leaves the parameters as recorded until it
//! announces itself; one that comes back with an older binary announces that at once, and the
//! next round turns off what it does not know.
//!
//! The leader records each member's name and client URLs the same way, when what the member
//! announces differs from what is stored (etcd's member publishes its own with
//! `ClusterMemberAttrSet`). A member added by `member add` is stored without a name; once it
//! has started and been heard, every member lists it with its name, also members it never
//! sends to and while it is down.

use std::collections::HashMap;
use std::time::Duration;

use super::handle::Api;
use crate::mvcc::{ClusterParamsSet, MemberAttrsSet, Op};
use crate::raft::NodeId;
use crate::server::contract::Announced;
use crate::server::contract::regular_peer_url;
use crate::version::{ClusterParams, decide};
use etcd_client::proto::PbMember;

/// What each member announced on its peer links, as read once per round.
type Heard = HashMap<NodeId, Announced>;

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
        // One read of the members and of what they announce serves both records.
        let Ok(members) = api.mvcc.members() else {
            continue;
        };
        let Some(heard) = api.client_urls.lock().ok().map(|h| h.clone()) else {
            continue;
        };
        record_attributes(&api, &members, &heard).await;
        let Some(wanted) = wanted(&api, &members, &heard) else {
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
fn wanted(api: &Api, members: &[PbMember], heard: &Heard) -> Option<ClusterParams> {
    let regular = members.iter().filter(|m| regular_peer_url(m).is_some());
    decide(regular.map(|m| {
        if m.id == api.member_id {
            Some(&api.own.attributes)
        } else {
            heard.get(&m.id).map(|a| &a.attributes)
        }
    }))
}

/// Records the attributes of each member whose announcement differs from what is stored.
async fn record_attributes(api: &Api, members: &[PbMember], heard: &Heard) {
    for m in members {
        let announced = if m.id == api.member_id {
            Some(&api.own)
        } else {
            heard.get(&m.id)
        };
        let Some(a) = announced.filter(|a| !a.name.is_empty()) else {
            continue;
        };
        if a.name == m.name && a.client_urls == m.client_ur_ls {
            continue;
        }
        let set = MemberAttrsSet {
            member_id: m.id,
            name: a.name.clone(),
            client_urls: a.client_urls.clone(),
        };
        match api.propose(Op::MemberAttrs(set)).await {
            Ok(_) => tracing::info!(
                member = format!("{:x}", m.id),
                name = %a.name,
                client_urls = ?a.client_urls,
                "recorded a member's name and client URLs"
            ),
            Err(e) => {
                tracing::warn!(error = %e.message(), "could not record a member's attributes")
            }
        }
    }
}
