#!/usr/bin/env bash
# The main job: a local etcd-node cluster of two members plus a witness in a local directory
# (.local-cluster/), initialised for you. Prints the endpoints and an etcdctl example; Ctrl-C
# stops both members cleanly. Data survives restarts of this script
# (`rm -rf .local-cluster` starts afresh).
#
# Environment (all optional): CLUSTER_DIR (default .local-cluster, or .local-cluster-tls with
# TLS=1), PORTS (client:peer of each member, default "2379:2380 22379:22380"), BIN_DIR (use the
# etcd-node and etcdutl found there instead of building them; the end-to-end test of this
# script does), TLS=1 (https on every URL with client certificates required: a throwaway CA
# and certificates are made in $CLUSTER_DIR/pki with openssl, and the etcdctl flags printed).

set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v protoc >/dev/null 2>&1 || need_apt+=(protobuf-compiler)
command -v etcdctl >/dev/null 2>&1 || need_apt+=(etcd-client)
command -v curl >/dev/null 2>&1 || need_apt+=(curl)
tls=${TLS:-0}
if [ "$tls" = 1 ]; then command -v openssl >/dev/null 2>&1 || need_apt+=(openssl); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "==> installing Debian packages: ${need_apt[*]}"
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need_apt[@]}"
fi

if [ -n "${BIN_DIR:-}" ]; then
  bin=$BIN_DIR
else
  echo "==> building etcd-node and etcdutl (release)"
  cargo build --release --locked -p etcd-node --bin etcd-node --bin etcdutl
  bin=$PWD/target/release
fi

if [ "$tls" = 1 ]; then base="${CLUSTER_DIR:-$PWD/.local-cluster-tls}"; else base="${CLUSTER_DIR:-$PWD/.local-cluster}"; fi
mkdir -p "$base/witness"
url="witness:mount?path=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$base/witness")"
if ! "$bin/etcdutl" witness status --advertise-peer-url "$url" >/dev/null 2>&1; then
  "$bin/etcdutl" witness init --name witness --advertise-peer-url "$url"
fi

read -r -a ports <<<"${PORTS:-2379:2380 22379:22380}"
[ ${#ports[@]} -eq 2 ] || { echo "PORTS must name two client:peer pairs, e.g. \"2379:2380 22379:22380\""; exit 1; }
c0=${ports[0]%%:*} p0=${ports[0]##*:} c1=${ports[1]%%:*} p1=${ports[1]##*:}

scheme=http tls_flags=() ctl_flags="" curl_flags=()
if [ "$tls" = 1 ]; then
  # A throwaway CA (30 days) and certificates for 127.0.0.1: one per member (also its client
  # certificate towards the other member) and one for etcdctl (CN root: with auth on, that user).
  pki="$base/pki"
  if [ ! -f "$pki/ca.crt" ]; then
    echo "==> making a throwaway CA and certificates in $pki"
    mkdir -p "$pki"
    ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -keyout "$pki/ca.key" -out "$pki/ca.crt" -days 30 \
      -subj "/CN=etcd-node local CA" 2>/dev/null
    for who in infra0 infra1 root; do
      openssl req "${ec[@]}" -keyout "$pki/$who.key" -out "$pki/$who.csr" -subj "/CN=$who" 2>/dev/null
      printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' > "$pki/$who.ext"
      openssl x509 -req -in "$pki/$who.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
        -days 30 -extfile "$pki/$who.ext" -out "$pki/$who.crt" 2>/dev/null
      rm -f "$pki/$who.csr" "$pki/$who.ext"
    done
    chmod 600 "$pki"/*.key
  fi
  scheme=https
  ctl_flags=" --cacert=$pki/ca.crt --cert=$pki/root.crt --key=$pki/root.key"
  curl_flags=(--cacert "$pki/ca.crt" --cert "$pki/root.crt" --key "$pki/root.key")
fi
cluster="infra0=$scheme://127.0.0.1:$p0,infra1=$scheme://127.0.0.1:$p1,witness=$url"
pids=()
stop() {
  echo; echo "==> stopping"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  echo "==> stopped; data kept in $base"
}
trap stop EXIT
trap 'exit 0' INT TERM
for i in 0 1; do
  client=${ports[$i]%%:*}; peer=${ports[$i]##*:}
  if [ "$tls" = 1 ]; then
    tls_flags=(--cert-file "$pki/infra$i.crt" --key-file "$pki/infra$i.key"
      --trusted-ca-file "$pki/ca.crt" --client-cert-auth
      --peer-cert-file "$pki/infra$i.crt" --peer-key-file "$pki/infra$i.key"
      --peer-trusted-ca-file "$pki/ca.crt" --peer-client-cert-auth)
  fi
  "$bin/etcd-node" --name "infra$i" --data-dir "$base/infra$i.etcd" \
    --listen-client-urls "$scheme://127.0.0.1:$client" --advertise-client-urls "$scheme://127.0.0.1:$client" \
    --listen-peer-urls "$scheme://127.0.0.1:$peer" --initial-advertise-peer-urls "$scheme://127.0.0.1:$peer" \
    --initial-cluster-token local-cluster --initial-cluster "$cluster" --initial-cluster-state new \
    ${tls_flags[@]+"${tls_flags[@]}"} 2> "$base/infra$i.log" &
  pids+=($!)
done

# Healthy means: both members this script started still run, and each answers /health on its
# own port (a foreign process holding a port makes our member exit: that is reported).
healthy() {
  for i in 0 1; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      echo "infra$i exited; the end of its log ($base/infra$i.log):" >&2
      tail -n 5 "$base/infra$i.log" >&2
      exit 1
    fi
  done
  curl -fs --max-time 2 ${curl_flags[@]+"${curl_flags[@]}"} "$scheme://127.0.0.1:$c0/health" >/dev/null 2>&1 &&
    curl -fs --max-time 2 ${curl_flags[@]+"${curl_flags[@]}"} "$scheme://127.0.0.1:$c1/health" >/dev/null 2>&1
}
echo "==> waiting for a leader"
ready=0
for _ in $(seq 1 100); do
  if healthy; then ready=1; break; fi
  sleep 0.2
done
[ "$ready" = 1 ] || { echo "no leader within 20 s; logs in $base/infra*.log" >&2; tail -n 5 "$base"/infra*.log >&2; exit 1; }

cat <<INFO

etcd-node cluster running: two members and a witness.
  infra0   client $scheme://127.0.0.1:$c0   peer $scheme://127.0.0.1:$p0    log $base/infra0.log
  infra1   client $scheme://127.0.0.1:$c1  peer $scheme://127.0.0.1:$p1   log $base/infra1.log
  witness  $url

Try:
  export ETCDCTL_API=3 ENDPOINTS=$scheme://127.0.0.1:$c0,$scheme://127.0.0.1:$c1
  etcdctl --endpoints=\$ENDPOINTS$ctl_flags put greeting hello
  etcdctl --endpoints=\$ENDPOINTS$ctl_flags get greeting
  etcdctl --endpoints=\$ENDPOINTS$ctl_flags member list -w table
  etcdctl --endpoints=\$ENDPOINTS$ctl_flags endpoint status --cluster -w table
  curl ${curl_flags[*]+${curl_flags[*]} }$scheme://127.0.0.1:$c0/metrics | grep etcd_witness

Ctrl-C stops both members.
INFO
wait
