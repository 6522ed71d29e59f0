#!/usr/bin/env bash
# Where one request's time goes, one request at a time: wrk -t1 -c1
# against URL while `perf record` takes the scheduler's wake-ups and
# switches and every system call on all CPUs, then the median of each
# segment of an exchange client -> proxy -> backend -> proxy -> client.
#
#   test/bench/hoptrace.sh URL PROXY_COMM [BACKEND_COMM] [SECONDS]
#
# PROXY_COMM is the proxy's thread name as perf shows it (rl-tproxy,
# evproto, nginx for nginx proxy_pass is ambiguous: use a proxy whose name
# differs from the backend's); BACKEND_COMM defaults to nginx. Start the
# proxy and the backend first, pinned as in run.sh (both on SERVER_CPU,
# wrk on CLIENT_CPU). The tracepoints slow every system call, so the
# trace is short (SECONDS, default 0.5) and absolute numbers are
# inflated: compare builds traced alike. A proxy "submits" with a write,
# writev, sendmsg or an io_uring_enter that submits SQEs. Needs root,
# perf, wrk, python3. (docs/bench/evloop.md, "One TIMEOUT per span".)
set -euo pipefail
URL=${1:?usage: hoptrace.sh URL PROXY_COMM [BACKEND_COMM] [SECONDS]}
PROXY=${2:?usage: hoptrace.sh URL PROXY_COMM [BACKEND_COMM] [SECONDS]}
BACKEND=${3:-nginx}
SECS=${4:-0.5}
CLIENT_CPU=${CLIENT_CPU:-0}
me=hoptrace.sh
# shellcheck source=trace1.sh
source "$(dirname "$0")/trace1.sh"
python3 - "$work/txt" "$PROXY" "$BACKEND" <<'PY'
import re, statistics, sys
path, proxy, backend = sys.argv[1:4]
line_rx = re.compile(r'^\s*(\S+)\s+\d+\s+\[\d+\]\s+([\d.]+):\s+(\S+):\s*(.*)$')
ev = []
for line in open(path):
    m = line_rx.match(line)
    if m and m.group(1) != 'perf':
        comm, t, name, rest = m.groups()
        ev.append((float(t) * 1e6, comm, name, rest))
def nr(rest):
    m = re.match(r'NR (\d+)', rest)
    return int(m.group(1)) if m else -1
def enter(comm, nrs):
    return lambda e: e[1] == comm and e[2] == 'raw_syscalls:sys_enter' and nr(e[3]) in nrs
def leave(comm, nrs):
    return lambda e: e[1] == comm and e[2] == 'raw_syscalls:sys_exit' and nr(e[3]) in nrs
def wakes(by, who):
    return lambda e: e[1] == by and e[2] == 'sched:sched_waking' and ('comm=' + who + ' ') in e[3]
WRITE = (1, 20, 46)  # write, writev, sendmsg
def submits(e):  # a write, or an io_uring_enter with SQEs to submit
    if e[1] != proxy or e[2] != 'raw_syscalls:sys_enter':
        return False
    n = nr(e[3])
    return n in WRITE or (n == 426 and re.match(r'NR 426 \(\w+, [1-9a-f]', e[3]) is not None)
ANY = (0, 1, 20, 45, 46, 47, 202, 232, 281, 426)
steps = [
    ('client writes', enter('wrk', (1,))),
    ('proxy woken', wakes('wrk', proxy)),
    ('proxy back from the kernel', leave(proxy, ANY)),
    ('proxy submits upstream', submits),
    ('backend woken', wakes(proxy, backend)),
    ('backend runs', lambda e: e[1] == backend),
    ('backend writes', enter(backend, WRITE + (40,))),
    ('proxy woken again', wakes(backend, proxy)),
    ('proxy runs', lambda e: e[1] == proxy),
    ('proxy submits downstream', submits),
    ('client woken', wakes(proxy, 'wrk')),
    ('client reads', leave('wrk', (0,))),
]
seg = [[] for _ in steps]
total = []
n, i = len(ev), 0
def find(i, pred, end):
    while i < end and not pred(ev[i]):
        i += 1
    return i
while True:
    i = find(i, steps[0][1], n)
    if i >= n:
        break
    nxt = find(i + 1, steps[0][1], n)
    ts, j = [ev[i][0]], i
    for _, pred in steps[1:]:
        j = find(j + 1, pred, nxt)
        if j >= nxt:
            break
        ts.append(ev[j][0])
    if len(ts) == len(steps):
        for k in range(1, len(steps)):
            seg[k].append(ts[k] - ts[k - 1])
        total.append(ts[-1] - ts[0])
    i = nxt
if not total:
    sys.exit(f"hoptrace.sh: no complete exchange of wrk -> {proxy} -> {backend} in the trace (names as perf shows them?)")
print(f"{len(total)} exchanges traced; µs, p50 (mean):")
for k in range(1, len(steps)):
    print(f"  {steps[k-1][0]:>26} -> {steps[k][0]:<26} {statistics.median(seg[k]):6.1f} ({statistics.mean(seg[k]):6.1f})")
print(f"  {'whole exchange':>55} {statistics.median(total):6.1f} ({statistics.mean(total):6.1f})")
PY
