//! Generates protobuf and gRPC code (needs `protoc`: Debian's `protobuf-compiler`, which
//! scripts/test.sh installs): the Raft log's records from proto/raft.proto, the peer transport
//! and its messages from proto/peer.proto, and the server side of etcd's Auth
//! service from proto/auth.proto, whose messages (but AuthStatus's) are etcd-client's types.

/// Messages of proto/auth.proto that are etcd-client's (`etcd_client::proto::Pb<name>`).
const ETCD_CLIENT_MESSAGES: &[&str] = &[
    "ResponseHeader",
    "AuthEnableRequest",
    "AuthEnableResponse",
    "AuthDisableRequest",
    "AuthDisableResponse",
    "AuthenticateRequest",
    "AuthenticateResponse",
    "AuthUserAddRequest",
    "AuthUserAddResponse",
    "AuthUserGetRequest",
    "AuthUserGetResponse",
    "AuthUserListRequest",
    "AuthUserListResponse",
    "AuthUserDeleteRequest",
    "AuthUserDeleteResponse",
    "AuthUserChangePasswordRequest",
    "AuthUserChangePasswordResponse",
    "AuthUserGrantRoleRequest",
    "AuthUserGrantRoleResponse",
    "AuthUserRevokeRoleRequest",
    "AuthUserRevokeRoleResponse",
    "AuthRoleAddRequest",
    "AuthRoleAddResponse",
    "AuthRoleGetRequest",
    "AuthRoleGetResponse",
    "AuthRoleListRequest",
    "AuthRoleListResponse",
    "AuthRoleDeleteRequest",
    "AuthRoleDeleteResponse",
    "AuthRoleGrantPermissionRequest",
    "AuthRoleGrantPermissionResponse",
    "AuthRoleRevokePermissionRequest",
    "AuthRoleRevokePermissionResponse",
];

fn fail(file: &str, e: std::io::Error) -> ! {
    eprintln!("error: compiling {file}: {e}");
    eprintln!("help: install protoc (Debian: apt-get install protobuf-compiler) or set PROTOC");
    std::process::exit(1);
}

fn main() {
    println!("cargo:rerun-if-changed=proto/raft.proto");
    println!("cargo:rerun-if-changed=proto/peer.proto");
    println!("cargo:rerun-if-changed=proto/auth.proto");
    let raft = tonic_prost_build::configure()
        .build_client(false)
        .build_server(false);
    if let Err(e) = raft.compile_protos(&["proto/raft.proto"], &["proto"]) {
        fail("proto/raft.proto", e);
    }
    // Snapshot data (in chunks, and in a Raft message) are slices of the snapshot's shared
    // buffer, not copies.
    let peer = tonic_prost_build::configure()
        .bytes(".etcdnode.peer.SnapshotChunk.data")
        .bytes(".etcdnode.peer.RaftMessage.snapshot_data")
        .extern_path(".etcdnode.raft", "crate::storage::codec::pb");
    if let Err(e) = peer.compile_protos(&["proto/peer.proto"], &["proto"]) {
        fail("proto/peer.proto", e);
    }
    let mut auth = tonic_prost_build::configure().build_client(false);
    for m in ETCD_CLIENT_MESSAGES {
        auth = auth.extern_path(
            format!(".etcdserverpb.{m}"),
            format!("::etcd_client::proto::Pb{m}"),
        );
    }
    if let Err(e) = auth.compile_protos(&["proto/auth.proto"], &["proto"]) {
        fail("proto/auth.proto", e);
    }
}
