#!/usr/bin/env bash
# The test suite, from a fresh machine: installs what the tests need, then runs the tiers
# (docs/testing.md):
#   lint   cargo fmt, gofmt, clippy on every target (the tiers below included), go vet
#   fast   `cargo test --workspace`: unit tests, the simulator, its scenarios and mutations
#   e2e    real etcd-node processes against Debian's etcdctl 3.4, etcd 3.6's, other clients,
#          Azurite (cargo test --test e2e, --test azurite)
#   root   tmpfs, sshfs and power-cut (FUSE) mounts, network namespaces, Patroni
#          (cargo test --test root)
#   go     etcd's robustness suite, Kubernetes' storage contract, kube-apiserver with its
#          controller managers and scheduler, kubeadm (Go, tests/go)
# With no argument it runs all of them, in that order, as CI does (.ci/run). Name tiers to run
# only those: `bash scripts/test.sh fast`, `bash scripts/test.sh e2e root`. The long modes
# (fault campaign, simulator sweeps, benchmarks) are never run here (docs/testing.md).
# Tests start and stop their own servers (Azurite, a loopback sshd for sshfs mounts, the
# control plane). Run as root: the root and go tiers mount file systems and add addresses.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
# No incremental compilation unless asked for: this script builds once from clean in CI, where
# incremental data only costs time and 3 GB of disk (docs/testing.md, "The suite's cost").
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}

tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || tiers=(lint fast e2e root go)
for t in "${tiers[@]}"; do
  case "$t" in lint|fast|e2e|root|go) ;;
    *) echo "test.sh: no tier '$t': say lint, fast, e2e, root or go (or nothing: all of them)" >&2; exit 2 ;;
  esac
done
runs() { [[ " ${tiers[*]} " == *" $1 "* ]]; }
# timed <tier> <command...>: runs a tier's command and reports the tier's time.
timed() {
  local tier=$1 t0=$SECONDS
  shift
  "$@"
  echo "==> tier $tier passed in $((SECONDS - t0)) s"
}

need_apt=()
command -v npm >/dev/null 2>&1 || need_apt+=(nodejs npm)
command -v setpriv >/dev/null 2>&1 || need_apt+=(util-linux)
[ -x /usr/bin/sshfs ] || need_apt+=(sshfs)
# (the power-cut file system mounts with mount(2) as root; fusermount3 is its fallback)
command -v fusermount3 >/dev/null 2>&1 || need_apt+=(fuse3)
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

if runs lint; then
  echo "==> [lint] cargo fmt --check, gofmt"
  cargo fmt --all -- --check
  unformatted=$(gofmt -l tests/go)
  if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted" >&2; exit 1; fi
  echo "==> [lint] cargo clippy (every target, then the tiers run by name)"
  cargo clippy --workspace --all-targets --locked -- -D warnings
  # (a second call: --all-targets leaves out targets with test = false, and given beside it
  # --test is ignored, so these went unchecked)
  cargo clippy --workspace --test e2e --test root --test azurite --locked -- -D warnings
fi

# etcd 3.6 first (the e2e tier runs its etcdctl and etcdutl, the go tier its robustness suite);
# Kubernetes (about 8 minutes cold on 2 cores) meanwhile in the background at the lowest
# priority: it takes the CPU the Rust tiers leave idle (their end-to-end tests mostly wait on
# processes), not the other way round.
if runs e2e || runs go; then
  echo "==> building etcd 3.6 from its Go module (cached in target/go)"
  bash scripts/build-go.sh etcd
fi
mkdir -p target
kube_build=
if runs go; then
  echo "==> compiling etcd's robustness suite (tests/go/robustness)"
  # (with the backported fix of tests/go/robustness/backport: a patched copy of etcd's module)
  robustness_modfile=$(bash scripts/robustness-modfile.sh)
  (cd tests/go/robustness && go test -modfile "$robustness_modfile" -c -o /dev/null .)
  echo "==> building Kubernetes from its Go module in the background (log: target/go-build.log)"
  nice -n 19 bash scripts/build-go.sh kube > target/go-build.log 2>&1 &
  kube_build=$!
  # (a failing step ends the script: the build goes with it. Under `set -e` a failing command
  # in the trap itself would turn a passing run into exit 1, so the whole trap is guarded.)
  trap '{ pkill -P "$kube_build"; kill "$kube_build"; } 2>/dev/null || true' EXIT
fi

if runs fast; then
  echo "==> [fast] cargo test --workspace"
  timed fast cargo test --workspace --locked
fi

if runs e2e; then
  echo "==> building the previous release (the rolling-upgrade test starts from it)"
  bash scripts/build-previous.sh
  echo "==> [e2e] cargo test --test e2e, --test azurite"
  # (--workspace, as the fast tier: the same features, so nothing is built twice)
  timed e2e cargo test --locked --workspace --test e2e --test azurite
fi

if runs root; then
  echo "==> [root] cargo test --test root (needs root)"
  timed root cargo test --locked --workspace --test root
fi

if runs go; then
  echo "==> waiting for the Kubernetes build"
  if ! wait "$kube_build"; then
    cat target/go-build.log >&2
    echo "!!! building Kubernetes failed (above)" >&2
    exit 1
  fi
  cat target/go-build.log
  echo "==> [go] go vet (tests/go)"
  (cd tests/go/kube && go vet ./...)
  (cd tests/go/etcd36 && go vet ./...)
  (cd tests/go/robustness && go vet -modfile "$robustness_modfile" ./...)
  # (the binaries the e2e tier runs, with its features and profile: built already when it ran)
  cargo test --locked --workspace --test e2e --no-run
  root=$PWD
  export ETCD_NODE_BIN=$root/target/debug/etcd-node ETCD_NODE_ETCDUTL=$root/target/debug/etcdutl \
    ETCDUTL_BIN=$root/target/debug/etcdutl ETCDCTL_BIN=$root/target/go/etcd36/etcdctl
  go_tier() {
    # etcd's robustness suite judges etcd-node (tests/go/robustness: its traffic, faults and
    # checks; the launcher only starts two members and a witness). Its log is long: the seed
    # and the verdicts are printed, the whole log only when it fails.
    robustness() { # <log> [VAR=value ...]: one go test of the suite, with those variables
      local log=$1
      shift
      echo "==> [go] etcd's robustness suite ${*:-} (log: $log)"
      if ! (cd tests/go/robustness && env "$@" go test -modfile "$robustness_modfile" -count=1 -v -timeout 30m -run TestRobustness .) \
        > "$log" 2>&1; then
        cat "$log" >&2
        # (the log is long and its end is the teardown: the verdicts again, in short)
        echo "==> [go] the robustness suite's seed, errors and verdicts, from $log:" >&2
        grep -E 'ROBUSTNESS_SEED=|[[:space:]]ERROR[[:space:]]|Error:|Linearization|Failed|panicked|--- FAIL' "$log" | cut -c1-400 | tail -40 >&2 || true
        echo "!!! etcd's robustness suite failed (above; ROBUSTNESS_SEED replays it)" >&2
        return 1
      fi
      grep -E 'ROBUSTNESS_SEED=|^(--- |ok|PASS)|validated ' "$log" || true
    }
    robustness target/robustness.log
    # (and its MemberReplace, which needs three regular members: two runs)
    robustness target/robustness-replace.log ROBUSTNESS_THREE_MEMBERS=1 \
      ROBUSTNESS_FAILPOINTS=MemberReplace ROBUSTNESS_RUNS=4
    echo "==> [go] Kubernetes: the storage contract, kube-apiserver, kubeadm (tests/go/kube)"
    (cd tests/go/kube && go test -count=1 -p 1 -timeout 20m ./storage/ ./apiserver/ ./kubeadm/)
  }
  timed go go_tier
fi

echo "==> passed: ${tiers[*]} in $((SECONDS - started)) s"
