//! Named failpoints at durable steps, for crash tests.
//!
//! `ETCD_NODE_FAILPOINT=<name>[:<n>]` makes the process abort (as a `kill -9` would, without
//! unwinding or flushing anything) the `n`-th time (default 1st) it reaches the failpoint
//! `<name>`. Unset, a failpoint costs one atomic load. The names are listed in
//! `docs/formats.md`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

struct Armed {
    name: String,
    remaining: AtomicU64,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var("ETCD_NODE_FAILPOINT").ok()?;
            let (name, n) = match spec.split_once(':') {
                Some((name, n)) => (name.to_string(), n.parse().unwrap_or(1)),
                None => (spec, 1),
            };
            Some(Armed {
                name,
                remaining: AtomicU64::new(n),
            })
        })
        .as_ref()
}

/// Aborts the process here if the failpoint `name` is armed and due.
pub fn hit(name: &str) {
    if let Some(a) = armed()
        && a.name == name
        && a.remaining.fetch_sub(1, Ordering::SeqCst) == 1
    {
        eprintln!("failpoint {name}: aborting");
        std::process::abort();
    }
}
