#!/usr/bin/env bash
# Replays a generated access log of N lines (default 1,000,000) through
# examples/policy.yaml with `rl-tproxy simulate` and prints the time it
# took and the lines per second. The log (about 400 bytes a line) is
# written to a temporary directory and removed afterwards; nothing big is
# committed. The replay runs on one core: pinned to CPU $CPU (default 0)
# with GOMAXPROCS=1. Usage: test/bench/simulate.sh [N] [BINARY]
set -euo pipefail
n=${1:-1000000}
CPU=${CPU:-0}
case "$n$CPU" in *[!0-9]*) echo "simulate.sh: N and CPU must be numbers" >&2; exit 2 ;; esac
cd "$(dirname "$0")/../.."
bin=${2:-}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ -z "$bin" ]; then
  bin=$tmp/rl-tproxy
  go build -o "$bin" ./cmd/rl-tproxy
fi
# One line a millisecond of virtual time from 2026-12-01T00:00:00Z; 2,000
# client addresses; the policy's locations in a mix (api, v2 with plans,
# checkout POSTs, health); durations 1..400 ms; all recorded as admitted.
awk -v n="$n" 'BEGIN {
  srand(1)
  for (i = 0; i < n; i++) {
    ms = i % 1000; s = int(i / 1000)
    hh = int(s / 3600); mm = int(s / 60) % 60; ss = s % 60
    c = int(rand() * 2000)
    r = rand()
    if (r < 0.6)       { m = "GET";  p = "/api/items";  loc = "api" }
    else if (r < 0.85) { m = "GET";  p = "/v2/orders";  loc = "v2" }
    else if (r < 0.95) { m = "POST"; p = "/checkout";   loc = "checkout" }
    else               { m = "GET";  p = "/healthz";    loc = "health" }
    printf "{\"time\":\"2026-12-01T%02d:%02d:%02d.%03dZ\",\"level\":\"INFO\",\"msg\":\"access\",\"service\":\"web\",\"location\":\"%s\",\"remote\":\"10.%d.%d.%d:%d\",\"method\":\"%s\",\"host\":\"shop.example\",\"path\":\"%s\",\"proto\":\"http/1.1\",\"status\":200,\"verdict\":\"allow\",\"outcome\":\"allow\",\"cause\":\"allow\",\"admission_ms\":0.4,\"duration_ms\":%d.%d,\"upstream\":\"127.0.0.1:8081\",\"upstream_status\":200,\"bytes_in\":0,\"bytes_out\":751,\"report\":true,\"user_agent\":\"bench/1\",\"generation\":1}\n", hh, mm, ss, ms, loc, int(c / 65536) % 256, int(c / 256) % 256, c % 256, 1024 + i % 60000, m, p, 1 + int(rand() * 400), int(rand() * 10)
  }
}' > "$tmp/access.log"
echo "test/bench/simulate.sh: $n lines, $(du -h "$tmp/access.log" | cut -f1), replaying on CPU $CPU of $(nproc) (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
start=$(date +%s.%N)
GOMAXPROCS=1 taskset -c "$CPU" "$bin" simulate --policy examples/policy.yaml --access-log "$tmp/access.log" > "$tmp/result.txt"
end=$(date +%s.%N)
cat "$tmp/result.txt"
awk -v s="$start" -v e="$end" -v n="$n" 'BEGIN { printf "simulate: %d lines in %.2f s wall = %.0f lines/s = %.1f million lines/min\n", n, e - s, n / (e - s), n / (e - s) * 60 / 1e6 }'
