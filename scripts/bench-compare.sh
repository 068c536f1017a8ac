#!/usr/bin/env bash
# Side by side on this machine, same tool (etcd-bench), same run: etcd-node as two members plus
# a witness in a local directory, and etcd as a three-member cluster: etcd 3.6 built from its Go
# module (scripts/build-go.sh), or Debian's etcd 3.4 with ETCD_RELEASE=3.4. Both with
# etcd's default timeouts (heartbeat 100 ms, election 1000 ms), data in the same directory tree.
# Prints RESULT lines and a markdown table (docs/benchmarks.md has the latest; docs/runs/ the dated runs).
#
#   bash scripts/bench-compare.sh            # full run (a few minutes)
#   QUICK=1 bash scripts/bench-compare.sh    # fewer requests
#   SUITE=api bash scripts/bench-compare.sh  # only watch fan-out and lease churn
#   SUITE=put bash scripts/bench-compare.sh  # only the puts (1, 16, 64 clients)
#   SUITE=tls bash scripts/bench-compare.sh  # the cost of TLS: both systems with plain and
#                                            # TLS URLs (client certificates required)
#   SUITE=gateway bash scripts/bench-compare.sh  # the cost of the JSON gateway: after 100000
#       writes, puts and linearizable ranges at 16 clients over gRPC, then the same through
#       etcd's HTTP/JSON gateway (an HTTP/1.1 connection per client), on both systems
#   SUITE=sustained bash scripts/bench-compare.sh  # after WARMUP writes (default 100000): puts,
#                                            # ranges, a mixed load (puts and linearizable
#                                            # gets of the same keys, half each, 16 clients),
#                                            # then memory and disk per member, the
#                                            # Raft loop's longest turn (and the slow
#                                            # turns it logged), and a leader killed
#                                            # under 16 writers with no timeout of their own;
#                                            # ROUNDS=3: both systems three times, alternated,
#                                            # then each point's medians and their ratio;
#                                            # SINGLE=1: etcd as one member too, in each round;
#                                            # VARIANT="<flags>": etcd-node again in each round
#                                            # with those flags (label etcd-node-variant)
#   SUITE=growth bash scripts/bench-compare.sh     # for each KEYS (default "100000 1000000";
#                                            # add 5000000 outside CI): a fresh cluster loaded with
#                                            # that many keys, then puts, ranges, memory, disk,
#                                            # snapshot save and restore, and defragment times.
#                                            # QUOTA sets --quota-backend-bytes on both systems
#                                            # (default: theirs, 2 GiB; 5M keys need more)
#   ETCD_RELEASE=3.4 bash scripts/bench-compare.sh  # against Debian's etcd 3.4 instead of 3.6
#   BATCH_LIMIT=1000 SUITE=... bash scripts/bench-compare.sh  # --backend-batch-limit on both
#                                            # systems (default: theirs, 10,000 entries between
#                                            # durable key-space commits)
set -euo pipefail
cd "$(dirname "$0")/.."
# Ports 26379-30380: below the kernel's ephemeral range (32768-60999 here; inside it a listener can
# find its port taken by one of the benchmark's own outgoing connections (etcd's second member
# once failed to start that way, and a run measured two members of three)), and apart from the
# local cluster's (2379-2380, 22379-22380).

# The etcd compared with: its server, its etcdctl, and the command that restores its snapshots
# (etcdutl since 3.5; 3.4's etcdctl).
case "${ETCD_RELEASE:=3.6}" in
  3.6)
    bash scripts/build-go.sh etcd
    etcd_bin=$PWD/target/go/etcd36/etcd etcdctl_bin=$PWD/target/go/etcd36/etcdctl
    etcd_restore=("$PWD/target/go/etcd36/etcdutl" snapshot restore) ;;
  3.4)
    command -v etcd >/dev/null || { echo "needs Debian's etcd-server (apt-get install etcd-server)"; exit 1; }
    etcd_bin=etcd etcdctl_bin=etcdctl etcd_restore=(etcdctl snapshot restore) ;;
  *) echo "ETCD_RELEASE must be 3.6 (built from the Go module) or 3.4 (Debian's)"; exit 1 ;;
esac
etcd_label=etcd-$ETCD_RELEASE
etcd_version=$("$etcd_bin" --version | head -1 | awk '{print $3}')
cargo build --release --locked -p etcd-node --bin etcd-node --bin etcdutl --bin etcd-bench
bin=$PWD/target/release
work=$(mktemp -d "${BENCH_DIR:-/var/tmp}/bench-compare.XXXXXX")
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

scale=${QUICK:+1}
n_small=$(( ${scale:-10} * 200 ))   # 1 client
n_big=$(( ${scale:-10} * 2000 ))    # 16 and 64 clients

rss_kb() { local t=0; for p in "$@"; do t=$(( t + $(awk '/VmRSS/{print $2}' "/proc/$p/status" 2>/dev/null || echo 0) )); done; echo $t; }
# CPU time process $1 used so far, in clock ticks (user + system, all threads).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
sys_ticks() { awk '{print $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# Context switches of all the process's threads (each a wait or a wake-up through the kernel).
switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/{n += $2} END {print n + 0}'; }
# The machine's idle clock ticks so far (all cores).
idle_ticks() { awk '/^cpu /{print $5}' /proc/stat; }

# Plain (the default) or TLS on every URL with client certificates required (SUITE=tls):
# scheme, the members' TLS flags, and the flags of etcd-bench and curl.
scheme=http member_tls=() client_tls=() curl_tls=()
use_tls() {
  local pki=$work/pki
  if [ ! -f "$pki/ca.crt" ]; then
    mkdir -p "$pki"
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 2 -subj "/CN=bench CA" 2>/dev/null
    for who in member client; do
      openssl req "${ec[@]}" -keyout "$pki/$who.key" -out "$pki/$who.csr" -subj "/CN=$who" 2>/dev/null
      printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n' > "$pki/$who.ext"
      openssl x509 -req -in "$pki/$who.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
        -days 2 -extfile "$pki/$who.ext" -out "$pki/$who.crt" 2>/dev/null
    done
  fi
  scheme=https
  member_tls=(--cert-file "$pki/member.crt" --key-file "$pki/member.key" --trusted-ca-file "$pki/ca.crt"
    --client-cert-auth --peer-cert-file "$pki/member.crt" --peer-key-file "$pki/member.key"
    --peer-trusted-ca-file "$pki/ca.crt" --peer-client-cert-auth)
  client_tls=(--cacert "$pki/ca.crt" --cert "$pki/client.crt" --key "$pki/client.key")
  curl_tls=("${client_tls[@]}")
}
use_plain() { scheme=http member_tls=() client_tls=() curl_tls=(); }

start_ours() { # [extra flags for both members]
  local dir=$work/ours-$scheme
  mkdir -p "$dir/witness"
  local url="witness:mount?path=$(python3 -c 'import sys,urllib.parse;print(urllib.parse.quote(sys.argv[1],safe=""))' "$dir/witness")"
  "$bin/etcdutl" witness init --name w --advertise-peer-url "$url" >/dev/null 2>&1
  local ic="n1=$scheme://127.0.0.1:26380,n2=$scheme://127.0.0.1:27380,w=$url"
  ours=()
  for i in 1 2; do
    "$bin/etcd-node" --name n$i --data-dir "$dir/n$i" \
      --listen-client-urls $scheme://127.0.0.1:$((25379 + i * 1000)) --advertise-client-urls $scheme://127.0.0.1:$((25379 + i * 1000)) \
      --listen-peer-urls $scheme://127.0.0.1:$((25380 + i * 1000)) --initial-advertise-peer-urls $scheme://127.0.0.1:$((25380 + i * 1000)) \
      --initial-cluster "$ic" ${QUOTA:+--quota-backend-bytes "$QUOTA"} ${BATCH_LIMIT:+--backend-batch-limit "$BATCH_LIMIT"} ${member_tls[@]+"${member_tls[@]}"} "$@" 2>"$dir/n$i.log" &
    ours+=($!); pids+=($!)
  done
  ours_eps=$scheme://127.0.0.1:26379,$scheme://127.0.0.1:27379
  ours_ports=(26379 27379)
}

# etcd with MEMBERS members (3 unless given: SINGLE=1 in the sustained suite runs 1, as issue 16
# asks for puts at least a single member's).
start_etcd() {
  local n=${1:-3} i ic=""
  theirs=() theirs_ports=()
  for i in $(seq 1 "$n"); do ic+="${ic:+,}e$i=$scheme://127.0.0.1:$((27380 + i * 1000))"; done
  for i in $(seq 1 "$n"); do
    "$etcd_bin" --name e$i --data-dir "$work/etcd-$scheme/e$i" \
      --listen-client-urls $scheme://127.0.0.1:$((27379 + i * 1000)) --advertise-client-urls $scheme://127.0.0.1:$((27379 + i * 1000)) \
      --listen-peer-urls $scheme://127.0.0.1:$((27380 + i * 1000)) --initial-advertise-peer-urls $scheme://127.0.0.1:$((27380 + i * 1000)) \
      --initial-cluster "$ic" --initial-cluster-state new --log-level error ${QUOTA:+--quota-backend-bytes "$QUOTA"} ${BATCH_LIMIT:+--backend-batch-limit "$BATCH_LIMIT"} \
      ${member_tls[@]+"${member_tls[@]}"} 2>"$work/etcd-e$i.log" &
    theirs+=($!); pids+=($!); theirs_ports+=($((27379 + i * 1000)))
  done
  theirs_eps=$(printf "$scheme://127.0.0.1:%s," "${theirs_ports[@]}"); theirs_eps=${theirs_eps%,}
}

wait_healthy() {
  for _ in $(seq 1 300); do curl -fs ${curl_tls[@]+"${curl_tls[@]}"} "$scheme://127.0.0.1:$1/health" >/dev/null 2>&1 && return; sleep 0.2; done
  echo "no leader on $1 after 60 s; the members' logs end:"; tail -n 5 "$work"/*.log "$work"/*/*.log 2>/dev/null; exit 1
}

# The index (in the ports array) of the member that leads.
leader_of() {
  local i=0
  for p in "$@"; do
    # (not curl | grep -q: with pipefail, grep's early exit fails curl on a long page)
    if grep -q '^etcd_server_is_leader 1' <<<"$(curl -fs ${curl_tls[@]+"${curl_tls[@]}"} "$scheme://127.0.0.1:$p/metrics")"; then echo $i; return; fi
    i=$((i + 1))
  done
  echo -1
}

bench() { # label eps pids... -- args
  local label=$1 eps=$2; shift 2
  local ps=(); while [ "$1" != "--" ]; do ps+=("$1"); shift; done; shift
  "$bin/etcd-bench" --endpoints "$eps" ${client_tls[@]+"${client_tls[@]}"} "$@" > "$work/out" 2>&1 &
  local b=$! peak=0 r cpu0=() sys0=() sw0=() idle0 t0 p
  for p in "${ps[@]}"; do cpu0+=("$(cpu_ticks "$p")") sys0+=("$(sys_ticks "$p")") sw0+=("$(switches "$p")"); done
  idle0=$(idle_ticks) t0=$(date +%s%N)
  while kill -0 $b 2>/dev/null; do r=$(rss_kb "${ps[@]}"); [ "$r" -gt "$peak" ] && peak=$r; sleep 0.2; done
  wait $b || { cat "$work/out"; exit 1; }
  # Each member's CPU over the point (ms, all threads; the leader's is the largest) and the
  # machine's idle share: where the cores went, for a rate that the members and the client,
  # sharing the machine's cores, bound.
  # Of that CPU, the time in the kernel (system calls: the network, fsyncs, thread wake-ups),
  # and each member's context switches over the point.
  local hz ms i cpu=() sys=() sw=(); hz=$(getconf CLK_TCK) ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  for i in "${!ps[@]}"; do
    cpu+=("$(( ($(cpu_ticks "${ps[$i]}") - cpu0[i]) * 1000 / hz ))")
    sys+=("$(( ($(sys_ticks "${ps[$i]}") - sys0[i]) * 1000 / hz ))")
    sw+=("$(( $(switches "${ps[$i]}") - sw0[i] ))")
  done
  local idle_pct=$(( ($(idle_ticks) - idle0) * 1000 / hz * 100 / (ms * $(nproc)) ))
  echo "$(grep '^RESULT' "$work/out") cluster=$label peak_rss_kb=$peak members_cpu_ms=$(IFS=,; echo "${cpu[*]}") members_sys_ms=$(IFS=,; echo "${sys[*]}") members_switches=$(IFS=,; echo "${sw[*]}") machine_idle_pct=$idle_pct" | tee -a "$work/results"
}

run_api() { # label eps pids...
  local label=$1 eps=$2; shift 2
  bench "$label" "$eps" "$@" -- --clients 4 --conns 10 watch-fanout --watchers 1000 --puts $(( ${scale:-10} * 50 ))
  bench "$label" "$eps" "$@" -- --clients 16 --conns 4 lease-churn --total $(( ${scale:-10} * 500 )) --ttl 5
}

run_suite() { # label eps pids...
  local label=$1 eps=$2; shift 2
  if [ "${SUITE:-all}" = api ]; then run_api "$label" "$eps" "$@"; return; fi
  echo "RESULT op=idle cluster=$label rss_kb=$(rss_kb "$@")" | tee -a "$work/results"
  bench "$label" "$eps" "$@" -- --clients 1 --conns 1 put --total $n_small --key-size 8 --val-size 256 --key-space-size 100000
  bench "$label" "$eps" "$@" -- --clients 16 --conns 4 put --total $n_big --key-size 8 --val-size 256 --key-space-size 100000
  bench "$label" "$eps" "$@" -- --clients 64 --conns 8 put --total $n_big --key-size 8 --val-size 256 --key-space-size 100000
  if [ "${SUITE:-all}" = put ]; then return; fi
  "$bin/etcd-bench" --endpoints "$eps" put --total 1 --key-size 3 >/dev/null
  bench "$label" "$eps" "$@" -- --clients 16 --conns 4 range 000 --consistency l --total $n_big
  bench "$label" "$eps" "$@" -- --clients 16 --conns 4 range 000 --consistency s --total $n_big
  bench "$label" "$eps" "$@" -- --clients 64 --conns 8 range 000 --consistency l --total $n_big
  run_api "$label" "$eps" "$@"
}

# The cost of TLS: each system plain, then with TLS on every URL, after 100k writes of warm-up,
# puts at 16 and 64 clients and linearizable ranges at 16 (about 10 s or more each).
run_tls_points() { # label eps pids...
  local label=$1 eps=$2; shift 2
  "$bin/etcd-bench" --endpoints "$eps" ${client_tls[@]+"${client_tls[@]}"} --clients 64 --conns 8 \
    put --total 100000 --key-size 8 --val-size 256 --key-space-size 100000 >/dev/null
  bench "$label" "$eps" "$@" -- --clients 16 --conns 4 put --total 40000 --key-size 8 --val-size 256 --key-space-size 100000
  bench "$label" "$eps" "$@" -- --clients 64 --conns 8 put --total 50000 --key-size 8 --val-size 256 --key-space-size 100000
  bench "$label" "$eps" "$@" -- --clients 16 --conns 4 range 000 --consistency l --total 100000
}
# Sustained load (docs/runs/benchmarks-2026-11-22-to-27.md, "Sustained load"): WARMUP writes, the points, then what
# each member holds (RSS, key-space file, data directory) and a leader kill under 16 writers.
sustained() { # label eps ports-array-name pids...
  local label=$1 eps=$2 ports_name=$3; shift 3
  local -n ports=$ports_name
  local ps=("$@") warm=${WARMUP:-100000}
  echo "warm-up: $warm writes"
  "$bin/etcd-bench" --endpoints "$eps" --clients 64 --conns 8 \
    put --total "$warm" --key-size 8 --val-size 256 --key-space-size 100000 >/dev/null
  bench "$label" "$eps" "${ps[@]}" -- --clients 16 --conns 4 put --total 40000 --key-size 8 --val-size 256 --key-space-size 100000
  bench "$label" "$eps" "${ps[@]}" -- --clients 64 --conns 8 put --total 60000 --key-size 8 --val-size 256 --key-space-size 100000
  bench "$label" "$eps" "${ps[@]}" -- --clients 16 --conns 4 range 000 --consistency l --total 100000
  bench "$label" "$eps" "${ps[@]}" -- --clients 16 --conns 4 mixed --total 60000 --read-percent 50 --key-size 8 --val-size 256 --key-space-size 100000
  local rss=() i
  for p in "${ps[@]}"; do rss+=("$(( $(rss_kb "$p") / 1024 ))"); done
  local dir kv=() data=()  # (member_dirs, kv_file: set by the caller)
  for dir in $member_dirs; do
    data+=("$(( $(du -sB1 "$dir" | cut -f1) / 1000000 ))")
    kv+=("$(( $(du -B1 "$dir/$kv_file" | cut -f1) / 1000000 ))")
  done
  local longest="" slow="" turns=""
  if [ "$label" = etcd-node ]; then
    for i in "${!ports[@]}"; do
      longest+="$(curl -fs "$scheme://127.0.0.1:${ports[$i]}/metrics" | awk '/^etcd_node_raft_loop_longest_turn_seconds/{printf "%.0f", $2 * 1000}'),"
    done
    # Applied batches over 100 ms (the member logs each, durable or not) and the slowest.
    for dir in $member_dirs; do
      slow+="$(grep -c 'applying a batch took too long' "$dir.log" || true)/$({ grep -o 'took=[0-9.]*ms' "$dir.log" || true; } | tr -dc '0-9.\n' | sort -n | tail -1)ms,"
      # Raft-loop turns over the heartbeat interval (logged with where the time went): how
      # many lines, and the longest as took/wal/applier/snapshot in ms.
      turns+="$(awk '/a turn of the Raft loop took longer/ {
          n++; t = w = a = s = 0
          for (i = 1; i <= NF; i++) {
            split($i, kv, "=")
            if (kv[1] == "took_ms") t = kv[2]; else if (kv[1] == "wal_write_and_fsync_ms") w = kv[2]
            else if (kv[1] == "applier_ms") a = kv[2]; else if (kv[1] == "snapshot_ms") s = kv[2]
          }
          if (t + 0 > best + 0) { best = t; worst = t "/" w "/" a "/" s }
        } END { printf "%d:%s", n, (n ? worst : "-") }' "$dir.log"),"
    done
  fi
  echo "RESULT op=footprint cluster=$label writes=$(( warm + 130000 )) rss_mb=$(IFS=,; echo "${rss[*]}") kv_file_mb=$(IFS=,; echo "${kv[*]}") data_dir_mb=$(IFS=,; echo "${data[*]}") ${longest:+loop_longest_turn_ms=${longest%,}} ${slow:+slow_batches=${slow%,}} ${turns:+slow_turns=${turns%,}}" | tee -a "$work/results"
  # (a single member has no one to fail over to)
  if [ "${#ps[@]}" -eq 1 ]; then return; fi
  "$bin/etcd-bench" --endpoints "$eps" --clients 16 failover --duration 12 > "$work/fo" 2>&1 & local b=$!
  sleep 4; local l; l=$(leader_of "${ports[@]}"); [ "$l" -ge 0 ] || { echo "no leader found"; exit 1; }
  echo "killing the leader on port ${ports[$l]}"; kill -9 "${ps[$l]}"; wait $b
  echo "$(grep '^RESULT' "$work/fo") cluster=$label" | tee -a "$work/results"
}
# Growth (docs/runs/benchmarks-2026-11-22-to-27.md, "Growth"): a fresh cluster loaded with `keys` distinct keys (256-byte
# values, 64 clients), then puts and linearizable ranges at 16 clients over those keys, what each
# member holds, `etcdctl snapshot save` from one member, a restore of one member from that file
# (etcdutl for etcd-node, etcd's own restore for etcd), and `etcdctl defrag` of one member.
secs() { local t0=$1; echo "$(( ($(date +%s%N) - t0) / 1000000 ))"; }
growth() { # label eps ports-array-name keys pids...
  local label=$1 eps=$2 ports_name=$3 keys=$4; shift 4
  local -n ports=$ports_name
  local ps=("$@") one="127.0.0.1:${ports[0]}" t0
  t0=$(date +%s%N)
  "$bin/etcd-bench" --endpoints "$eps" --clients 64 --conns 8 \
    put --total "$keys" --key-size 16 --val-size 256 --key-space-size "$keys" --sequential-keys > "$work/load"
  local load_ms; load_ms=$(secs "$t0")
  # (a full quota refuses the rest of the load: that is a result too, said in the RESULT line)
  local load_errors; load_errors=$(grep -o 'errors=[0-9]*' "$work/load" | cut -d= -f2)
  bench "$label" "$eps" "${ps[@]}" -- --clients 16 --conns 4 put --total 40000 --key-size 16 --val-size 256 --key-space-size "$keys"
  bench "$label" "$eps" "${ps[@]}" -- --clients 16 --conns 4 range 000 --consistency l --total 100000
  local rss=() p dir kv=() data=()
  for p in "${ps[@]}"; do rss+=("$(( $(rss_kb "$p") / 1024 ))"); done
  for dir in $member_dirs; do
    data+=("$(( $(du -sB1 "$dir" | cut -f1) / 1000000 ))")
    kv+=("$(( $(du -B1 "$dir/$kv_file" | cut -f1) / 1000000 ))")
  done
  local snap=$work/growth.snap peak=0 r
  rm -f "$snap"
  t0=$(date +%s%N)
  ETCDCTL_API=3 "$etcdctl_bin" --endpoints "$one" snapshot save "$snap" >/dev/null 2>&1 &
  local c=$!
  while kill -0 $c 2>/dev/null; do r=$(rss_kb "${ps[0]}"); [ "$r" -gt "$peak" ] && peak=$r; sleep 0.1; done
  wait $c
  local save_ms; save_ms=$(secs "$t0")
  local snap_mb=$(( $(stat -c %s "$snap") / 1000000 ))
  local restored=$work/restored; rm -rf "$restored" "$work/restore-witness"
  t0=$(date +%s%N)
  if [ "$label" = etcd-node ]; then
    mkdir -p "$work/restore-witness"
    local wurl="witness:mount?path=$(python3 -c 'import sys,urllib.parse;print(urllib.parse.quote(sys.argv[1],safe=""))' "$work/restore-witness")"
    "$bin/etcdutl" witness init --name w --advertise-peer-url "$wurl" >/dev/null 2>&1
    /usr/bin/time -f %M -o "$work/restore.rss" "$bin/etcdutl" snapshot restore "$snap" --name r1 --data-dir "$restored" \
      --initial-cluster "r1=http://127.0.0.1:1,r2=http://127.0.0.1:2,w=$wurl" --initial-advertise-peer-urls http://127.0.0.1:1 >/dev/null
  else
    ETCDCTL_API=3 /usr/bin/time -f %M -o "$work/restore.rss" "${etcd_restore[@]}" "$snap" --data-dir "$restored" >/dev/null 2>&1
  fi
  local restore_ms; restore_ms=$(secs "$t0")
  local restore_rss_mb=$(( $(tail -1 "$work/restore.rss") / 1024 ))
  t0=$(date +%s%N)
  ETCDCTL_API=3 "$etcdctl_bin" --endpoints "$one" --command-timeout 600s defrag >/dev/null
  local defrag_ms; defrag_ms=$(secs "$t0")
  local first; first=$(echo "$member_dirs" | awk '{print $1}')
  local kv_after=$(( $(du -B1 "$first/$kv_file" | cut -f1) / 1000000 ))
  echo "RESULT op=growth cluster=$label keys=$keys load_ms=$load_ms load_errors=$load_errors rss_mb=$(IFS=,; echo "${rss[*]}") kv_file_mb=$(IFS=,; echo "${kv[*]}") data_dir_mb=$(IFS=,; echo "${data[*]}") snapshot_save_ms=$save_ms snapshot_mb=$snap_mb member_peak_rss_during_save_mb=$(( peak / 1024 )) restore_ms=$restore_ms restore_peak_rss_mb=$restore_rss_mb defrag_ms=$defrag_ms kv_file_after_defrag_mb=$kv_after" | tee -a "$work/results"
  rm -rf "$snap" "$restored"
}
if [ "${SUITE:-all}" = growth ]; then
  command -v /usr/bin/time >/dev/null || { echo "needs /usr/bin/time (apt-get install time)"; exit 1; }
  for keys in ${KEYS:-100000 1000000}; do
    echo "==> etcd-node: two members + witness, $keys keys"
    rm -rf "$work/ours-http"; start_ours; for p in 26379 27379; do wait_healthy $p; done; sleep 1
    member_dirs="$work/ours-http/n1 $work/ours-http/n2" kv_file=member/kv.redb
    growth etcd-node "$ours_eps" ours_ports "$keys" "${ours[@]}"
    kill -9 "${ours[@]}" 2>/dev/null || true; wait "${ours[@]}" 2>/dev/null || true
    rm -rf "$work/ours-http"
    echo "==> etcd $etcd_version: three members, $keys keys"
    rm -rf "$work/etcd-http"; start_etcd; for p in 28379 29379 30379; do wait_healthy $p; done; sleep 1
    member_dirs="$work/etcd-http/e1 $work/etcd-http/e2 $work/etcd-http/e3" kv_file=member/snap/db
    growth "$etcd_label" "$theirs_eps" theirs_ports "$keys" "${theirs[@]}"
    kill -9 "${theirs[@]}" 2>/dev/null || true; wait "${theirs[@]}" 2>/dev/null || true
    rm -rf "$work/etcd-http"
  done
  echo; echo "==> all results"; cat "$work/results"; exit 0
fi
# Tags the RESULT lines written since the last call with round=N.
tag_round() { sed -i "/ round=/!s/\$/ round=$1/" "$work/results"; }
# Per point of the sustained suite: each system's median rate over the rounds, the ratio of the
# medians, and each round's ratio (both systems of a round ran one after the other).
summarize_rounds() {
  python3 - "$work/results" "$etcd_label" <<'PY'
import statistics, sys
def median(rounds, i):
    return statistics.median(v[i] for v in rounds.values())
runs = {}
for line in open(sys.argv[1]):
    f = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    if f.get("op") in ("put", "range", "mixed") and "rps" in f:
        point = f"{f['op']} clients={f['clients']}"
        rounds = runs.setdefault(point, {}).setdefault(f["cluster"], {})
        # (the members' CPU per request, in microseconds, all members together)
        total = lambda name: sum(float(c) for c in f.get(name, "0").split(","))
        cpu, n = total("members_cpu_ms"), float(f["requests"])
        members = len(f.get("members_cpu_ms", "0").split(","))
        rounds[f["round"]] = (float(f["rps"]), float(f["p99_ms"]), cpu * 1000 / n,
                              total("members_sys_ms") / max(cpu, 1), total("members_switches") / n,
                              cpu * 1000 / n / members,
                              # (a mixed load's puts and gets apart)
                              float(f.get("put_rps", 0)), float(f.get("put_p99_ms", 0)),
                              float(f.get("range_rps", 0)), float(f.get("range_p99_ms", 0)))
for point, by in runs.items():
    label = sys.argv[2]
    ours, theirs = by.get("etcd-node", {}), by.get(label, {})
    if not ours or not theirs:
        continue
    mo, mt = median(ours, 0), median(theirs, 0)
    po, pt = median(ours, 1), median(theirs, 1)
    each = " ".join(f"{ours[r][0] / theirs[r][0]:.2f}x" for r in sorted(ours) if r in theirs)
    single, variant = by.get(label + "-single", {}), by.get("etcd-node-variant", {})
    each_member = median(ours, 5) / median(theirs, 5)
    alone = (f" cpu_us_per_op_medians={median(ours, 2):.0f},{median(theirs, 2):.0f}"
             f" member_cpu_us_per_op_medians={median(ours, 5):.0f},{median(theirs, 5):.0f}"
             f" member_cpu_ratio={each_member:.2f}x"
             f" kernel_share_medians={median(ours, 3):.2f},{median(theirs, 3):.2f}"
             f" switches_per_op_medians={median(ours, 4):.1f},{median(theirs, 4):.1f}")
    if single:
        ms = median(single, 0)
        alone += (f" {label}-single_median_rps={ms:.0f} ratio_to_single={mo / ms:.2f}x"
                  f" single_cpu_us_per_op_median={median(single, 2):.0f}")
    if point.startswith("mixed"):
        alone += "".join(f" {what}_medians={median(ours, i):.1f},{median(theirs, i):.1f}"
                         for i, what in ((6, "put_rps"), (7, "put_p99_ms"),
                                         (8, "range_rps"), (9, "range_p99_ms")))
    if variant:
        mv, pv = median(variant, 0), median(variant, 1)
        alone += (f" variant_median_rps={mv:.0f} variant_ratio={mv / mt:.2f}x"
                  f" variant_p99_ms_median={pv:.1f}")
    print(f"SUMMARY {point} rounds={len(ours)} etcd-node_median_rps={mo:.0f} "
          f"{label}_median_rps={mt:.0f} ratio_of_medians={mo / mt:.2f}x per_round={each} "
          f"p99_ms_medians={po:.1f},{pt:.1f} p99_ratio={po / pt:.2f}x{alone}")
PY
}
if [ "${SUITE:-all}" = sustained ]; then
  # ROUNDS=n repeats both systems n times, alternated, each time on fresh data directories.
  sustained_etcd() { # label members
    rm -rf "$work/etcd-http"; start_etcd "$2"; for p in "${theirs_ports[@]}"; do wait_healthy $p; done; sleep 1
    member_dirs=$(printf "$work/etcd-http/e%s " $(seq 1 "$2")) kv_file=member/snap/db
    sustained "$1" "$theirs_eps" theirs_ports "${theirs[@]}"
    kill -9 "${theirs[@]}" 2>/dev/null || true; wait "${theirs[@]}" 2>/dev/null || true
    rm -rf "$work/etcd-http"
  }
  sustained_ours() { # label [extra flags]
    local label=$1; shift
    rm -rf "$work/ours-http"; start_ours "$@"; for p in 26379 27379; do wait_healthy $p; done; sleep 1
    member_dirs="$work/ours-http/n1 $work/ours-http/n2" kv_file=member/kv.redb
    sustained "$label" "$ours_eps" ours_ports "${ours[@]}"
    kill -9 "${ours[@]}" 2>/dev/null || true; wait "${ours[@]}" 2>/dev/null || true
    rm -rf "$work/ours-http"
  }
  for round in $(seq 1 "${ROUNDS:-1}"); do
    echo "==> round $round: etcd-node: two members + witness"
    sustained_ours etcd-node
    if [ -n "${VARIANT:-}" ]; then
      echo "==> round $round: etcd-node with $VARIANT"
      # (word splitting wanted: VARIANT is a list of flags)
      # shellcheck disable=SC2086
      sustained_ours etcd-node-variant $VARIANT
    fi
    echo "==> round $round: etcd $etcd_version: three members"
    sustained_etcd "$etcd_label" 3
    if [ -n "${SINGLE:-}" ]; then
      echo "==> round $round: etcd, one member"
      sustained_etcd "$etcd_label-single" 1
    fi
    tag_round "$round"
  done
  echo; echo "==> all results"; cat "$work/results"; summarize_rounds; exit 0
fi
# The cost of the JSON gateway beside gRPC, on the same members after 100k writes.
run_gateway_points() { # label eps pids...
  local label=$1 eps=$2; shift 2
  "$bin/etcd-bench" --endpoints "$eps" --clients 64 --conns 8 \
    put --total 100000 --key-size 8 --val-size 256 --key-space-size 100000 >/dev/null
  "$bin/etcd-bench" --endpoints "$eps" put --total 1 --key-size 3 >/dev/null
  local via
  for via in grpc gateway; do
    local flag=(); [ $via = gateway ] && flag=(--gateway)
    bench "$label" "$eps" "$@" -- "${flag[@]}" --clients 16 --conns 4 put --total 80000 --key-size 8 --val-size 256 --key-space-size 100000
    bench "$label" "$eps" "$@" -- "${flag[@]}" --clients 16 --conns 4 range 000 --consistency l --total 200000
  done
}
if [ "${SUITE:-all}" = gateway ]; then
  echo "==> etcd-node: two members + witness"
  start_ours; for p in 26379 27379; do wait_healthy $p; done; sleep 1
  run_gateway_points etcd-node "$ours_eps" "${ours[@]}"
  kill -9 "${ours[@]}" 2>/dev/null || true
  echo "==> etcd $etcd_version: three members"
  start_etcd; for p in 28379 29379 30379; do wait_healthy $p; done; sleep 1
  run_gateway_points "$etcd_label" "$theirs_eps" "${theirs[@]}"
  kill -9 "${theirs[@]}" 2>/dev/null || true
  echo; echo "==> all results"; cat "$work/results"; exit 0
fi
if [ "${SUITE:-all}" = tls ]; then
  command -v openssl >/dev/null || { echo "needs openssl"; exit 1; }
  for mode in plain tls; do
    if [ $mode = tls ]; then use_tls; else use_plain; fi
    echo "==> etcd-node ($mode): two members + witness"
    start_ours; for p in 26379 27379; do wait_healthy $p; done; sleep 1
    run_tls_points "etcd-node-$mode" "$ours_eps" "${ours[@]}"
    kill -9 "${ours[@]}" 2>/dev/null || true
    echo "==> etcd $etcd_version ($mode): three members"
    start_etcd; for p in 28379 29379 30379; do wait_healthy $p; done; sleep 1
    run_tls_points "$etcd_label-$mode" "$theirs_eps" "${theirs[@]}"
    kill -9 "${theirs[@]}" 2>/dev/null || true
    sleep 1
  done
  echo; echo "==> all results"; cat "$work/results"; exit 0
fi

echo "==> etcd-node: two members + witness"
start_ours; for p in 26379 27379; do wait_healthy $p; done; sleep 1
run_suite etcd-node "$ours_eps" "${ours[@]}"
failover_ours() {
  "$bin/etcd-bench" --endpoints "$ours_eps" failover --duration 12 > "$work/fo" 2>&1 & local b=$!
  sleep 4; local l; l=$(leader_of "${ours_ports[@]}"); [ "$l" -ge 0 ] || { echo "no leader found"; exit 1; }
  echo "killing the leader on port ${ours_ports[$l]}"; kill -9 "${ours[$l]}"; wait $b
  echo "$(grep '^RESULT' "$work/fo") cluster=etcd-node" | tee -a "$work/results"
}
case "${SUITE:-all}" in api|put) ;; *) failover_ours ;; esac
kill -9 "${ours[@]}" 2>/dev/null || true

echo "==> etcd $etcd_version: three members"
start_etcd; for p in 28379 29379 30379; do wait_healthy $p; done; sleep 1
run_suite "$etcd_label" "$theirs_eps" "${theirs[@]}"
case "${SUITE:-all}" in api|put) echo; echo "==> all results"; cat "$work/results"; exit 0 ;; esac
"$bin/etcd-bench" --endpoints "$theirs_eps" failover --duration 12 > "$work/fo" 2>&1 & b=$!
sleep 4; l=$(leader_of "${theirs_ports[@]}"); [ "$l" -ge 0 ] || { echo "no leader found"; exit 1; }
echo "killing the leader on port ${theirs_ports[$l]}"; kill -9 "${theirs[$l]}"; wait $b
echo "$(grep '^RESULT' "$work/fo") cluster=$etcd_label" | tee -a "$work/results"

echo
echo "==> all results"
cat "$work/results"
