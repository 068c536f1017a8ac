//! The witness this member uses now. The cluster's witness changes at run time (`member add`
//! of a `witness:` URL, `member remove` of the witness), so the Raft loop and the probe ask
//! this slot for the current one instead of holding a client from start-up.
//!
//! Invariants: the slot follows the applied member list (the loop calls [`WitnessSlot::follow`]
//! after every applied membership change and snapshot, before the Raft core acts on the change,
//! so no step of a new witness ever finds the slot empty); once a witness has left the member
//! list no new step reaches its storage (a step already running finishes).

use std::sync::{Arc, Mutex};

use etcd_client::proto::PbMember;
use witness_core::{Witness, WitnessUrl};

use super::metrics::Metrics;
use super::node::SharedWitness;
use crate::raft::NodeId;
use crate::witness::open_store;

/// The witness member of the applied configuration and its storage client.
#[derive(Debug)]
pub struct WitnessSlot {
    current: Mutex<Option<Current>>,
    metrics: Arc<Metrics>,
}

#[derive(Debug, Clone)]
struct Current {
    id: NodeId,
    /// The peer URL as the member list stores it.
    url: String,
    /// The open client, or why the storage could not be opened here.
    client: Result<SharedWitness, String>,
}

impl WitnessSlot {
    pub fn new(metrics: Arc<Metrics>) -> WitnessSlot {
        WitnessSlot {
            current: Mutex::new(None),
            metrics,
        }
    }

    /// Follows `members`: opens the witness it names (if not already open), or forgets the
    /// witness that left. A new or departed witness clears what was reported of the old one.
    pub fn follow(&self, members: &[PbMember]) {
        let named = members.iter().find_map(|m| {
            let url = m.peer_ur_ls.first().filter(|u| WitnessUrl::is_witness(u))?;
            Some((m.id, url.clone()))
        });
        let mut current = self.lock();
        let unchanged = match (&*current, &named) {
            (Some(c), Some((id, url))) => c.id == *id && c.url == *url,
            (None, None) => true,
            _ => false,
        };
        if unchanged {
            return;
        }
        match &named {
            Some((id, url)) => tracing::info!(
                witness = format!("{id:x}"),
                url = %witness_core::url::redact(url),
                "this member now uses the witness"
            ),
            None => {
                if let Some(c) = &*current {
                    tracing::info!(
                        witness = format!("{:x}", c.id),
                        "the witness left the configuration; its storage is no longer used"
                    );
                }
            }
        }
        *current = named.map(|(id, url)| Current {
            id,
            client: open(&url),
            url,
        });
        self.metrics.witness_changed();
    }

    /// The current witness: its id and client. `Err` says why its storage cannot be used here.
    pub fn get(&self) -> Option<(NodeId, Result<SharedWitness, String>)> {
        self.lock().as_ref().map(|c| (c.id, c.client.clone()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Opens the storage a stored witness URL names.
fn open(url: &str) -> Result<SharedWitness, String> {
    WitnessUrl::parse(url)
        .and_then(|u| open_store(&u))
        .map(|store| Arc::new(Witness::new(store)))
        .map_err(|e| {
            format!(
                "the witness storage {} cannot be opened on this member: {e}",
                witness_core::url::redact(url)
            )
        })
}
