#!/usr/bin/env bash
# The RateLimitly sizing model of docs/operations.md, measured:
#   1. datagrams and bytes per protected request for each request policy
#      at 1, 3 and 5 servers, healthy and with the oldest server silent
#      (test/bench/sizing, the real client and servers on loopback);
#   2. decisions per CPU-second of one server core: the standalone server
#      (the server child of pkg/rlclient BenchmarkRingsAsync256, pinned to
#      CPU $SERVER_CPU, its own CPU time per decision) and the embedded
#      server (pkg/hook BenchmarkAdmitEmbedded64Loop: gate, client and
#      embedded server in one process pinned to one CPU, GOMAXPROCS=1: the
#      CPU one node spends per protected request on admission);
#   3. a worked example: $NODES proxy nodes x $RATE protected requests/s.
# CPU is measured as CPU time (getrusage), not wall time, so a busy shared
# machine slows the run more than it skews the figures; the load average
# at the start is printed with them.
#
# Env: N=200000 (decisions per CPU benchmark) SERVER_CPU=1 CLIENT_CPU=0
#      NODES=200 RATE=5000 OUT=docs/bench/sizing.md (OUT=- prints only)
set -euo pipefail
cd "$(dirname "$0")/../.."

N=${N:-200000}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
NODES=${NODES:-200}
RATE=${RATE:-5000}
OUT=${OUT:-docs/bench/sizing.md}
case "$N$NODES$RATE$SERVER_CPU$CLIENT_CPU" in *[!0-9]*) echo "sizing.sh: N, NODES, RATE and the CPUs must be numbers" >&2; exit 2 ;; esac
if [ "$(nproc)" -lt 2 ]; then SERVER_CPU=0 CLIENT_CPU=0; fi
for tool in go taskset python3; do
  command -v "$tool" >/dev/null || { echo "sizing.sh: needs $tool (make deps installs it)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/rl-sizing.XXXXXX)
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM
load=$(cut -d' ' -f1-3 /proc/loadavg)
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain -- pkg test 2>/dev/null)" ] || rev="$rev+dirty"

echo "sizing.sh: traffic per protected request" >&2
SIZING_TRAFFIC_OUT="$work/traffic.md" go test -count=1 -run '^TestTraffic$' ./test/bench/sizing/ >&2

echo "sizing.sh: the standalone server" >&2
go test -c -o "$work/rlclient.test" ./pkg/rlclient/
(cd "$work" && GOMAXPROCS=1 RLBENCH_SERVER_CPU="$SERVER_CPU" taskset -c "$CLIENT_CPU" \
  ./rlclient.test -test.run '^$' -test.bench '^BenchmarkRingsAsync256$' -test.benchtime "${N}x") |
  grep '^BenchmarkRingsAsync256' | tee "$work/standalone.txt" >&2

echo "sizing.sh: the embedded server" >&2
go test -c -o "$work/hook.test" ./pkg/hook/
(cd "$work" && GOMAXPROCS=1 taskset -c "$SERVER_CPU" ./hook.test -test.run '^$' -test.bench '^BenchmarkAdmitEmbedded64Loop$' -test.benchtime "${N}x") |
  grep '^BenchmarkAdmitEmbedded64Loop' | tee "$work/embedded.txt" >&2

python3 - "$work" "$rev" "$load" "$N" "$NODES" "$RATE" "$SERVER_CPU" "$CLIENT_CPU" >"$work/out.md" <<'PY'
import re, sys, time
work, rev, load, n, nodes, rate, scpu, ccpu = sys.argv[1:]
nodes, rate = int(nodes), int(rate)

def metrics(path):
    p = open(path).read().split()
    return {p[i + 1]: float(p[i]) for i in range(2, len(p) - 1) if re.match(r'^[0-9.]+$', p[i])}

srv = metrics(work + "/standalone.txt")["srv-cpu-µs/op"]        # server CPU µs per decision
emb = metrics(work + "/embedded.txt")["cpu-µs/op"]               # whole admission, one process

rows = {}
for line in open(work + "/traffic.md"):
    c = [x.strip() for x in line.strip().strip('|').split('|')]
    if len(c) == 11 and re.match(r'^\d+$', c[1]):
        rows[(c[0], int(c[1]), c[2])] = [float(x) for x in c[3:]]

out = []
w = out.append
w("# RateLimitly sizing (test/bench/sizing.sh)\n")
w("At %s, %s. **Shared machine**: %s, load average %s at the start (other engineers' builds and tests were running), so the CPU figures are CPU time per decision (getrusage), which a busy host inflates less than wall time, and they are upper bounds for a quiet core.\n" % (rev, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0].strip(), load))
w("## Decisions per core\n")
w("| what | CPU µs per decision | decisions per core-second | measured by |")
w("|---|--:|--:|---|")
w("| standalone server (`rl-tproxy ratelimitly-server` code: worker goroutine, batched recvmmsg/sendmmsg), 1 request + 1 answer | %.2f | %.0f | server child of `pkg/rlclient` BenchmarkRingsAsync256, pinned to CPU %s, 256 checks in flight, %s decisions |" % (srv, 1e6 / srv, scpu, n))
w("| embedded (`embedded: true`, `pkg/embedded`): gate + client + server in one process on one core, per protected request | %.2f | %.0f | `pkg/hook` BenchmarkAdmitEmbedded64Loop, one event loop, GOMAXPROCS=1, CPU %s; its server reads on a worker goroutine, where the node drives the same server code from its event loops |" % (emb, 1e6 / emb, scpu))
w("")
w("Scaling model: a server with `--workers W` runs W SO_REUSEPORT sockets, each read and decided by its own goroutine; the tables are sharded 64 ways, so decisions per second grow with cores until two workers hit the same bucket shard: **W cores ≈ W × the per-core figure** for many distinct buckets, and a single hot bucket serialises on its shard lock. Measured here on 1 core; 2 cores is the model (this 2-CPU machine also runs the load generator and other engineers' work).\n")
w("## Datagrams and bytes per protected request\n")
w(open(work + "/traffic.md").read())
w("Each row: %s checks from 32 goroutines with unit 20 ms, every allowed check followed by one latency report (the client sends a report to every server). Timing on a loaded host moves the completions column: a completion goes to every server that had not answered when the decision was taken, so under `standard` it grows when answers arrive spread out.\n" % "400")

def example(pol, servers, case="all answer"):
    r = rows[(pol, servers, case)]
    req, repl, resp, comp, rep, dg, byts, dec = r
    R = nodes * rate
    inbound = (req + comp + rep) / servers       # datagrams each server reads per protected request
    cores = R * inbound * srv / 1e6               # model: every datagram read costs a decision
    return R, dg, byts, inbound, resp / servers, cores

w("## Worked example: %d nodes × %d protected requests/s\n" % (nodes, rate))
w("%d protected requests/s in all. Model: each server reads its share of requests, completions and reports and answers its requests; every datagram it reads is costed like a decision (%.2f µs, the standalone figure; completions of an id already seen and reports are cheaper, so this is an upper bound).\n" % (nodes * rate, srv))
w("| request policy | servers | datagrams/s in all | per proxy node | bytes/s in all | per proxy node | each server reads/s | answers/s | server cores each (model) |")
w("|---|--:|--:|--:|--:|--:|--:|--:|--:|")
for pol, s in (("standard", 3), ("standard", 5), ("single_round", 3), ("custom", 3)):
    if (pol, s, "all answer") not in rows:
        continue
    R, dg, byts, inb, outb, cores = example(pol, s)
    w("| %s | %d | %.1f M | %.0f k | %.2f GB/s (%.1f Gbit/s) | %.1f MB/s (%.0f Mbit/s) | %.2f M | %.2f M | %.1f |" % (
        pol, s, R * dg / 1e6, rate * dg / 1e3, R * byts / 1e9, R * byts * 8 / 1e9, rate * byts / 1e6, rate * byts * 8 / 1e6,
        R * inb / 1e6, R * outb / 1e6, cores))
w("")
if ("standard", 3, "all answer") in rows:
    R, dg, byts, inb, outb, cores = example("standard", 3)
    w("Reading it: at 3 servers under `standard`, %d nodes at %d protected requests/s put about %.1f million datagrams and %.1f Gbit/s a second on the RateLimitly network (%.0f Mbit/s per node), and each server reads about %.1f million datagrams a second: about %.1f cores each by the model above. Locations without `report` send no report datagrams: take that column out for them. A fifth server adds fan-out traffic without taking decisions off the others (each server decides every request): more servers buy availability, not capacity. These figures are from the shared bench host; run `test/bench/sizing.sh` on your own hardware.\n" % (
        nodes, rate, R * dg / 1e6, R * byts * 8 / 1e9, rate * byts * 8 / 1e6, R * inb / 1e6, cores))
w("Embedded RateLimitly is for single-node use: there each node decides its own %d requests/s for about %.2f cores of admission work (%.2f µs per protected request, gate and client included)." % (rate, rate * emb / 1e6, emb))
print("\n".join(out))
PY
if [ "$OUT" = - ]; then cat "$work/out.md"; else cp "$work/out.md" "$OUT"; cat "$OUT"; fi
