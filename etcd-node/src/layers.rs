//! The layers docs/architecture.md draws, checked: a test reads every source file of the library
//! and fails on a `crate::` path that points the wrong way (a module naming one above it) and on
//! a gRPC type below the API layer. A new module goes into one of the lists below, where the
//! architecture note puts it.

use std::path::{Path, PathBuf};

/// The library's modules from the bottom up: each names only itself and those before it.
/// (`layers`, this test-only module, lends its file walk to other modules' tests.)
const CRATE_LAYERS: &[&str] = &[
    "layers",
    "errors",
    "failpoint",
    "version",
    "tls",
    "raft",
    "storage",
    "mvcc",
    "witness",
    "config",
    "reconcile",
    "server",
    "sim",
];

/// Macros exported at the crate's root (`crate::crash!`), by the module that defines them.
const MACROS: &[(&str, &str)] = &[
    ("crash", "failpoint"),
    ("storage_error", "failpoint"),
    ("etcd_api_version", "version"),
];

/// The layers of `server`, from the bottom up: a module names `server` modules of its own layer
/// and those below (docs/architecture.md, "Layers of server").
const SERVER_LAYERS: &[&[&str]] = &[
    &["contract", "wire", "watch_hub"],
    &[
        "node",
        "applier",
        "driver",
        "proposals",
        "reads",
        "removal",
        "lessor",
        "peer",
        "peer_thread",
        "witness_slot",
        "witness_probe",
        "metrics",
    ],
    &["api"],
    &["bootstrap", "restore", "force", "snapshot_file", "wal_dump"],
];

/// The modules below the API layer that must not name gRPC (`tonic`): they return typed
/// errors (crate::errors) that the API layer maps.
const NO_GRPC: &[&str] = &["errors", "raft", "storage", "mvcc", "config"];

/// Every `.rs` file under `dir`, sorted.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The identifiers that follow each occurrence of `prefix` in `text`.
fn names_after<'t>(text: &'t str, prefix: &str) -> Vec<&'t str> {
    text.match_indices(prefix)
        .filter(|(at, _)| {
            // (a whole path segment: not `foo_crate::x`)
            !text[..*at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .map(|(at, _)| {
            let rest = &text[at + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .filter(|n| !n.is_empty())
        .collect()
}

fn crate_rank(name: &str) -> Option<usize> {
    let module = MACROS
        .iter()
        .find(|(m, _)| *m == name)
        .map_or(name, |(_, module)| *module);
    CRATE_LAYERS.iter().position(|m| *m == module)
}

fn server_rank(name: &str) -> Option<usize> {
    SERVER_LAYERS.iter().position(|layer| layer.contains(&name))
}

/// What is wrong with one file's imports, given its path under src/.
fn violations(rel: &Path, text: &str) -> Vec<String> {
    let parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    let top = parts[0].as_str();
    let mut out = Vec::new();
    let Some(own) = crate_rank(top) else {
        return vec![format!(
            "module {top} is in no layer: add it to CRATE_LAYERS"
        )];
    };
    for name in names_after(text, "crate::") {
        match crate_rank(name) {
            None => out.push(format!("crate::{name} is in no layer")),
            Some(r) if r > own => out.push(format!("{top} names crate::{name}, a layer above it")),
            Some(_) => {}
        }
    }
    if NO_GRPC.contains(&top) && text.contains("tonic") {
        out.push(format!("{top} is below the API layer and names tonic"));
    }
    if top == "server" && parts.len() > 1 && parts[1] != "mod" {
        let module = parts[1].as_str();
        let Some(own) = server_rank(module) else {
            return vec![format!(
                "server::{module} is in no layer: add it to SERVER_LAYERS"
            )];
        };
        let mut named = names_after(text, "crate::server::");
        // `super::` is `server` in server/*.rs and `server::api` below it
        named.extend(names_after(
            text,
            if parts.len() == 2 {
                "super::"
            } else {
                "super::super::"
            },
        ));
        for name in named {
            match server_rank(name) {
                Some(r) if r > own => out.push(format!(
                    "server::{module} names server::{name}, a layer above it"
                )),
                _ => {}
            }
        }
    }
    out
}

#[test]
fn imports_point_down_the_layers_and_no_grpc_below_the_api() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut wrong = Vec::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap();
        // (this file's own examples name every layer)
        if rel == Path::new("lib.rs") || rel == Path::new("layers.rs") || rel.starts_with("bin") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        for v in violations(rel, &text) {
            wrong.push(format!("{}: {v}", rel.display()));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// The check can fail: the imports this round removed are reported.
#[test]
fn an_import_pointing_up_is_reported() {
    let config = violations(
        Path::new("config/mod.rs"),
        "use crate::server::applier::{self, SyncPolicy};",
    );
    assert_eq!(config, ["config names crate::server, a layer above it"]);
    let metrics = violations(
        Path::new("server/metrics.rs"),
        "use crate::server::api::handle::VERSION;",
    );
    assert_eq!(
        metrics,
        ["server::metrics names server::api, a layer above it"]
    );
    let mvcc = violations(Path::new("mvcc/mod.rs"), "code: tonic::Code,");
    assert_eq!(mvcc, ["mvcc is below the API layer and names tonic"]);
    let api = violations(
        Path::new("server/api/kv.rs"),
        "use super::super::bootstrap::x;",
    );
    assert_eq!(
        api,
        ["server::api names server::bootstrap, a layer above it"]
    );
}
