//! Named failpoints at durable steps, for crash and storage-failure tests, through the `fail`
//! crate: they exist only in a build with the `failpoints` feature (the tests' build); in any
//! other build [`crash!`](crate::crash) and [`storage_error!`](crate::storage_error) compile to
//! nothing.
//!
//! `ETCD_NODE_FAILPOINT=<name>[:<n>]` arms one failpoint: the `n`-th time (default 1st) the
//! process reaches it, a crash point aborts the process (as a `kill -9` would, without unwinding
//! or flushing anything) and a storage-error point fails the step with its error: a full disk
//! (`ENOSPC`) or a failing one (`EIO`). `FAILPOINTS` (the `fail` crate's syntax, `name=actions;...`) configures them freely.
//! The names are listed in `docs/formats.md`.

/// Failpoints asked for that cannot be armed; the message names the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadFailpoints(String);

/// Arms the failpoints the environment asks for; call once, at start. An error names the
/// variable: a malformed one, or one set for a build without failpoints (it would silently
/// test nothing).
pub fn setup() -> Result<(), BadFailpoints> {
    let mut wanted: Vec<(String, String)> = Vec::new();
    if let Ok(spec) = std::env::var("FAILPOINTS") {
        for one in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, actions) = one.split_once('=').ok_or_else(|| {
                BadFailpoints(format!(
                    "FAILPOINTS={spec}: expected name=actions in {one:?}"
                ))
            })?;
            wanted.push((name.trim().into(), actions.trim().into()));
        }
    }
    if let Ok(spec) = std::env::var("ETCD_NODE_FAILPOINT") {
        let (name, n) = match spec.split_once(':') {
            Some((name, n)) => (
                name,
                n.parse::<u64>().ok().filter(|&n| n > 0).ok_or_else(|| {
                    BadFailpoints(format!(
                        "ETCD_NODE_FAILPOINT={spec}: the count after ':' must be 1 or more"
                    ))
                })?,
            ),
            None => (spec.as_str(), 1),
        };
        let actions = match n {
            1 => "return".to_string(),
            n => format!("{}*off->return", n - 1),
        };
        wanted.push((name.into(), actions));
    }
    if wanted.is_empty() {
        return Ok(());
    }
    if !cfg!(feature = "failpoints") {
        return Err(BadFailpoints(format!(
            "failpoint {} asked for (ETCD_NODE_FAILPOINT or FAILPOINTS), but this build has \
             none: build etcd-node with --features failpoints",
            wanted[0].0
        )));
    }
    for (name, actions) in wanted {
        fail::cfg(name.as_str(), &actions)
            .map_err(|e| BadFailpoints(format!("failpoint {name}: {e}")))?;
    }
    Ok(())
}

/// Aborts the process at the crash point `$name` when it is armed and due.
#[macro_export]
macro_rules! crash {
    ($name:literal) => {
        fail::fail_point!($name, |_| {
            eprintln!("failpoint {}: aborting", $name);
            std::process::abort()
        })
    };
}

/// The errors a storage-error point fails with.
pub const ENOSPC: i32 = 28;
pub const EIO: i32 = 5;

/// Returns `Err($error(..))` from the enclosing function at the storage-error point `$name`
/// when it is armed and due: the I/O error `$errno` ([`ENOSPC`], [`EIO`]), as `$error` wraps
/// it.
#[macro_export]
macro_rules! storage_error {
    ($name:literal, $errno:expr, $error:expr) => {
        fail::fail_point!($name, |_| {
            let e = std::io::Error::from_raw_os_error($errno);
            eprintln!("failpoint {}: failing with {e}", $name);
            Err($error(e))
        })
    };
}
