//! witness-azblob against a real Azurite (started here, stopped with SIGTERM): the conformance
//! suite, the multi-process race, the start-up self-test and credential errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use e2e_tests::azurite::Azurite;
use witness_azblob::{AzBlobOptions, AzBlobStore};
use witness_core::conformance::{self, Backend, Location};
use witness_core::{CasOutcome, Error, WitnessState, WitnessStore, WitnessUrl};

const CONTAINER: &str = "witness";

fn open(url: &str) -> AzBlobStore {
    let WitnessUrl::AzBlob { uri } = WitnessUrl::parse(url).expect("witness URL") else {
        panic!("not an azblob URL: {url}");
    };
    AzBlobStore::open(&uri, AzBlobOptions::default()).expect("open blob store")
}

struct BlobLocation {
    azurite: Arc<Azurite>,
    blob: String,
    url: String,
}

#[async_trait::async_trait]
impl Location for BlobLocation {
    async fn client(&self) -> Arc<dyn WitnessStore> {
        Arc::new(open(&self.url))
    }
    async fn read_raw(&self) -> Vec<u8> {
        let (az, blob) = (self.azurite.clone(), self.blob.clone());
        tokio::task::spawn_blocking(move || az.get_blob(CONTAINER, &blob).expect("blob exists"))
            .await
            .unwrap()
    }
    async fn write_raw(&self, bytes: &[u8]) {
        let (az, blob, bytes) = (self.azurite.clone(), self.blob.clone(), bytes.to_vec());
        tokio::task::spawn_blocking(move || az.put_blob(CONTAINER, &blob, &bytes))
            .await
            .unwrap()
    }
    async fn stored_versions(&self) -> usize {
        1
    }
    fn retention(&self) -> Option<usize> {
        None
    }
}

struct Blobs {
    azurite: Arc<Azurite>,
    next: AtomicUsize,
}

#[async_trait::async_trait]
impl Backend for Blobs {
    async fn fresh(&self) -> Arc<dyn Location> {
        let blob = format!("w{}/state", self.next.fetch_add(1, Ordering::SeqCst));
        let az = self.azurite.clone();
        let b = blob.clone();
        let url = tokio::task::spawn_blocking(move || az.witness_url(CONTAINER, &b))
            .await
            .unwrap();
        Arc::new(BlobLocation {
            azurite: self.azurite.clone(),
            blob,
            url,
        })
    }
}

async fn start_azurite() -> Arc<Azurite> {
    Arc::new(tokio::task::spawn_blocking(Azurite::start).await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn azurite_passes_the_conformance_suite() {
    let azurite = start_azurite().await;
    conformance::run_all(&Blobs {
        azurite,
        next: AtomicUsize::new(0),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn increments_from_separate_processes_lose_nothing() {
    const NAME: &str = "increments_from_separate_processes_lose_nothing";
    let opener = |loc: &str| Arc::new(open(loc)) as Arc<dyn WitnessStore>;
    if let Some(loc) = conformance::child_location() {
        return conformance::increments_in_processes(NAME, &loc, opener, 0, 25).await;
    }
    let azurite = start_azurite().await;
    let az = azurite.clone();
    let url = tokio::task::spawn_blocking(move || az.witness_url(CONTAINER, "race/state"))
        .await
        .unwrap();
    conformance::increments_in_processes(NAME, &url, opener, 4, 25).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_test_accepts_azurite_and_changes_nothing() {
    let azurite = start_azurite().await;
    let az = azurite.clone();
    let url = tokio::task::spawn_blocking(move || az.witness_url(CONTAINER, "selftest"))
        .await
        .unwrap();
    let store = open(&url);
    let err = store.self_test().await.unwrap_err();
    assert!(matches!(err, Error::NotInitialised { .. }), "{err}");
    assert!(matches!(
        store.create(&WitnessState::new(0, "w", "x")).await.unwrap(),
        CasOutcome::Written(_)
    ));
    let before = store.load().await.unwrap().unwrap();
    store
        .self_test()
        .await
        .expect("Azurite honours If-None-Match and If-Match");
    assert_eq!(
        store.load().await.unwrap().unwrap(),
        before,
        "self-test changed nothing, not even the ETag"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_signature_is_permission_denied_and_not_logged() {
    let azurite = start_azurite().await;
    let az = azurite.clone();
    let url = tokio::task::spawn_blocking(move || az.witness_url(CONTAINER, "badsig"))
        .await
        .unwrap();
    let forged = url.replace("sig%3D", "sig%3DAAAA");
    assert_ne!(forged, url);
    let store = open(&forged);
    let err = store.load().await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied { .. }), "{err}");
    let msg = err.to_string();
    assert!(!msg.contains("AAAA"), "the signature leaked into: {msg}");
    assert!(msg.contains("REDACTED"), "{msg}");
}
