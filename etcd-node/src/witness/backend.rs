//! Maps a parsed [`WitnessUrl`] to the storage backend it names. The only place that knows
//! every backend (witness-core knows none).

use std::sync::Arc;
use std::time::Duration;

use witness_azblob::{AzBlobOptions, AzBlobStore};
use witness_core::{CasOutcome, Error, Loaded, Result, WitnessState, WitnessStore, WitnessUrl};
use witness_mount::{MountOptions, MountStore};

/// Why [`load_within`] read nothing.
#[derive(Debug)]
pub enum Unread {
    /// The store could not be opened (a mount path that does not exist, a bad URL).
    Open(Error),
    /// The storage at `location` did not answer in time.
    TimedOut { location: String },
    /// The load (or, for [`claim_within`], the write) failed.
    Load(Error),
}

/// Opens the store `url` names and reads it, waiting at most `limit`: its location (redacted)
/// and its record, if any.
pub async fn load_within(
    url: &WitnessUrl,
    limit: Duration,
) -> std::result::Result<(String, Option<Loaded>), Unread> {
    let store = open_store(url).map_err(Unread::Open)?;
    let location = store.location();
    match tokio::time::timeout(limit, store.load()).await {
        Err(_) => Err(Unread::TimedOut { location }),
        Ok(loaded) => Ok((location, loaded.map_err(Unread::Load)?)),
    }
}

/// Whether a record is one no witness step has written: no term, no vote, no entry. A record
/// bound to a cluster by [`claim_within`] and never used since is still fresh.
pub fn unused(state: &WitnessState) -> bool {
    state.term == 0
        && state.voted_for == 0
        && state.last_log_term == 0
        && state.last_log_index == 0
        && state.replication_set.is_empty()
}

/// How [`claim_within`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Claim {
    /// The record is now bound to the cluster and its witness member.
    Claimed,
    /// Another writer changed the record since it was loaded (another cluster claiming it): it
    /// must be read and checked again.
    Lost,
}

/// Binds the record `loaded` (read from `url`) to `cluster` and its witness member `member`,
/// as the witness's first step would, by compare-and-swap, waiting at most `limit`. `member
/// add` claims a witness this way before it proposes the change, so that a second cluster is
/// refused at once instead of when it first needs the witness.
pub async fn claim_within(
    url: &WitnessUrl,
    loaded: &Loaded,
    cluster: u64,
    member: u64,
    limit: Duration,
) -> std::result::Result<Claim, Unread> {
    let store = open_store(url).map_err(Unread::Open)?;
    let location = store.location();
    let claimed = WitnessState {
        cluster_id: cluster,
        member_id: member,
        ..loaded.state.clone()
    };
    match tokio::time::timeout(limit, store.compare_and_swap(&loaded.version, &claimed)).await {
        Err(_) => Err(Unread::TimedOut { location }),
        Ok(Err(e)) => Err(Unread::Load(e)),
        Ok(Ok(CasOutcome::Written(_))) => Ok(Claim::Claimed),
        Ok(Ok(CasOutcome::Conflict)) => Ok(Claim::Lost),
    }
}

/// Opens the store `url` names. Makes no network request; a mount path must exist.
pub fn open_store(url: &WitnessUrl) -> Result<Arc<dyn WitnessStore>> {
    Ok(match url {
        WitnessUrl::Mount { path } => Arc::new(MountStore::open(path, MountOptions::default())?),
        WitnessUrl::AzBlob { uri } => Arc::new(AzBlobStore::open(uri, AzBlobOptions::default())?),
    })
}
