# Shared by hoptrace.sh and waketrace.sh; sourced, not run. The caller
# sets $me (its name, for messages), $URL, $SECS and $CLIENT_CPU. Checks
# the tools, then runs wrk -t1 -c1 against URL on CLIENT_CPU while `perf
# record` takes the scheduler's wake-ups and switches and every system
# call on all CPUs for SECS seconds; prints wrk's rate and p50 during the
# trace and leaves the decoded events in $work/txt (comm, tid, cpu, time,
# event, fields), $work being a temporary directory removed on exit.

for tool in perf wrk python3 taskset; do
  command -v "$tool" >/dev/null || { echo "$me: needs $tool (make deps installs it)" >&2; exit 1; }
done
work=$(mktemp -d "/tmp/${me%.sh}.XXXXXX")
trap 'rm -rf "$work"' EXIT
taskset -c "$CLIENT_CPU" wrk -t1 -c1 -d1s "$URL" >/dev/null
taskset -c "$CLIENT_CPU" wrk -t1 -c1 -d"$(python3 -c "print(int($SECS)+3)")"s --latency "$URL" >"$work/wrk" &
wrkpid=$!
sleep 1
perf record -q -e sched:sched_switch,sched:sched_waking,raw_syscalls:sys_enter,raw_syscalls:sys_exit \
  -a -o "$work/data" -- sleep "$SECS" >/dev/null 2>&1
wait "$wrkpid"
echo "wrk during the trace: $(awk '/Requests\/sec/{print $2 " req/s"} $1=="50%"{print "p50 " $2}' "$work/wrk" | paste -sd' ')"
perf script -i "$work/data" -F comm,tid,cpu,time,event,trace 2>/dev/null >"$work/txt"
