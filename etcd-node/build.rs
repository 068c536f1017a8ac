//! Generates protobuf and gRPC code (needs `protoc`: Debian's `protobuf-compiler`, which
//! scripts/test.sh installs): the Raft log's records from proto/raft.proto, the peer transport
//! and its messages from proto/peer.proto, and the server side of etcd's Auth
//! service from proto/auth.proto, whose messages (but AuthStatus's) are etcd-client's types.
//!
//! From etcd's own protos, as the etcd-client crate ships them (found through `cargo metadata`,
//! not copied here): the server side of the Lock and Election services, and for the JSON
//! gateway every message of etcd's client API with serde in the proto3 JSON mapping (pbjson)
//! and the table of the gateway's paths, read from the protos' `google.api.http` options.

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

/// etcd's protos that define the client API (paths under etcd-client's `proto/`).
const ETCD_PROTOS: &[&str] = &[
    "etcd/api/etcdserverpb/rpc.proto",
    "etcd/api/mvccpb/kv.proto",
    "etcd/api/authpb/auth.proto",
    "etcd/server/etcdserver/api/v3lock/v3lockpb/v3lock.proto",
    "etcd/server/etcdserver/api/v3election/v3electionpb/v3election.proto",
];

/// The etcd-client crate's `proto/` directory, from `cargo metadata` (the version Cargo.lock
/// pins, wherever Cargo unpacked it).
fn etcd_client_protos() -> std::path::PathBuf {
    let metadata = |offline: bool| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        std::process::Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--locked"])
            .args(offline.then_some("--offline"))
            .args([
                "--filter-platform",
                &std::env::var("TARGET").expect("TARGET"),
            ])
            .current_dir(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap_or_else(|e| panic!("cargo metadata (to find etcd-client's protos): {e}"))
    };
    // Offline first. The workspace's metadata names every member's dependencies, dev ones
    // included, and a build of this package alone (`cargo build -p etcd-node` on a new
    // machine) has not downloaded them all: then Cargo may fetch them.
    let mut out = metadata(true);
    if !out.status.success() {
        out = metadata(false);
    }
    assert!(
        out.status.success(),
        "cargo metadata (to find etcd-client's protos) failed: {}\nhelp: run `cargo fetch \
         --locked` (it downloads every package the workspace names), then build again",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
    let manifest = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "etcd-client")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("etcd-client among the packages");
    std::path::Path::new(manifest)
        .parent()
        .expect("etcd-client's directory")
        .join("proto")
}

/// One `rpc` of a service with the gateway's paths for it.
struct Rpc {
    grpc: String,
    request: String,
    response: String,
    client_streaming: bool,
    server_streaming: bool,
    posts: Vec<String>,
}

/// The rpcs of a proto file, with the paths of their `google.api.http` options (`post:` and
/// those of `additional_bindings`): a scan of the text, enough for etcd's files (one rpc per
/// statement, options in braces after it).
fn rpcs_of(text: &str) -> Vec<Rpc> {
    let words = |line: &str| -> Vec<String> {
        line.split(|c: char| c.is_whitespace() || "();{}".contains(c))
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    let (mut package, mut service, mut out) = (String::new(), String::new(), Vec::<Rpc>::new());
    for line in text.lines().map(str::trim) {
        let w = words(line);
        match w.first().map(String::as_str) {
            Some("package") => package = w[1].clone(),
            Some("service") => service = w[1].clone(),
            Some("rpc") => {
                // rpc Name ( [stream] Req ) returns ( [stream] Resp )
                let client_streaming = w[2] == "stream";
                let request = w[2 + usize::from(client_streaming)].clone();
                let at = w.iter().position(|x| x == "returns").expect("returns");
                let server_streaming = w[at + 1] == "stream";
                let response = w[at + 1 + usize::from(server_streaming)].clone();
                out.push(Rpc {
                    grpc: format!("/{package}.{service}/{}", w[1]),
                    request: format!(
                        "{package}::{}",
                        heck::ToUpperCamelCase::to_upper_camel_case(request.as_str())
                    ),
                    response: format!(
                        "{package}::{}",
                        heck::ToUpperCamelCase::to_upper_camel_case(response.as_str())
                    ),
                    client_streaming,
                    server_streaming,
                    posts: Vec::new(),
                });
            }
            Some("post:") => {
                let path = w[1].trim_matches('"').to_string();
                out.last_mut()
                    .expect("a post: inside an rpc")
                    .posts
                    .push(path);
            }
            _ => {}
        }
    }
    out
}

/// Generates etcd's messages with serde (pbjson) into `OUT_DIR/gateway/` and the gateway's
/// table of paths (`OUT_DIR/gateway/methods.rs`).
fn gateway(protos: &std::path::Path) {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("gateway");
    std::fs::create_dir_all(&out).expect("create OUT_DIR/gateway");
    let descriptors = out.join("descriptors.bin");
    let files: Vec<_> = ETCD_PROTOS.iter().map(|f| protos.join(f)).collect();
    let build = tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .out_dir(&out)
        .file_descriptor_set_path(&descriptors);
    if let Err(e) = build.compile_protos(&files, &[protos.to_path_buf()]) {
        fail("etcd's protos (gateway)", e);
    }
    let set = std::fs::read(&descriptors).expect("the descriptor set");
    pbjson_build::Builder::new()
        .out_dir(&out)
        .register_descriptors(&set)
        .expect("etcd's descriptors")
        .preserve_proto_field_names()
        // (etcd's gateway ignores fields it does not know, 3.4 and 3.6 alike)
        .ignore_unknown_fields()
        .build(&[
            ".etcdserverpb",
            ".mvccpb",
            ".authpb",
            ".v3lockpb",
            ".v3electionpb",
        ])
        .expect("pbjson for etcd's messages");
    let mut table = String::from(
        "// Generated by build.rs from etcd's protos: the gateway's paths.\n\
         pub(super) const METHODS: &[Method] = &[\n",
    );
    for file in ETCD_PROTOS {
        let text = std::fs::read_to_string(protos.join(file)).expect("an etcd proto");
        for rpc in rpcs_of(&text) {
            for post in &rpc.posts {
                table += &format!(
                    "    Method {{ path: {post:?}, grpc: {:?}, client_streaming: {}, \
                     server_streaming: {}, request: json_to_proto::<pb::{}>, \
                     response: proto_to_json::<pb::{}> }},\n",
                    rpc.grpc, rpc.client_streaming, rpc.server_streaming, rpc.request, rpc.response
                );
            }
        }
    }
    table += "];\n";
    std::fs::write(out.join("methods.rs"), table).expect("write methods.rs");
}

/// The server side of etcd's Lock and Election services (`OUT_DIR/services/`), their
/// messages our own but the header and key-value, which are etcd-client's.
fn lock_and_election(protos: &std::path::Path) {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("services");
    std::fs::create_dir_all(&out).expect("create OUT_DIR/services");
    let build = tonic_prost_build::configure()
        .build_client(false)
        .out_dir(&out)
        .extern_path(
            ".etcdserverpb.ResponseHeader",
            "::etcd_client::proto::PbResponseHeader",
        )
        .extern_path(".mvccpb.KeyValue", "::etcd_client::proto::PbKeyValue");
    let files = [ETCD_PROTOS[3], ETCD_PROTOS[4]].map(|f| protos.join(f));
    if let Err(e) = build.compile_protos(&files, &[protos.to_path_buf()]) {
        fail("etcd's Lock and Election protos", e);
    }
}

fn main() {
    let protos = etcd_client_protos();
    println!("cargo:rerun-if-changed={}", protos.display());
    gateway(&protos);
    lock_and_election(&protos);
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
