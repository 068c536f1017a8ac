//! `etcdutl witness init`: write version 0 of a new witness.
//!
//! Invariants: an existing witness is never replaced without `force`; on a mount, hard links and
//! fsync are checked before anything is written; on a blob, the service must honour conditional
//! writes (self-test) before the witness is declared usable. The stored peer URL is the redacted
//! form: a SAS signature is never written into the witness record.

use witness_azblob::{AzBlobOptions, AzBlobStore};
use witness_core::{CasOutcome, Error, Result, Version, WitnessState, WitnessUrl};
use witness_mount::FsReport;

use super::backend::open_store;

/// What to initialise.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// The witness member's name (as in `--initial-cluster NAME=witness:...`).
    pub name: String,
    pub url: WitnessUrl,
    /// Replace an existing (or corrupt) witness. Its term and vote are discarded.
    pub force: bool,
}

/// What init did.
#[derive(Debug, Clone)]
pub struct InitReport {
    /// The file system under a mount witness.
    pub fs: Option<FsReport>,
    /// Things the operator should know (e.g. a local, non-shared directory).
    pub warnings: Vec<String>,
    /// True when an existing witness was replaced (`--force`).
    pub replaced: bool,
    pub version: Version,
}

/// Checks a member name as etcd's `--initial-cluster` needs it.
fn check_name(name: &str) -> anyhow::Result<()> {
    if name.is_empty() {
        anyhow::bail!("--name must not be empty");
    }
    if let Some(c) = name
        .chars()
        .find(|c| c.is_whitespace() || *c == ',' || *c == '=')
    {
        anyhow::bail!(
            "--name {name:?} contains {c:?}; a member name cannot contain whitespace, ',' or '=' (they separate --initial-cluster entries)"
        );
    }
    Ok(())
}

/// Initialises a witness. See the module invariants.
pub async fn init(opts: &InitOptions) -> anyhow::Result<InitReport> {
    check_name(&opts.name)?;
    let mut warnings = Vec::new();
    let fs = match &opts.url {
        WitnessUrl::Mount { path } => {
            let report = witness_mount::check_directory(path)?;
            if !report.is_network {
                warnings.push(format!(
                    "{} is on a local {} file system, not a network share: only processes on this machine can use this witness; for nodes on two machines, mount an NFS or SMB share there",
                    path.display(),
                    report.fs_type
                ));
            }
            Some(report)
        }
        WitnessUrl::AzBlob { .. } => None,
    };
    let store = open_store(&opts.url)?;
    let state = WitnessState::new(0, opts.name.clone(), opts.url.to_string()).with_fresh_nonce();
    let (version, replaced) = match store.create(&state).await? {
        CasOutcome::Written(v) => (v, false),
        CasOutcome::Conflict => match replace(&*store, &state, opts).await {
            Ok(v) => (v, true),
            Err(e @ Error::Corrupt { .. }) => anyhow::bail!(
                "{e}. To overwrite it here anyway, pass --force, and only once no member of any \
                 cluster that used it will run again: a cluster bound to it refuses a new \
                 witness at this location"
            ),
            Err(e) => return Err(e.into()),
        },
    };
    if let WitnessUrl::AzBlob { uri } = &opts.url {
        AzBlobStore::open(uri, AzBlobOptions::default())?
            .self_test()
            .await?;
    }
    Ok(InitReport {
        fs,
        warnings,
        replaced,
        version,
    })
}

/// A witness exists: replace it if forced, else refuse naming it.
async fn replace(
    store: &dyn witness_core::WitnessStore,
    state: &WitnessState,
    opts: &InitOptions,
) -> Result<Version> {
    let (current, name) = match store.load().await {
        Ok(Some(l)) => (l.version, l.state.name),
        Ok(None) => {
            // Removed between our create and load: try again as a fresh create.
            return match store.create(state).await? {
                CasOutcome::Written(v) => Ok(v),
                CasOutcome::Conflict => Err(Error::TooManyConflicts {
                    location: store.location(),
                    attempts: 2,
                    conflicts: 2,
                }),
            };
        }
        Err(Error::Corrupt { version, .. }) if opts.force => (version, "<corrupt>".into()),
        Err(e) => return Err(e),
    };
    if !opts.force {
        return Err(Error::AlreadyInitialised {
            location: store.location(),
            name,
        });
    }
    match store.compare_and_swap(&current, state).await? {
        CasOutcome::Written(v) => Ok(v),
        CasOutcome::Conflict => Err(Error::TooManyConflicts {
            location: store.location(),
            attempts: 1,
            conflicts: 1,
        }),
    }
}
