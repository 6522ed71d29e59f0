#!/usr/bin/env bash
# Side-by-side HTTP benchmark (`make bench`): one run on this machine, every
# setup pinned alike, wrk against
#   direct      nginx serving a 612-byte static body (the backend of all rows)
#   proxy_pass  nginx proxy_pass, upstream keepalive            -> backend
#   limit_req   the proxy_pass server plus limit_req at a rate that never
#               denies (the cost of the check)                  -> backend
#   haproxy     HAProxy 2.x, mode http, keep-alive + http-reuse -> backend
#   caddy       Caddy 2 reverse_proxy (the Go peer), keep-alive  -> backend
#   unprotected rl-tproxy listener mode, location without admission -> backend
#   admission   rl-tproxy listener mode, every request admitted by the
#               embedded RateLimitly server on loopback (zone never denies)
#   admission_xff  the admission row with `client_address: {from:
#               x-forwarded-for, trusted: [127.0.0.1/32]}`, wrk sending
#               `X-Forwarded-For: 203.0.113.7` (the client the zone keys
#               on): the cost of naming the client behind a balancer
#               (ONLY="admission admission_xff" compares the two)
#   pkgproxy    test/bench/proxy/proxy: pkg/proxy alone, no hook (what the
#               rl-tproxy rows add on top: policy match, hook, abort watcher)
#   pkghook     the same with an allow-all Hook (-hook): the hook plumbing and
#               the client-abort watcher without any policy work
#   pkgloop, pkglhook  pkgproxy and pkghook on pkg/proxy's event-loop path
#               (-event-loops 1)
#   evproto     test/bench/evproto, the event-loop measurement prototype
#               (no strictness, no admission; a floor, not a product row)
#   evuring     the same prototype on io_uring (-mode uring)
#   evstrict, evustrict  both prototypes with -strict (pkg/httpparse parses
#               both heads, as the data path does)
#   steered     rl-tproxy with admission, steered by sk_lookup: nginx on :80
#               and the proxy (`port: 80`) in a "node" netns, wrk in a
#               "client" netns over a veth (root only; with a reference row
#               `veth direct` = wrk -> the same nginx on :8080, not steered)
#
# Pinning: every server process (nginx: 1 worker; HAProxy: 1 thread;
# rl-tproxy: GOMAXPROCS=1, embedded RateLimitly in the same process) runs on
# CPU $SERVER_CPU; wrk runs on CPU $CLIENT_CPU. Rounds alternate the rows to
# spread machine noise, even rounds in reverse order (ABBA: a drift over a
# round does not favour the rows measured first); each row reports the
# round with the median req/s and the ratio to nginx proxy_pass, and the
# medians over the rounds of p50/p99 (wrk --latency) and of the perf counts.
# The ratios that decide the issue's bars are also given paired: the two
# rows' req/s in each round, and the median of those ratios.
# Access logs are off everywhere (rl-tproxy: --log-level warn).
#
# Per row, `perf stat -e raw_syscalls:sys_enter,task-clock,context-switches
# -p PIDS` counts the serving process(es) alone (nginx: master + worker) for
# exactly the wrk run: system calls, context switches and CPU µs per
# request. Then one request at a time (wrk -c1) against the backend, nginx
# proxy_pass and both rl-tproxy rows (latency added per hop; also paired:
# the per-round difference between two rows and its median), and memory per
# idle keep-alive connection (IDLE_CONNS connections, RSS delta / N) for
# nginx proxy_pass and rl-tproxy.
#
# Assumes bin/rl-tproxy is built (`make build`) and nginx, haproxy, wrk,
# curl, taskset are installed (`make deps`). Writes $OUT (Markdown).
#
# Env: DURATION=10s CONNS=64 THREADS=1 ROUNDS=5 SERVER_CPU=1 CLIENT_CPU=0
#      (5 rounds: ratios near their bar, such as admission against
#      limit_req, flip with one disturbed round of 3)
#      OUT=docs/bench/sidebyside.md BIN=bin/rl-tproxy STEERED=1 (0 skips it)
#      EVPROTO=1 (0 skips the prototype row) SERIAL=1 (0 skips the -c1 pass)
#      SERIAL_ROUNDS=5 SERIAL_DURATION=6s (the -c1 pass: more, shorter
#      rounds than -c64, alternating like them; its bars are differences of
#      tens of µs between rows whose p50 moves by as much between rounds)
#      IDLE_CONNS=10000 (0 skips the idle-memory pass) IDLE_SETTLE=3 (s)
#      RESULTS=OUT with .tsv (the rows for test/bench/charts.sh, which draws
#      sidebyside-*.svg beside OUT with gnuplot)
#      ONLY="row row..." measures only these rows (proxy_pass is always
#      kept as the reference; e.g. ONLY="evproto evuring" CONNS=256)
#      BIN_OLD=path: a second rl-tproxy build measured beside BIN in the
#      same run (rows unprotected_old, admission_old; e.g. main before a
#      change: ONLY="unprotected admission unprotected_old admission_old")
#      FLAME=1 (0 skips the flame graphs: perf record -g during one more wrk
#      run per row in FLAME_ROWS, SVGs written to FLAME_DIR=docs/bench)
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-10s}
CONNS=${CONNS:-64}
THREADS=${THREADS:-1}
ROUNDS=${ROUNDS:-5}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
OUT_GIVEN=${OUT:-}
OUT=${OUT:-docs/bench/sidebyside.md}
BIN=${BIN:-bin/rl-tproxy}
STEERED=${STEERED:-1}
EVPROTO=${EVPROTO:-1}
SERIAL=${SERIAL:-1}
SERIAL_ROUNDS=${SERIAL_ROUNDS:-5}
SERIAL_DURATION=${SERIAL_DURATION:-6s}
IDLE_CONNS=${IDLE_CONNS:-10000}
IDLE_SETTLE=${IDLE_SETTLE:-3}
FLAME=${FLAME:-1}
FLAME_DIR=${FLAME_DIR:-docs/bench}
FLAME_ROWS=${FLAME_ROWS:-proxy_pass unprotected admission evproto evuring}
if [ "$(nproc)" -lt 2 ]; then SERVER_CPU=0 CLIENT_CPU=0; fi
WRK="wrk -t$THREADS -c$CONNS -d$DURATION --latency --timeout 10s"

for tool in nginx haproxy caddy perf wrk curl taskset python3 go gnuplot; do
  command -v "$tool" >/dev/null || { echo "run.sh: needs $tool (make deps installs it)" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "run.sh: $BIN missing (make build)" >&2; exit 1; }
BIN=$(realpath "$BIN")
BIN_OLD=${BIN_OLD:-}
if [ -n "$BIN_OLD" ]; then
  [ -x "$BIN_OLD" ] || { echo "run.sh: BIN_OLD=$BIN_OLD is not executable" >&2; exit 1; }
  BIN_OLD=$(realpath "$BIN_OLD")
fi
if [ "$IDLE_CONNS" -gt 0 ]; then
  # Each server holds IDLE_CONNS sockets: raise the soft limit as far as allowed.
  ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
  if [ "$(ulimit -n)" -lt $((IDLE_CONNS + 1000)) ]; then
    echo "run.sh: ulimit -n is $(ulimit -n), need $((IDLE_CONNS + 1000)) for IDLE_CONNS=$IDLE_CONNS" >&2; exit 1
  fi
fi
NOFILE=$(ulimit -n)

work=$(mktemp -d /tmp/rl-sidebyside.XXXXXX)
pids=()
NS_NODE="rlbench-node-$$"
NS_CLI="rlbench-cli-$$"
netns_made=0
cleanup() {
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  if [ "$netns_made" = 1 ]; then
    # Remove the pinned sk_lookup program, link and maps of the node netns.
    nsenter --net="/run/netns/$NS_NODE" "$BIN" redirect detach >/dev/null 2>&1
    ip netns del "$NS_CLI" 2>/dev/null
    ip netns del "$NS_NODE" 2>/dev/null
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
# wait_http URL [ns]: bounded readiness poll (curl answers 2xx).
wait_http() {
  local pre=()
  [ -n "${2:-}" ] && pre=(nsenter --net="/run/netns/$2")
  for _ in $(seq 1 1000); do
    if "${pre[@]}" curl -fsS -o /dev/null --max-time 2 "$1" 2>/dev/null; then return 0; fi
    sleep 0.02
  done
  echo "run.sh: $1 not answering 2xx" >&2
  exit 1
}

user_line=""; [ "$(id -u)" = 0 ] && user_line="user root;"
mkdir -p "$work/www"
head -c 612 /dev/zero | tr '\0' 'x' >"$work/www/index.html" # nginx default page size

nginx_conf() { # $1 dir, $2 http-level body
  mkdir -p "$1"
  cat >"$1/nginx.conf" <<EOF
$user_line
daemon off;
worker_processes 1;
pid $1/nginx.pid;
error_log $1/error.log warn;
worker_rlimit_nofile $NOFILE;
events { worker_connections $((NOFILE - 100)); }
http {
    access_log off;
    keepalive_timeout 300s;
    keepalive_requests 1000000;
    client_body_temp_path $1/tmp_body;
    proxy_temp_path $1/tmp_proxy;
    fastcgi_temp_path $1/tmp_fcgi;
    uwsgi_temp_path $1/tmp_uwsgi;
    scgi_temp_path $1/tmp_scgi;
    $2
}
EOF
}
proxy_loc='proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection "";
        proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;'

BACKEND=$(free_port); NGXPROXY=$(free_port); NGXLIMIT=$(free_port); HAPROXY=$(free_port)
RLOPEN=$(free_port); RLADM=$(free_port); RLXFF=$(free_port); RLADMIN=$(free_port); CADDY=$(free_port); EVP=$(free_port); EVU=$(free_port); EVPS=$(free_port); EVUS=$(free_port); PKGP=$(free_port); PKGH=$(free_port)

nginx_conf "$work/backend" "server { listen 127.0.0.1:$BACKEND; root $work/www; open_file_cache max=16; location / { index index.html; } }"
nginx_conf "$work/nproxy" "upstream backend { server 127.0.0.1:$BACKEND; keepalive 64; }
    server { listen 127.0.0.1:$NGXPROXY; location / { $proxy_loc } }"
# limit_req: one key for all of wrk's connections (one client address); the
# rate is far above what this machine reaches, so it never denies.
nginx_conf "$work/nlimit" "upstream backend { server 127.0.0.1:$BACKEND; keepalive 64; }
    limit_req_zone \$binary_remote_addr zone=bench:1m rate=10000000r/s;
    server { listen 127.0.0.1:$NGXLIMIT; location / { limit_req zone=bench burst=100000 nodelay; $proxy_loc } }"

cat >"$work/haproxy.cfg" <<EOF
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    option http-keep-alive
    option forwardfor
    http-reuse always
frontend fe
    bind 127.0.0.1:$HAPROXY
    default_backend be
backend be
    server s1 127.0.0.1:$BACKEND maxconn 64
EOF

# Caddy: reverse_proxy with keep-alive to the backend (X-Forwarded-For is
# Caddy's default); no access log (Caddy logs none unless told to).
mkdir -p "$work/caddy"
cat >"$work/caddy/Caddyfile" <<EOF
{
    admin off
    auto_https off
}
http://127.0.0.1:$CADDY {
    reverse_proxy 127.0.0.1:$BACKEND {
        transport http {
            keepalive 300s
            keepalive_idle_conns_per_host 64
        }
    }
}
EOF

# rl-tproxy: one process, two services (unprotected / admission), embedded
# RateLimitly with a generated key; the zone (one bucket per client address)
# is so large that it always allows.
rl_policy() { # $1 service block
  cat <<EOF
ratelimitly:
  embedded: true
  request_policy: {name: standard, unit: 20ms}
  fail: close
defaults:
  forwarded_headers: {x_forwarded_for: true}
zones:
  huge: {bucket: "bench:{remote_addr}", rate: 4000000000/s, burst: 4000000000}
services:
$1
EOF
}
rl_services() { # $1 unprotected port, $2 admission port, [$3 admission_xff port]
  echo "  - name: open
    listen: 127.0.0.1:$1
    upstream: 127.0.0.1:$BACKEND
    locations:
      - name: open
  - name: adm
    listen: 127.0.0.1:$2
    upstream: 127.0.0.1:$BACKEND
    locations:
      - name: adm
        limit: [huge]"
  [ -n "${3:-}" ] && echo "  - name: adm_xff
    listen: 127.0.0.1:$3
    upstream: 127.0.0.1:$BACKEND
    client_address: {from: x-forwarded-for, trusted: [127.0.0.1/32]}
    locations:
      - name: adm
        limit: [huge]"
  return 0
}
rl_policy "$(rl_services "$RLOPEN" "$RLADM" "$RLXFF")" >"$work/policy.yaml"
"$BIN" check --policy "$work/policy.yaml" >/dev/null

start() { # pinned server in the background; remember its pid (in $last)
  taskset -c "$SERVER_CPU" "$@" &
  last=$!
  pids+=("$last")
}
declare -A URL NS DESC PID WRKARGS
start nginx -p "$work/backend" -c "$work/backend/nginx.conf" -e "$work/backend/error.log"; PID[direct]=$last
start nginx -p "$work/nproxy" -c "$work/nproxy/nginx.conf" -e "$work/nproxy/error.log"; PID[proxy_pass]=$last
start nginx -p "$work/nlimit" -c "$work/nlimit/nginx.conf" -e "$work/nlimit/error.log"; PID[limit_req]=$last
start haproxy -db -f "$work/haproxy.cfg"; PID[haproxy]=$last
start env HOME="$work/caddy" XDG_DATA_HOME="$work/caddy" XDG_CONFIG_HOME="$work/caddy" GOMAXPROCS=1 \
  caddy run --config "$work/caddy/Caddyfile" --adapter caddyfile; PID[caddy]=$last
start env GOMAXPROCS=1 "$BIN" run --policy "$work/policy.yaml" --admin "127.0.0.1:$RLADMIN" --log-level warn --watch=false
PID[unprotected]=$last; PID[admission]=$last; PID[admission_xff]=$last
if [ -n "$BIN_OLD" ]; then
  RLOPEN2=$(free_port); RLADM2=$(free_port); RLADMIN2=$(free_port)
  rl_policy "$(rl_services "$RLOPEN2" "$RLADM2")" >"$work/policy-old.yaml"
  start env GOMAXPROCS=1 "$BIN_OLD" run --policy "$work/policy-old.yaml" --admin "127.0.0.1:$RLADMIN2" --log-level warn --watch=false
  PID[unprotected_old]=$last; PID[admission_old]=$last
fi
go build -trimpath -o "$work/pkgproxy" ./test/bench/proxy/proxy
start env GOMAXPROCS=1 "$work/pkgproxy" -listen "127.0.0.1:$PKGP" -upstream "127.0.0.1:$BACKEND"; PID[pkgproxy]=$last
start env GOMAXPROCS=1 "$work/pkgproxy" -hook -listen "127.0.0.1:$PKGH" -upstream "127.0.0.1:$BACKEND"; PID[pkghook]=$last
PKGL=$(free_port); PKGLH=$(free_port)
start env GOMAXPROCS=1 "$work/pkgproxy" -event-loops 1 -listen "127.0.0.1:$PKGL" -upstream "127.0.0.1:$BACKEND"; PID[pkgloop]=$last
start env GOMAXPROCS=1 "$work/pkgproxy" -event-loops 1 -hook -listen "127.0.0.1:$PKGLH" -upstream "127.0.0.1:$BACKEND"; PID[pkglhook]=$last
ports=("$BACKEND" "$NGXPROXY" "$NGXLIMIT" "$HAPROXY" "$CADDY" "$RLOPEN" "$PKGP" "$PKGH" "$PKGL" "$PKGLH")
if [ "$EVPROTO" = 1 ]; then
  go build -trimpath -o "$work/evproto" ./test/bench/evproto
  start env GOMAXPROCS=1 "$work/evproto" -listen "127.0.0.1:$EVP" -upstream "127.0.0.1:$BACKEND"; PID[evproto]=$last
  start env GOMAXPROCS=1 "$work/evproto" -mode uring -listen "127.0.0.1:$EVU" -upstream "127.0.0.1:$BACKEND"; PID[evuring]=$last
  start env GOMAXPROCS=1 "$work/evproto" -strict -listen "127.0.0.1:$EVPS" -upstream "127.0.0.1:$BACKEND"; PID[evstrict]=$last
  start env GOMAXPROCS=1 "$work/evproto" -strict -mode uring -listen "127.0.0.1:$EVUS" -upstream "127.0.0.1:$BACKEND"; PID[evustrict]=$last
  ports+=("$EVP" "$EVU" "$EVPS" "$EVUS")
fi
for port in "${ports[@]}"; do wait_http "http://127.0.0.1:$port/"; done
wait_http "http://127.0.0.1:$RLADMIN/readyz"
wait_http "http://127.0.0.1:$RLADM/"
wait_http "http://127.0.0.1:$RLXFF/"
if [ -n "$BIN_OLD" ]; then
  wait_http "http://127.0.0.1:$RLADMIN2/readyz"; wait_http "http://127.0.0.1:$RLOPEN2/"; wait_http "http://127.0.0.1:$RLADM2/"
fi

rows=(direct proxy_pass limit_req haproxy caddy unprotected admission admission_xff pkgproxy pkghook pkgloop pkglhook)
URL[direct]="http://127.0.0.1:$BACKEND/";      DESC[direct]="nginx static backend, direct"
URL[proxy_pass]="http://127.0.0.1:$NGXPROXY/"; DESC[proxy_pass]="nginx proxy_pass, upstream keepalive"
URL[limit_req]="http://127.0.0.1:$NGXLIMIT/";  DESC[limit_req]="nginx proxy_pass + limit_req (never denies)"
URL[haproxy]="http://127.0.0.1:$HAPROXY/";     DESC[haproxy]="HAProxy, http mode, keep-alive to backend"
URL[caddy]="http://127.0.0.1:$CADDY/";         DESC[caddy]="Caddy $(caddy version | awk '{print $1}') reverse_proxy, keep-alive to backend"
URL[unprotected]="http://127.0.0.1:$RLOPEN/";  DESC[unprotected]="rl-tproxy, unprotected location"
URL[admission]="http://127.0.0.1:$RLADM/";     DESC[admission]="rl-tproxy + admission (embedded RateLimitly)"
URL[admission_xff]="http://127.0.0.1:$RLXFF/"; DESC[admission_xff]="rl-tproxy + admission, client_address from X-Forwarded-For (wrk sends one)"
WRKARGS[admission_xff]="-H X-Forwarded-For:203.0.113.7"
URL[pkgproxy]="http://127.0.0.1:$PKGP/"; DESC[pkgproxy]="pkg/proxy alone (test/bench/proxy/proxy: no hook, no policy)"
URL[pkghook]="http://127.0.0.1:$PKGH/"; DESC[pkghook]="pkg/proxy with an allow-all hook (test/bench/proxy/proxy -hook)"
URL[pkgloop]="http://127.0.0.1:$PKGL/"; DESC[pkgloop]="pkg/proxy on event loops, no hook (-event-loops 1)"
URL[pkglhook]="http://127.0.0.1:$PKGLH/"; DESC[pkglhook]="pkg/proxy on event loops, allow-all hook (-event-loops 1 -hook)"
if [ "$EVPROTO" = 1 ]; then
  URL[evproto]="http://127.0.0.1:$EVP/"; DESC[evproto]="prototype: test/bench/evproto (epoll loop, no strictness/admission)"
  URL[evuring]="http://127.0.0.1:$EVU/"; DESC[evuring]="prototype on io_uring: test/bench/evproto -mode uring"
  URL[evstrict]="http://127.0.0.1:$EVPS/"; DESC[evstrict]="prototype, epoll, strict (-strict: pkg/httpparse on both heads)"
  URL[evustrict]="http://127.0.0.1:$EVUS/"; DESC[evustrict]="prototype, io_uring, strict (-mode uring -strict)"
  rows+=(evproto evuring evstrict evustrict)
fi

if [ -n "$BIN_OLD" ]; then
  URL[unprotected_old]="http://127.0.0.1:$RLOPEN2/"; DESC[unprotected_old]="rl-tproxy, unprotected location, BIN_OLD build"
  URL[admission_old]="http://127.0.0.1:$RLADM2/";    DESC[admission_old]="rl-tproxy + admission, BIN_OLD build"
  rows+=(unprotected_old admission_old)
fi

if [ -n "${ONLY:-}" ]; then
  keep=(proxy_pass)
  for row in "${rows[@]}"; do [[ " $ONLY " == *" $row "* && $row != proxy_pass ]] && keep+=("$row"); done
  rows=("${keep[@]}")
  STEERED=0 SERIAL=0 IDLE_CONNS=0 FLAME=0
  # A partial run does not replace the committed write-ups unless OUT says so.
  [ -z "$OUT_GIVEN" ] && OUT=$work/partial.md
fi
steer_note=""
if [ "$STEERED" != 1 ]; then
  steer_note="steered row skipped: STEERED=$STEERED"
elif [ "$(id -u)" != 0 ]; then
  steer_note="steered row skipped: needs root (network namespaces, eBPF sk_lookup)"
else
  ip netns add "$NS_NODE"; ip netns add "$NS_CLI"; netns_made=1
  ip link add "rlbn$$" type veth peer name "rlbc$$"
  ip link set "rlbn$$" netns "$NS_NODE"; ip link set "rlbc$$" netns "$NS_CLI"
  ip -n "$NS_NODE" addr add 10.213.0.1/24 dev "rlbn$$"; ip -n "$NS_CLI" addr add 10.213.0.2/24 dev "rlbc$$"
  for ns in "$NS_NODE" "$NS_CLI"; do ip -n "$ns" link set lo up; done
  ip -n "$NS_NODE" link set "rlbn$$" up; ip -n "$NS_CLI" link set "rlbc$$" up
  # nginx on :80 (steered) and :8080 (not steered: the veth reference).
  nginx_conf "$work/nsbackend" "server { listen 0.0.0.0:80; listen 0.0.0.0:8080; root $work/www; open_file_cache max=16; location / { index index.html; } }"
  rl_policy "  - name: web
    port: 80
    upstream: 127.0.0.1:80
    locations:
      - name: adm
        limit: [huge]" >"$work/steered.yaml"
  # nsenter --net keeps the host's mount namespace (bpffs at /sys/fs/bpf).
  start nsenter --net="/run/netns/$NS_NODE" nginx -p "$work/nsbackend" -c "$work/nsbackend/nginx.conf" -e "$work/nsbackend/error.log"
  PID[veth]=$last
  wait_http "http://10.213.0.1:8080/" "$NS_CLI"
  start nsenter --net="/run/netns/$NS_NODE" env GOMAXPROCS=1 "$BIN" run --policy "$work/steered.yaml" --admin 127.0.0.1:9901 --log-level warn --watch=false
  PID[steered]=$last
  wait_http "http://127.0.0.1:9901/readyz" "$NS_NODE"
  # Steering is in place once the proxy counts a steered lookup.
  steered_ok=0
  for _ in $(seq 1 500); do
    nsenter --net="/run/netns/$NS_CLI" curl -fsS -o /dev/null --max-time 2 http://10.213.0.1/ || true
    m=$(nsenter --net="/run/netns/$NS_NODE" curl -fsS --max-time 2 http://127.0.0.1:9901/metrics || true)
    if grep -Eq '^rl_tproxy_redirect_lookups_total\{result="steered"\} [1-9]' <<<"$m"; then steered_ok=1; break; fi
    sleep 0.02
  done
  [ "$steered_ok" = 1 ] || { echo "run.sh: steering never took effect" >&2; exit 1; }
  URL[veth]="http://10.213.0.1:8080/"; NS[veth]=$NS_CLI; DESC[veth]="veth direct: nginx :8080 in the node netns, not steered (reference)"
  URL[steered]="http://10.213.0.1/"; NS[steered]=$NS_CLI; DESC[steered]="rl-tproxy + admission, sk_lookup steered (netns, veth)"
  rows+=(veth steered)
fi

# pidlist PID -> "PID,child,..." (nginx master + worker)
pidlist() { { echo "$1"; pgrep -P "$1" || true; } | paste -sd, -; }
rss_kb() { # summed VmRSS of a process and its children
  local total=0 p
  for p in $(pidlist "$1" | tr ',' ' '); do total=$((total + $(awk '/VmRSS/ {print $2}' "/proc/$p/status"))); done
  echo "$total"
}
to_ms() { # wrk latency ("612.00us", "1.23ms", "1.02s") -> ms
  awk -v v="$1" 'BEGIN { if (v ~ /us$/) printf "%.3f", v*0.001; else if (v ~ /ms$/) printf "%.3f", v+0; else if (v ~ /s$/) printf "%.3f", v*1000; else print "?" }'
}
# run_wrk ROW [CONNS] -> "req/s p50ms p99ms errors cpu_us/req syscalls/req ctxsw/req"
# (non-2xx answers and socket errors are counted). perf stat counts the
# row's server process(es) for exactly the wrk run.
run_wrk() {
  local row=$1 conns=${2:-$CONNS} dur=${3:-$DURATION} out pre=() pf="$work/perf.out" perfpid
  [ -n "${NS[$row]:-}" ] && pre=(nsenter --net="/run/netns/${NS[$row]}")
  perf stat -x, -e raw_syscalls:sys_enter,task-clock,context-switches -p "$(pidlist "${PID[$row]}")" -o "$pf" &
  perfpid=$!
  # shellcheck disable=SC2086 # WRKARGS: the row's extra wrk words
  out=$("${pre[@]}" taskset -c "$CLIENT_CPU" wrk -t"$THREADS" -c"$conns" -d"$dur" --latency --timeout 10s ${WRKARGS[$row]:-} "${URL[$row]}")
  kill -INT "$perfpid"; wait "$perfpid" || true
  if grep -Eq 'Non-2xx|Socket errors' <<<"$out"; then
    echo "  $row: $(grep -E 'Non-2xx|Socket errors' <<<"$out" | sed 's/^ *//' | tr '\n' ' ')" >&2
  fi
  local rps p50 p99 non2xx sockerr n
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(to_ms "$(awk '$1=="50%" {print $2}' <<<"$out")")
  p99=$(to_ms "$(awk '$1=="99%" {print $2}' <<<"$out")")
  non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out"); non2xx=${non2xx:-0}
  sockerr=$(awk -F'[ ,]+' '/Socket errors/ {print $4+$6+$8+$10}' <<<"$out"); sockerr=${sockerr:-0}
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  echo "$rps $p50 $p99 $((non2xx + sockerr)) $(awk -F, -v n="$n" '
    /raw_syscalls/ {s = $1} /task-clock/ {t = $1} /context-switches/ {c = $1}
    END {printf "%.1f %.2f %.3f", t * 1000 / n, s / n, c / n}' "$pf")"
}

# outcomes: non-zero rl_tproxy_requests_total by outcome, from a scrape on stdin.
outcomes() {
  awk '/^rl_tproxy_requests_total\{/ { match($0, /outcome="[a-z_]+"/); o = substr($0, RSTART + 9, RLENGTH - 10); s[o] += $2 }
       END { for (o in s) if (s[o] > 0) printf "%s %d, ", o, s[o] }' | sed 's/, $//'
}

declare -A RES SRES
measure() { # rows... : ROUNDS alternating rounds
  local r row order
  for r in $(seq 1 "$ROUNDS"); do
    local line="round $r:"
    # Even rounds run the rows in reverse (ABBA): a drift of the machine
    # over a round does not favour the rows that come first.
    order=("$@")
    if [ $((r % 2)) = 0 ]; then
      local i; order=(); for ((i = $#; i >= 1; i--)); do order+=("${!i}"); done
    fi
    for row in "${order[@]}"; do
      local res
      res=$(run_wrk "$row")
      RES[$row]+="$res;"
      line+=" $row ${res%% *}"
    done
    echo "$line req/s"
  done
}
measure_serial() { # rows... : SERIAL_ROUNDS rounds of wrk -c1, ABBA
  local r row order i
  for r in $(seq 1 "$SERIAL_ROUNDS"); do
    order=("$@")
    if [ $((r % 2)) = 0 ]; then
      order=(); for ((i = $#; i >= 1; i--)); do order+=("${!i}"); done
    fi
    for row in "${order[@]}"; do SRES[$row]+="$(run_wrk "$row" 1 "$SERIAL_DURATION");"; done
  done
}

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "machine: $(nproc) CPUs ($(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)), kernel $(uname -r), load $load_before"
echo "$WRK, $ROUNDS alternating rounds; servers on CPU $SERVER_CPU, wrk on CPU $CLIENT_CPU"
measure "${rows[@]}"
# The rows the bars compare run next to each other in every round.
serial_rows=(direct unprotected admission proxy_pass pkgproxy pkgloop)
[ "$EVPROTO" = 1 ] && serial_rows+=(evproto evuring)
[ "$SERIAL" = 1 ] && measure_serial "${serial_rows[@]}"
if [ -n "${URL[steered]:-}" ]; then
  steered_outcomes=$(nsenter --net="/run/netns/$NS_NODE" curl -fsS http://127.0.0.1:9901/metrics | outcomes)
  echo "steered rl-tproxy outcomes: $steered_outcomes"
fi
listener_outcomes=$(curl -fsS "http://127.0.0.1:$RLADMIN/metrics" | outcomes)
echo "listener-mode rl-tproxy outcomes: $listener_outcomes"

idle_mem() { # ROW -> "KiB-before KiB-after bytes/conn"
  local row=$1 fifo="$work/idle.fifo.$1" before after cpid
  rm -f "$fifo"; mkfifo "$fifo"
  before=$(rss_kb "${PID[$row]}")
  local addr=${URL[$row]#http://}
  taskset -c "$CLIENT_CPU" "$work/idleconns" -addr "${addr%/}" -n "$IDLE_CONNS" <"$fifo" >"$work/idle.out.$row" &
  cpid=$!
  exec 4>"$fifo"
  for _ in $(seq 1 1200); do
    grep -q ready "$work/idle.out.$row" 2>/dev/null && break
    kill -0 "$cpid" 2>/dev/null || { echo "run.sh: idleconns failed against $row" >&2; exit 1; }
    sleep 0.1
  done
  grep -q ready "$work/idle.out.$row" || { echo "run.sh: idleconns not ready against $row" >&2; exit 1; }
  sleep "$IDLE_SETTLE" # rl-tproxy parks idle connections after 100 ms
  after=$(rss_kb "${PID[$row]}")
  exec 4>&-
  wait "$cpid" || true
  awk -v b="$before" -v a="$after" -v n="$IDLE_CONNS" 'BEGIN {printf "%d %d %.0f", b, a, (a - b) * 1024 / n}'
}
# flame ROW: perf record -g on the row's server during one wrk run, then
# test/bench/flame writes $FLAME_DIR/flame-ROW.svg and prints the top self
# time.
declare -A FLAMETOP
flame() {
  local row=$1 pd="$work/perf.data" rec
  perf record -q -F 997 -g -o "$pd" -p "$(pidlist "${PID[$row]}")" &
  rec=$!
  taskset -c "$CLIENT_CPU" $WRK "${URL[$row]}" >/dev/null
  kill -INT "$rec"; wait "$rec" || true
  FLAMETOP[$row]=$(perf script -i "$pd" 2>/dev/null | "$work/flame" -title "${DESC[$row]} (wrk -c$CONNS)" -o "$FLAME_DIR/flame-$row.svg" -top 12)
}
if [ "$FLAME" = 1 ]; then
  go build -trimpath -o "$work/flame" ./test/bench/flame
  for row in $FLAME_ROWS; do
    [ -n "${URL[$row]:-}" ] || continue
    flame "$row"; echo "flame $row: $FLAME_DIR/flame-$row.svg"
  done
fi

declare -A IDLE
idle_rows=(proxy_pass unprotected pkgproxy pkgloop)
[ "$EVPROTO" = 1 ] && idle_rows+=(evproto evuring)
if [ "$IDLE_CONNS" -gt 0 ]; then
  go build -trimpath -o "$work/idleconns" ./test/bench/proxy/idleconns
  for row in "${idle_rows[@]}"; do IDLE[$row]=$(idle_mem "$row"); echo "idle $row: ${IDLE[$row]}"; done
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

pick() { # row [assoc] -> the round with the median req/s
  local -n src=${2:-RES}
  tr ';' '\n' <<<"${src[$1]}" | sed '/^$/d' | sort -g -k1,1 | awk '{a[NR]=$0} END {print a[int((NR+1)/2)]}'
}
median_col() { # row col [assoc] -> median of that column over the rounds
  local -n srcm=${3:-RES}
  tr ';' '\n' <<<"${srcm[$1]}" | sed '/^$/d' | awk -v c="$2" '{print $c}' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
base=$(pick proxy_pass | cut -d' ' -f1)
basecpu=$(median_col proxy_pass 5)
table="| setup | req/s (median of $ROUNDS) | p50 ms | p99 ms | req/s vs nginx proxy_pass | CPU µs/req | CPU vs proxy_pass | syscalls/req | ctx switches/req | errors/non-2xx |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for row in "${rows[@]}"; do
  read -r rps _ _ errs _ <<<"$(pick "$row")"
  p50=$(median_col "$row" 2); p99=$(median_col "$row" 3)
  cpu=$(median_col "$row" 5); sys=$(median_col "$row" 6); cs=$(median_col "$row" 7)
  ratio=$(awk -v a="$rps" -v b="$base" 'BEGIN {printf "%.2f", a/b}')
  cratio=$(awk -v a="$cpu" -v b="$basecpu" 'BEGIN {printf "%.2f", a/b}')
  table+="
| ${DESC[$row]} | $rps | $p50 | $p99 | $ratio | $cpu | $cratio | $sys | $cs | $errs |"
done
# paired ROW BASE: ROW's req/s over BASE's in each round (both measured in
# the same round), and their median: the ratio least moved by the machine's
# drift between rounds.
paired() { # ROW BASE [COL NAME]: req/s (column 1) unless COL says
  [ -n "${RES[$1]:-}" ] && [ -n "${RES[$2]:-}" ] || return 0
  local ratios col=${3:-1} what=${4:+ $4}
  ratios=$(paste -d' ' <(tr ';' '\n' <<<"${RES[$1]}" | sed '/^$/d' | cut -d' ' -f"$col") \
    <(tr ';' '\n' <<<"${RES[$2]}" | sed '/^$/d' | cut -d' ' -f"$col") | awk '{printf "%.3f\n", $1 / $2}')
  echo "- $1 ÷ $2$what, per round: $(paste -sd, <<<"$ratios" | sed 's/,/, /g'); median $(sort -g <<<"$ratios" | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')"
}
pairs=""
for pr in "unprotected proxy_pass" "admission limit_req" "unprotected unprotected_old" "admission admission_old" "admission_xff admission"; do
  # shellcheck disable=SC2086 # two row names
  l=$(paired $pr); [ -n "$l" ] && pairs+="$l"$'\n'
done
# The client_address bar is on CPU per request: paired like req/s.
l=$(paired admission_xff admission 5 "CPU µs/req"); [ -n "$l" ] && pairs+="$l"$'\n'
pairs=${pairs%$'\n'}
[ -n "$pairs" ] && table+="

req/s ratios paired within each round:
$pairs"
# paired_diff ROW BASE COL NAME: ROW's column COL (ms) minus BASE's in
# each -c1 round, in µs, and their median: the difference least moved by
# the machine's drift between rounds.
paired_diff() {
  [ -n "${SRES[$1]:-}" ] && [ -n "${SRES[$2]:-}" ] || return 0
  local diffs
  diffs=$(paste -d' ' <(tr ';' '\n' <<<"${SRES[$1]}" | sed '/^$/d' | cut -d' ' -f"$3") \
    <(tr ';' '\n' <<<"${SRES[$2]}" | sed '/^$/d' | cut -d' ' -f"$3") | awk '{printf "%+.0f\n", ($1 - $2) * 1000}')
  echo "- $1 − $2, $4, per round: $(paste -sd, <<<"$diffs" | sed 's/,/, /g'); median $(sort -g <<<"$diffs" | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')"
}
serial=""
if [ "$SERIAL" = 1 ]; then
  # Every column is its median over the rounds: a single request's latency
  # suffers most from the other jobs on a shared machine.
  d50=$(median_col direct 2 SRES)
  serial="| setup (wrk -c1, one request at a time; medians of $SERIAL_ROUNDS rounds of $SERIAL_DURATION) | req/s | p50 ms | p99 ms | p50 added over backend direct ms | CPU µs/req | syscalls/req |
|---|---:|---:|---:|---:|---:|---:|"
  for row in "${serial_rows[@]}"; do
    rps=$(median_col "$row" 1 SRES); p50=$(median_col "$row" 2 SRES); p99=$(median_col "$row" 3 SRES)
    cpu=$(median_col "$row" 5 SRES); sys=$(median_col "$row" 6 SRES)
    serial+="
| ${DESC[$row]} | $rps | $p50 | $p99 | $(awk -v a="$p50" -v b="$d50" 'BEGIN {printf "%+.3f", a-b}') | $cpu | $sys |"
  done
  u50=$(median_col unprotected 2 SRES); u99=$(median_col unprotected 3 SRES)
  a50=$(median_col admission 2 SRES); a99=$(median_col admission 3 SRES)
  serial+="

admission over unprotected, one request at a time: p50 $(awk -v a="$a50" -v b="$u50" 'BEGIN {printf "%+.0f µs", (a-b)*1000}'), p99 $(awk -v a="$a99" -v b="$u99" 'BEGIN {printf "%+.0f µs", (a-b)*1000}') (medians over the rounds)

latency added, paired within each round (µs; the two rows measured in the same round, back to back):
$(paired_diff unprotected direct 2 p50)
$(paired_diff proxy_pass direct 2 p50)
$(paired_diff admission unprotected 2 p50)
$(paired_diff admission unprotected 3 p99)"
fi
idle=""
if [ "$IDLE_CONNS" -gt 0 ]; then
  idle="| memory per idle keep-alive connection ($IDLE_CONNS idle, RSS delta / N) | RSS before KiB | RSS after KiB | bytes/conn |
|---|---:|---:|---:|"
  for row in "${idle_rows[@]}"; do
    read -r b a per <<<"${IDLE[$row]}"
    idle+="
| ${DESC[$row]} | $b | $a | $per |"
  done
fi
echo
echo "$table"
[ -n "$serial" ] && { echo; echo "$serial"; }
[ -n "$idle" ] && { echo; echo "$idle"; }
[ -n "$steer_note" ] && echo "$steer_note"

# idle_desc names the cpuidle driver and, for haltpoll, its poll bound.
idle_desc() {
  local d=/sys/devices/system/cpu/cpuidle p=/sys/module/haltpoll/parameters/guest_halt_poll_ns
  local drv gov
  drv=$(cat $d/current_driver 2>/dev/null || echo none)
  gov=$(cat $d/current_governor 2>/dev/null || cat $d/current_governor_ro 2>/dev/null || echo none)
  if [ -r "$p" ]; then
    echo "driver $drv, governor $gov, guest_halt_poll_ns $(cat $p)"
  else
    echo "driver $drv, governor $gov"
  fi
}

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain -- cmd pkg internal 2>/dev/null | grep -q . && echo " (working tree had uncommitted changes in cmd/pkg/internal)" || true)
{
  echo "# Side-by-side benchmark"
  echo
  echo "Written by \`test/bench/run.sh\` (\`make bench\`); do not edit by hand."
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- commit: $commit$dirty"
  echo "- kernel: $(uname -r); CPU: $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo), $(nproc) CPUs"
  echo "- load average before/after: $load_before / $load_after (the machine was shared with other jobs: numbers are noisy)"
  echo "- CPU idle: $(idle_desc) (a virtual CPU that halts without polling first wakes slowly: it dominates the -c1 latencies; docs/bench/evloop.md)"
  echo "- command: \`${ONLY:+ONLY=\"$ONLY\" }${BIN_OLD:+BIN=$BIN BIN_OLD=$BIN_OLD }DURATION=$DURATION CONNS=$CONNS THREADS=$THREADS ROUNDS=$ROUNDS SERIAL_ROUNDS=$SERIAL_ROUNDS SERIAL_DURATION=$SERIAL_DURATION SERVER_CPU=$SERVER_CPU CLIENT_CPU=$CLIENT_CPU test/bench/run.sh\`"
  echo "- wrk: \`taskset -c $CLIENT_CPU $WRK URL\`; servers \`taskset -c $SERVER_CPU\`: nginx $(nginx -v 2>&1 | sed 's/.*\///') 1 worker, $(haproxy -v | awk 'NR==1 {print "HAProxy " $3}') nbthread 1, $(caddy version | awk '{print "Caddy " $1}') GOMAXPROCS=1, rl-tproxy GOMAXPROCS=1 (embedded RateLimitly in the same process)"
  echo "- body: 612 bytes static (nginx default page size); access logs off everywhere (rl-tproxy \`--log-level warn\`)"
  echo "- rounds alternate the rows (even rounds in reverse order); each row shows its median round's req/s; p50, p99, CPU, syscalls and context switches per request are medians over the rounds, from \`perf stat -e raw_syscalls:sys_enter,task-clock,context-switches -p PIDS\` on the row's server process(es) alone (nginx: master + worker; rl-tproxy: the whole process, embedded RateLimitly included) for exactly the wrk run"
  echo
  echo "$table"
  echo
  [ -n "$serial" ] && { echo "$serial"; echo; }
  [ -n "$idle" ] && { echo "$idle"; echo; echo "(\`test/bench/proxy/idleconns\` opens the connections, one GET each, then holds them idle; RSS read ${IDLE_SETTLE}s later.)"; echo; }
  if [ "$FLAME" = 1 ]; then
    echo "Flame graphs (\`perf record -F 997 -g -p PIDS\` during one more wrk run per row, rendered by \`test/bench/flame\`), with each row's functions by self and by inclusive time:"
    echo
    for row in $FLAME_ROWS; do
      [ -n "${FLAMETOP[$row]:-}" ] || continue
      echo "- [${DESC[$row]}](flame-$row.svg)"
      echo
      echo '```'
      echo "${FLAMETOP[$row]}"
      echo '```'
      echo
    done
  fi
  [ -n "$steer_note" ] && { echo "$steer_note"; echo; }
  echo "rl-tproxy admission outcomes over the whole run (\`rl_tproxy_requests_total\`; the rl-tproxy policies use \`fail: close\`, the default unit 20ms, horizon 60ms, so a check that gets no answer in time is a 429 and shows up as \`fail_close\` and in the errors column):"
  echo
  echo "- listener mode (unprotected + admission + admission_xff rows): $listener_outcomes"
  [ -n "${steered_outcomes:-}" ] && echo "- steered: $steered_outcomes"
  echo
  cat <<'EOF'
Rows:

- *nginx proxy_pass* is the reference (ratio 1.00): `upstream { keepalive 64; }`,
  HTTP/1.1 to the backend, `X-Forwarded-For` added.
- *limit_req*: the same server with `limit_req_zone $binary_remote_addr
  rate=10000000r/s` and `limit_req burst=100000 nodelay`: the check runs on
  every request and never denies.
- *HAProxy*: `mode http`, `option http-keep-alive`, `http-reuse always`,
  `option forwardfor`.
- *Caddy*: the Go peer, `reverse_proxy` with `keepalive 300s` and
  `keepalive_idle_conns_per_host 64` (X-Forwarded-For is its default), no
  access log.
- *pkg/proxy alone*: `test/bench/proxy/proxy`, the data path with no
  hook and no policy (X-Forwarded-For on): the difference to *rl-tproxy
  unprotected* is what the product adds per request (location match, the
  hook's Admit/Done with metrics, the client-abort watcher). *with an
  allow-all hook* (`-hook`) adds only the hook plumbing and the watcher.
- *prototype*: `test/bench/evproto`, the measurement prototype of the
  event-loop design (one edge-triggered epoll loop per CPU, `writev` of the
  head with X-Forwarded-For, no EAGAIN round, no per-request `epoll_ctl`).
  It parses nothing strictly and has no admission, body, chunked or timeout
  handling: its row is the floor the system-call pattern allows, not a
  product result.
- *prototype on io_uring*: the same relay with `-mode uring`: multishot
  accept, one multishot recv per socket drawing from a registered
  provided-buffer ring (no buffer per idle connection; a pooled upstream
  connection stays armed, so readiness while idle discards it without a
  peek), writev/send submissions, one `io_uring_enter` per loop turn
  (`SINGLE_ISSUER|DEFER_TASKRUN`).
- *strict* prototype rows: `-strict` parses the request and the response
  head with pkg/httpparse (the data path's parser) instead of scanning for
  the blank line: the prototype's cost with the strictness rules.
- *rl-tproxy unprotected*: a location without `limit`/`guard`: parse, match,
  forward, no RateLimitly request.
- *rl-tproxy + admission*: every request renders the bucket
  `bench:{remote_addr}` and is checked by the embedded RateLimitly server
  over loopback UDP (standard request policy, unit 20ms, sealed datagrams)
  before it is forwarded; the zone is so large that it always allows (the
  script prints the allow count from `/metrics`).
- *admission, client_address from X-Forwarded-For*: the admission row's
  location in a service with `client_address: {from: x-forwarded-for,
  trusted: [127.0.0.1/32]}`; wrk sends `X-Forwarded-For: 203.0.113.7`, so
  every request names its client from the header (the bucket is
  `bench:203.0.113.7`). The paired CPU ratio against *admission* is the
  cost of naming the client behind a balancer.
- *steered*: nginx listens on :80 in a "node" namespace; `rl-tproxy run`
  with `port: 80` attaches the sk_lookup program there; wrk runs in a
  "client" namespace and connects to 10.213.0.1:80 over a veth. *veth
  direct* is the same path before the proxy started (wrk -> nginx :80), so
  compare the steered row with it as well as with the loopback rows.
EOF
} >"$OUT"
echo "wrote $OUT"

# The same rows, machine-readable, and drawn as charts (test/bench/charts.sh).
RESULTS=${RESULTS:-${OUT%.md}.tsv}
{
  printf 'row\tsetup\treq_s\tp50_ms\tp99_ms\tcpu_us_per_req\n'
  for row in "${rows[@]}"; do
    read -r rps p50 p99 _ <<<"$(pick "$row")"
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$row" "${DESC[$row]}" "$rps" "$p50" "$p99" "$(median_col "$row" 5)"
  done
} >"$RESULTS"
test/bench/charts.sh "$RESULTS" "$(dirname "$OUT")"

