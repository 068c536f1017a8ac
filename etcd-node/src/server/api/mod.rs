//! The etcd v3 client API (gRPC, etcd-client's server types), one struct per service over the
//! shared handle [`Api`]: [`kv::Kv`], [`cluster::Cluster`], [`maintenance::Maintenance`],
//! [`lease::Lease`], [`watch::Watch`] and [`auth::Auth`]; plus `/health` and `/metrics`. The
//! handle talks to the Raft loop only through `server::contract` (inputs in, status out).
//! Writes go through Raft; linearizable reads wait for a ReadIndex round, serializable ones read
//! this member's key space at once.

pub mod auth;
pub mod cluster;
pub mod corruption;
pub mod handle;
pub mod kv;
pub mod lease;
pub mod maintenance;
pub mod watch;

use etcd_client::proto::{
    PbClusterServer, PbKvServer, PbLeaseServer, PbMaintenanceServer, PbWatchServer,
};
use tonic::service::{Routes, interceptor::InterceptedService};

use auth::Auth;
use cluster::Cluster;
pub use handle::{Api, MAX_REQUEST_BYTES, leader_check};
use kv::Kv;
use lease::Lease;
use maintenance::Maintenance;
use watch::Watch;

/// The client API's gRPC services, each behind etcd's require-leader check.
pub fn routes(api: &Api) -> Routes {
    let check = || leader_check(api.status.clone());
    let kv = Kv { api: api.clone() };
    Routes::new(InterceptedService::new(
        PbKvServer::new(kv).max_decoding_message_size(MAX_REQUEST_BYTES + 512 * 1024),
        check(),
    ))
    .add_service(PbClusterServer::with_interceptor(
        Cluster { api: api.clone() },
        check(),
    ))
    .add_service(PbMaintenanceServer::with_interceptor(
        Maintenance { api: api.clone() },
        check(),
    ))
    .add_service(PbWatchServer::with_interceptor(
        Watch { api: api.clone() },
        check(),
    ))
    .add_service(PbLeaseServer::with_interceptor(
        Lease { api: api.clone() },
        check(),
    ))
    .add_service(auth::pb::auth_server::AuthServer::with_interceptor(
        Auth { api: api.clone() },
        check(),
    ))
}
