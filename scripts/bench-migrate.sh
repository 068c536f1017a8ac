#!/usr/bin/env bash
# The migration runbook of docs/operations.md, timed: a three-member etcd 3.4 (Debian's) with
# KEYS keys (default 100000, 256-byte values) moved to two etcd-node members plus a witness,
# then back to a three-member etcd. Prints each step's time, the downtime each way (from the
# last write the old cluster took to the first one the new cluster acknowledges), the files'
# sizes and the peak memory of each restore.
#
# Environment (all optional): BIN (directory with etcd-node, etcdutl and etcd-bench; default:
# build them in release), KEYS, KEEP (set: keep the working directory, with the logs).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BIN:-}" ]; then
  cargo build --release --locked -p etcd-node --bin etcd-node --bin etcdutl --bin etcd-bench
  BIN=$PWD/target/release
fi
keys=${KEYS:-100000}
work=$(mktemp -d)
pids=()
trap 'kill ${pids[@]+"${pids[@]}"} 2>/dev/null; wait 2>/dev/null; [ -n "${KEEP:-}" ] && echo "kept $work" || rm -rf "$work"' EXIT
export ETCDCTL_API=3
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f} s')" "$1" "$(now)"; }
peak() { # command...: runs it, prints its peak RSS
  /usr/bin/time -f '%M' -o "$work/rss" "$@" >/dev/null
  echo "$(($(cat "$work/rss") / 1024)) MB"
}
first_write() { # endpoints: waits until a put is acknowledged
  until etcdctl --endpoints "$1" --command-timeout 2s put migrated yes >/dev/null 2>&1; do sleep 0.05; done
}

etcd_ic="e1=http://127.0.0.1:41380,e2=http://127.0.0.1:42380,e3=http://127.0.0.1:43380"
etcd_eps=http://127.0.0.1:41379,http://127.0.0.1:42379,http://127.0.0.1:43379
start_etcd() { # data-dir-prefix [extra flags]: starts e1..e3
  local prefix=$1; shift
  for i in 1 2 3; do
    etcd --name e$i --data-dir "$prefix-e$i" --log-level error \
      --listen-client-urls http://127.0.0.1:4${i}379 --advertise-client-urls http://127.0.0.1:4${i}379 \
      --listen-peer-urls http://127.0.0.1:4${i}380 --initial-advertise-peer-urls http://127.0.0.1:4${i}380 \
      --initial-cluster "$etcd_ic" "$@" 2>>"$work/etcd-e$i.log" &
    pids+=($!)
  done
}
stop_all() { kill ${pids[@]+"${pids[@]}"} 2>/dev/null || true; wait 2>/dev/null || true; pids=(); }

echo "== a three-member etcd 3.4 with $keys keys"
start_etcd "$work/old" --initial-cluster-state new
sleep 2
"$BIN/etcd-bench" --endpoints "$etcd_eps" --conns 4 --clients 64 put --total "$keys" \
  --key-space-size "$keys" --sequential-keys --key-size 12 --val-size 256 | grep -E 'requests|per second' || true

echo "== etcd -> etcd-node"
t0=$(now)
etcdctl --endpoints http://127.0.0.1:41379 snapshot save "$work/etcd.snap" >/dev/null 2>&1
echo "snapshot save: $(since "$t0") ($(du -h "$work/etcd.snap" | cut -f1))"
t=$(now); stop_all; echo "stopping the etcd members: $(since "$t")"
mkdir -p "$work/witness"
url="witness:mount?path=$(python3 -c 'import sys,urllib.parse;print(urllib.parse.quote(sys.argv[1],safe=""))' "$work/witness")"
"$BIN/etcdutl" witness init --name w --advertise-peer-url "$url" >/dev/null 2>&1
ic="n1=http://127.0.0.1:44380,n2=http://127.0.0.1:45380,w=$url"
for i in 1 2; do
  t=$(now)
  rss=$(peak "$BIN/etcdutl" snapshot restore "$work/etcd.snap" --name n$i --data-dir "$work/n$i" \
    --initial-cluster "$ic" --initial-advertise-peer-urls http://127.0.0.1:4$((i + 3))380)
  echo "etcdutl snapshot restore n$i: $(since "$t"), peak RSS $rss"
done
t=$(now)
for i in 1 2; do
  "$BIN/etcd-node" --name n$i --data-dir "$work/n$i" \
    --listen-client-urls http://127.0.0.1:4$((i + 3))379 --advertise-client-urls http://127.0.0.1:4$((i + 3))379 \
    --listen-peer-urls http://127.0.0.1:4$((i + 3))380 --initial-advertise-peer-urls http://127.0.0.1:4$((i + 3))380 \
    --initial-cluster "$ic" 2>"$work/n$i.log" &
  pids+=($!)
done
ours=http://127.0.0.1:44379,http://127.0.0.1:45379
first_write "$ours"
echo "start to first write: $(since "$t")"
echo "downtime etcd -> etcd-node (save, two restores, start, first write): $(since "$t0")"
echo "keys on etcd-node: $(etcdctl --endpoints "$ours" get "" --prefix --keys-only | grep -c .)"

echo "== etcd-node -> etcd"
t0=$(now)
etcdctl --endpoints http://127.0.0.1:44379 snapshot save "$work/ours.snap" >/dev/null 2>&1
echo "snapshot save: $(since "$t0") ($(du -h "$work/ours.snap" | cut -f1))"
t=$(now); stop_all; echo "stopping the etcd-node members: $(since "$t")"
t=$(now)
rss=$(peak "$BIN/etcdutl" snapshot export "$work/ours.snap" --format etcd --output "$work/back.db")
echo "etcdutl snapshot export: $(since "$t") ($(du -h "$work/back.db" | cut -f1)), peak RSS $rss"
for i in 1 2 3; do
  t=$(now)
  rss=$(peak etcdctl snapshot restore "$work/back.db" --name e$i --data-dir "$work/back-e$i" \
    --initial-cluster "$etcd_ic" --initial-advertise-peer-urls http://127.0.0.1:4${i}380)
  echo "etcdctl snapshot restore e$i: $(since "$t"), peak RSS $rss"
done
t=$(now)
start_etcd "$work/back"
first_write "$etcd_eps"
echo "start to first write: $(since "$t")"
echo "downtime etcd-node -> etcd (save, export, three restores, start, first write): $(since "$t0")"
echo "keys on etcd: $(etcdctl --endpoints "$etcd_eps" get "" --prefix --keys-only | grep -c .)"
