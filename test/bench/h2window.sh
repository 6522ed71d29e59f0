#!/usr/bin/env bash
# Zero-window memory bound (docs/http.md "Memory per stream and
# connection"): nginx with `listen ... http2` on a cleartext port (h2c prior
# knowledge) serves a 64 MiB file as the h2c
# upstream; rl-tproxy (listener mode, upstream_protocol h2c) proxies it;
# CLIENTS zero-window clients (test/bench/zerowin) each open STREAMS streams
# to the file and hold them HOLD seconds without granting any window.
# Prints the proxy's RSS before, the peak while the clients hold (sampled
# every 0.2 s) and the growth; fails when the growth passes LIMIT_MIB per
# client.
#
# Env: STREAMS=100 CLIENTS=1 HOLD=5 LIMIT_MIB=64 BIN= (an rl-tproxy binary;
#      built into the temporary directory when unset)
set -euo pipefail
cd "$(dirname "$0")/../.."

STREAMS=${STREAMS:-100}
CLIENTS=${CLIENTS:-1}
HOLD=${HOLD:-5}
LIMIT_MIB=${LIMIT_MIB:-64}
for tool in nginx curl python3; do
  command -v "$tool" >/dev/null || { echo "h2window.sh: needs $tool" >&2; exit 1; }
done
work=$(mktemp -d)
BIN=${BIN:-$work/rl-tproxy}
[ -x "$BIN" ] || go build -o "$BIN" ./cmd/rl-tproxy
go build -o "$work/zerowin" ./test/bench/zerowin
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
UP=$(free_port); RL=$(free_port); ADMIN=$(free_port)
mkdir -p "$work/www" "$work/ng"
head -c $((64 << 20)) /dev/zero >"$work/www/big"
user_line=""; [ "$(id -u)" = 0 ] && user_line="user root;"
cat >"$work/ng/nginx.conf" <<CONF
$user_line
daemon off;
worker_processes 1;
pid $work/ng/nginx.pid;
error_log $work/ng/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    http2_max_concurrent_streams 256;
    client_body_temp_path $work/ng/tmp_body;
    proxy_temp_path $work/ng/tmp_proxy;
    fastcgi_temp_path $work/ng/tmp_fcgi;
    uwsgi_temp_path $work/ng/tmp_uwsgi;
    scgi_temp_path $work/ng/tmp_scgi;
    server { listen 127.0.0.1:$UP http2; root $work/www; }
}
CONF
cat >"$work/policy.yaml" <<EOF
ratelimitly:
  embedded: true
  request_policy: {name: standard, unit: 20ms}
  fail: close
services:
  - name: big
    listen: 127.0.0.1:$RL
    upstream: 127.0.0.1:$UP
    upstream_protocol: h2c
    locations: [{name: open}]
EOF
nginx -p "$work/ng" -c "$work/ng/nginx.conf" -e "$work/ng/error.log" & pids+=($!)
"$BIN" run --policy "$work/policy.yaml" --admin "127.0.0.1:$ADMIN" --log-level warn --watch=false & RLPID=$!; pids+=($RLPID)
for _ in $(seq 1 500); do # bounded readiness poll
  if curl -fsS -o /dev/null --max-time 2 --http2-prior-knowledge -r 0-0 "http://127.0.0.1:$RL/big" 2>/dev/null; then break; fi
  sleep 0.02
done
curl -fsS -o /dev/null --max-time 2 --http2-prior-knowledge "http://127.0.0.1:$UP/big" -r 0-0 || { echo "h2window.sh: nginx h2c upstream not answering" >&2; exit 1; }
rss() { awk '/^VmRSS/ {print $2}' /proc/"$RLPID"/status; } # KiB
before=$(rss)
cpids=()
for _ in $(seq 1 "$CLIENTS"); do
  "$work/zerowin" -addr "127.0.0.1:$RL" -path /big -streams "$STREAMS" -hold "${HOLD}s" & cpids+=($!)
done
peak=$before
end=$(( $(date +%s) + HOLD + 60 )) # hang guard
while [ "$(date +%s)" -lt "$end" ]; do
  r=$(rss); [ "$r" -gt "$peak" ] && peak=$r
  alive=0; for p in "${cpids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ "$alive" = 0 ] && break
  sleep 0.2
done
fail=0; for p in "${cpids[@]}"; do wait "$p" || fail=1; done
echo "clients=$CLIENTS streams=$STREAMS hold=${HOLD}s rss_before_kib=$before rss_peak_kib=$peak growth_mib=$(( (peak - before) / 1024 ))"
[ "$fail" = 0 ] || { echo "h2window.sh: a client failed" >&2; exit 1; }
if [ $(( (peak - before) / 1024 )) -gt $(( LIMIT_MIB * CLIENTS )) ]; then
  echo "h2window.sh: growth over $(( LIMIT_MIB * CLIENTS )) MiB" >&2
  exit 1
fi
