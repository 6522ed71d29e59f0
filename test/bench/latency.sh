#!/usr/bin/env bash
# The latency matrix (`make bench`; docs/performance.md): the tail a request
# sees through rl-tproxy beside nginx proxy_pass and the backend direct, in
# one run, for every combination of
#   concurrency      CONCS (default 1 4 16 64)
#   placement        unpinned: every process with its defaults, as users
#                    run them (rl-tproxy: one loop per CPU; nginx:
#                    worker_processes auto), the client unpinned too;
#                    pinned: servers on SERVER_CPU (rl-tproxy GOMAXPROCS=1,
#                    nginx one worker), the client on CLIENT_CPU
#   upstream         keepalive: the backend keeps connections open;
#                    close: the backend closes every connection after its
#                    answer (nginx keepalive_timeout 0), so every request
#                    through a proxy connects to it anew
#   client conns     persistent (keep-alive) or new (a connection per request)
#   client           wrk (wrk 4.1 --latency: its percentiles correct for
#                    coordinated omission) and test/bench/latclient (every
#                    request timed on its own, nothing synthesised)
# Rows: direct (the backend itself), proxy_pass (nginx, upstream keepalive
# 64), unprotected (rl-tproxy, a location without admission), admission
# (rl-tproxy, every request checked with the embedded RateLimitly; a zone
# that never denies). Each cell: req/s, server CPU µs per request (perf
# stat task-clock of the serving processes for exactly that run), p50,
# p99, p99.9 and max in ms. Every process runs with its default flags
# (access logs off; rl-tproxy --log-level warn) unless RLFLAGS says more.
#
# Env: DURATION=3s CONCS="1 4 16 64" PLACES="unpinned pinned"
#      UPSTREAMS="keepalive close" CLIENTS="wrk latclient"
#      CONNMODES="persistent new" ROWS="direct proxy_pass unprotected admission"
#      SERVER_CPU=1 CLIENT_CPU=0 BIN=bin/rl-tproxy RLFLAGS="" (extra run flags)
#      RLFLAGS_ALT="--loop-backend epoll" (a second rl-tproxy with these
#      flags, in the same run: rows unprotected_alt, admission_alt; add them
#      to ROWS) BIN_ALT=path (the second rl-tproxy runs this build instead:
#      before/after in one run; RLFLAGS_ALT may then be empty)
#      OUT=docs/bench/latency.md (the table; TSV beside it as .tsv)
# Needs nginx, wrk, perf, taskset, curl, python3, go (make deps).
set -euo pipefail
cd "$(dirname "$0")/../.."
me=latency.sh
DURATION=${DURATION:-3s}
CONCS=${CONCS:-1 4 16 64}
PLACES=${PLACES:-unpinned pinned}
UPSTREAMS=${UPSTREAMS:-keepalive close}
CLIENTS=${CLIENTS:-wrk latclient}
CONNMODES=${CONNMODES:-persistent new}
ROWS=${ROWS:-direct proxy_pass unprotected admission}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
BIN=${BIN:-bin/rl-tproxy}
RLFLAGS=${RLFLAGS:-}
RLFLAGS_ALT=${RLFLAGS_ALT:-}
BIN_ALT=${BIN_ALT:-$BIN}
ALT=0
if [ -n "$RLFLAGS_ALT" ] || [ "$BIN_ALT" != "$BIN" ]; then ALT=1; fi
ALT_DESC=$RLFLAGS_ALT # what the report says the *_alt rows run
[ "$BIN_ALT" = "$BIN" ] || ALT_DESC="the build $BIN_ALT${RLFLAGS_ALT:+ $RLFLAGS_ALT}"
OUT=${OUT:-docs/bench/latency.md}
if [ "$(nproc)" -lt 2 ]; then SERVER_CPU=0 CLIENT_CPU=0; fi
for tool in nginx wrk perf taskset curl python3 go; do
  command -v "$tool" >/dev/null || { echo "$me: needs $tool (make deps installs it)" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "$me: $BIN missing (make build)" >&2; exit 1; }
BIN=$(realpath "$BIN")
ulimit -n 65536 2>/dev/null || true

# shellcheck source=servers.sh
source "$(dirname "$0")/servers.sh"
go build -trimpath -o "$work/latclient" ./test/bench/latclient
cat >"$work/pct.lua" <<'EOF'
done = function(summary, latency, requests)
  io.write(string.format("LAT %d %d %.3f %.3f %.3f %.3f %.3f\n", summary.requests,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status + summary.errors.timeout,
    latency:percentile(50) / 1000, latency:percentile(99) / 1000, latency:percentile(99.9) / 1000, latency.max / 1000,
    summary.duration / 1e6))
end
EOF
user_line=""; [ "$(id -u)" = 0 ] && user_line="user root;"
mkdir -p "$work/www"
head -c 612 /dev/zero | tr '\0' 'x' >"$work/www/index.html"

BKA=$(free_port); BCL=$(free_port); NKA=$(free_port); NCL=$(free_port)
RKA=$(free_port); RCL=$(free_port); AKA=$(free_port); ACL=$(free_port); RADMIN=$(free_port)
XKA=$(free_port); XCL=$(free_port); YKA=$(free_port); YCL=$(free_port); XADMIN=$(free_port)
nginx_conf() { # dir workers http-body
  mkdir -p "$1"
  cat >"$1/nginx.conf" <<EOF
$user_line
daemon off;
worker_processes $2;
pid $1/nginx.pid;
error_log $1/error.log warn;
events { worker_connections 16384; }
http {
    access_log off;
    keepalive_timeout 300s;
    keepalive_requests 1000000;
    client_body_temp_path $1/tb; proxy_temp_path $1/tp; fastcgi_temp_path $1/tf; uwsgi_temp_path $1/tu; scgi_temp_path $1/ts;
    $3
}
EOF
}
cat >"$work/policy.yaml" <<EOF
ratelimitly:
  embedded: true
  request_policy: {name: standard, unit: 20ms}
  fail: close
defaults:
  forwarded_headers: {x_forwarded_for: true}
zones:
  huge: {bucket: "bench:{remote_addr}", rate: 4000000000/s, burst: 4000000000}
services:
  - {name: open-ka, listen: "127.0.0.1:$RKA", upstream: "127.0.0.1:$BKA", locations: [{name: open}]}
  - {name: open-close, listen: "127.0.0.1:$RCL", upstream: "127.0.0.1:$BCL", locations: [{name: open}]}
  - {name: adm-ka, listen: "127.0.0.1:$AKA", upstream: "127.0.0.1:$BKA", locations: [{name: adm, limit: [huge]}]}
  - {name: adm-close, listen: "127.0.0.1:$ACL", upstream: "127.0.0.1:$BCL", locations: [{name: adm, limit: [huge]}]}
EOF
sed -e "s/127.0.0.1:$RKA\"/127.0.0.1:$XKA\"/; s/127.0.0.1:$RCL\"/127.0.0.1:$XCL\"/" \
  -e "s/127.0.0.1:$AKA\"/127.0.0.1:$YKA\"/; s/127.0.0.1:$ACL\"/127.0.0.1:$YCL\"/" "$work/policy.yaml" >"$work/policy-alt.yaml"
"$BIN" check --policy "$work/policy.yaml" >/dev/null
"$BIN" check --policy "$work/policy-alt.yaml" >/dev/null

declare -A PID
servers=()
start_servers() { # placement
  local pre=() workers=auto env=()
  if [ "$1" = pinned ]; then pre=(taskset -c "$SERVER_CPU"); workers=1; env=(GOMAXPROCS=1); fi
  nginx_conf "$work/backend" "$workers" "server { listen 127.0.0.1:$BKA; root $work/www; open_file_cache max=16; location / { index index.html; } }
    server { listen 127.0.0.1:$BCL; keepalive_timeout 0; root $work/www; open_file_cache max=16; location / { index index.html; } }"
  local loc='proxy_http_version 1.1; proxy_set_header Connection ""; proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;'
  nginx_conf "$work/nproxy" "$workers" "upstream ka { server 127.0.0.1:$BKA; keepalive 64; }
    upstream cl { server 127.0.0.1:$BCL; keepalive 64; }
    server { listen 127.0.0.1:$NKA; location / { proxy_pass http://ka; $loc } }
    server { listen 127.0.0.1:$NCL; location / { proxy_pass http://cl; $loc } }"
  "${pre[@]}" nginx -p "$work/backend" -c "$work/backend/nginx.conf" -e "$work/backend/error.log" &
  PID[direct]=$!
  "${pre[@]}" nginx -p "$work/nproxy" -c "$work/nproxy/nginx.conf" -e "$work/nproxy/error.log" &
  PID[proxy_pass]=$!
  # shellcheck disable=SC2086 # RLFLAGS is a list of flags
  "${pre[@]}" env "${env[@]}" "$BIN" run --policy "$work/policy.yaml" --admin "127.0.0.1:$RADMIN" --log-level warn --watch=false $RLFLAGS >"$work/rl.log" 2>&1 &
  PID[unprotected]=$!; PID[admission]=$!
  servers=("${PID[direct]}" "${PID[proxy_pass]}" "${PID[unprotected]}")
  local ports=("$BKA" "$BCL" "$NKA" "$NCL" "$RKA" "$RCL" "$AKA" "$ACL")
  if [ "$ALT" = 1 ]; then
    # shellcheck disable=SC2086 # a list of flags
    "${pre[@]}" env "${env[@]}" "$BIN_ALT" run --policy "$work/policy-alt.yaml" --admin "127.0.0.1:$XADMIN" --log-level warn --watch=false $RLFLAGS_ALT >"$work/rl-alt.log" 2>&1 &
    PID[unprotected_alt]=$!; PID[admission_alt]=$!
    servers+=("${PID[unprotected_alt]}")
    ports+=("$XKA" "$XCL" "$YKA" "$YCL")
  fi
  pids+=("${servers[@]}")
  for u in "${ports[@]}"; do wait_http "http://127.0.0.1:$u/"; done
  wait_http "http://127.0.0.1:$RADMIN/readyz"
  [ "$ALT" = 0 ] || wait_http "http://127.0.0.1:$XADMIN/readyz"
}
stop_servers() {
  local p
  for p in "${servers[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${servers[@]}"; do wait "$p" 2>/dev/null || true; done
  servers=()
}
url() { # row upstream
  case "$1/$2" in
    direct/keepalive) echo "http://127.0.0.1:$BKA/" ;; direct/close) echo "http://127.0.0.1:$BCL/" ;;
    proxy_pass/keepalive) echo "http://127.0.0.1:$NKA/" ;; proxy_pass/close) echo "http://127.0.0.1:$NCL/" ;;
    unprotected/keepalive) echo "http://127.0.0.1:$RKA/" ;; unprotected/close) echo "http://127.0.0.1:$RCL/" ;;
    admission/keepalive) echo "http://127.0.0.1:$AKA/" ;; admission/close) echo "http://127.0.0.1:$ACL/" ;;
    unprotected_alt/keepalive) echo "http://127.0.0.1:$XKA/" ;; unprotected_alt/close) echo "http://127.0.0.1:$XCL/" ;;
    admission_alt/keepalive) echo "http://127.0.0.1:$YKA/" ;; admission_alt/close) echo "http://127.0.0.1:$YCL/" ;;
  esac
}

# cell placement upstream connmode conc client row -> "rps cpu_us p50 p99 p999 max errors"
cell() {
  local place=$1 up=$2 mode=$3 c=$4 client=$5 row=$6 pre=() pf="$work/perf.out" perfpid out n errs rest
  [ "$place" = pinned ] && pre=(taskset -c "$CLIENT_CPU")
  perf stat -x, -e task-clock -p "$(pidlist "${PID[$row]}")" -o "$pf" &
  perfpid=$!
  if [ "$client" = wrk ]; then
    local hdr=()
    [ "$mode" = new ] && hdr=(-H "Connection: close")
    out=$("${pre[@]}" wrk -t1 -c"$c" -d"$DURATION" --timeout 10s "${hdr[@]}" -s "$work/pct.lua" "$(url "$row" "$up")" | awk '/^LAT/')
    read -r _ n errs p50 p99 p999 mx secs <<<"$out"
    rest="$(awk -v n="$n" -v s="$secs" 'BEGIN {printf "%.0f", n / s}') $p50 $p99 $p999 $mx $errs"
  else
    local fl=()
    [ "$mode" = new ] && fl=(-new)
    out=$("${pre[@]}" "$work/latclient" -url "$(url "$row" "$up")" -c "$c" -d "$DURATION" "${fl[@]}" 2>/dev/null)
    n=$(sed -E 's/.*requests=([0-9]+).*/\1/' <<<"$out")
    rest=$(sed -E 's/.*errors=([0-9]+) rps=([0-9]+) p50_ms=([0-9.]+) p90_ms=[0-9.]+ p99_ms=([0-9.]+) p999_ms=([0-9.]+) max_ms=([0-9.]+)/\2 \3 \4 \5 \6 \1/' <<<"$out")
  fi
  kill -INT "$perfpid"; wait "$perfpid" || true
  local cpu
  cpu=$(awk -F, -v n="$n" '/task-clock/ {t = $1} END {if (n > 0) printf "%.1f", t * 1000 / n; else print "-"}' "$pf")
  read -r rps p50 p99 p999 mx errs <<<"$rest"
  echo "$rps $cpu $p50 $p99 $p999 $mx $errs"
}

tsv="${OUT%.md}.tsv"
echo -e "placement\tupstream\tclient_conns\tconc\tclient\trow\trps\tcpu_us\tp50_ms\tp99_ms\tp999_ms\tmax_ms\terrors" >"$work/tsv"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
echo "$me: $(nproc) CPUs, kernel $(uname -r), load $load_before; $DURATION per cell"
for place in $PLACES; do
  start_servers "$place"
  for up in $UPSTREAMS; do
    for mode in $CONNMODES; do
      for c in $CONCS; do
        for client in $CLIENTS; do
          line="$place $up $mode c=$c $client:"
          for row in $ROWS; do
            r=$(cell "$place" "$up" "$mode" "$c" "$client" "$row")
            read -r rps cpu p50 p99 p999 mx errs <<<"$r"
            echo -e "$place\t$up\t$mode\t$c\t$client\t$row\t$rps\t$cpu\t$p50\t$p99\t$p999\t$mx\t$errs" >>"$work/tsv"
            line+=" $row p99 $p99"
          done
          echo "$line"
        done
      done
    done
  done
  stop_servers
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

mkdir -p "$(dirname "$OUT")"
cp "$work/tsv" "$tsv"
python3 - "$work/tsv" "$OUT" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$load_before" "$load_after" "$DURATION" "$RLFLAGS" "$ALT_DESC" <<'PY'
import csv, sys, datetime
src, out, rev, lb, la, dur, flags, alt = sys.argv[1:9]
rows = list(csv.DictReader(open(src), delimiter='\t'))
def num(x):
    try: return float(x)
    except ValueError: return None
ref = {}
for r in rows:
    ref[(r['placement'], r['upstream'], r['client_conns'], r['conc'], r['client'], r['row'])] = r
lines = [
    "# Latency matrix",
    "",
    f"`test/bench/latency.sh` at {rev}, {datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, {dur} per cell, load {lb} before, {la} after"
    + (f", rl-tproxy flags `{flags}`" if flags else ", every server with its defaults")
    + (f"; rows `*_alt`: rl-tproxy with `{alt}`" if alt else "") + ".",
    "Times in ms; CPU is the serving processes' task-clock per request (µs);",
    "`p99 ÷ pp` and `p99.9 ÷ pp` divide by nginx proxy_pass's in the same cell.",
    "",
    "| placement | upstream | client conns | c | client | row | req/s | CPU µs | p50 | p99 | p99.9 | max | p99 ÷ pp | p99.9 ÷ pp | errors |",
    "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
]
for r in rows:
    pp = ref.get((r['placement'], r['upstream'], r['client_conns'], r['conc'], r['client'], 'proxy_pass'))
    def ratio(k):
        a, b = num(r[k]), num(pp[k]) if pp else None
        return f"{a / b:.2f}" if a is not None and b else "-"
    lines.append(f"| {r['placement']} | {r['upstream']} | {r['client_conns']} | {r['conc']} | {r['client']} | {r['row']} | "
                 f"{r['rps']} | {r['cpu_us']} | {r['p50_ms']} | {r['p99_ms']} | {r['p999_ms']} | {r['max_ms']} | "
                 f"{ratio('p99_ms')} | {ratio('p999_ms')} | {r['errors']} |")
# The bars: what a transparent proxy may add, read from the cells above
# (unpinned: the deployment users run).
def cell(place, up, mode, c, client, row):
    return ref.get((place, up, mode, str(c), client, row))
def f(r, k):
    return num(r[k]) if r else None
bars = []
for row in ("unprotected", "unprotected_alt"):
    for client in ("latclient", "wrk"):
        d, x = cell("unpinned", "close", "new", 1, client, "direct"), cell("unpinned", "close", "new", 1, client, row)
        if d and x:
            bars.append((f"closing upstream, new connection per request, c=1, {client}: {row} p50 {f(x,'p50_ms'):.3f} / p99 {f(x,'p99_ms'):.3f} ms vs direct {f(d,'p50_ms'):.3f} / {f(d,'p99_ms'):.3f}",
                         f(x,'p50_ms') - f(d,'p50_ms') <= 0.5 and f(x,'p99_ms') - f(d,'p99_ms') <= 2))
for (up, mode) in (("keepalive", "persistent"), ("close", "new")):
    for sfx in ("", "_alt"):
        u, a = cell("unpinned", up, mode, 1, "latclient", "unprotected" + sfx), cell("unpinned", up, mode, 1, "latclient", "admission" + sfx)
        if u and a:
            bars.append((f"serial admission{sfx}, {up} upstream, {mode} client connections, c=1: p50 {f(a,'p50_ms'):.3f} ms vs unprotected {f(u,'p50_ms'):.3f}",
                         f(a,'p50_ms') - f(u,'p50_ms') <= 1))
for c in (4, 64):
    for client in ("wrk", "latclient"):
        for row in ("unprotected", "unprotected_alt"):
            pp, x = cell("unpinned", "keepalive", "persistent", c, client, "proxy_pass"), cell("unpinned", "keepalive", "persistent", c, client, row)
            if pp and x and f(pp,'p99_ms') and f(pp,'p999_ms'):
                r99, r999 = f(x,'p99_ms') / f(pp,'p99_ms'), f(x,'p999_ms') / f(pp,'p999_ms')
                bars.append((f"keep-alive c={c}, {client}, {row}: p99 {r99:.2f}x, p99.9 {r999:.2f}x nginx proxy_pass's", r99 <= 1.5 and r999 <= 2))
if bars:
    lines += ["", "## Bars (unpinned defaults)", "",
              "A transparent proxy must add no latency a user can see: p50 within 0.5 ms and p99 within 2 ms of the",
              "backend direct through a closing upstream; admission p50 within 1 ms of the unprotected location;",
              "keep-alive p99 at most 1.5x and p99.9 at most 2x nginx proxy_pass's.", ""]
    lines += [f"- {'met' if ok else '**not met**'}: {text}" for text, ok in bars]
open(out, 'w').write("\n".join(lines) + "\n")
print("\n".join(f"{'met' if ok else 'NOT MET'}: {text}" for text, ok in bars))
PY
echo "$me: wrote $OUT and $tsv"
