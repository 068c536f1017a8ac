//! The witness this member uses now. The cluster's witness changes at run time (`member add`
//! of a `witness:` URL, `member remove` of the witness), so the Raft loop and the probe ask
//! this slot for the current one instead of holding a client from start-up.
//!
//! The member list stores a blob witness's URL with its SAS signature redacted: the secret is
//! never replicated, so it is in no snapshot, member list or key space. Each member takes the
//! SAS token from its own configuration ([`Credentials`]): `--witness-sas-file` (read again at
//! every use, so a rotated token is picked up without a restart), else the witness URL in its
//! own `--initial-cluster`.
//!
//! Invariants: the slot follows the applied member list (the loop calls [`WitnessSlot::follow`]
//! after every applied membership change and snapshot, before the Raft core acts on the change,
//! so no step of a new witness ever finds the slot empty); once a witness has left the member
//! list no new step reaches its storage (a step already running finishes).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use etcd_client::proto::PbMember;
use witness_core::url::BlobSasUri;
use witness_core::{Witness, WitnessUrl};

use super::metrics::Metrics;
use super::node::SharedWitness;
use crate::raft::NodeId;
use crate::witness::open_store;

/// Where this member finds the SAS token of a blob witness.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// `--witness-sas-file`: a SAS token (the query string) or a whole blob SAS URI.
    pub sas_file: Option<PathBuf>,
    /// The witness URL in this member's own `--initial-cluster`, signature included.
    pub initial: Option<WitnessUrl>,
}

impl Credentials {
    /// The URL to open for a witness URL as stored (its signature possibly redacted): the
    /// same URL for a mount; for a blob, the stored blob with this member's SAS token.
    pub fn resolve(&self, stored: &WitnessUrl) -> Result<WitnessUrl, String> {
        let WitnessUrl::AzBlob { uri } = stored else {
            return Ok(stored.clone());
        };
        if let Some(file) = &self.sas_file {
            let flag = || format!("--witness-sas-file {}", file.display());
            let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", flag()))?;
            let text = text.trim();
            let sas = if text.starts_with("http://") || text.starts_with("https://") {
                let given = BlobSasUri::parse(text).map_err(|e| format!("{}: {e}", flag()))?;
                if !given.same_blob(uri) {
                    return Err(format!(
                        "{}: names the blob {}, but the witness is {uri}; write the SAS token \
                         of the witness's blob",
                        flag(),
                        given.redacted()
                    ));
                }
                given.sas_query().to_string()
            } else {
                text.to_string()
            };
            return uri
                .with_sas(&sas)
                .map(|uri| WitnessUrl::AzBlob { uri })
                .map_err(|e| format!("{}: {e}", flag()));
        }
        if let Some(WitnessUrl::AzBlob { uri: full }) = &self.initial
            && full.same_blob(uri)
            && !full.has_redacted_signature()
        {
            return Ok(WitnessUrl::AzBlob { uri: full.clone() });
        }
        if !uri.has_redacted_signature() {
            // A member list written before signatures were redacted.
            return Ok(stored.clone());
        }
        Err(format!(
            "the witness blob {uri} needs its SAS token on this member: write the token to a \
             file only etcd-node can read and pass --witness-sas-file FILE (docs/operations.md, \
             \"The witness's secret\")"
        ))
    }
}

/// The witness member of the applied configuration and its storage client.
#[derive(Debug)]
pub struct WitnessSlot {
    current: Mutex<Option<Current>>,
    credentials: Credentials,
    metrics: Arc<Metrics>,
}

#[derive(Debug, Clone)]
struct Current {
    id: NodeId,
    /// The peer URL as the member list stores it.
    url: String,
    /// The URL the client was opened with (secret included), to notice a rotated SAS token.
    opened: Option<String>,
    /// The open client, or why the storage could not be opened here.
    client: Result<SharedWitness, String>,
}

impl Current {
    fn open(id: NodeId, url: String, credentials: &Credentials) -> Current {
        let resolved = WitnessUrl::parse(&url)
            .map_err(|e| e.to_string())
            .and_then(|stored| credentials.resolve(&stored));
        let (opened, client) = match resolved {
            Ok(u) => (Some(u.to_url_string()), open(&u)),
            Err(why) => (None, Err(why)),
        };
        Current {
            id,
            url,
            opened,
            client,
        }
    }
}

impl WitnessSlot {
    pub fn new(metrics: Arc<Metrics>, credentials: Credentials) -> WitnessSlot {
        WitnessSlot {
            current: Mutex::new(None),
            credentials,
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
        *current = named.map(|(id, url)| Current::open(id, url, &self.credentials));
        self.metrics.witness_changed();
    }

    /// The current witness: its id and client. `Err` says why its storage cannot be used here.
    /// A blob witness's SAS token is looked up again each time: a changed one reopens the
    /// client.
    pub fn get(&self) -> Option<(NodeId, Result<SharedWitness, String>)> {
        let mut current = self.lock();
        let c = current.as_mut()?;
        if c.url.starts_with("witness:azblob") {
            let now = WitnessUrl::parse(&c.url)
                .map_err(|e| e.to_string())
                .and_then(|stored| self.credentials.resolve(&stored))
                .map(|u| u.to_url_string());
            if now.as_ref().ok() != c.opened.as_ref() {
                tracing::info!(
                    witness = format!("{:x}", c.id),
                    "the witness's SAS token changed: reopening its storage"
                );
                *c = Current::open(c.id, c.url.clone(), &self.credentials);
            }
        }
        Some((c.id, c.client.clone()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Opens the storage a witness URL names.
fn open(url: &WitnessUrl) -> Result<SharedWitness, String> {
    open_store(url)
        .map(|store| Arc::new(Witness::new(store)))
        .map_err(|e| format!("the witness storage {url} cannot be opened on this member: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOB: &str = "https://acct.blob.core.windows.net/cont/w?sv=1&sp=rw&sig=OLDSIG";

    fn blob(uri: &str) -> WitnessUrl {
        WitnessUrl::AzBlob {
            uri: BlobSasUri::parse(uri).unwrap(),
        }
    }

    fn stored() -> WitnessUrl {
        let WitnessUrl::AzBlob { uri } = blob(BLOB) else {
            unreachable!()
        };
        blob(&uri.redacted())
    }

    #[test]
    fn the_token_comes_from_the_file_then_the_flags_else_a_message_says_where_to_put_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("sas");
        let with_file = Credentials {
            sas_file: Some(file.clone()),
            initial: Some(blob(BLOB)),
        };
        let e = with_file.resolve(&stored()).unwrap_err();
        assert!(e.contains("--witness-sas-file"), "{e}");
        std::fs::write(&file, "?sv=2&sp=rw&sig=NEWSIG\n").unwrap();
        let got = with_file.resolve(&stored()).unwrap().to_url_string();
        assert!(got.contains("NEWSIG") && !got.contains("OLDSIG"), "{got}");
        std::fs::write(&file, "https://acct.blob.core.windows.net/cont/other?sig=X").unwrap();
        let e = with_file.resolve(&stored()).unwrap_err();
        assert!(e.contains("names the blob") && !e.contains("sig=X"), "{e}");

        let from_flags = Credentials {
            sas_file: None,
            initial: Some(blob(BLOB)),
        };
        let got = from_flags.resolve(&stored()).unwrap().to_url_string();
        assert!(got.contains("OLDSIG"), "{got}");
        let e = Credentials::default().resolve(&stored()).unwrap_err();
        assert!(
            e.contains("needs its SAS token") && e.contains("--witness-sas-file"),
            "{e}"
        );
        let mount = WitnessUrl::mount("/w").unwrap();
        assert_eq!(Credentials::default().resolve(&mount).unwrap(), mount);
    }
}
