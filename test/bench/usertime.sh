#!/usr/bin/env bash
# User and system CPU time per request of running servers at one request
# at a time (wrk -t1 -c1), read from /proc/PID/stat around each round:
# no profiler attached, so the latencies are the undisturbed ones (a
# `perf record` on the server doubles the p50 at -c1 on a virtual
# machine). Tick accounting (CONFIG_TICK_CPU_ACCOUNTING) samples at HZ,
# so use rounds of 10 s or more; it does not see a halted vCPU's slow
# resumption, which perf's task-clock counts.
#
#   test/bench/usertime.sh ROUNDS SECONDS NAME=PID=URL...
#
# e.g. test/bench/usertime.sh 3 10 direct=$(pgrep -P $(cat nginx.pid))=http://127.0.0.1:18080/ \
#        rl=$(pgrep -f 'rl-tproxy run')=http://127.0.0.1:18081/
# Start and pin the servers first (as in run.sh: servers on SERVER_CPU,
# wrk on CLIENT_CPU). The first target is the reference for the "over"
# column (p50 difference within the round). Needs wrk and taskset.
# (docs/bench/evloop.md, "The -c1 hop sits at the design's floor".)
set -euo pipefail
ROUNDS=${1:?usage: usertime.sh ROUNDS SECONDS NAME=PID=URL...}
SECS=${2:?usage: usertime.sh ROUNDS SECONDS NAME=PID=URL...}
shift 2
[ $# -ge 1 ] || { echo "usertime.sh: no target" >&2; exit 1; }
CLIENT_CPU=${CLIENT_CPU:-0}
for tool in wrk taskset; do
  command -v "$tool" >/dev/null || { echo "usertime.sh: needs $tool (make deps installs it)" >&2; exit 1; }
done
HZ=$(getconf CLK_TCK)
for t in "$@"; do
  IFS='=' read -r name pid url <<<"$t"
  [ -n "$url" ] && [ -r "/proc/$pid/stat" ] || { echo "usertime.sh: bad target $t (want NAME=PID=URL of a running process)" >&2; exit 1; }
done
ticks() { # PID -> "utime stime" (fields 14, 15; the comm field may hold spaces)
  sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12, $13}'
}
printf '%-12s %5s %9s %7s %8s %11s %11s\n' target round p50_us over_us requests user_us/req sys_us/req
for r in $(seq 1 "$ROUNDS"); do
  ref=""
  for t in "$@"; do
    IFS='=' read -r name pid url <<<"$t"
    taskset -c "$CLIENT_CPU" wrk -t1 -c1 -d1s "$url" >/dev/null
    read -r u1 s1 < <(ticks "$pid")
    out=$(taskset -c "$CLIENT_CPU" wrk -t1 -c1 -d"${SECS}s" --latency "$url")
    read -r u2 s2 < <(ticks "$pid")
    n=$(awk '/ requests in /{print $1}' <<<"$out")
    p50=$(awk '$1=="50%"{v=$2; if (v ~ /ms$/) {sub(/ms/,"",v); v*=1000} else if (v ~ /us$/) sub(/us/,"",v); else if (v ~ /s$/) {sub(/s/,"",v); v*=1e6}; print v}' <<<"$out")
    [ -n "$n" ] && [ "$n" -gt 0 ] || { echo "usertime.sh: $name: wrk made no request" >&2; exit 1; }
    [ -z "$ref" ] && ref=$p50
    awk -v name="$name" -v r="$r" -v p="$p50" -v ref="$ref" -v n="$n" -v u=$((u2 - u1)) -v s=$((s2 - s1)) -v hz="$HZ" \
      'BEGIN {printf "%-12s %5d %9.0f %+7.0f %8d %11.2f %11.2f\n", name, r, p, p - ref, n, u * 1e6 / hz / n, s * 1e6 / hz / n}'
  done
done
