//! Maps a parsed [`WitnessUrl`] to the storage backend it names. The only place that knows
//! every backend (witness-core knows none).

use std::sync::Arc;

use witness_azblob::{AzBlobOptions, AzBlobStore};
use witness_core::{Result, WitnessStore, WitnessUrl};
use witness_mount::{MountOptions, MountStore};

/// Opens the store `url` names. Makes no network request; a mount path must exist.
pub fn open_store(url: &WitnessUrl) -> Result<Arc<dyn WitnessStore>> {
    Ok(match url {
        WitnessUrl::Mount { path } => Arc::new(MountStore::open(path, MountOptions::default())?),
        WitnessUrl::AzBlob { uri } => Arc::new(AzBlobStore::open(uri, AzBlobOptions::default())?),
    })
}
