#!/usr/bin/env bash
# Who wakes a server's threads: `perf record -e sched:sched_wakeup -a -g`
# for SECONDS while wrk drives URL with CONNS connections, then every
# wake-up of a thread whose name starts with COMM, counted by the kernel
# function that woke it, and how many came through rcu_do_batch (an RCU
# callback: a wake-up deferred to the next grace period, 4-20 ms late;
# one whose chain shows an interrupt above rcu_do_batch is the interrupt's).
#
#   test/bench/wakesrc.sh URL COMM [CONNS] [SECONDS]
#
# Start the server first. Needs root, perf, wrk, python3.
set -euo pipefail
URL=${1:?usage: wakesrc.sh URL COMM [CONNS] [SECONDS]}
COMM=${2:?usage: wakesrc.sh URL COMM [CONNS] [SECONDS]}
CONNS=${3:-4}
SECS=${4:-2}
for tool in perf wrk python3; do
  command -v "$tool" >/dev/null || { echo "wakesrc.sh: needs $tool (make deps installs it)" >&2; exit 1; }
done
work=$(mktemp -d /tmp/rl-wakesrc.XXXXXX)
trap '[ -n "${KEEP:-}" ] && cp "$work/txt" "$KEEP"; rm -rf "$work"' EXIT
wrk -t1 -c"$CONNS" -d"$(awk -v s="$SECS" 'BEGIN {print int(s + 3)}')s" --latency "$URL" >"$work/wrk" &
wrkpid=$!
sleep 1 # past wrk's connects
perf record -q -e sched:sched_wakeup -a -g -o "$work/perf.data" -- sleep "$SECS" 2>/dev/null
wait "$wrkpid"
grep -E 'Requests/sec|Latency ' "$work/wrk"
perf script -i "$work/perf.data" 2>/dev/null >"$work/txt"
python3 - "$work/txt" "$COMM" <<'PY'
import re, sys
path, comm = sys.argv[1:3]
# Frames that name the mechanism; the first one found (innermost) wins.
known = ('io_eventfd_do_signal', '__io_req_task_work_add', 'io_req_local_work_add', 'io_req_normal_work_add',
         'task_work_add', 'eventfd_signal_mask', 'ep_poll_callback', 'ep_autoremove_wake_function',
         'futex_wake', 'hrtimer_wakeup', 'wake_up_q', 'complete_signal')
total = rcu = 0
by = {}
for ev in open(path).read().split('\n\n'):
    m = re.search(r'sched_wakeup:.*?comm=(\S+)', ev)
    if not m or not m.group(1).startswith(comm):
        continue
    total += 1
    frames = [l.split()[1].split('+')[0] for l in ev.split('\n')[1:] if len(l.split()) > 1]
    # The waker's own chain ends where an interrupt came in: an hrtimer
    # that fires while rcu_do_batch runs is the timer's wake-up, not RCU's.
    own = frames
    for i, f in enumerate(frames):
        if 'sysvec' in f or f.endswith('_interrupt'):
            own = frames[:i]
            break
    if 'rcu_do_batch' in own:
        rcu += 1
        if rcu <= 3:  # show what the callback was
            print(f"through rcu_do_batch: {m.group(0)}\n    " + " <- ".join(frames[:8]))
    key = next((f for f in frames if f in known), frames[0] if frames else '?')
    by[key] = by.get(key, 0) + 1
if total == 0:
    sys.exit(f"wakesrc.sh: no wake-up of a {comm} thread traced (is it running, is the name right?)")
print(f"{total} wake-ups of {comm} threads, {rcu} through rcu_do_batch; by waker:")
for k, v in sorted(by.items(), key=lambda kv: -kv[1]):
    print(f"  {v:8d}  {k}")
PY
