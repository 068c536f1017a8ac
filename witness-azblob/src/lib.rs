//! witness-azblob: a [`witness_core::WitnessStore`] on one Azure blob, reached with its SAS URI
//! (`witness:azblob?uri=<escaped SAS URI>`), through `object_store`.
//!
//! Invariants:
//! - the blob holds one framed witness record; its ETag is the version;
//! - create is a put with `If-None-Match: *` (`PutMode::Create`), an update a put with
//!   `If-Match: <etag>` (`PutMode::Update`); a 409 or 412 (AlreadyExists, Precondition) means
//!   "lost the race", never an error;
//! - the SAS query string is the only credential; it is passed as query pairs and never logged
//!   ([`witness_core::BlobSasUri`] redacts it);
//! - [`AzBlobStore::self_test`] refuses a store that ignores those conditions (it probes with
//!   the blob's own bytes, so a store that ignores them is left unchanged).
//!
//! ```no_run
//! use witness_core::{WitnessStore, WitnessUrl};
//! use witness_azblob::{AzBlobOptions, AzBlobStore};
//! # async fn demo() -> witness_core::Result<()> {
//! let url = WitnessUrl::parse("witness:azblob?uri=https%3A%2F%2Facct.blob.core.windows.net%2Fc%2Fw%3Fsv%3D2022-11-02%26sig%3DX")?;
//! let WitnessUrl::AzBlob { uri } = url else { unreachable!() };
//! let store = AzBlobStore::open(&uri, AzBlobOptions::default())?;
//! if let Some(loaded) = store.load().await? {
//!     store.self_test().await?;
//!     println!("term {}", loaded.state.term);
//! }
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig, UpdateVersion,
};
use witness_core::{
    BlobSasUri, CasOutcome, Error, Loaded, Result, Version, WitnessState, WitnessStore, codec,
};

/// Timeouts and retries for blob requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AzBlobOptions {
    /// Whole-request timeout.
    pub timeout: Duration,
    pub connect_timeout: Duration,
    /// Retries of transient failures inside object_store (the witness client retries too).
    pub max_retries: usize,
}

impl Default for AzBlobOptions {
    fn default() -> Self {
        AzBlobOptions {
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            max_retries: 2,
        }
    }
}

/// A witness store on one Azure blob.
#[derive(Debug, Clone)]
pub struct AzBlobStore {
    store: Arc<dyn ObjectStore>,
    path: Path,
    /// The redacted URI, for messages.
    location: String,
}

/// What an object_store error means for a witness step.
fn map_error(op: &'static str, location: &str, e: object_store::Error) -> Error {
    let location = location.to_string();
    match e {
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => Error::PermissionDenied { op, location },
        e @ (object_store::Error::NotSupported { .. }
        | object_store::Error::NotImplemented { .. }) => Error::Unsupported {
            location,
            reason: format!("{op}: {e}"),
        },
        other => Error::Remote {
            op,
            location,
            message: other.to_string(),
            // Timeouts, connection failures, 5xx: the request may or may not have taken effect.
            transient: true,
        },
    }
}

impl AzBlobStore {
    /// A store for the blob `uri` names. Makes no request.
    pub fn open(uri: &BlobSasUri, options: AzBlobOptions) -> Result<Self> {
        let location = uri.redacted();
        let http = uri.endpoint().starts_with("http://");
        let client = ClientOptions::new()
            .with_timeout(options.timeout)
            .with_connect_timeout(options.connect_timeout)
            .with_allow_http(http);
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(20),
                max_backoff: Duration::from_millis(500),
                base: 2.0,
            },
            max_retries: options.max_retries,
            retry_timeout: options.timeout * 2,
        };
        let store = MicrosoftAzureBuilder::new()
            .with_account(uri.account())
            .with_container_name(uri.container())
            .with_endpoint(uri.endpoint())
            .with_sas_authorization(uri.sas_pairs())
            .with_client_options(client)
            .with_retry(retry)
            .build()
            .map_err(|e| Error::Unsupported {
                location: location.clone(),
                reason: format!("cannot configure the Azure client: {e}"),
            })?;
        let path = Path::parse(uri.blob()).map_err(|e| Error::Unsupported {
            location: location.clone(),
            reason: format!("blob name is not usable: {e}"),
        })?;
        Ok(AzBlobStore {
            store: Arc::new(store),
            path,
            location,
        })
    }

    async fn put(&self, mode: PutMode, bytes: Vec<u8>, op: &'static str) -> Result<CasOutcome> {
        let opts = PutOptions::from(mode);
        match self
            .store
            .put_opts(&self.path, PutPayload::from(bytes), opts)
            .await
        {
            Ok(r) => {
                let etag = r.e_tag.ok_or_else(|| Error::Remote {
                    op,
                    location: self.location.clone(),
                    message: "the service returned no ETag".into(),
                    transient: false,
                })?;
                Ok(CasOutcome::Written(Version::new(etag)))
            }
            // 409 and 412 alike: someone else got there first (Azurite answers a failed
            // create with 409, Azure may use 412); an If-Match on a missing blob is a lost race too.
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. }
                | object_store::Error::NotFound { .. },
            ) => Ok(CasOutcome::Conflict),
            Err(e) => Err(map_error(op, &self.location, e)),
        }
    }

    /// The raw bytes and ETag of the blob, `None` if it does not exist.
    async fn get(&self) -> Result<Option<(Vec<u8>, Version)>> {
        let got = match self.store.get(&self.path).await {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(map_error("read", &self.location, e)),
        };
        let etag = got.meta.e_tag.clone().ok_or_else(|| Error::Remote {
            op: "read",
            location: self.location.clone(),
            message: "the service returned no ETag".into(),
            transient: false,
        })?;
        let bytes = got
            .bytes()
            .await
            .map_err(|e| map_error("read", &self.location, e))?;
        Ok(Some((bytes.to_vec(), Version::new(etag))))
    }

    /// Checks that the service honours conditional writes: a create over the existing blob and
    /// an update with a wrong ETag must both be refused. Both probes carry the blob's current
    /// bytes, so a service that ignores conditions is left unchanged. The blob must exist.
    pub async fn self_test(&self) -> Result<()> {
        let Some((bytes, _)) = self.get().await? else {
            return Err(Error::NotInitialised {
                location: self.location.clone(),
            });
        };
        let unsupported = |what: &str| Error::Unsupported {
            location: self.location.clone(),
            reason: format!(
                "the blob service accepted {what}; it does not honour conditional writes, so it cannot hold a witness"
            ),
        };
        if self
            .put(PutMode::Create, bytes.clone(), "self-test create")
            .await?
            != CasOutcome::Conflict
        {
            return Err(unsupported(
                "a create over an existing blob (If-None-Match: *)",
            ));
        }
        let stale = PutMode::Update(UpdateVersion {
            e_tag: Some("\"0x8D000000BADE7A9\"".into()),
            version: None,
        });
        if self.put(stale, bytes, "self-test update").await? != CasOutcome::Conflict {
            return Err(unsupported("an update with a wrong ETag (If-Match)"));
        }
        Ok(())
    }
}

#[async_trait]
impl WitnessStore for AzBlobStore {
    fn location(&self) -> String {
        self.location.clone()
    }

    async fn load(&self) -> Result<Option<Loaded>> {
        let Some((bytes, version)) = self.get().await? else {
            return Ok(None);
        };
        let state = codec::decode(&bytes).map_err(|source| Error::Corrupt {
            location: self.location.clone(),
            version: version.clone(),
            source,
        })?;
        Ok(Some(Loaded { state, version }))
    }

    async fn create(&self, state: &WitnessState) -> Result<CasOutcome> {
        self.put(PutMode::Create, codec::encode(state), "create")
            .await
    }

    async fn compare_and_swap(
        &self,
        expected: &Version,
        state: &WitnessState,
    ) -> Result<CasOutcome> {
        let mode = PutMode::Update(UpdateVersion {
            e_tag: Some(expected.as_str().to_string()),
            version: None,
        });
        self.put(mode, codec::encode(state), "compare-and-swap")
            .await
    }
}
