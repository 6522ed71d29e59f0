#!/usr/bin/env bash
# Large response bodies side by side: wrk fetches a SIZE-byte file (1 MiB
# by default) through
#   proxy_pass    nginx proxy_pass, upstream keepalive, default buffering
#                 (bodies above its memory buffers go through a temp file)
#   unbuffered    the same with proxy_buffering off
#   unprotected   rl-tproxy listener mode, location without admission
#   old           BIN_OLD's rl-tproxy, the same policy (only when BIN_OLD is set)
# all in front of one nginx static backend (sendfile). Pinning as in
# run.sh: every server on CPU $SERVER_CPU, wrk on CPU $CLIENT_CPU,
# rl-tproxy with GOMAXPROCS=1. Rounds alternate the rows (even rounds
# reversed). Per row and round, `perf stat` on the serving process(es)
# gives CPU µs and system calls per MiB relayed; the proxy's peak RSS
# (VmHWM) after the rounds shows what a body costs in memory. Medians over
# the rounds.
#
# Env: SIZE=1048576 CONNS=4 DURATION=5s ROUNDS=3 BIN=bin/rl-tproxy BIN_OLD=
#      SERVER_CPU=1 CLIENT_CPU=0 OUT=docs/bench/bigbody.md (Markdown, also
#      printed; OUT=- prints only).
set -euo pipefail
cd "$(dirname "$0")/../.."

SIZE=${SIZE:-1048576}
CONNS=${CONNS:-4}
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
BIN=${BIN:-bin/rl-tproxy}
BIN_OLD=${BIN_OLD:-}
OUT=${OUT:-docs/bench/bigbody.md}
if [ "$(nproc)" -lt 2 ]; then SERVER_CPU=0 CLIENT_CPU=0; fi
for tool in nginx perf wrk curl taskset python3; do
  command -v "$tool" >/dev/null || { echo "bigbody.sh: needs $tool (make deps installs it)" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "bigbody.sh: $BIN missing (make build)" >&2; exit 1; }
BIN=$(realpath "$BIN")
[ -z "$BIN_OLD" ] || BIN_OLD=$(realpath "$BIN_OLD")

me=bigbody.sh
# shellcheck source=servers.sh
. test/bench/servers.sh # (the working directory is the repository root)

mkdir -p "$work/www"
head -c "$SIZE" /dev/urandom >"$work/www/big.bin"
BACKEND=$(free_port); NGX=$(free_port); NGXU=$(free_port); RL=$(free_port); RLOLD=$(free_port)
user_line=""; [ "$(id -u)" = 0 ] && user_line="user root;"
cat >"$work/nginx.conf" <<EOF
$user_line
daemon off;
worker_processes 1;
pid $work/nginx.pid;
error_log $work/error.log warn;
events { worker_connections 1024; }
http {
  access_log off; keepalive_timeout 300s; keepalive_requests 1000000; sendfile on;
  client_body_temp_path $work/tb; proxy_temp_path $work/tp; fastcgi_temp_path $work/tf;
  uwsgi_temp_path $work/tu; scgi_temp_path $work/ts;
  server { listen 127.0.0.1:$BACKEND; root $work/www; }
}
EOF
sed -e "s|pid $work/nginx.pid|pid $work/nproxy.pid|" -e "s|error_log $work/error.log|error_log $work/nproxy.log|" \
  -e "s|  server { listen 127.0.0.1:$BACKEND; root $work/www; }|  upstream b { server 127.0.0.1:$BACKEND; keepalive 16; }\n  server { listen 127.0.0.1:$NGX; location / { proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }\n  server { listen 127.0.0.1:$NGXU; location / { proxy_buffering off; proxy_pass http://b; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }|" \
  "$work/nginx.conf" >"$work/nproxy.conf"
policy() { # listen port -> policy file
  cat >"$work/policy.$1.yaml" <<EOF
ratelimitly:
  embedded: true
services:
  - name: big
    listen: 127.0.0.1:$1
    upstream: 127.0.0.1:$BACKEND
    locations:
      - name: open
EOF
}
declare -A PID PORT
start nginx -c "$work/nginx.conf" -p "$work"
start nginx -c "$work/nproxy.conf" -p "$work"; PID[proxy_pass]=$last; PID[unbuffered]=$last
PORT[proxy_pass]=$NGX; PORT[unbuffered]=$NGXU
policy "$RL"
start env GOMAXPROCS=1 "$BIN" run --policy "$work/policy.$RL.yaml" --admin "127.0.0.1:$(free_port)" --log-level warn --watch=false
PID[unprotected]=$last; PORT[unprotected]=$RL
rows=(proxy_pass unbuffered unprotected)
if [ -n "$BIN_OLD" ]; then
  policy "$RLOLD"
  start env GOMAXPROCS=1 "$BIN_OLD" run --policy "$work/policy.$RLOLD.yaml" --admin "127.0.0.1:$(free_port)" --log-level warn --watch=false
  PID[old]=$last; PORT[old]=$RLOLD; rows+=(old)
fi
for r in "${rows[@]}"; do wait_http "http://127.0.0.1:${PORT[$r]}/big.bin"; done

mib=$(python3 -c "print($SIZE/1048576)")
for round in $(seq 1 "$ROUNDS"); do
  order=("${rows[@]}")
  if [ $((round % 2)) = 0 ]; then order=(); for ((i=${#rows[@]}-1; i>=0; i--)); do order+=("${rows[$i]}"); done; fi
  for r in "${order[@]}"; do
    pf="$work/perf.$r.$round"
    perf stat -x, -e raw_syscalls:sys_enter,task-clock -p "$(pidlist "${PID[$r]}")" -o "$pf" &
    pp=$!
    timeout 120 taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNS" -d"$DURATION" --timeout 10s "http://127.0.0.1:${PORT[$r]}/big.bin" >"$work/wrk.$r.$round"
    kill -INT "$pp"; wait "$pp" || true
    n=$(awk '/requests in/ {print $1}' "$work/wrk.$r.$round")
    [ "${n:-0}" -gt 0 ] || { echo "bigbody.sh: no request completed on $r" >&2; exit 1; }
    awk -F, -v n="$n" -v mib="$mib" -v r="$r" -v rps="$(awk '/Requests\/sec/ {print $2}' "$work/wrk.$r.$round")" '
      /task-clock/ {cpu=$1} /sys_enter/ {sc=$1}
      END {printf "%s\t%.1f\t%.1f\t%.1f\t%.2f\n", r, rps, rps*mib, cpu*1000/(n*mib), sc/(n*mib)}' "$pf" >>"$work/results"
  done
done

report() {
  med() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
  echo "Large bodies: $SIZE-byte file, wrk -t1 -c$CONNS -d$DURATION, $ROUNDS rounds, medians ($(date -u +%Y-%m-%dT%H:%MZ), $(git rev-parse --short HEAD))"
  echo
  echo "| setup | req/s | MiB/s | CPU µs per MiB | syscalls per MiB | peak RSS of the proxy MiB |"
  echo "|---|---:|---:|---:|---:|---:|"
  for r in "${rows[@]}"; do
    col() { awk -F'\t' -v r="$r" -v c="$1" '$1==r {print $c}' "$work/results" | med; }
    hwm=0
    for p in $(pidlist "${PID[$r]}" | tr , ' '); do
      h=$(awk '/VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null || echo 0)
      [ "${h:-0}" -gt "$hwm" ] && hwm=$h
    done
    printf "| %s | %s | %s | %s | %s | %.1f |\n" "$r" "$(col 2)" "$(col 3)" "$(col 4)" "$(col 5)" "$(awk -v k="$hwm" 'BEGIN {print k/1024}')"
  done
}
report >"$work/report.md"
[ "$OUT" = - ] || cp "$work/report.md" "$OUT"
cat "$work/report.md"
