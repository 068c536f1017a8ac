#!/usr/bin/env bash
# The main job, until etcd-node's server lands: a witness in a local directory, initialised
# with `etcdutl witness init` and shown with `etcdutl witness status`.
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${WITNESS_DIR:-$PWD/.local-cluster/witness}"
mkdir -p "$dir"
cargo build --release --locked -p etcd-node --bin etcdutl
etcdutl=target/release/etcdutl
url="witness:mount?path=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$dir")"
echo "==> witness peer URL: $url"
if "$etcdutl" witness status --advertise-peer-url "$url" >/dev/null 2>&1; then
  echo "==> a witness already exists there; showing it (etcdutl witness init --force replaces it)"
else
  "$etcdutl" witness init --name infra2 --advertise-peer-url "$url"
fi
"$etcdutl" witness status --advertise-peer-url "$url"
