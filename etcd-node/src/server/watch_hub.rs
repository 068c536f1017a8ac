//! Where the Raft loop publishes what each applied batch changed, for the watch streams
//! (`api::watch`): a broadcast of the last [`HUB_CAPACITY`] batches. Writes never wait for
//! watchers: a stream that falls further behind catches up from the history instead.

use std::sync::Arc;

use etcd_client::proto::PbEvent;
use tokio::sync::broadcast;

/// Batches the hub keeps for streams that are behind (beyond: catch-up from the history).
const HUB_CAPACITY: usize = 256;

/// What one applied batch changed.
#[derive(Debug)]
pub struct Batch {
    /// The store's revision after the batch.
    pub revision: u64,
    pub events: Vec<PbEvent>,
    /// The key space was replaced (a snapshot was installed): the batches before it were not
    /// all published, streams catch up from the history.
    pub reset: bool,
}

/// Where the apply loop publishes batches for the watch streams.
#[derive(Debug, Clone)]
pub struct WatchHub {
    tx: broadcast::Sender<Arc<Batch>>,
}

impl Default for WatchHub {
    fn default() -> Self {
        WatchHub {
            tx: broadcast::channel(HUB_CAPACITY).0,
        }
    }
}

impl WatchHub {
    /// Publishes the events of a batch just committed to the store (nothing when it changed
    /// nothing).
    pub fn publish(&self, events: Vec<PbEvent>, revision: u64) {
        if !events.is_empty() {
            let _ = self.tx.send(Arc::new(Batch {
                revision,
                events,
                reset: false,
            }));
        }
    }

    /// The key space was replaced by a snapshot at `revision`.
    pub fn reset(&self, revision: u64) {
        let _ = self.tx.send(Arc::new(Batch {
            revision,
            events: Vec::new(),
            reset: true,
        }));
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Batch>> {
        self.tx.subscribe()
    }
}
