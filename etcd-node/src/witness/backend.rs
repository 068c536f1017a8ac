//! Maps a parsed [`WitnessUrl`] to the storage backend it names. The only place that knows
//! every backend (witness-core knows none).

use std::sync::Arc;
use std::time::Duration;

use witness_azblob::{AzBlobOptions, AzBlobStore};
use witness_core::{Error, Loaded, Result, WitnessStore, WitnessUrl};
use witness_mount::{MountOptions, MountStore};

/// Why [`load_within`] read nothing.
#[derive(Debug)]
pub enum Unread {
    /// The store could not be opened (a mount path that does not exist, a bad URL).
    Open(Error),
    /// The storage at `location` did not answer in time.
    TimedOut { location: String },
    /// The load failed.
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

/// Opens the store `url` names. Makes no network request; a mount path must exist.
pub fn open_store(url: &WitnessUrl) -> Result<Arc<dyn WitnessStore>> {
    Ok(match url {
        WitnessUrl::Mount { path } => Arc::new(MountStore::open(path, MountOptions::default())?),
        WitnessUrl::AzBlob { uri } => Arc::new(AzBlobStore::open(uri, AzBlobOptions::default())?),
    })
}
