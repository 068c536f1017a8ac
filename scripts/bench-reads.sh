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
for round in $(seq 1 "$ROUNDS"); do
  for sys in "${systems[@]}"; do
    fresh "$sys"
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
