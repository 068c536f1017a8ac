#!/usr/bin/env bash
# What the values hold, and what the key-space file and a put cost for it: etcd-node (two
# members and a witness in a local directory) against etcd 3.6 x 3, in alternated rounds on fresh
# clusters (docs/benchmarks.md, "Values that compress"). Per round, system and kind of value
# (etcd-bench --values random: random bytes, as etcd's benchmark tool writes; object: JSON text
# like a Kubernetes object's): PUTS puts (default 65,000) over 100,000 keys at 16 clients, then
# PUTS at 64, of 256-byte random values or 1,024-byte objects (KINDS="random:256 object:1024"); prints each stretch's rate and the members' CPU per put per member
# (from /proc) and, after each stretch, the first member's key-space file (kv.redb; etcd:
# member/snap/db) and data directory, each as its length (what `ls -l` and `du -b` show) and as
# the disk it takes (`du`; redb lengthens its file in doubling steps whose unwritten end takes no
# disk; bbolt keeps etcd's up to 16 MiB longer than what it wrote). OLD_BIN=<an etcd-node binary of another build> adds that build (`old`). Ports
# 26379-30380.
#   ROUNDS=3 bash scripts/bench-values.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3} PUTS=${PUTS:-65000} KINDS=${KINDS:-random:256 object:1024}
source scripts/bench-lib.sh bench-values
mib() { echo "scale=1; $1 / 1048576" | bc; }
# "<length> MiB long, <disk> MiB on disk" for a file or directory
sizes() { echo "$(mib "$(du -sb "$1" | cut -f1)") MiB long, $(mib "$(du -sB1 "$1" | cut -f1)") MiB on disk"; }
for round in $(seq 1 "$ROUNDS"); do
  for kind in $KINDS; do
    values=${kind%:*} size=${kind#*:}
    for sys in "${systems[@]}"; do
      fresh "$sys"
      line="round $round $values/$size $sys:"
      if [ "$sys" = etcd36x3 ]; then dir=$work/e1 file=$work/e1/member/snap/db; else dir=$work/n1 file=$work/n1/member/kv.redb; fi
      for clients in 16 64; do
        before=$(cpu "${pids[@]}")
        result=$("$bin/etcd-bench" --endpoints "$eps" --clients $clients --conns $((clients / 8)) put \
          --total "$PUTS" --key-size 8 --val-size "$size" --key-space-size 100000 --values "$values" | grep RESULT)
        after=$(cpu "${pids[@]}")
        rps=$(sed 's/.*rps=\([0-9.]*\).*/\1/' <<<"$result")
        us=$(( (after - before) * 1000000 / tick / PUTS / ${#pids[@]} ))
        line="$line puts/s at $clients $rps (CPU per put per member $us µs), key-space file $(sizes "$file"), data directory $(sizes "$dir");"
      done
      echo "$line"
      kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
    done
  done
done
