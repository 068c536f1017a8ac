#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need, then runs
# formatting, lints and every test (end-to-end ones run etcd-node processes against Debian's
# etcdctl and etcd 3.6's), then the Kubernetes tier (Go: Kubernetes' storage contract through
# the real etcd3 store, and kube-apiserver, controller managers and a scheduler on etcd-node).
# Tests start and stop their own servers (Azurite, a loopback sshd for sshfs mounts, the
# control plane). Run as root: some tests mount tmpfs and sshfs file systems.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)
[ -x /usr/bin/sshfs ] || need_apt+=(sshfs)
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
command -v etcdctl >/dev/null 2>&1 || need_apt+=(etcd-client)
command -v etcd >/dev/null 2>&1 || need_apt+=(etcd-server)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
# (Patroni managing two PostgreSQL servers on etcd-node: tests/python/patroni_check.py)
[ -x /usr/bin/patroni ] || need_apt+=(patroni)
[ -x /usr/lib/postgresql/15/bin/postgres ] || need_apt+=(postgresql-15)
command -v openssl >/dev/null 2>&1 || need_apt+=(openssl)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
command -v pkill >/dev/null 2>&1 || need_apt+=(procps)
# (the Python client check builds a venv: Debian splits venv/ensurepip out of python3)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_apt+=(python3 python3-venv)
# (the /metrics page is checked with the Prometheus Python client's text parser, Debian's)
/usr/bin/python3 -c 'import prometheus_client' >/dev/null 2>&1 || need_apt+=(python3-prometheus-client)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "==> installing Debian packages: ${need_apt[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

# Go (1.26 or newer) builds the Kubernetes tier and etcd 3.6; Debian's golang is too old, so it
# is not installed here.
if ! command -v go >/dev/null 2>&1; then
  echo "!!! no \`go\` on PATH: the Kubernetes tier and the etcd 3.6 tests need Go 1.26 or newer" >&2
  echo "!!! (https://go.dev/doc/install); the suite cannot run without it" >&2
  exit 1
fi

echo "==> installing Azurite (npm ci, pinned in package-lock.json)"
npm ci --no-audit --no-fund --loglevel=error

echo "==> cargo fmt --check, gofmt"
cargo fmt --all -- --check
unformatted=$(gofmt -l tests/go)
if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted" >&2; exit 1; fi

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

# etcd 3.6 first (the Rust tests run its etcdctl and etcdutl); Kubernetes (about 8 minutes cold
# on 2 cores) meanwhile in the background at the lowest priority: it takes the CPU the Rust
# suite leaves idle (its end-to-end tests mostly wait on processes), not the other way round.
echo "==> building etcd 3.6 from its Go module (cached in target/go)"
bash scripts/build-go.sh etcd
# (etcd's robustness suite runs inside `cargo test`, etcd-node/tests/cluster.rs; compiled here
# first so that its test does not spend its time compiling etcd's packages)
echo "==> compiling etcd's robustness suite (tests/go/robustness)"
(cd tests/go/robustness && go test -c -o /dev/null .)
mkdir -p target
echo "==> building Kubernetes from its Go module in the background (log: target/go-build.log)"
nice -n 19 bash scripts/build-go.sh kube > target/go-build.log 2>&1 &
kube_build=$!
# (a failing step ends the script: the build goes with it. Under `set -e` a failing command in
# the trap itself would turn a passing run into exit 1, so the whole trap is guarded.)
trap '{ pkill -P "$kube_build"; kill "$kube_build"; } 2>/dev/null || true' EXIT

echo "==> building the previous release (the rolling-upgrade test starts from it)"
bash scripts/build-previous.sh

echo "==> cargo test"
cargo test --workspace --locked

echo "==> waiting for the Kubernetes build"
if ! wait "$kube_build"; then
  cat target/go-build.log >&2
  echo "!!! building Kubernetes failed (above)" >&2
  exit 1
fi
cat target/go-build.log

echo "==> go vet (tests/go)"
(cd tests/go/kube && go vet ./...)
(cd tests/go/etcd36 && go vet ./...)
(cd tests/go/robustness && go vet ./...)

echo "==> the Kubernetes tier (tests/go/kube: the storage contract, kube-apiserver, kubeadm)"
(
  cd tests/go/kube
  export ETCD_NODE_BIN=$PWD/../../../target/debug/etcd-node ETCDUTL_BIN=$PWD/../../../target/debug/etcdutl
  go test -count=1 -p 1 -timeout 20m ./storage/ ./apiserver/ ./kubeadm/
)
