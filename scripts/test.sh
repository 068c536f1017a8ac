#!/usr/bin/env bash
# The whole test suite, from a fresh machine: installs what the tests need, then runs
# formatting, lints and every test (end-to-end ones run etcd-node processes against Debian's
# etcdctl). Tests start and stop their own servers (Azurite, a
# loopback sshd for sshfs mounts). Run as root: some tests mount tmpfs and sshfs file systems.
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

echo "==> installing Azurite (npm ci, pinned in package-lock.json)"
npm ci --no-audit --no-fund --loglevel=error

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> building the previous release (the rolling-upgrade test starts from it)"
bash scripts/build-previous.sh

echo "==> cargo test"
cargo test --workspace --locked
