#!/usr/bin/env bash
# Builds the Go programs the Kubernetes tier and the comparisons run, from the Go modules
# pinned in tests/go/*/go.mod and go.sum (the Go module proxy; nothing else is fetched):
#   target/go/bin/   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubeadm
#                    (k8s.io/kubernetes, tests/go/kube)
#   target/go/etcd36/  etcd, etcdctl, etcdutl of etcd 3.6 (tests/go/etcd36)
# A build is skipped when its outputs exist and were built from the same go.mod and go.sum
# (a stamp beside them); Go's own cache (~/.cache/go-build) makes any rebuild after a change
# link-only. From cold on 2 cores: about 9 minutes for Kubernetes, 1 for etcd.
#
#   bash scripts/build-go.sh          # both
#   bash scripts/build-go.sh kube     # only the Kubernetes commands
#   bash scripts/build-go.sh etcd     # only etcd 3.6
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

if ! command -v go >/dev/null 2>&1; then
  echo "build-go.sh: no \`go\` on PATH: install Go 1.26 or newer (https://go.dev/doc/install)" >&2
  exit 1
fi

# build <module dir> <output dir> <package>... : one `go build` of the packages into the
# output directory, unless the stamp says it is current.
build() {
  local module=$1 out=$2
  shift 2
  local stamp="$out/.built-from"
  local want
  want=$(cat "$module/go.mod" "$module/go.sum" | sha256sum | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "==> $out is current (built from $module's go.mod and go.sum)"
    return
  fi
  echo "==> building $* into $out (from $module)"
  mkdir -p "$out"
  local started=$SECONDS
  (cd "$module" && go build -o "$root/$out/" "$@")
  echo "$want" > "$stamp"
  echo "==> built in $((SECONDS - started)) s"
}

what=${1:-all}
case "$what" in all|kube|etcd) ;; *) echo "build-go.sh: say kube, etcd or nothing (both), not $what" >&2; exit 1 ;; esac

if [ "$what" != etcd ]; then
build tests/go/kube target/go/bin \
  k8s.io/kubernetes/cmd/kube-apiserver \
  k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler \
  k8s.io/kubernetes/cmd/kubectl \
  k8s.io/kubernetes/cmd/kubeadm
fi

if [ "$what" != kube ]; then
build tests/go/etcd36 target/go/etcd36 \
  go.etcd.io/etcd/server/v3 \
  go.etcd.io/etcd/etcdctl/v3 \
  go.etcd.io/etcd/etcdutl/v3
# (etcd's server package builds as `server`; its release calls the binary `etcd`)
if [ -f target/go/etcd36/server ]; then
  mv target/go/etcd36/server target/go/etcd36/etcd
fi
fi
