#!/usr/bin/env bash
# Linearizable ranges, etcd-node (two members and a witness in a local directory) against etcd
# 3.6 x 3, in alternated rounds on fresh clusters (docs/benchmarks.md, "Reads"). Per round and
# system: 20,000 unmeasured puts, then READS linearizable ranges of one key (default 100,000) at
# 16 clients over 4 connections spread over every member; prints the rate, the p99 and the
# members' CPU per range per member (from /proc, as scripts/bench-compare.sh).
# OLD_BIN=<an etcd-node binary of another build> adds that build to every round (`old`), to
# compare two builds. Ports 26379-30380.
#   ROUNDS=3 bash scripts/bench-reads.sh
#   OLD_BIN=/var/tmp/etcd-node-before ROUNDS=6 bash scripts/bench-reads.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3} READS=${READS:-100000}
source scripts/bench-lib.sh bench-reads
# cpu <pid>...: their user and system time, in clock ticks.
cpu() { local t=0 p; for p in "$@"; do t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat"))); done; echo "$t"; }
tick=$(getconf CLK_TCK)

ours() { # etcd-node binary
  local url="witness:mount?path=$(enc "$work/w")"
  ic="n1=http://127.0.0.1:26380,n2=http://127.0.0.1:27380,w=$url"
  mkdir -p "$work/w"
  "$bin/etcdutl" witness init --name w --advertise-peer-url "$url" >/dev/null 2>&1
  start_members "$1"
  eps=http://127.0.0.1:26379,http://127.0.0.1:27379
}
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

systems=(etcd-node etcd36x3)
[ -n "${OLD_BIN:-}" ] && systems=(old etcd-node etcd36x3)
for round in $(seq 1 "$ROUNDS"); do
  for sys in "${systems[@]}"; do
    rm -rf "${work:?}"/*
    pids=()
    case $sys in
      old) ours "$OLD_BIN" ;;
      etcd-node) ours "$bin/etcd-node" ;;
      *) theirs ;;
    esac
    for _ in $(seq 1 100); do
      "$e36/etcdctl" --endpoints "${eps//http:\/\//}" endpoint health >/dev/null 2>&1 && break
      sleep 0.3
    done
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "$sys: a member exited; logs in $work"; exit 1; }; done
    "$bin/etcd-bench" --endpoints "$eps" --clients 16 --conns 4 put --total 20000 --key-size 8 \
      --val-size 256 --key-space-size 10000 >/dev/null
    before=$(cpu "${pids[@]}")
    result=$("$bin/etcd-bench" --endpoints "$eps" --clients 16 --conns 4 range 000 --consistency l \
      --total "$READS" | grep RESULT)
    after=$(cpu "${pids[@]}")
    rps=$(sed 's/.*rps=\([0-9.]*\).*/\1/' <<<"$result") p99=$(sed 's/.*p99_ms=\([0-9.]*\).*/\1/' <<<"$result")
    us=$(( (after - before) * 1000000 / tick / READS / ${#pids[@]} ))
    echo "round $round $sys: ranges/s $rps, p99 $p99 ms, CPU per range per member $us µs"
    kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
  done
done
