#!/usr/bin/env bash
# Failover, side by side: kills the leader ROUNDS times (default 10) while `etcd-bench
# failover` writes without pause, and prints per kill the gap at the kill (the longest time
# between two acknowledged writes that spans the kill or begins within a second of it) and the
# longest gap of the whole run, then the mean, min and max of the gaps at the kills.
#   KILL=follower   kills a member that does not lead instead (the gap is what the follower's
#                   death costs the writers)
#   WRITE_TO=leader gives the writers the leader's endpoint alone (default: every member's; a
#                   client then also reconnects when its endpoint dies, which costs it a gap of
#                   its own, later in the run with etcd's Rust client)
#   CLIENTS=16      writers (default 1)
#   WHICH           clusters (default "ours etcd"): etcd-node as two members plus a witness in a
#                   local directory, etcd as three members
#   ETCD_RELEASE    3.6 (default: etcd 3.6 built from its Go module, scripts/build-go.sh) or
#                   3.4 (Debian's etcd-server)
# Both with etcd's default timeouts (heartbeat 100 ms, election 1000 ms).
#   bash scripts/bench-failover.sh            # both, 10 kills each
#   ROUNDS=20 WHICH=ours bash scripts/bench-failover.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p etcd-node --bin etcd-node --bin etcdutl --bin etcd-bench
case "${ETCD_RELEASE:=3.6}" in
  3.6) [[ " ${WHICH:-ours etcd} " == *" etcd "* ]] && bash scripts/build-go.sh etcd
    etcd_bin=$PWD/target/go/etcd36/etcd ;;
  3.4) command -v etcd >/dev/null || { echo "needs Debian's etcd-server (apt-get install etcd-server)"; exit 1; }
    etcd_bin=etcd ;;
  *) echo "ETCD_RELEASE must be 3.6 (built from the Go module) or 3.4 (Debian's)"; exit 1 ;;
esac
bin=$PWD/target/release
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/bench-failover.XXXXXX")
declare -A pid
cleanup() { kill -9 "${pid[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

# start <cluster> <i>: starts member i of etcd-node ("ours", ports 4i379/4i380) or etcd (5i3xx).
start() {
  local c=$1 i=$2
  if [ "$c" = ours ]; then
    "$bin/etcd-node" --name n$i --data-dir "$work/ours/n$i" \
      --listen-client-urls http://127.0.0.1:4${i}379 --advertise-client-urls http://127.0.0.1:4${i}379 \
      --listen-peer-urls http://127.0.0.1:4${i}380 --initial-advertise-peer-urls http://127.0.0.1:4${i}380 \
      --initial-cluster "$ours_ic" 2>>"$work/ours-n$i.log" &
  else
    "$etcd_bin" --name e$i --data-dir "$work/etcd/e$i" \
      --listen-client-urls http://127.0.0.1:5${i}379 --advertise-client-urls http://127.0.0.1:5${i}379 \
      --listen-peer-urls http://127.0.0.1:5${i}380 --initial-advertise-peer-urls http://127.0.0.1:5${i}380 \
      --initial-cluster "$etcd_ic" --initial-cluster-state new --log-level error 2>>"$work/etcd-e$i.log" &
  fi
  pid[$c$i]=$!
}

# leader <cluster> <members>: the member that reports itself leader (waits for one).
leader() {
  local port=$([ "$1" = ours ] && echo 4 || echo 5)
  for _ in $(seq 1 150); do
    for i in $(seq 1 "$2"); do
      # (not curl | grep -q: with pipefail, grep's early exit fails curl on a long page)
      if grep -q '^etcd_server_is_leader 1' <<<"$(curl -fs "http://127.0.0.1:$port${i}379/metrics" || true)"; then
        echo "$i"; return
      fi
    done
    sleep 0.2
  done
  echo "no leader in $1" >&2; exit 1
}

run() { # cluster members
  local c=$1 n=$2 port=$([ "$1" = ours ] && echo 4 || echo 5) eps="" gaps=()
  for i in $(seq 1 "$n"); do start "$c" "$i"; eps+="${eps:+,}127.0.0.1:$port${i}379"; done
  leader "$c" "$n" >/dev/null
  for r in $(seq 1 "${ROUNDS:-10}"); do
    local l; l=$(leader "$c" "$n") to=$eps
    [ "${WRITE_TO:-all}" = leader ] && to=127.0.0.1:$port${l}379
    "$bin/etcd-bench" --endpoints "$to" --clients "${CLIENTS:-1}" failover --duration 6 --acks "$work/acks" > "$work/fo" 2>&1 & local b=$!
    sleep 2
    l=$(leader "$c" "$n")
    [ "${KILL:-leader}" = follower ] && l=$((l % n + 1))
    local killed; killed=$(date +%s.%N)
    kill -9 "${pid[$c$l]}"; wait "${pid[$c$l]}" 2>/dev/null || true
    wait $b || { cat "$work/fo"; exit 1; }
    local gap at; gap=$(grep -o 'longest_gap_ms=[0-9.]*' "$work/fo" | cut -d= -f2)
    # the kill's own gap: the longest between two acknowledgements that spans the kill or
    # begins within a second of it
    at=$(awk -v k="$killed" 'NR > 1 && $1 > k && prev < k + 1 && ($1 - prev) * 1000 > g {g = ($1 - prev) * 1000}
      {prev = $1} END {printf "%.0f", g}' "$work/acks")
    echo "$c kill $r: member $l, gap at the kill ${at} ms, longest gap of the run ${gap} ms"
    gaps+=("$at $gap")
    start "$c" "$l"; sleep 3; leader "$c" "$n" >/dev/null
  done
  printf '%s\n' "${gaps[@]}" | awk -v c="$([ "$c" = etcd ] && echo "etcd-$ETCD_RELEASE" || echo ours)" -v k="${KILL:-leader}" -v w="${WRITE_TO:-all}" '
    {s+=$1; if(min==""||$1<min)min=$1; if($1>max)max=$1; if($2>run)run=$2}
    END {printf "RESULT cluster=%s killed=%s writers_to=%s kills=%d mean_ms=%.0f min_ms=%.0f max_ms=%.0f longest_of_any_run_ms=%.0f\n", c, k, w, NR, s/NR, min, max, run}'
  for i in $(seq 1 "$n"); do kill "${pid[$c$i]}" 2>/dev/null || true; wait "${pid[$c$i]}" 2>/dev/null || true; done
}

for c in ${WHICH:-ours etcd}; do
  if [ "$c" = ours ]; then
    mkdir -p "$work/ours/witness"
    url="witness:mount?path=$(python3 -c 'import sys,urllib.parse;print(urllib.parse.quote(sys.argv[1],safe=""))' "$work/ours/witness")"
    "$bin/etcdutl" witness init --name w --advertise-peer-url "$url" >/dev/null
    ours_ic="n1=http://127.0.0.1:41380,n2=http://127.0.0.1:42380,w=$url"
    run ours 2
  else
    etcd_ic="e1=http://127.0.0.1:51380,e2=http://127.0.0.1:52380,e3=http://127.0.0.1:53380"
    run etcd 3
  fi
done
