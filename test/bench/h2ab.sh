#!/usr/bin/env bash
# Simultaneous before/after of two rl-tproxy builds on the HTTP/2 path, for
# a shared machine where test/bench/h2.sh's sequential rounds see the load
# of other jobs change between rows. Both builds serve the same h2c
# upstream (an nginx `http2` static server, 612-byte body) as in h2.sh,
# both pinned with it to $SERVER_CPU (GOMAXPROCS=1); each round runs one
# h2load per build AT THE SAME TIME on $CLIENT_CPU, so both see the same
# interference. Per round: req/s and CPU µs per request of each build
# (utime+stime from /proc over the round / succeeded requests) and the
# ratios; then the medians. The absolute numbers are lower than h2.sh's
# (two proxies share the CPU); only the ratios mean something.
#
# Env: BASE_BIN (required; the "before" build) BIN=bin/rl-tproxy DURATION=5
#      ROUNDS=6 CONNS=16 STREAMS=10 SERVER_CPU=1 CLIENT_CPU=0
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${BIN:-bin/rl-tproxy}
BASE_BIN=${BASE_BIN:?BASE_BIN: the build to compare against}
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-6}
CONNS=${CONNS:-16}
STREAMS=${STREAMS:-10}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
if [ "$(nproc)" -lt 2 ]; then SERVER_CPU=0 CLIENT_CPU=0; fi
for tool in nginx h2load curl taskset python3; do
  command -v "$tool" >/dev/null || { echo "h2ab.sh: needs $tool (make deps installs it)" >&2; exit 1; }
done
for b in "$BIN" "$BASE_BIN"; do [ -x "$b" ] || { echo "h2ab.sh: $b missing" >&2; exit 1; }; done

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_h2() { # bounded readiness poll
  for _ in $(seq 1 1000); do
    if curl -fsS -o /dev/null --max-time 2 --http2-prior-knowledge "$1" 2>/dev/null; then return 0; fi
    sleep 0.02
  done
  echo "h2ab.sh: $1 not answering 2xx over h2c" >&2
  exit 1
}
user_line=""; [ "$(id -u)" = 0 ] && user_line="user root;"
UP=$(free_port)
mkdir -p "$work/www" "$work/up"
head -c 612 /dev/zero | tr '\0' 'x' >"$work/www/index.html"
cat >"$work/up/nginx.conf" <<CONF
$user_line
daemon off;
worker_processes 1;
pid $work/up/nginx.pid;
error_log $work/up/error.log warn;
events { worker_connections 4096; }
http {
    access_log off; keepalive_timeout 300s; keepalive_requests 1000000; http2_max_concurrent_streams 128;
    client_body_temp_path $work/tb; proxy_temp_path $work/tp; fastcgi_temp_path $work/tf;
    uwsgi_temp_path $work/tu; scgi_temp_path $work/ts;
    server { listen 127.0.0.1:$UP http2; root $work/www; open_file_cache max=16; location / { index index.html; } }
}
CONF
taskset -c "$SERVER_CPU" nginx -p "$work/up" -c "$work/up/nginx.conf" -e "$work/up/error.log" &
pids+=("$!")
declare -A URL PID
for v in base new; do
  port=$(free_port); admin=$(free_port)
  cat >"$work/policy-$v.yaml" <<EOF2
ratelimitly:
  embedded: true
  request_policy: {name: standard, unit: 20ms}
  fail: close
defaults:
  limits: {h2_max_concurrent_streams: 128}
services:
  - name: h2c
    listen: 127.0.0.1:$port
    upstream: 127.0.0.1:$UP
    upstream_protocol: h2c
    locations: [{name: open}]
EOF2
  bin=$BIN; [ "$v" = base ] && bin=$BASE_BIN
  taskset -c "$SERVER_CPU" env GOMAXPROCS=1 "$bin" run --policy "$work/policy-$v.yaml" --admin "127.0.0.1:$admin" \
    --log-level error --watch=false &
  PID[$v]=$!; pids+=("$!")
  URL[$v]="http://127.0.0.1:$port/"
done
for v in base new; do wait_h2 "${URL[$v]}"; done
ticks() { awk '{print $14 + $15}' /proc/"$1"/stat; }
HZ=$(getconf CLK_TCK)
rows=()
for r in $(seq 1 "$ROUNDS"); do
  b0=$(ticks "${PID[base]}"); n0=$(ticks "${PID[new]}")
  taskset -c "$CLIENT_CPU" h2load -t1 -c"$CONNS" -m"$STREAMS" -D"$DURATION" "${URL[base]}" >"$work/out-base" 2>&1 &
  hb=$!
  taskset -c "$CLIENT_CPU" h2load -t1 -c"$CONNS" -m"$STREAMS" -D"$DURATION" "${URL[new]}" >"$work/out-new" 2>&1 &
  hn=$!
  wait "$hb" "$hn"
  b1=$(ticks "${PID[base]}"); n1=$(ticks "${PID[new]}")
  rb=$(awk '/^requests:/ {print $8}' "$work/out-base"); rn=$(awk '/^requests:/ {print $8}' "$work/out-new")
  rows+=("$(python3 -c "
b=($b1-$b0)*1e6/$HZ/max(1,$rb); n=($n1-$n0)*1e6/$HZ/max(1,$rn)
print(f'$r {$rb/$DURATION:.0f} {b:.1f} {$rn/$DURATION:.0f} {n:.1f} {n/b:.3f} {$rn/max(1,$rb):.3f}')")")
  echo "round ${rows[-1]}" >&2
done
echo "| round | base req/s | base CPU µs/req | new req/s | new CPU µs/req | new/base CPU per request | new/base req/s |"
echo "|---|---|---|---|---|---|---|"
for row in "${rows[@]}"; do echo "| ${row// / | } |"; done
printf '%s\n' "${rows[@]}" | python3 -c "
import sys, statistics as s
r=[l.split() for l in sys.stdin if l.strip()]
print(f'| median | {s.median(float(x[1]) for x in r):.0f} | {s.median(float(x[2]) for x in r):.1f} | {s.median(float(x[3]) for x in r):.0f} | {s.median(float(x[4]) for x in r):.1f} | **{s.median(float(x[5]) for x in r):.3f}** | **{s.median(float(x[6]) for x in r):.3f}** |')"
