#!/usr/bin/env bash
# Kills the leader of a local etcd-node 2 + witness cluster ROUNDS times (default 5) while
# etcd-bench writes without pause; prints the longest gap between acknowledged writes per kill.
# Build first: cargo build --release -p etcd-node --bin etcd-node --bin etcdutl --bin etcd-bench
set -u
cd "$(dirname "$0")/.."
bin=$PWD/target/release; w=$(mktemp -d /var/tmp/fo.XXXX); mkdir -p $w/witness
url="witness:mount?path=$(python3 -c 'import sys,urllib.parse;print(urllib.parse.quote(sys.argv[1],safe=""))' "$w/witness")"
$bin/etcdutl witness init --name w --advertise-peer-url "$url" >/dev/null 2>&1
ic="n1=http://127.0.0.1:41380,n2=http://127.0.0.1:42380,w=$url"
declare -A pid
start() { $bin/etcd-node --name n$1 --data-dir $w/n$1 --listen-client-urls http://127.0.0.1:4${1}379 --advertise-client-urls http://127.0.0.1:4${1}379 --listen-peer-urls http://127.0.0.1:4${1}380 --initial-advertise-peer-urls http://127.0.0.1:4${1}380 --initial-cluster "$ic" 2>>$w/n$1.log & pid[$1]=$!; }
start 1; start 2; sleep 3
for _ in $(seq 1 "${ROUNDS:-5}"); do
  $bin/etcd-bench --endpoints 127.0.0.1:41379,127.0.0.1:42379 failover --duration 7 > $w/fo 2>&1 & b=$!
  sleep 2
  for i in 1 2; do if grep -q '^etcd_server_is_leader 1' <<<"$(curl -fs http://127.0.0.1:4${i}379/metrics)"; then l=$i; fi; done
  kill -9 ${pid[$l]}; wait $b; grep RESULT $w/fo
  start $l; sleep 3
done
kill ${pid[1]} ${pid[2]}; rm -rf $w
