#!/usr/bin/env bash
# The main job: a local etcd-node cluster of two members plus a witness in a local directory
# (.local-cluster/), initialised for you. Prints the endpoints and an etcdctl example; Ctrl-C
# stops both members cleanly. Data survives restarts of this script
# (`rm -rf .local-cluster` starts afresh).
#
# Environment (all optional): CLUSTER_DIR (default .local-cluster), PORTS (client:peer of each
# member, default "2379:2380 22379:22380"), BIN_DIR (use the etcd-node and etcdutl found there
# instead of building them; the end-to-end test of this script does).

set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
command -v etcdctl >/dev/null 2>&1 || need_apt+=(etcd-client)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "==> installing Debian packages: ${need_apt[*]}"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}"
fi

if [ -n "${BIN_DIR:-}" ]; then
  bin=$BIN_DIR
else
  echo "==> building etcd-node and etcdutl (release)"
  cargo build --release --locked -p etcd-node --bin etcd-node --bin etcdutl
  bin=$PWD/target/release
fi

base="${CLUSTER_DIR:-$PWD/.local-cluster}"
mkdir -p "$base/witness"
url="witness:mount?path=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$base/witness")"
if ! "$bin/etcdutl" witness status --advertise-peer-url "$url" >/dev/null 2>&1; then
  "$bin/etcdutl" witness init --name witness --advertise-peer-url "$url"
fi

read -r -a ports <<<"${PORTS:-2379:2380 22379:22380}"
[ ${#ports[@]} -eq 2 ] || { echo "PORTS must name two client:peer pairs, e.g. \"2379:2380 22379:22380\""; exit 1; }
c0=${ports[0]%%:*} p0=${ports[0]##*:} c1=${ports[1]%%:*} p1=${ports[1]##*:}
cluster="infra0=http://127.0.0.1:$p0,infra1=http://127.0.0.1:$p1,witness=$url"
pids=()
stop() {
  echo; echo "==> stopping"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  echo "==> stopped; data kept in $base"
}
trap stop EXIT
trap 'exit 0' INT TERM
for i in 0 1; do
  client=${ports[$i]%%:*}; peer=${ports[$i]##*:}
  "$bin/etcd-node" --name "infra$i" --data-dir "$base/infra$i.etcd" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster-token local-cluster --initial-cluster "$cluster" --initial-cluster-state new \
    2> "$base/infra$i.log" &
  pids+=($!)
done

echo "==> waiting for a leader"
for _ in $(seq 1 100); do
  if curl -fs "http://127.0.0.1:$c0/health" >/dev/null 2>&1; then break; fi
  sleep 0.2
done
curl -fs "http://127.0.0.1:$c0/health" >/dev/null || { echo "no leader; logs in $base/infra*.log"; exit 1; }

cat <<INFO

etcd-node cluster running: two members and a witness.
  infra0   client http://127.0.0.1:$c0   peer http://127.0.0.1:$p0    log $base/infra0.log
  infra1   client http://127.0.0.1:$c1  peer http://127.0.0.1:$p1   log $base/infra1.log
  witness  $url

Try:
  export ETCDCTL_API=3 ENDPOINTS=127.0.0.1:$c0,127.0.0.1:$c1
  etcdctl --endpoints=\$ENDPOINTS put greeting hello
  etcdctl --endpoints=\$ENDPOINTS get greeting
  etcdctl --endpoints=\$ENDPOINTS member list -w table
  etcdctl --endpoints=\$ENDPOINTS endpoint status -w table
  curl http://127.0.0.1:$c0/metrics | grep etcd_witness

Ctrl-C stops both members.
INFO
wait
