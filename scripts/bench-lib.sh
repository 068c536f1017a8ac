# Sourced by the benchmarks that compare etcd-node with etcd 3.6 built from its Go modules:
# builds both, then sets bin (etcd-node's release binaries), e36 (etcd 3.6's), work (a new
# directory under BENCH_DIR, /var/tmp by default, removed on exit with every member in pids
# killed) and enc (percent-escapes its argument for a witness: URL); defines the clusters a
# round starts (start_members, ours, theirs, fresh) and cpu. $1: the directory's prefix.
set -euo pipefail
bash scripts/build-go.sh etcd
cargo build --release --locked -p etcd-node --bin etcd-node --bin etcdutl --bin etcd-bench
bin=$PWD/target/release e36=$PWD/target/go/etcd36
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/$1.XXXXXX")
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
enc() { python3 -c 'import sys,urllib.parse;print(urllib.parse.quote(sys.argv[1],safe=""))' "$1"; }
# start_members <etcd-node binary>: members n1 and n2 of the cluster $ic names (clients on
# 26379 and 27379, peers on 26380 and 27380), data in $work, their pids added to pids.
start_members() {
  for i in 1 2; do
    "$1" --name n$i --data-dir "$work/n$i" --listen-client-urls http://127.0.0.1:$((25379 + i * 1000)) \
      --advertise-client-urls http://127.0.0.1:$((25379 + i * 1000)) --listen-peer-urls http://127.0.0.1:$((25380 + i * 1000)) \
      --initial-advertise-peer-urls http://127.0.0.1:$((25380 + i * 1000)) --initial-cluster "$ic" 2>>"$work/n$i.log" &
    pids+=($!)
  done
}
# cpu <pid>...: their user and system time, in clock ticks (tick: clock ticks per second).
cpu() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo "$t"; }
tick=$(getconf CLK_TCK)
# ours <etcd-node binary>: two members and a witness in $work/w; eps: their client URLs.
ours() {
  local url="witness:mount?path=$(enc "$work/w")"
  ic="n1=http://127.0.0.1:26380,n2=http://127.0.0.1:27380,w=$url"
  mkdir -p "$work/w"
  "$bin/etcdutl" witness init --name w --advertise-peer-url "$url" >/dev/null 2>&1
  start_members "$1"
  eps=http://127.0.0.1:26379,http://127.0.0.1:27379
}
# theirs: three etcd 3.6 members e1-e3 (clients on 28379-30379); eps: their client URLs.
theirs() {
  local ic=e1=http://127.0.0.1:28380,e2=http://127.0.0.1:29380,e3=http://127.0.0.1:30380
  for i in 1 2 3; do
    "$e36/etcd" --name e$i --data-dir "$work/e$i" --listen-client-urls http://127.0.0.1:$((27379 + i * 1000)) \
      --advertise-client-urls http://127.0.0.1:$((27379 + i * 1000)) --listen-peer-urls http://127.0.0.1:$((27380 + i * 1000)) \
      --initial-advertise-peer-urls http://127.0.0.1:$((27380 + i * 1000)) --initial-cluster $ic 2>>"$work/e$i.log" &
    pids+=($!)
  done
  eps=http://127.0.0.1:28379,http://127.0.0.1:29379,http://127.0.0.1:30379
}
# fresh <system>: an empty $work with the cluster of <system> started and healthy: old (the
# etcd-node binary $OLD_BIN), etcd-node (this build's) or etcd36x3; exits if a member died.
fresh() {
  rm -rf "${work:?}"/*
  pids=()
  case $1 in
    old) ours "$OLD_BIN" ;;
    etcd-node) ours "$bin/etcd-node" ;;
    *) theirs ;;
  esac
  for _ in $(seq 1 100); do
    "$e36/etcdctl" --endpoints "${eps//http:\/\//}" endpoint health >/dev/null 2>&1 && break
    sleep 0.3
  done
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "$1: a member exited; logs in $work"; exit 1; }; done
}
# The systems a round compares (old only with OLD_BIN, an etcd-node binary of another build).
systems=(etcd-node etcd36x3)
if [ -n "${OLD_BIN:-}" ]; then systems=(old etcd-node etcd36x3); fi
