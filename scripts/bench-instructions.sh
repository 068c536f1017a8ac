#!/usr/bin/env bash
# Instructions per put, counted by valgrind's callgrind: the same on a busy machine as on an
# idle one, where CPU time is not (this machine has no `perf` counters). Both members of
# etcd-node (two members and a witness in a local directory) run under callgrind; WARMUP puts
# go first (default 20000, 256-byte values over 10,000 keys), then the counters are zeroed and
# PUTS puts (default 10000) at CLIENTS clients (default 16) are counted. Prints each member's
# instructions per put and their sum, and keeps the callgrind files for
# scripts/callgrind-shares.py.
# etcd cannot be counted this way: Go's runtime stops valgrind 3.19 at its first signal
# (callgrind's "vgCallgrind_post_signal" assertion), so etcd's side is its CPU time
# (scripts/bench-compare.sh). Ports 32179-32280 (below the kernel's ephemeral range).
# Timeouts are stretched (heartbeat 1 s, election 10 s): under callgrind a member runs about
# 50 times slower, and elections would otherwise come and go.
#   bash scripts/bench-instructions.sh
#   PUTS=5000 CLIENTS=64 bash scripts/bench-instructions.sh
#   PRELOAD=/usr/lib/x86_64-linux-gnu/libmimalloc.so.2 bash scripts/bench-instructions.sh
#   CALLGRIND_DIR=/tmp/cg bash scripts/bench-instructions.sh
#   NODE_BIN=/var/tmp/etcd-node-before bash scripts/bench-instructions.sh
# (NODE_BIN: another etcd-node binary to count, to compare two builds: build it with
# `--profile profiling` so that callgrind-shares.py can name its functions;
# PRELOAD: a library the members load first, such as another allocator, not etcd-bench;
# CALLGRIND_DIR: where the callgrind files go, a new directory under /var/tmp by default)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)"; exit 1; }
cargo build --profile profiling --locked -p etcd-node --bin etcd-node --bin etcdutl
cargo build --release --locked -p etcd-node --bin etcd-bench
prof=$PWD/target/profiling bench=$PWD/target/release/etcd-bench
node=${NODE_BIN:-$prof/etcd-node}
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/bench-instructions.XXXXXX")
# (not OUT_DIR: Cargo passes that to build scripts, and a different one rebuilds them)
out=${CALLGRIND_DIR:-$work}
mkdir -p "$out"
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT
timing=(--heartbeat-interval 1000 --election-timeout 10000)
warmup=${WARMUP:-20000} puts=${PUTS:-10000} clients=${CLIENTS:-16}

# put <endpoints> <n>: n puts of 256-byte values over 10,000 keys.
put() {
  "$bench" --endpoints "$1" --clients "$clients" --conns 4 put --total "$2" --key-size 8 \
    --val-size 256 --key-space-size 10000 | grep RESULT
}

# count <label> <endpoints> <pid>...: warm up, zero the counters, count, dump.
count() {
  local label=$1 eps=$2; shift 2
  local ready=""
  for _ in $(seq 1 180); do
    ready=yes
    for e in ${eps//,/ }; do
      grep -q '"health":"true"' <<<"$(curl -fs "http://$e/health" || true)" || ready=""
    done
    [ -n "$ready" ] && break
    sleep 1
  done
  [ -n "$ready" ] || { echo "$label: not healthy within 180 s"; exit 1; }
  put "$eps" "$warmup" >/dev/null
  for p in "$@"; do callgrind_control -z "$p" >/dev/null; done
  put "$eps" "$puts"
  for p in "$@"; do callgrind_control -d "$p" >/dev/null; done
  sleep 2
  local total=0
  for p in "$@"; do
    local ir
    # (the last dump of that process: the counted puts)
    ir=$(grep -h '^summary:' "$(ls -t "$out/$label".callgrind.out."$p"* | head -1)" | awk '{print $2}')
    echo "RESULT op=instructions cluster=$label pid=$p instructions=$ir per_put=$((ir / puts))"
    total=$((total + ir))
  done
  echo "RESULT op=instructions cluster=$label members=$# puts=$puts clients=$clients per_put_all_members=$((total / puts))"
}

mkdir -p "$work/witness"
url="witness:mount?path=$(python3 -c 'import sys,urllib.parse;print(urllib.parse.quote(sys.argv[1],safe=""))' "$work/witness")"
"$prof/etcdutl" witness init --name w --advertise-peer-url "$url" >/dev/null 2>&1
ic="n1=http://127.0.0.1:32180,n2=http://127.0.0.1:32280,w=$url"
for i in 1 2; do
  env ${PRELOAD:+LD_PRELOAD="$PRELOAD"} \
    valgrind --tool=callgrind --callgrind-out-file="$out/etcd-node.callgrind.out.%p" \
    "$node" --name n$i --data-dir "$work/n$i" "${timing[@]}" \
    --listen-client-urls http://127.0.0.1:32${i}79 --advertise-client-urls http://127.0.0.1:32${i}79 \
    --listen-peer-urls http://127.0.0.1:32${i}80 --initial-advertise-peer-urls http://127.0.0.1:32${i}80 \
    --initial-cluster "$ic" 2>"$work/n$i.log" &
  pids+=($!)
done
count etcd-node "127.0.0.1:32179,127.0.0.1:32279" "${pids[@]}"
cleanup; pids=()

echo "callgrind files in $out (python3 scripts/callgrind-shares.py <file> --top 30)"
