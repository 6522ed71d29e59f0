#!/usr/bin/env bash
# HTTP/2 side-by-side benchmark (`make bench`, after run.sh): h2load
# (Debian nghttp2-client, h2c prior knowledge) against
#   direct        nginx `listen ... http2` serving a 612-byte static body:
#                 the h2c upstream of every other row
#   nginx_grpc    nginx `listen ... http2` + grpc_pass grpc://upstream
#                 (HTTP/2 to the upstream, keepalive 64)
#   rl_h2c        rl-tproxy, unprotected location, upstream_protocol: h2c
#   rl_h2c_adm    rl-tproxy + admission (embedded RateLimitly, never denies)
#   nginx_h1      nginx `listen ... http2` + proxy_pass HTTP/1.1 keepalive
#                 to the same nginx's HTTP/1.1 port
#   rl_h1         rl-tproxy, unprotected, upstream_protocol: http1
# Servers are pinned to CPU $SERVER_CPU (nginx: 1 worker each; rl-tproxy
# GOMAXPROCS=1, embedded RateLimitly in the same process), h2load to
# $CLIENT_CPU. Rounds alternate the rows; each row reports its median round
# and the CPU time its front process(es) used per request (utime+stime
# from /proc over exactly the h2load run; the upstream nginx is shared and
# not counted). Writes $OUT (Markdown).
#
# With BASE_BIN set (another rl-tproxy build, e.g. an older commit's), a
# row rl_h2c_base runs it beside the others for a before/after in one run.
#
# Env: DURATION=10 (s) CONNS=16 STREAMS=10 ROUNDS=3 SERVER_CPU=1
#      CLIENT_CPU=0 OUT=docs/bench/h2.md BIN=bin/rl-tproxy BASE_BIN=
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-10}
CONNS=${CONNS:-16}
STREAMS=${STREAMS:-10}
ROUNDS=${ROUNDS:-3}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
OUT=${OUT:-docs/bench/h2.md}
BIN=${BIN:-bin/rl-tproxy}
BASE_BIN=${BASE_BIN:-}
if [ "$(nproc)" -lt 2 ]; then SERVER_CPU=0 CLIENT_CPU=0; fi
H2LOAD="h2load -t1 -c$CONNS -m$STREAMS -D$DURATION"

for tool in nginx h2load curl taskset python3; do
  command -v "$tool" >/dev/null || { echo "h2.sh: needs $tool (make deps installs it)" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "h2.sh: $BIN missing (make build)" >&2; exit 1; }
BIN=$(realpath "$BIN")
if [ -n "$BASE_BIN" ]; then
  [ -x "$BASE_BIN" ] || { echo "h2.sh: BASE_BIN $BASE_BIN missing" >&2; exit 1; }
  BASE_BIN=$(realpath "$BASE_BIN")
fi

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
wait_h2() { # bounded readiness poll: an h2c request answers 2xx
  for _ in $(seq 1 1000); do
    if curl -fsS -o /dev/null --max-time 2 --http2-prior-knowledge "$1" 2>/dev/null; then return 0; fi
    sleep 0.02
  done
  echo "h2.sh: $1 not answering 2xx over h2c" >&2
  exit 1
}
user_line=""; [ "$(id -u)" = 0 ] && user_line="user root;"
mkdir -p "$work/www"
head -c 612 /dev/zero | tr '\0' 'x' >"$work/www/index.html"
nginx_conf() { # $1 dir, $2 http-level body
  mkdir -p "$1"
  cat >"$1/nginx.conf" <<CONF
$user_line
daemon off;
worker_processes 1;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_timeout 300s;
    keepalive_requests 1000000;
    http2_max_concurrent_streams 128;
    client_body_temp_path $1/tmp_body;
    proxy_temp_path $1/tmp_proxy;
    fastcgi_temp_path $1/tmp_fcgi;
    uwsgi_temp_path $1/tmp_uwsgi;
    scgi_temp_path $1/tmp_scgi;
    $2
}
CONF
}
UP2=$(free_port); UP1=$(free_port); NGRPC=$(free_port); NH1=$(free_port)
RLH2=$(free_port); RLADM=$(free_port); RLH1=$(free_port); RLADMIN=$(free_port)
nginx_conf "$work/up" "server { listen 127.0.0.1:$UP2 http2; listen 127.0.0.1:$UP1; root $work/www;
        open_file_cache max=16; location / { index index.html; } }"
nginx_conf "$work/grpc" "upstream up2 { server 127.0.0.1:$UP2; keepalive 64; }
    server { listen 127.0.0.1:$NGRPC http2; location / { grpc_pass grpc://up2; } }"
nginx_conf "$work/h1" "upstream up1 { server 127.0.0.1:$UP1; keepalive 64; }
    server { listen 127.0.0.1:$NH1 http2; location / { proxy_pass http://up1; proxy_http_version 1.1;
        proxy_set_header Connection \"\"; } }"
cat >"$work/policy.yaml" <<EOF
ratelimitly:
  embedded: true
  request_policy: {name: standard, unit: 20ms}
  fail: close
zones:
  huge: {bucket: "bench:{remote_addr}", rate: 4000000000/s, burst: 4000000000}
defaults:
  limits: {h2_max_concurrent_streams: 128}
services:
  - name: h2c
    listen: 127.0.0.1:$RLH2
    upstream: 127.0.0.1:$UP2
    upstream_protocol: h2c
    locations: [{name: open}]
  - name: h2c-adm
    listen: 127.0.0.1:$RLADM
    upstream: 127.0.0.1:$UP2
    upstream_protocol: h2c
    locations: [{name: adm, limit: [huge]}]
  - name: h1
    listen: 127.0.0.1:$RLH1
    upstream: 127.0.0.1:$UP1
    upstream_protocol: http1
    locations: [{name: open}]
EOF
"$BIN" check --policy "$work/policy.yaml" >/dev/null
RLBASE=$(free_port); RLBASEADMIN=$(free_port)
cat >"$work/policy-base.yaml" <<EOF
ratelimitly:
  embedded: true
  request_policy: {name: standard, unit: 20ms}
  fail: close
defaults:
  limits: {h2_max_concurrent_streams: 128}
services:
  - name: h2c-base
    listen: 127.0.0.1:$RLBASE
    upstream: 127.0.0.1:$UP2
    upstream_protocol: h2c
    locations: [{name: open}]
EOF

start() { taskset -c "$SERVER_CPU" "$@" & last=$!; pids+=("$last"); }
declare -A URL DESC PID
start nginx -p "$work/up" -c "$work/up/nginx.conf" -e "$work/up/error.log"; PID[direct]=$last
start nginx -p "$work/grpc" -c "$work/grpc/nginx.conf" -e "$work/grpc/error.log"; PID[nginx_grpc]=$last
start nginx -p "$work/h1" -c "$work/h1/nginx.conf" -e "$work/h1/error.log"; PID[nginx_h1]=$last
start env GOMAXPROCS=1 "$BIN" run --policy "$work/policy.yaml" --admin "127.0.0.1:$RLADMIN" --log-level warn --watch=false
PID[rl_h2c]=$last; PID[rl_h2c_adm]=$last; PID[rl_h1]=$last
URL[direct]="http://127.0.0.1:$UP2/";      DESC[direct]="nginx h2c static upstream, direct"
URL[nginx_grpc]="http://127.0.0.1:$NGRPC/"; DESC[nginx_grpc]="nginx http2 + grpc_pass (h2c upstream, keepalive)"
URL[rl_h2c]="http://127.0.0.1:$RLH2/";     DESC[rl_h2c]="rl-tproxy h2, unprotected, upstream_protocol h2c"
URL[rl_h2c_adm]="http://127.0.0.1:$RLADM/"; DESC[rl_h2c_adm]="rl-tproxy h2 + admission (embedded RateLimitly), h2c"
URL[nginx_h1]="http://127.0.0.1:$NH1/";    DESC[nginx_h1]="nginx http2 + proxy_pass HTTP/1.1 keepalive"
URL[rl_h1]="http://127.0.0.1:$RLH1/";      DESC[rl_h1]="rl-tproxy h2, unprotected, upstream_protocol http1"
rows=(direct nginx_grpc rl_h2c rl_h2c_adm nginx_h1 rl_h1)
if [ -n "$BASE_BIN" ]; then
  start env GOMAXPROCS=1 "$BASE_BIN" run --policy "$work/policy-base.yaml" --admin "127.0.0.1:$RLBASEADMIN" --log-level warn --watch=false
  PID[rl_h2c_base]=$last
  URL[rl_h2c_base]="http://127.0.0.1:$RLBASE/"
  DESC[rl_h2c_base]="rl-tproxy h2 → h2c, unprotected, BASE_BIN ($(basename "$BASE_BIN"))"
  rows=(direct nginx_grpc rl_h2c_base rl_h2c rl_h2c_adm nginx_h1 rl_h1)
fi
for r in "${rows[@]}"; do wait_h2 "${URL[$r]}"; done

cpu_ticks() { # utime+stime of a pid and its children (nginx master + worker)
  local t=0 p
  for p in $1 $(cat /proc/"$1"/task/*/children 2>/dev/null); do
    t=$((t + $(awk '{print $14 + $15}' /proc/"$p"/stat 2>/dev/null || echo 0)))
  done
  echo "$t"
}
HZ=$(getconf CLK_TCK)
declare -A RES
for round in $(seq 1 "$ROUNDS"); do
  for r in "${rows[@]}"; do
    before=$(cpu_ticks "${PID[$r]}")
    out=$(taskset -c "$CLIENT_CPU" $H2LOAD "${URL[$r]}" 2>&1)
    after=$(cpu_ticks "${PID[$r]}")
    rps=$(awk '/^finished in/ {gsub(",","",$4); print $4}' <<<"$out")
    done_n=$(awk '/^requests:/ {print $8}' <<<"$out")
    ok=$(awk '/^status codes:/ {print $3}' <<<"$out")
    mean=$(awk '/^time for request:/ {print $6}' <<<"$out")
    cpu_us=$(python3 -c "print(round(($after-$before)*1e6/$HZ/max(1,$done_n),2))")
    RES[$r,$round]="$rps $cpu_us $mean $done_n $ok"
    echo "round $round $r: $rps req/s, $cpu_us CPU-µs/req, mean $mean, 2xx $ok, succeeded $done_n" >&2
  done
done

median_row() { # prints "rps cpu mean done ok" of the median-rps round
  local r=$1 i
  for i in $(seq 1 "$ROUNDS"); do echo "${RES[$r,$i]}"; done | sort -n -k1 | awk -v n="$ROUNDS" 'NR==int((n+1)/2)'
}
ref=$(median_row nginx_grpc | awk '{print $1}')
ref1=$(median_row nginx_h1 | awk '{print $1}')
{
  echo "# HTTP/2 side by side (h2load)"
  echo
  echo "Generated by \`make bench\` (test/bench/h2.sh) on $(date -u +%Y-%m-%d), $(nproc) CPUs, $(uname -r)."
  echo
  echo "| row | what | req/s | vs nginx (same upstream protocol) | CPU µs/req (front) | mean latency | 2xx / succeeded |"
  echo "|---|---|---|---|---|---|---|"
  for r in "${rows[@]}"; do
    read -r rps cpu mean done_n ok <<<"$(median_row "$r")"
    base=$ref
    if [ "$r" = nginx_h1 ] || [ "$r" = rl_h1 ]; then base=$ref1; fi
    ratio=$(python3 -c "print(f'{$rps/$base:.2f}x')")
    [ "$r" = direct ] && ratio="-"
    echo "| $r | ${DESC[$r]} | $rps | $ratio | $cpu | $mean | $ok / $done_n |"
  done
  echo
  echo "- client: \`taskset -c $CLIENT_CPU $H2LOAD URL\` (h2c prior knowledge; $CONNS connections × $STREAMS concurrent streams, ${DURATION}s)"
  echo "- servers \`taskset -c $SERVER_CPU\`: nginx $(nginx -v 2>&1 | sed 's/.*\///') 1 worker each (front and upstream), rl-tproxy GOMAXPROCS=1; body 612 bytes; access logs off"
  echo "- $ROUNDS alternating rounds; each row shows its median round. CPU µs/req is the front process's (nginx master + worker, or rl-tproxy whole) utime+stime over the h2load run divided by succeeded requests; the shared upstream nginx is not counted"
  echo "- ratio: rl_h2c / rl_h2c_adm against nginx_grpc (both speak h2c upstream); rl_h1 against nginx_h1 (both HTTP/1.1 upstream)"
  if [ -n "$BASE_BIN" ]; then echo "- rl_h2c_base: the same service on \`BASE_BIN\` (another build), to compare builds in one run"; fi
} >"$OUT"
echo "wrote $OUT" >&2
