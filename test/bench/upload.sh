#!/usr/bin/env bash
# Large request bodies (uploads) side by side: wrk POSTs SIZE bytes (1 MiB
# by default) through
#   proxy_pass    nginx proxy_pass, upstream keepalive, default request
#                 buffering (bodies above 16 KiB go through a temp file)
#   unbuffered    the same with proxy_request_buffering off
#   unprotected   rl-tproxy listener mode: the body is spliced upstream
#   copy          the same binary with --splice-min 0 (the body copied)
# all in front of test/bench/uploadsink, which reads each body to its end,
# READ bytes per read at most, before it answers (an application taking an
# upload; nginx's `return 200` answers before the body and is no such
# backend). Pinning as in run.sh: servers on CPU $SERVER_CPU, wrk on CPU
# $CLIENT_CPU, rl-tproxy and the sink with GOMAXPROCS=1. Rounds alternate
# the rows (even rounds reversed); `perf stat` on the serving process(es)
# gives CPU µs and system calls per upload. Medians over the rounds, and
# the per-round ratios of the rl-tproxy rows.
#
# Env: SIZE=1048576 READ=4096 CONNS=4 DURATION=5s ROUNDS=3 BIN=bin/rl-tproxy
#      SERVER_CPU=1 CLIENT_CPU=0 OUT=docs/bench/upload.md (Markdown, also
#      printed; OUT=- prints only).
set -euo pipefail
cd "$(dirname "$0")/../.."

SIZE=${SIZE:-1048576}
READ=${READ:-4096}
CONNS=${CONNS:-4}
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
BIN=${BIN:-bin/rl-tproxy}
OUT=${OUT:-docs/bench/upload.md}
case "$SIZE$READ$CONNS$ROUNDS" in *[!0-9]*) echo "upload.sh: SIZE, READ, CONNS and ROUNDS must be numbers" >&2; exit 2 ;; esac
if [ "$(nproc)" -lt 2 ]; then SERVER_CPU=0 CLIENT_CPU=0; fi
for tool in go nginx perf wrk curl taskset python3; do
  command -v "$tool" >/dev/null || { echo "upload.sh: needs $tool (make deps installs it)" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "upload.sh: $BIN missing (make build)" >&2; exit 1; }
BIN=$(realpath "$BIN")

me=upload.sh
# shellcheck source=servers.sh
. test/bench/servers.sh # (the working directory is the repository root)

go build -o "$work/uploadsink" ./test/bench/uploadsink
BACKEND=$(free_port); NGX=$(free_port); NGXU=$(free_port); RL=$(free_port); RLC=$(free_port)
start env GOMAXPROCS=1 "$work/uploadsink" -listen "127.0.0.1:$BACKEND" -read "$READ"
user_line=""; [ "$(id -u)" = 0 ] && user_line="user root;"
cat >"$work/nproxy.conf" <<EOF
$user_line
daemon off;
worker_processes 1;
pid $work/nproxy.pid;
error_log $work/nproxy.log warn;
events { worker_connections 1024; }
http {
  access_log off; keepalive_timeout 300s; keepalive_requests 1000000; client_max_body_size 0;
  client_body_temp_path $work/tb; proxy_temp_path $work/tp; fastcgi_temp_path $work/tf;
  uwsgi_temp_path $work/tu; scgi_temp_path $work/ts;
  upstream b { server 127.0.0.1:$BACKEND; keepalive 16; }
  server { listen 127.0.0.1:$NGX; location / { proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; } }
  server { listen 127.0.0.1:$NGXU; location / { proxy_request_buffering off; proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection ""; } }
}
EOF
policy() { # listen port -> policy file
  cat >"$work/policy.$1.yaml" <<EOF
ratelimitly:
  embedded: true
services:
  - name: up
    listen: 127.0.0.1:$1
    upstream: 127.0.0.1:$BACKEND
    locations:
      - name: open
EOF
}
declare -A PID PORT
start nginx -c "$work/nproxy.conf" -p "$work"; PID[proxy_pass]=$last; PID[unbuffered]=$last
PORT[proxy_pass]=$NGX; PORT[unbuffered]=$NGXU
policy "$RL"; policy "$RLC"
start env GOMAXPROCS=1 "$BIN" run --policy "$work/policy.$RL.yaml" --admin "127.0.0.1:$(free_port)" --log-level warn --watch=false
PID[unprotected]=$last; PORT[unprotected]=$RL
start env GOMAXPROCS=1 "$BIN" run --policy "$work/policy.$RLC.yaml" --admin "127.0.0.1:$(free_port)" --log-level warn --watch=false --splice-min 0
PID[copy]=$last; PORT[copy]=$RLC
rows=(proxy_pass unbuffered unprotected copy)
for r in "${rows[@]}"; do wait_http "http://127.0.0.1:${PORT[$r]}/"; done
printf 'wrk.method = "POST"\nwrk.body = string.rep("x", %d)\nwrk.headers["Content-Type"] = "application/octet-stream"\n' "$SIZE" >"$work/post.lua"

for round in $(seq 1 "$ROUNDS"); do
  order=("${rows[@]}")
  if [ $((round % 2)) = 0 ]; then order=(); for ((i=${#rows[@]}-1; i>=0; i--)); do order+=("${rows[$i]}"); done; fi
  for r in "${order[@]}"; do
    pf="$work/perf.$r.$round"
    perf stat -x, -e raw_syscalls:sys_enter,task-clock -p "$(pidlist "${PID[$r]}")" -o "$pf" &
    pp=$!
    timeout 120 taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" --timeout 10s -s "$work/post.lua" \
      "http://127.0.0.1:${PORT[$r]}/" >"$work/wrk.$r.$round"
    kill -INT "$pp"; wait "$pp" || true
    n=$(awk '/requests in/ {print $1}' "$work/wrk.$r.$round")
    [ "${n:-0}" -gt 0 ] || { echo "upload.sh: no request completed on $r" >&2; exit 1; }
    errs=$(awk '/Socket errors|Non-2xx/ {for (i=1;i<=NF;i++) if ($i ~ /^[0-9]+,?$/) s+=$i} END {print s+0}' "$work/wrk.$r.$round")
    awk -F, -v n="$n" -v r="$r" -v round="$round" -v e="$errs" -v rps="$(awk '/Requests\/sec/ {print $2}' "$work/wrk.$r.$round")" '
      /task-clock/ {cpu=$1} /sys_enter/ {sc=$1}
      END {printf "%s\t%d\t%.1f\t%.1f\t%.2f\t%d\n", r, round, rps, cpu*1000/n, sc/n, e}' "$pf" >>"$work/results"
  done
done

python3 - "$work/results" "$SIZE" "$READ" "$CONNS" "$DURATION" "$ROUNDS" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >"$work/report.md" <<'EOF'
import statistics as st, sys, time
path, size, read, conns, dur, rounds, rev = sys.argv[1:]
rows = {}
for line in open(path):
    r, rnd, rps, cpu, sc, errs = line.split('\t')
    rows.setdefault(r, {})[int(rnd)] = (float(rps), float(cpu), float(sc), int(errs))
print(f"Uploads: {size}-byte POST bodies, wrk -t1 -c{conns} -d{dur}, {rounds} rounds, medians "
      f"({time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, {rev}); the backend reads each body "
      f"to its end, at most {read} bytes per read, before it answers\n")
print("| setup | req/s | MiB/s | CPU µs per upload | syscalls per upload | wrk errors (all rounds) |")
print("|---|---:|---:|---:|---:|---:|")
mib = int(size) / 1048576
for r in ("proxy_pass", "unbuffered", "unprotected", "copy"):
    v = rows.get(r, {}).values()
    med = lambda i: st.median(x[i] for x in v)
    print(f"| {r} | {med(0):.1f} | {med(0)*mib:.1f} | {med(1):.1f} | {med(2):.2f} | {sum(x[3] for x in v)} |")
print()
for a, b in (("unprotected", "copy"), ("unprotected", "proxy_pass"), ("unprotected", "unbuffered")):
    rs = sorted(set(rows.get(a, {})) & set(rows.get(b, {})))
    q = [rows[a][k][0] / rows[b][k][0] for k in rs]
    c = [rows[a][k][1] / rows[b][k][1] for k in rs]
    print(f"- {a} ÷ {b}, per round: req/s {', '.join(f'{x:.2f}' for x in q)} (median **{st.median(q):.2f}**); "
          f"CPU per upload {', '.join(f'{x:.2f}' for x in c)} (median **{st.median(c):.2f}**)")
EOF
[ "$OUT" = - ] || cp "$work/report.md" "$OUT"
cat "$work/report.md"
