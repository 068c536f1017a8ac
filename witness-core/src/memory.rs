//! An in-memory [`WitnessStore`] with fault injection, for tests and simulation.
//!
//! Invariants: versions are consecutive integers starting at 0; every stored record is the
//! encoded bytes of a state (so corruption can be injected and is caught by the codec); faults
//! fire once each, in the order they were queued.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use crate::codec::{self, DecodeError};
use crate::error::{Error, Result};
use crate::state::WitnessState;
use crate::store::{CasOutcome, Loaded, Version, WitnessStore};

/// A fault the next operation meets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The next conditional write reports a conflict without writing.
    Conflict,
    /// The next operation fails with a transient error without taking effect.
    Error,
    /// The next conditional write takes effect, but the caller gets a transient error.
    LostReply,
    /// The next operation waits this long first.
    Delay(Duration),
    /// The next load returns the version this many before the newest (the oldest if there
    /// are fewer), as a mount's attribute or directory cache may; a write computed from it
    /// loses its compare-and-swap.
    StaleLoad(usize),
}

#[derive(Debug, Default)]
struct Inner {
    /// Encoded records, index = version.
    versions: Vec<Vec<u8>>,
    faults: VecDeque<Fault>,
    loads: u64,
    writes: u64,
}

/// A witness store in memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store holding `states` as its versions, oldest first (the last is the newest).
    pub fn with_states(states: &[WitnessState]) -> Self {
        let store = Self::new();
        store.lock().versions = states.iter().map(codec::encode).collect();
        store
    }

    /// Queues a fault for a coming operation.
    pub fn inject(&self, fault: Fault) {
        self.lock().faults.push_back(fault);
    }

    /// Replaces the newest record's bytes (to test corruption handling).
    pub fn corrupt_latest(&self, f: impl FnOnce(&mut Vec<u8>)) {
        let mut inner = self.lock();
        let last = inner
            .versions
            .last_mut()
            .expect("a stored record to corrupt");
        f(last);
    }

    /// Every stored state, oldest first (records that do not decode are left out).
    pub fn states(&self) -> Vec<WitnessState> {
        let inner = self.lock();
        inner
            .versions
            .iter()
            .filter_map(|b| codec::decode(b).ok())
            .collect()
    }

    /// (loads, successful writes) so far.
    pub fn counts(&self) -> (u64, u64) {
        let inner = self.lock();
        (inner.loads, inner.writes)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn transient(op: &'static str) -> Error {
        Error::Remote {
            op,
            location: "memory".into(),
            message: "injected transient failure".into(),
            transient: true,
        }
    }

    /// Takes the next fault that applies to this operation, sleeping for delays. Faults that
    /// only a write can meet (conflict, lost reply) stay queued for the next write.
    async fn next_fault(&self, write: bool) -> Option<Fault> {
        loop {
            let fault = {
                let mut inner = self.lock();
                match inner.faults.front() {
                    Some(Fault::Conflict | Fault::LostReply) if !write => None,
                    Some(Fault::StaleLoad(_)) if write => None,
                    _ => inner.faults.pop_front(),
                }
            };
            match fault {
                Some(Fault::Delay(d)) => tokio::time::sleep(d).await,
                other => return other,
            }
        }
    }

    async fn write(
        &self,
        expected: Option<&Version>,
        state: &WitnessState,
        op: &'static str,
    ) -> Result<CasOutcome> {
        let fault = self.next_fault(true).await;
        match fault {
            Some(Fault::Conflict) => return Ok(CasOutcome::Conflict),
            Some(Fault::Error) => return Err(Self::transient(op)),
            _ => {}
        }
        let bytes = codec::encode(state);
        let mut inner = self.lock();
        let current = inner.versions.len().checked_sub(1).map(|v| v.to_string());
        let matches = match expected {
            None => current.is_none(),
            Some(v) => current.as_deref() == Some(v.as_str()),
        };
        if !matches {
            return Ok(CasOutcome::Conflict);
        }
        inner.versions.push(bytes);
        inner.writes += 1;
        let version = Version::new((inner.versions.len() - 1).to_string());
        if fault == Some(Fault::LostReply) {
            return Err(Self::transient(op));
        }
        Ok(CasOutcome::Written(version))
    }
}

#[async_trait]
impl WitnessStore for MemoryStore {
    fn location(&self) -> String {
        "memory".into()
    }

    async fn load(&self) -> Result<Option<Loaded>> {
        let back = match self.next_fault(false).await {
            Some(Fault::Error) => return Err(Self::transient("load")),
            Some(Fault::StaleLoad(back)) => back,
            _ => 0,
        };
        let mut inner = self.lock();
        inner.loads += 1;
        let Some(newest) = inner.versions.len().checked_sub(1) else {
            return Ok(None);
        };
        let at = newest.saturating_sub(back);
        let bytes = &inner.versions[at];
        let version = Version::new(at.to_string());
        let state = codec::decode(bytes).map_err(|source: DecodeError| Error::Corrupt {
            location: "memory".into(),
            version: version.clone(),
            source,
        })?;
        Ok(Some(Loaded { state, version }))
    }

    async fn create(&self, state: &WitnessState) -> Result<CasOutcome> {
        self.write(None, state, "create").await
    }

    async fn compare_and_swap(
        &self,
        expected: &Version,
        state: &WitnessState,
    ) -> Result<CasOutcome> {
        self.write(Some(expected), state, "compare-and-swap").await
    }
}
