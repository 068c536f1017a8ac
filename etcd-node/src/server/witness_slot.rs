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
//! list no new step reaches its storage (a step already running finishes); `follow` does no
//! I/O (it runs on the Raft thread), `get` opens the storage on a blocking thread, tries a
//! failed open again after a second, and keeps an open client while the token file cannot be
//! read; the resolved URL (which holds the secret) is kept only as a digest.
//!
//! A share that stops answering (packets dropped, not refused) leaves each operation on it
//! blocked in the kernel, a thread each, for as long as the share stays away. Every operation a
//! member makes on its witness (steps and probes) therefore first takes one of
//! [`WITNESS_IO_LIMIT`] permits ([`WitnessSlot::begin_io`]) and holds it until the operation
//! really returns; with none free, the operation fails at once, saying so. A hung share costs a
//! bounded number of threads, and the member goes on answering (a failed step is an unreachable
//! witness to the Raft loop).

use std::hash::{Hash, Hasher};

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use etcd_client::proto::PbMember;
use witness_core::url::BlobSasUri;
use witness_core::{Witness, WitnessStore, WitnessUrl};

use super::contract::witness_member;
use super::metrics::Metrics;
use crate::raft::NodeId;
use crate::witness::open_store;

/// A witness-core client of the witness's storage, shared by concurrent steps.
pub type SharedWitness = Arc<Witness<Arc<dyn WitnessStore>>>;

/// Where this member finds the SAS token of a blob witness.
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// `--witness-sas-file`: a SAS token (the query string) or a whole blob SAS URI.
    pub sas_file: Option<PathBuf>,
    /// The witness URL in this member's own `--initial-cluster`, signature included.
    pub initial: Option<WitnessUrl>,
}

/// Why this member cannot use the witness's storage right now; the message names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WitnessProblem {
    /// Its stored URL, or this member's SAS token for it (the message names the flag).
    #[error("{0}")]
    Credentials(String),
    #[error("the witness storage {url} cannot be opened on this member: {why}")]
    Open { url: String, why: String },
    #[error(
        "{WITNESS_IO_LIMIT} operations on the witness storage have not returned: the share (or \
         blob endpoint) hangs; check the mount on this machine (`stat` of the witness directory \
         should answer at once) and its network"
    )]
    Hung,
    /// A probe that did not return in time (opening the storage included).
    #[error("the witness storage did not answer within {limit:?} (a hung mount?)")]
    ProbeTimedOut { limit: Duration },
    /// The storage, opened, did not load the record in time.
    #[error("the witness storage {location} did not answer within {limit:?}")]
    LoadTimedOut { location: String, limit: Duration },
    /// What the witness's record, or its storage, said (witness-core's error).
    #[error("{0}")]
    Witness(String),
}

impl Credentials {
    /// The URL to open for a witness URL as stored (its signature possibly redacted): the
    /// same URL for a mount; for a blob, the stored blob with this member's SAS token.
    pub fn resolve(&self, stored: &WitnessUrl) -> Result<WitnessUrl, WitnessProblem> {
        use WitnessProblem::Credentials as Bad;
        let WitnessUrl::AzBlob { uri } = stored else {
            return Ok(stored.clone());
        };
        if let Some(file) = &self.sas_file {
            let flag = || format!("--witness-sas-file {}", file.display());
            let text =
                std::fs::read_to_string(file).map_err(|e| Bad(format!("{}: {e}", flag())))?;
            let text = text.trim();
            let sas = if text.starts_with("http://") || text.starts_with("https://") {
                let given = BlobSasUri::parse(text).map_err(|e| Bad(format!("{}: {e}", flag())))?;
                if !given.same_blob(uri) {
                    return Err(Bad(format!(
                        "{}: names the blob {}, but the witness is {uri}; write the SAS token \
                         of the witness's blob",
                        flag(),
                        given.redacted()
                    )));
                }
                given.sas_query().to_string()
            } else {
                text.to_string()
            };
            return uri
                .with_sas(&sas)
                .map(|uri| WitnessUrl::AzBlob { uri })
                .map_err(|e| Bad(format!("{}: {e}", flag())));
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
        Err(Bad(format!(
            "the witness blob {uri} needs its SAS token on this member: write the token to a \
             file only etcd-node can read and pass --witness-sas-file FILE (docs/operations.md, \
             \"The witness's secret\")"
        )))
    }
}

/// The witness member of the applied configuration and its storage client.
#[derive(Debug)]
pub struct WitnessSlot {
    current: Mutex<Option<Current>>,
    credentials: Credentials,
    metrics: Arc<Metrics>,
    /// The permits of the witness operations in flight.
    io: Arc<Semaphore>,
}

/// How many operations on the witness's storage may be in flight at once (each may hold a
/// blocking thread while the storage does not answer).
pub const WITNESS_IO_LIMIT: usize = 8;

/// How often opening a witness's storage that failed is tried again.
const REOPEN_AFTER: Duration = Duration::from_secs(1);

/// A failure to open the storage is logged again this often while it lasts.
const REPEAT_WARNING: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Current {
    id: NodeId,
    /// The peer URL as the member list stores it.
    url: String,
    /// What the client was opened with: a digest of the resolved URL (it holds the secret, so
    /// only its digest is kept), to notice a rotated SAS token.
    opened: u64,
    /// The open client; None before the first open, or after one that failed.
    client: Option<SharedWitness>,
    /// The last failure to open, when it was tried, and when it was last logged.
    failed: Option<(WitnessProblem, Instant, Option<Instant>)>,
}

fn digest(s: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

impl WitnessSlot {
    pub fn new(metrics: Arc<Metrics>, credentials: Credentials) -> WitnessSlot {
        WitnessSlot {
            current: Mutex::new(None),
            credentials,
            metrics,
            io: Arc::new(Semaphore::new(WITNESS_IO_LIMIT)),
        }
    }

    /// The permit of one operation on the witness's storage, to hold until it returns; an
    /// error when [`WITNESS_IO_LIMIT`] of them have not returned yet (a share that hangs).
    pub fn begin_io(&self) -> Result<OwnedSemaphorePermit, WitnessProblem> {
        self.io
            .clone()
            .try_acquire_owned()
            .map_err(|_| WitnessProblem::Hung)
    }

    /// Follows `members`: notes the witness it names, or forgets the witness that left. No I/O
    /// (it runs on the Raft thread): the storage is opened by the first [`WitnessSlot::get`].
    /// A new or departed witness clears what was reported of the old one.
    pub fn follow(&self, members: &[PbMember]) {
        let named = witness_member(members).map(|(m, url)| (m.id, url.to_string()));
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
            url,
            opened: 0,
            client: None,
            failed: None,
        });
        drop(current);
        self.metrics.witness_changed();
    }

    /// The current witness: its id and client, opened here when needed. `Err` says why its
    /// storage cannot be used on this member. It may block (a stat of the mount, a file read),
    /// so call it off the Raft thread. A blob witness's SAS token is looked up again each time:
    /// a changed one reopens the client; a token that cannot be read keeps the open client.
    /// A failed open is tried again after [`REOPEN_AFTER`].
    pub fn get(&self) -> Option<(NodeId, Result<SharedWitness, WitnessProblem>)> {
        // (a share that stops answering: tests arm this with a sleep, and every use blocks)
        fail::fail_point!("witness-io-hang");
        let (id, url, opened, client, failed) = {
            let current = self.lock();
            let c = current.as_ref()?;
            (
                c.id,
                c.url.clone(),
                c.opened,
                c.client.clone(),
                c.failed.clone(),
            )
        };
        let resolved = WitnessUrl::parse(&url)
            .map_err(|e| WitnessProblem::Credentials(e.to_string()))
            .and_then(|stored| self.credentials.resolve(&stored));
        let attempt = match (&resolved, client, &failed) {
            // The same URL and token as the open client: use it.
            (Ok(u), Some(c), _) if digest(&u.to_url_string()) == opened => {
                return Some((id, Ok(c)));
            }
            // The token cannot be read now (a rotation half written?): keep the open client.
            (Err(why), Some(c), _) => {
                tracing::debug!(
                    witness = format!("{id:x}"),
                    "keeping the open witness client: {why}"
                );
                return Some((id, Ok(c)));
            }
            // Failed lately: not again yet.
            (_, None, Some((why, at, _))) if at.elapsed() < REOPEN_AFTER => {
                return Some((id, Err(why.clone())));
            }
            (Ok(u), had, _) => {
                if had.is_some() {
                    tracing::info!(
                        witness = format!("{id:x}"),
                        "the witness's SAS token changed: reopening its storage"
                    );
                }
                open(u).map(|c| (c, digest(&u.to_url_string())))
            }
            (Err(why), None, _) => Err(why.clone()),
        };
        let mut current = self.lock();
        let c = current.as_mut().filter(|c| c.id == id && c.url == url)?;
        let answer = match attempt {
            Ok((client, opened)) => {
                if c.failed.take().is_some() {
                    tracing::info!(witness = format!("{id:x}"), "the witness's storage opened");
                }
                c.client = Some(client.clone());
                c.opened = opened;
                Ok(client)
            }
            Err(why) => {
                let logged = c.failed.as_ref().and_then(|f| f.2);
                let again = c.failed.as_ref().is_none_or(|f| f.0 != why)
                    || logged.is_none_or(|at| at.elapsed() >= REPEAT_WARNING);
                if again {
                    tracing::warn!(witness = format!("{id:x}"), "{why}");
                }
                c.client = None;
                c.failed = Some((
                    why.clone(),
                    Instant::now(),
                    if again { Some(Instant::now()) } else { logged },
                ));
                Err(why)
            }
        };
        Some((id, answer))
    }

    /// Can this member use the witness `id` right now, as far as it knows without I/O: it is
    /// the current witness, its storage opened, and no failure of it is being reported.
    pub fn usable(&self, id: NodeId) -> bool {
        let open = self
            .lock()
            .as_ref()
            .is_some_and(|c| c.id == id && c.client.is_some());
        open && self.metrics.witness_problem(USABLE_WINDOW).is_none()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Current>> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A witness step or probe that failed within this long makes the witness count as unusable
/// for the strict reconfiguration check.
const USABLE_WINDOW: Duration = Duration::from_secs(30);

/// Opens the storage a witness URL names.
fn open(url: &WitnessUrl) -> Result<SharedWitness, WitnessProblem> {
    open_store(url)
        .map(|store| Arc::new(Witness::new(store)))
        .map_err(|e| WitnessProblem::Open {
            url: url.to_string(),
            why: e.to_string(),
        })
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
        let e = with_file.resolve(&stored()).unwrap_err().to_string();
        assert!(e.contains("--witness-sas-file"), "{e}");
        std::fs::write(&file, "?sv=2&sp=rw&sig=NEWSIG\n").unwrap();
        let got = with_file.resolve(&stored()).unwrap().to_url_string();
        assert!(got.contains("NEWSIG") && !got.contains("OLDSIG"), "{got}");
        std::fs::write(&file, "https://acct.blob.core.windows.net/cont/other?sig=X").unwrap();
        let e = with_file.resolve(&stored()).unwrap_err().to_string();
        assert!(e.contains("names the blob") && !e.contains("sig=X"), "{e}");

        let from_flags = Credentials {
            sas_file: None,
            initial: Some(blob(BLOB)),
        };
        let got = from_flags.resolve(&stored()).unwrap().to_url_string();
        assert!(got.contains("OLDSIG"), "{got}");
        let e = Credentials::default()
            .resolve(&stored())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("needs its SAS token") && e.contains("--witness-sas-file"),
            "{e}"
        );
        let mount = WitnessUrl::mount("/w").unwrap();
        assert_eq!(Credentials::default().resolve(&mount).unwrap(), mount);
    }
}
