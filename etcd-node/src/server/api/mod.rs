//! The etcd v3 client API (gRPC, etcd-client's server types), one struct per service over the
//! shared handle [`Api`]: [`kv::Kv`], [`cluster::Cluster`], [`maintenance::Maintenance`],
//! [`lease::Lease`], [`watch::Watch`], [`auth::Auth`], and etcd's [`lock::Lock`] and
//! [`election::Election`] built on them ([`concurrency`]), gRPC's health service; plus `/metrics` and the health
//! endpoints ([`probes`]: `/health`, `/livez`, `/readyz`). The
//! handle talks to the Raft loop only through `server::contract` (inputs in, status out).
//! Writes go through Raft; linearizable reads wait for a ReadIndex round, serializable ones read
//! this member's key space at once.

pub mod auth;
pub mod cluster;
pub mod cluster_params;
pub mod compactor;
pub mod concurrency;
pub mod corruption;
pub mod election;
pub mod gateway;
pub mod handle;
pub mod kv;
pub mod lease;
pub mod lock;
pub mod maintenance;
pub mod probes;
mod status;
pub mod watch;

use etcd_client::proto::{
    PbClusterServer, PbKvServer, PbLeaseServer, PbMaintenanceServer, PbWatchServer,
};
use tonic::service::{Routes, interceptor::InterceptedService};

use auth::Auth;
use cluster::Cluster;
pub use handle::{Api, leader_check, learner_gate, ready_gate};
use kv::Kv;
use lease::Lease;
use maintenance::Maintenance;
use watch::Watch;

/// What gRPC adds to a request around its message: a request up to `--max-request-bytes`
/// must still be received (etcd's grpcOverheadBytes).
pub const GRPC_OVERHEAD_BYTES: usize = 512 * 1024;

/// The client API's gRPC services, each behind etcd's require-leader check, each receiving
/// messages up to `--max-request-bytes` plus gRPC's overhead (as etcd).
pub fn routes(api: &Api) -> Routes {
    let check = || leader_check(api.status.clone());
    let limit = api.max_request_bytes + GRPC_OVERHEAD_BYTES;
    let api = || api.clone();
    Routes::new(InterceptedService::new(
        PbKvServer::new(Kv { api: api() }).max_decoding_message_size(limit),
        check(),
    ))
    .add_service(InterceptedService::new(
        PbClusterServer::new(Cluster { api: api() }).max_decoding_message_size(limit),
        check(),
    ))
    .add_service(InterceptedService::new(
        PbMaintenanceServer::new(Maintenance { api: api() }).max_decoding_message_size(limit),
        check(),
    ))
    .add_service(InterceptedService::new(
        PbWatchServer::new(Watch { api: api() }).max_decoding_message_size(limit),
        check(),
    ))
    .add_service(InterceptedService::new(
        PbLeaseServer::new(Lease { api: api() }).max_decoding_message_size(limit),
        check(),
    ))
    .add_service(InterceptedService::new(
        auth::pb::auth_server::AuthServer::new(Auth { api: api() })
            .max_decoding_message_size(limit),
        check(),
    ))
    .add_service(InterceptedService::new(
        lock::pb::lock_server::LockServer::new(lock::Lock { api: api() })
            .max_decoding_message_size(limit),
        check(),
    ))
    .add_service(InterceptedService::new(
        election::pb::election_server::ElectionServer::new(election::Election { api: api() })
            .max_decoding_message_size(limit),
        check(),
    ))
    // gRPC's health service, SERVING for "" (every service) as etcd's: etcd's robustness
    // suite checks it between faults, and gRPC load balancers and `grpc_health_probe` use it.
    .add_service(tonic_health::server::health_reporter().1)
}
