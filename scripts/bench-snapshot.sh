#!/usr/bin/env bash
# Memory of both members when a follower paused (SIGSTOP) while the leader took snapshots of a
# large key space resumes and needs a snapshot. Prints the leader's and the follower's RSS each
# second after the resume, how many snapshots the leader sent, and checks the follower caught up.
# Before the fix in docs/raft.md ("Snapshots") the leader grew to 17 GB here and was OOM-killed.
#
# Environment (all optional): BIN (directory with etcd-node and etcdutl; default: build them),
# PUTS (writes of a 933 KB value before the pause, default 800), DURING (during it, default
# 100), SECS (seconds sampled after the resume, default 25). Needs about 10 GB of disk.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${BIN:-}" ]; then
  cargo build --release --locked -p etcd-node --bin etcd-node --bin etcdutl
  BIN=$PWD/target/release
fi
base=$(mktemp -d); mkdir -p "$base/witness"
url="witness:mount?path=$(python3 -c 'import sys,urllib.parse;print(urllib.parse.quote(sys.argv[1],safe=""))' "$base/witness")"
"$BIN/etcdutl" witness init --name witness --advertise-peer-url "$url" >/dev/null 2>&1
cluster="a=http://127.0.0.1:32380,b=http://127.0.0.1:32480,witness=$url"
start() { # name client-port peer-port
  "$BIN/etcd-node" --name "$1" --data-dir "$base/$1" --listen-client-urls "http://127.0.0.1:$2" \
    --advertise-client-urls "http://127.0.0.1:$2" --listen-peer-urls "http://127.0.0.1:$3" \
    --initial-advertise-peer-urls "http://127.0.0.1:$3" --initial-cluster "$cluster" \
    --initial-cluster-state new --snapshot-count 50 --quota-backend-bytes 8000000000 2>"$base/$1.log" &
}
start a 32379 32380; pa=$!
start b 32479 32480; pb=$!
trap 'kill -CONT $pa $pb 2>/dev/null; kill $pa $pb 2>/dev/null; wait; rm -rf "$base"' EXIT
sleep 3
head -c 700000 /dev/urandom | base64 -w0 >"$base/val"
E=--endpoints=http://127.0.0.1:32379,http://127.0.0.1:32479
put() { etcdctl "$@" >/dev/null 2>&1 || true; } # a put may time out while a snapshot is taken
for i in $(seq 1 "${PUTS:-800}"); do put "$E" put "big$((i % 50))" <"$base/val"; done
if curl -s http://127.0.0.1:32379/metrics | grep -q '^etcd_server_is_leader 1'; then
  L=$pa F=$pb lead=http://127.0.0.1:32379 follow=http://127.0.0.1:32479
else
  L=$pb F=$pa lead=http://127.0.0.1:32479 follow=http://127.0.0.1:32379
fi
rss() { awk '/VmRSS/{printf "%.0f MB", $2/1024}' "/proc/$1/status" 2>/dev/null || echo gone; }
echo "before the pause: leader $(rss $L), follower $(rss $F), data $(du -sh "$base/a" | cut -f1) per member"
kill -STOP $F
for i in $(seq 1 "${DURING:-100}"); do put --endpoints=$lead put "big$((i % 50))" <"$base/val"; done
for i in $(seq 1 120); do put --endpoints=$lead put "small$i" v; done
echo "before the resume: leader $(rss $L)"
kill -CONT $F
for s in $(seq 1 "${SECS:-25}"); do sleep 1; echo "t=${s}s leader $(rss $L) follower $(rss $F)"; done
curl -s $lead/metrics | grep -E '^etcd_network_snapshot_send'
grep -h "sent a snapshot" "$base"/*.log || true
[ "$(etcdctl --endpoints=$follow get small120 --consistency=s --print-value-only)" = v ] \
  && echo "the follower caught up" || { echo "the follower did not catch up"; exit 1; }
