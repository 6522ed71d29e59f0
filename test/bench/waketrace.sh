#!/usr/bin/env bash
# How long a server takes to come back from its wait, one request at a
# time: wrk -t1 -c1 against URL while `perf record` takes the scheduler's
# wake-ups and switches and every system call on all CPUs; then, for the
# threads named COMM, the median time from each sched_waking to the
# thread being switched in and to its next return from a system call
# (the wait: epoll_wait, io_uring_enter). With the backend alone
# (nginx direct) this is the step hoptrace.sh calls "proxy woken -> proxy
# back from the kernel", so the two can be compared.
#
#   test/bench/waketrace.sh URL COMM [SECONDS]
#
# Start and pin the server first (as in run.sh). The tracepoints slow
# every system call: compare servers traced alike. Needs root, perf, wrk,
# python3. (docs/bench/evloop.md, "The -c1 hop sits at the design's
# floor".)
set -euo pipefail
URL=${1:?usage: waketrace.sh URL COMM [SECONDS]}
COMM=${2:?usage: waketrace.sh URL COMM [SECONDS]}
SECS=${3:-0.5}
CLIENT_CPU=${CLIENT_CPU:-0}
me=waketrace.sh
# shellcheck source=trace1.sh
source "$(dirname "$0")/trace1.sh"
python3 - "$work/txt" "$COMM" <<'PY'
import re, statistics, sys
path, comm = sys.argv[1:3]
line_re = re.compile(r'\s*(\S+)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s*(.*)')
woken = {}   # tid -> time of its sched_waking (µs)
ran = set()  # tids switched in since their wake-up
to_run, to_exit = [], []
for line in open(path):
    m = line_re.match(line)
    if not m:
        continue
    c, tid, _cpu, t, ev, rest = m.groups()
    t = float(t) * 1e6
    if ev.endswith('sched_waking'):
        w = re.search(r'comm=(\S+) pid=(\d+)', rest)
        if w and w.group(1).startswith(comm):
            woken[w.group(2)] = t
            ran.discard(w.group(2))
    elif ev.endswith('sched_switch'):
        w = re.search(r'next_comm=(\S+) next_pid=(\d+)', rest)
        if w and w.group(2) in woken and w.group(2) not in ran:
            to_run.append(t - woken[w.group(2)])
            ran.add(w.group(2))
    elif ev.endswith('sys_exit') and c.startswith(comm) and tid in woken:
        to_exit.append(t - woken.pop(tid))
if not to_exit:
    sys.exit(f"waketrace.sh: no wake-up of {comm} traced (is it running, is the name right?)")
print(f"{len(to_exit)} wake-ups of {comm}; µs, p50 (mean):")
print(f"  woken -> switched in           {statistics.median(to_run):6.1f} ({statistics.mean(to_run):6.1f})")
print(f"  woken -> back from the kernel  {statistics.median(to_exit):6.1f} ({statistics.mean(to_exit):6.1f})")
PY
