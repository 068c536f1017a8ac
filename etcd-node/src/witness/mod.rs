//! The witness as etcd-node uses it: opening the backend a `witness:` URL names, and the
//! `etcdutl witness` operations (init, status) as library functions the CLI calls.

pub mod backend;
pub mod init;
pub mod status;

pub use backend::{Claim, Unread, claim_within, load_within, open_store, unused};
pub use init::{InitOptions, InitReport, init};
pub use status::{StatusReport, status};
