//! The `WitnessStore` trait: optimistic compare-and-swap over one witness record.
//!
//! Invariants every implementation keeps (checked by [`crate::conformance`]):
//! - `load` returns the newest successfully written state and its version; it never falls back
//!   to an older state when the newest is damaged (that is [`crate::Error::Corrupt`]);
//! - `create` succeeds for exactly one of any number of racing creators;
//! - `compare_and_swap(v, s)` stores `s` only if `v` is still the newest version, and succeeds
//!   for exactly one of any number of racing writers holding `v`;
//! - after a transient error (see [`crate::Error::is_transient`]) a write may or may not have
//!   happened: the caller re-reads; the writer nonce in the state says who won.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;

use crate::error::Result;
use crate::state::WitnessState;

/// An opaque storage version: a file sequence number on a mount, an ETag on a blob.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Version(Arc<str>);

impl Version {
    pub fn new(v: impl Into<Arc<str>>) -> Self {
        Version(v.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Version({})", self.0)
    }
}

/// A state as loaded, with the version a compare-and-swap must name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub state: WitnessState,
    pub version: Version,
}

/// The result of a conditional write: an expected outcome, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasOutcome {
    /// The state was stored as this new version.
    Written(Version),
    /// Another writer got there first (or, for `create`, the witness already exists).
    Conflict,
}

/// Shared storage holding one witness state, updated only by compare-and-swap.
#[async_trait]
pub trait WitnessStore: Send + Sync + fmt::Debug {
    /// Where the state lives, for messages (never includes credentials).
    fn location(&self) -> String;

    /// The newest state and its version, or `None` if no witness was initialised here.
    async fn load(&self) -> Result<Option<Loaded>>;

    /// Stores `state` as the first version if nothing is stored yet.
    async fn create(&self, state: &WitnessState) -> Result<CasOutcome>;

    /// Stores `state` as the next version if `expected` is still the newest.
    async fn compare_and_swap(
        &self,
        expected: &Version,
        state: &WitnessState,
    ) -> Result<CasOutcome>;
}

#[async_trait]
impl<S: WitnessStore + ?Sized> WitnessStore for Arc<S> {
    fn location(&self) -> String {
        (**self).location()
    }
    async fn load(&self) -> Result<Option<Loaded>> {
        (**self).load().await
    }
    async fn create(&self, state: &WitnessState) -> Result<CasOutcome> {
        (**self).create(state).await
    }
    async fn compare_and_swap(
        &self,
        expected: &Version,
        state: &WitnessState,
    ) -> Result<CasOutcome> {
        (**self).compare_and_swap(expected, state).await
    }
}
