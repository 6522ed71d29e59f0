#!/usr/bin/env bash
# Proxy data-path benchmark, one run on one machine with fixed CPU pinning:
#   (a) wrk -> nginx static backend
#   (b) wrk -> nginx proxy_pass (upstream keepalive) -> nginx backend
#   (c) wrk -> rl-tproxy data path (pkg/proxy, no admission) -> nginx backend
# Servers (backend, proxy) run on CPU $SERVER_CPU (nginx: 1 worker each;
# Go: GOMAXPROCS=1), wrk on CPU $CLIENT_CPU. Rounds alternate a,b,c to
# spread machine noise; the median req/s per setup is reported with the
# ratio c/b, and the median CPU time the measured server process (the proxy
# alone for b and c) spent per request, which a shared machine disturbs far
# less than throughput. Then memory per idle keep-alive connection:
# $IDLE_CONNS idle connections (one request each) against (b) and (c),
# RSS delta / N.
#
# Usage: test/bench/proxy.sh            (env: DURATION=5s CONNS=50 ROUNDS=3 (0: memory only)
#                                        IDLE_CONNS=10000 IDLE_SETTLE=3 SERVER_CPU=0 CLIENT_CPU=1
#                                        BASE_PROXY=path: also measure (d), another build of
#                                        test/bench/proxy/proxy, e.g. before a change, in the
#                                        same rounds and with the same pinning)
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-5s}
CONNS=${CONNS:-50}
ROUNDS=${ROUNDS:-3}
IDLE_CONNS=${IDLE_CONNS:-10000}
IDLE_SETTLE=${IDLE_SETTLE:-3} # seconds between the last idle connection and the RSS reading
SERVER_CPU=${SERVER_CPU:-0}
CLIENT_CPU=${CLIENT_CPU:-1}
if [ "$(nproc)" -lt 2 ]; then SERVER_CPU=0 CLIENT_CPU=0; fi

for tool in nginx wrk taskset go; do
  command -v "$tool" >/dev/null || { echo "proxy.sh: needs $tool (test/deps.sh installs it)" >&2; exit 1; }
done
# Each process holds IDLE_CONNS sockets: raise the soft limit as far as allowed.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
NOFILE=$(ulimit -n)
if [ "$NOFILE" -lt $((IDLE_CONNS + 1000)) ]; then
  echo "proxy.sh: ulimit -n is $NOFILE, need $((IDLE_CONNS + 1000)) for IDLE_CONNS=$IDLE_CONNS" >&2; exit 1
fi

work=$(mktemp -d /tmp/rl-proxy-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_port() { # bounded readiness poll of a just-started server
  for _ in $(seq 1 500); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.01
  done
  echo "proxy.sh: nothing listening on port $1" >&2; exit 1
}

BACKEND=$(free_port); NGXPROXY=$(free_port); GOPROXY=$(free_port); BASEPROXY=$(free_port)
user_line=""; [ "$(id -u)" = 0 ] && user_line="user root;"

mkdir -p "$work/www" "$work/backend" "$work/nproxy"
head -c 612 /dev/zero | tr '\0' 'x' >"$work/www/index.html" # nginx default page size

nginx_conf() { # $1 dir, $2 server block body
  cat >"$1/nginx.conf" <<EOF
$user_line
daemon off;
worker_processes 1;
worker_rlimit_nofile $NOFILE;
pid $1/nginx.pid;
error_log $1/error.log warn;
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
nginx_conf "$work/backend" "server { listen 127.0.0.1:$BACKEND; root $work/www; open_file_cache max=16; location / { index index.html; } }"
nginx_conf "$work/nproxy" "upstream backend { server 127.0.0.1:$BACKEND; keepalive 64; }
    server { listen 127.0.0.1:$NGXPROXY; location / {
        proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection \"\";
        proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for; proxy_buffering on; } }"

go build -trimpath -o "$work/proxy" ./test/bench/proxy/proxy
go build -trimpath -o "$work/idleconns" ./test/bench/proxy/idleconns

taskset -c "$SERVER_CPU" nginx -p "$work/backend" -c "$work/backend/nginx.conf" -e "$work/backend/error.log" &
BACKPID=$!; pids+=($!)
taskset -c "$SERVER_CPU" nginx -p "$work/nproxy" -c "$work/nproxy/nginx.conf" -e "$work/nproxy/error.log" &
NGXPID=$!; pids+=($!)
GOMAXPROCS=1 taskset -c "$SERVER_CPU" "$work/proxy" -listen "127.0.0.1:$GOPROXY" -upstream "127.0.0.1:$BACKEND" &
GOPID=$!; pids+=($!)
wait_port "$BACKEND"; wait_port "$NGXPROXY"; wait_port "$GOPROXY"
if [ -n "${BASE_PROXY:-}" ]; then
  GOMAXPROCS=1 taskset -c "$SERVER_CPU" "$BASE_PROXY" -listen "127.0.0.1:$BASEPROXY" -upstream "127.0.0.1:$BACKEND" &
  BASEPID=$!; pids+=($!)
  wait_port "$BASEPROXY"
fi

for port in "$BACKEND" "$NGXPROXY" "$GOPROXY"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")
  [ "$code" = 200 ] || { echo "proxy.sh: port $port answered $code" >&2; exit 1; }
done

cpu_ticks() { # utime+stime (clock ticks) of a process and its children
  local total=0 p
  for p in "$1" $(pgrep -P "$1" || true); do
    total=$((total + $(sed 's/.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  echo "$total"
}
TCK=$(getconf CLK_TCK)
run_wrk() { # $1 port, $2 label, $3 pid of the measured server -> "req/s cpu-us/req"
  local out t0 t1 n
  t0=$(cpu_ticks "$3")
  out=$(taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" --timeout 10s "http://127.0.0.1:$1/")
  t1=$(cpu_ticks "$3")
  if grep -q 'Non-2xx' <<<"$out"; then echo "proxy.sh: non-2xx answers from $2:" >&2; echo "$out" >&2; exit 1; fi
  if grep -q 'Socket errors' <<<"$out"; then echo "  $2: $(grep 'Socket errors' <<<"$out" | sed 's/^ *//')" >&2; fi
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  awk -v r="$(awk '/Requests\/sec/ {print $2}' <<<"$out")" -v t=$((t1 - t0)) -v n="$n" -v hz="$TCK" \
    'BEGIN {printf "%s %.1f\n", r, t / hz * 1e6 / n}'
}
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "machine: $(nproc) CPUs, $(uname -r), load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ulimit -n $NOFILE; wrk -t1 -c$CONNS -d$DURATION --timeout 10s, $ROUNDS rounds; servers on CPU $SERVER_CPU, wrk on CPU $CLIENT_CPU"
echo "CPU/req = CPU time (user+sys) of the measured server process during the run / requests:"
echo "  (a) the backend nginx, (b) the nginx proxy only, (c) the Go proxy only"
declare -a A B C D AC BC CC DC
if [ "$ROUNDS" -gt 0 ]; then
for r in $(seq 1 "$ROUNDS"); do
  res=$(run_wrk "$BACKEND" a "$BACKPID"); read -r x y <<<"$res"; A+=("$x"); AC+=("$y")
  res=$(run_wrk "$NGXPROXY" b "$NGXPID"); read -r x y <<<"$res"; B+=("$x"); BC+=("$y")
  res=$(run_wrk "$GOPROXY" c "$GOPID"); read -r x y <<<"$res"; C+=("$x"); CC+=("$y")
  line="round $r: (a) ${A[-1]} req/s ${AC[-1]} us/req  (b) ${B[-1]} req/s ${BC[-1]} us/req  (c) ${C[-1]} req/s ${CC[-1]} us/req"
  if [ -n "${BASE_PROXY:-}" ]; then
    res=$(run_wrk "$BASEPROXY" d "$BASEPID"); read -r x y <<<"$res"; D+=("$x"); DC+=("$y")
    line="$line  (d) ${D[-1]} req/s ${DC[-1]} us/req"
  fi
  echo "$line"
done
med() { printf '%s\n' "$@" | median; }
a=$(med "${A[@]}"); b=$(med "${B[@]}"); c=$(med "${C[@]}")
ac=$(med "${AC[@]}"); bc=$(med "${BC[@]}"); cc=$(med "${CC[@]}")
printf '%-44s %14s %16s\n' "setup (medians)" "req/s" "CPU us/req"
printf '%-44s %14s %16s\n' "(a) nginx static backend, direct" "$a" "$ac"
printf '%-44s %14s %16s\n' "(b) nginx proxy_pass, upstream keepalive" "$b" "$bc"
printf '%-44s %14s %16s\n' "(c) rl-tproxy data path (no admission)" "$c" "$cc"
if [ -n "${BASE_PROXY:-}" ]; then
  d=$(med "${D[@]}"); dc=$(med "${DC[@]}")
  printf '%-44s %14s %16s\n' "(d) BASE_PROXY build (no admission)" "$d" "$dc"
fi
awk -v b="$b" -v c="$c" -v bc="$bc" -v cc="$cc" \
  'BEGIN {printf "ratio (c)/(b): throughput %.2f, proxy CPU per request %.2f (below 1: cheaper than nginx)\n", c/b, cc/bc}'
if [ -n "${BASE_PROXY:-}" ]; then
  awk -v b="$b" -v d="$d" -v bc="$bc" -v dc="$dc" \
    'BEGIN {printf "ratio (d)/(b): throughput %.2f, proxy CPU per request %.2f\n", d/b, dc/bc}'
fi
fi

rss_kb() { # sum VmRSS of a process and its children (nginx master + worker)
  local total=0 p
  for p in "$1" $(pgrep -P "$1" || true); do
    total=$((total + $(awk '/VmRSS/ {print $2}' "/proc/$p/status")))
  done
  echo "$total"
}
idle_mem() { # $1 port, $2 server pid -> bytes per idle connection
  local before after fifo="$work/idle.fifo.$1" line
  rm -f "$fifo"; mkfifo "$fifo"
  before=$(rss_kb "$2")
  taskset -c "$CLIENT_CPU" "$work/idleconns" -addr "127.0.0.1:$1" -n "$IDLE_CONNS" <"$fifo" >"$work/idle.out.$1" &
  local cpid=$!
  exec 4>"$fifo"
  for _ in $(seq 1 600); do
    if grep -q ready "$work/idle.out.$1" 2>/dev/null; then break; fi
    if ! kill -0 "$cpid" 2>/dev/null; then echo "proxy.sh: idleconns failed" >&2; exit 1; fi
    sleep 0.1
  done
  grep -q ready "$work/idle.out.$1" || { echo "proxy.sh: idleconns not ready" >&2; exit 1; }
  sleep "$IDLE_SETTLE" # let the idle connections settle (their buffers go back to the loop)
  after=$(rss_kb "$2")
  exec 4>&-
  wait "$cpid" || true
  echo "$before $after" | awk -v n="$IDLE_CONNS" '{printf "%d KiB -> %d KiB: %.0f bytes/conn\n", $1, $2, ($2-$1)*1024/n}'
}
echo "memory per idle keep-alive connection ($IDLE_CONNS connections, RSS delta / N):"
mb=$(idle_mem "$NGXPROXY" "$NGXPID"); echo "  (b) nginx proxy:  $mb"
mc=$(idle_mem "$GOPROXY" "$GOPID"); echo "  (c) rl-tproxy:    $mc"
