# Sourced by the benchmarks that compare etcd-node with etcd 3.6 built from its Go modules:
# builds both, then sets bin (etcd-node's release binaries), e36 (etcd 3.6's), work (a new
# directory under BENCH_DIR, /var/tmp by default, removed on exit with every member in pids
# killed) and enc (percent-escapes its argument for a witness: URL). $1: the directory's prefix.
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
