#!/usr/bin/env bash
# Snapshot restore and defragment at KEYS keys, etcd-node against etcd 3.6, in alternated rounds
# from the same loaded data (docs/benchmarks.md, "Growth, memory and disk"). Loads an etcd-node
# cluster (two members and a witness) and one etcd 3.6 member once each with KEYS keys of
# 256-byte values and 40,000 random puts, keeps copies of their data directories and their
# snapshots, then per round:
#   - restores each snapshot (`etcdutl snapshot restore`; etcd 3.6's own etcdutl for its file,
#     and also for the etcd-node snapshot exported to etcd's format);
#   - starts each system again on a fresh copy of its loaded data and times `etcdctl defrag` of
#     one member.
# OLD_BIN=<dir with etcd-node and etcdutl of another build> adds that build to every round
# (`old`), to compare two builds on the same data.
#
#   KEYS=2000000 ROUNDS=3 bash scripts/bench-restore.sh      # about 15 minutes, 6 GB of disk
set -euo pipefail
cd "$(dirname "$0")/.."
KEYS=${KEYS:-2000000} ROUNDS=${ROUNDS:-3}
source scripts/bench-lib.sh bench-restore
url="witness:mount?path=$(enc "$work/w")"
ic="n1=http://127.0.0.1:26380,n2=http://127.0.0.1:27380,w=$url"

ours() { # etcd-node binary
  pids=()
  start_members "$1"
  until "$e36/etcdctl" --endpoints 127.0.0.1:26379,127.0.0.1:27379 endpoint health >/dev/null 2>&1; do sleep 0.2; done
}
theirs() {
  pids=()
  "$e36/etcd" --name e1 --data-dir "$work/e1" --listen-client-urls http://127.0.0.1:28379 \
    --advertise-client-urls http://127.0.0.1:28379 --listen-peer-urls http://127.0.0.1:28380 \
    --initial-advertise-peer-urls http://127.0.0.1:28380 --initial-cluster e1=http://127.0.0.1:28380 \
    --quota-backend-bytes 8589934592 2>>"$work/e1.log" &
  pids+=($!)
  until "$e36/etcdctl" --endpoints 127.0.0.1:28379 endpoint health >/dev/null 2>&1; do sleep 0.2; done
}
stop() { kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true; pids=(); }
load() { # endpoints
  "$bin/etcd-bench" --endpoints "$1" --clients 64 --conns 8 put --total "$KEYS" --key-size 16 --val-size 256 \
    --key-space-size "$KEYS" --sequential-keys | tail -1
  "$bin/etcd-bench" --endpoints "$1" --clients 16 --conns 4 put --total 40000 --key-size 16 --val-size 256 \
    --key-space-size "$KEYS" | tail -1
}

mkdir -p "$work/w"
"$bin/etcdutl" witness init --name w --advertise-peer-url "$url" >/dev/null 2>&1
ours "$bin/etcd-node"
echo "etcd-node load: $(load http://127.0.0.1:26379,http://127.0.0.1:27379 | tr '\n' ' ')"
"$e36/etcdctl" --endpoints 127.0.0.1:26379 snapshot save "$work/node.snap" >/dev/null 2>&1
stop
"$bin/etcdutl" snapshot export "$work/node.snap" -o "$work/node-exported.db" >/dev/null
theirs
echo "etcd 3.6 load: $(load http://127.0.0.1:28379 | tr '\n' ' ')"
"$e36/etcdctl" --endpoints 127.0.0.1:28379 snapshot save "$work/etcd.db" >/dev/null 2>&1
stop
for d in n1 n2 e1 w; do mv "$work/$d" "$work/$d.loaded"; done
echo "files: etcd-node kv.redb $(du -B1 "$work/n1.loaded/member/kv.redb" | cut -f1) B, snapshot $(stat -c %s "$work/node.snap") B;" \
  "etcd db $(du -B1 "$work/e1.loaded/member/snap/db" | cut -f1) B, snapshot $(stat -c %s "$work/etcd.db") B"

restore() { # label snapshot etcdutl
  local label=$1 file=$2 tool=$3 r=$work/restored
  rm -rf "$r" "$r.restoring" "$work/rw"
  mkdir -p "$work/rw"
  local rurl; rurl="witness:mount?path=$(enc "$work/rw")"
  local args=(--data-dir "$r")
  if [ "$tool" != "$e36/etcdutl" ]; then
    "$tool" witness init --name w --advertise-peer-url "$rurl" >/dev/null 2>&1
    args+=(--name r1 --initial-cluster "r1=http://127.0.0.1:1,r2=http://127.0.0.1:2,w=$rurl"
      --initial-advertise-peer-urls http://127.0.0.1:1)
  fi
  sync
  local t0; t0=$(date +%s%N)
  /usr/bin/time -f %M -o "$work/rss" "$tool" snapshot restore "$file" "${args[@]}" >/dev/null 2>&1
  echo "RESULT op=restore build=$label keys=$KEYS ms=$(( ($(date +%s%N) - t0) / 1000000 ))" \
    "peak_rss_mb=$(( $(tail -1 "$work/rss") / 1024 )) data_dir_mb=$(( $(du -sB1 "$r" | cut -f1) / 1000000 ))"
  rm -rf "$r"
}
defrag() { # label [etcd-node binary]
  local label=$1 ep file
  rm -rf "$work/n1" "$work/n2" "$work/e1" "$work/w"
  if [ "$label" = etcd-3.6 ]; then
    cp -a "$work/e1.loaded" "$work/e1"; sync; theirs
    ep=127.0.0.1:28379 file=$work/e1/member/snap/db
  else
    for d in n1 n2 w; do cp -a "$work/$d.loaded" "$work/$d"; done; sync; ours "$2"
    ep=127.0.0.1:26379 file=$work/n1/member/kv.redb
  fi
  sleep 2
  local t0; t0=$(date +%s%N)
  "$e36/etcdctl" --endpoints "$ep" --command-timeout 600s defrag >/dev/null
  echo "RESULT op=defrag build=$label keys=$KEYS ms=$(( ($(date +%s%N) - t0) / 1000000 ))" \
    "file_after_mb=$(( $(du -B1 "$file" | cut -f1) / 1000000 ))"
  stop
}
for round in $(seq "$ROUNDS"); do
  echo "==> round $round"
  [ -n "${OLD_BIN:-}" ] && restore old "$work/node.snap" "$OLD_BIN/etcdutl"
  restore etcd-node "$work/node.snap" "$bin/etcdutl"
  restore etcd-3.6 "$work/etcd.db" "$e36/etcdutl"
  restore etcd-3.6-of-etcd-node "$work/node-exported.db" "$e36/etcdutl"
  [ -n "${OLD_BIN:-}" ] && defrag old "$OLD_BIN/etcd-node"
  defrag etcd-node "$bin/etcd-node"
  defrag etcd-3.6
done
