#!/usr/bin/env bash
# The fault campaign (docs/testing.md, "The fault campaign"): builds the release binaries, then
# runs fault runs against a local cluster of real etcd-node processes (two members and a
# witness directory) under a client workload, checking every key's history for
# linearizability and both members for the same data after each run.
#   bash scripts/faults.sh [--runs N] [--seed S] [--clients C] [--keys K]
#     [--witness dir|sshfs|azurite] [--full-disk | --power-cut] [--faults F,...]
# (--full-disk, --power-cut and --witness sshfs need root; --power-cut needs /dev/fuse)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p etcd-node --bin etcd-node --bin etcdutl -p e2e-tests --bin faults
exec target/release/faults "$@"
