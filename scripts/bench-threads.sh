#!/usr/bin/env bash
# Where a member's CPU goes per put, by thread: etcd-node (two members and a witness in a local
# directory) and then etcd 3.6 (three members, scripts/build-go.sh etcd) each take WARMUP puts
# (default 30000), then PUTS puts (default 40000) of 256-byte values over 10,000 keys at CLIENTS
# clients (default 16); before and after those, each thread's CPU (user and system, from
# /proc/PID/task/TID/stat) and context switches, and each member's WAL fsyncs and key-space
# commits (its /metrics). Prints per put: each thread group's user and system microseconds and
# context switches, and each member's puts per WAL fsync and per key-space commit. etcd's
# threads are all named "etcd" (Go's runtime moves goroutines between them).
#   bash scripts/bench-threads.sh
#   CLIENTS=64 bash scripts/bench-threads.sh
#   NODE_BIN=/var/tmp/etcd-node-before ONLY=etcd-node bash scripts/bench-threads.sh
#   PERF_SECONDS=5 bash scripts/bench-threads.sh
# (NODE_BIN: another etcd-node binary, to compare two builds; ONLY=etcd-node: skip etcd;
# PERF_SECONDS: also record the members' CPU with perf for that long during the counted puts
# and print where it went, by kind of work (scripts/perf-shares.py). perf's own cost inflates
# that round's CPU figures: take them from rounds without it. For etcd-node's symbols, build
# with `cargo build --profile profiling` and give NODE_BIN=target/profiling/etcd-node.
# KEEP_PERF=<file>: keep the recording there, for `perf script -i <file>`.)
# Ports 32179-32680 (below the kernel's ephemeral range).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p etcd-node --bin etcd-node --bin etcdutl --bin etcd-bench
[ -x target/go/etcd36/etcd ] || bash scripts/build-go.sh etcd
rel=$PWD/target/release etcd=$PWD/target/go/etcd36/etcd node=${NODE_BIN:-$PWD/target/release/etcd-node}
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/bench-threads.XXXXXX")
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; [ -n "${KEEP_PERF:-}" ] && cp "$work/perf.data" "$KEEP_PERF" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
clients=${CLIENTS:-16} warmup=${WARMUP:-30000} puts=${PUTS:-40000}

put() { # endpoints n
  "$rel/etcd-bench" --endpoints "$1" --clients "$clients" --conns 4 put --total "$2" \
    --key-size 8 --val-size 256 --key-space-size 10000 | grep RESULT
}

# One line per thread: pid, thread id, name, context switches, user ticks, system ticks.
threads() {
  local p t
  for p in "${pids[@]}"; do
    for t in /proc/"$p"/task/*; do
      echo "$p ${t##*/} $(tr ' ' _ <"$t/comm") $(awk '/ctxt_switches/{n += $2} END {print n + 0}' "$t/status") $(awk '{print $14, $15}' "$t/stat")"
    done 2>/dev/null
  done
}

# One line per member: port, WAL fsyncs, key-space commits.
disk() {
  local port
  for port in "$@"; do
    curl -fs "http://127.0.0.1:$port/metrics" | awk -v port="$port" '
      /^etcd_disk_wal_fsync_duration_seconds_count/ {f = $2}
      /^etcd_disk_backend_commit_duration_seconds_count/ {c = $2}
      END {print port, f + 0, c + 0}'
  done
}

healthy() {
  local port
  for port in "$@"; do
    for _ in $(seq 1 60); do
      grep -q '"health":"true"' <<<"$(curl -fs "http://127.0.0.1:$port/health" || true)" && break
      sleep 0.5
    done
  done
}

# measure <label> <ports...>: warm up, then the counted puts, then the report.
measure() {
  local label=$1; shift
  local eps; eps=$(printf "127.0.0.1:%s," "$@"); eps=${eps%,}
  healthy "$@"
  put "$eps" "$warmup" >/dev/null
  threads >"$work/threads.before"; disk "$@" >"$work/disk.before"
  local perf=
  if [ -n "${PERF_SECONDS:-}" ]; then
    perf record -q -e cpu-clock -F 999 --call-graph dwarf,16384 -o "$work/perf.data" \
      -p "$(IFS=,; echo "${pids[*]}")" -- sleep "$PERF_SECONDS" 2>/dev/null &
    perf=$!
  fi
  echo "$label: $(put "$eps" "$puts")"
  threads >"$work/threads.after"; disk "$@" >"$work/disk.after"
  if [ -n "$perf" ]; then
    wait "$perf" || true
    echo "$label: where the members' CPU went (perf, $PERF_SECONDS s of the counted puts):"
    perf script -i "$work/perf.data" -F comm,pid,tid,ip,sym 2>/dev/null | python3 scripts/perf-shares.py
  fi
  python3 - "$work" "$puts" "$(getconf CLK_TCK)" "$label" <<'PY'
import collections, sys
work, puts, hz, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
def rows(name):
    # (keyed by thread id: a thread that started or ended between the reads is left out)
    return {(f[0], f[2], f[1]): list(map(int, f[3:]))
            for f in (l.split() for l in open(f"{work}/{name}"))}
before, after = rows("threads.before"), rows("threads.after")
by = collections.defaultdict(lambda: [0, 0, 0])
for key, now in after.items():
    if key in before:
        for i in range(3):
            by[key[:2]][i] += now[i] - before[key][i]
us = 1e6 / hz / puts
for (pid, name), (sw, user, system) in sorted(by.items()):
    if sw or user or system:
        print(f"RESULT op=threads cluster={label} pid={pid} thread={name} "
              f"user_us_per_put={user * us:.1f} sys_us_per_put={system * us:.1f} "
              f"switches_per_put={sw / puts:.2f}")
d0 = {l.split()[0]: l.split()[1:] for l in open(f"{work}/disk.before")}
for line in open(f"{work}/disk.after"):
    port, fsyncs, commits = line.split()
    f = int(fsyncs) - int(d0[port][0])
    c = int(commits) - int(d0[port][1])
    print(f"RESULT op=disk cluster={label} port={port} wal_fsyncs={f} "
          f"puts_per_fsync={puts / max(f, 1):.1f} kv_commits={c} "
          f"puts_per_commit={puts / max(c, 1):.1f}")
PY
  kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=()
}

mkdir -p "$work/witness"
url="witness:mount?path=$(python3 -c 'import sys,urllib.parse;print(urllib.parse.quote(sys.argv[1],safe=""))' "$work/witness")"
"$rel/etcdutl" witness init --name w --advertise-peer-url "$url" >/dev/null 2>&1
ic="n1=http://127.0.0.1:32180,n2=http://127.0.0.1:32280,w=$url"
for i in 1 2; do
  "$node" --name n$i --data-dir "$work/n$i" \
    --listen-client-urls http://127.0.0.1:32${i}79 --advertise-client-urls http://127.0.0.1:32${i}79 \
    --listen-peer-urls http://127.0.0.1:32${i}80 --initial-advertise-peer-urls http://127.0.0.1:32${i}80 \
    --initial-cluster "$ic" 2>"$work/n$i.log" &
  pids+=($!)
done
measure etcd-node 32179 32279
[ "${ONLY:-}" = etcd-node ] && exit 0

ic=""
for i in 4 5 6; do ic+="${ic:+,}e$i=http://127.0.0.1:32${i}80"; done
for i in 4 5 6; do
  "$etcd" --name e$i --data-dir "$work/e$i" --log-level error \
    --listen-client-urls http://127.0.0.1:32${i}79 --advertise-client-urls http://127.0.0.1:32${i}79 \
    --listen-peer-urls http://127.0.0.1:32${i}80 --initial-advertise-peer-urls http://127.0.0.1:32${i}80 \
    --initial-cluster "$ic" --initial-cluster-state new 2>"$work/e$i.log" &
  pids+=($!)
done
measure etcd-3.6 32479 32579 32679
