//! Generates the peer transport's gRPC code from proto/peer.proto (needs `protoc`: Debian's
//! `protobuf-compiler`, which scripts/test.sh installs).

fn main() {
    println!("cargo:rerun-if-changed=proto/peer.proto");
    if let Err(e) = tonic_prost_build::configure().compile_protos(&["proto/peer.proto"], &["proto"])
    {
        eprintln!("error: compiling proto/peer.proto: {e}");
        eprintln!("help: install protoc (Debian: apt-get install protobuf-compiler) or set PROTOC");
        std::process::exit(1);
    }
}
