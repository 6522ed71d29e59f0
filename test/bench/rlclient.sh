#!/usr/bin/env bash
# The RateLimitly client at 256 checks in flight, side by side in one run:
#   RingsLoop256   the batched client as the data path drives it (checks
#                  issued from an event loop, sendmmsg/recvmmsg with GSO)
#   RingsAsync256  the batched client from goroutines (CheckAsync)
#   Naive256       the baseline: one write and one read per datagram
# each against its own pkg/rlserver child (see pkg/rlclient's
# bench_test.go). Pinning as in run.sh: the client on CPU $CLIENT_CPU with
# GOMAXPROCS=1, the server child on CPU $SERVER_CPU. Rounds alternate the
# order (even rounds reversed). The benchmark reports the client's own CPU
# per decision (getrusage, server excluded) beside the time per decision;
# the table gives medians over the rounds and, per round, naive ÷ batched
# for both (the bar: the batched client at most a third of the naive
# one per decision, and at least its decisions per second).
#
# Env: ROUNDS=3 N=200000 (decisions per run) SERVER_CPU=1 CLIENT_CPU=0
#      OUT=docs/bench/rlclient-run.md (Markdown, also printed; OUT=- prints
#      only).
set -euo pipefail
cd "$(dirname "$0")/../.."

ROUNDS=${ROUNDS:-3}
N=${N:-200000}
SERVER_CPU=${SERVER_CPU:-1}
CLIENT_CPU=${CLIENT_CPU:-0}
OUT=${OUT:-docs/bench/rlclient-run.md}
case "$ROUNDS$N" in *[!0-9]*) echo "rlclient.sh: ROUNDS and N must be numbers" >&2; exit 2 ;; esac
if [ "$(nproc)" -lt 2 ]; then SERVER_CPU=0 CLIENT_CPU=0; fi
for tool in go taskset python3; do
  command -v "$tool" >/dev/null || { echo "rlclient.sh: needs $tool (make deps installs it)" >&2; exit 1; }
done

work=$(mktemp -d /tmp/rl-rlclient.XXXXXX)
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT TERM

go test -c -o "$work/rlclient.test" ./pkg/rlclient/
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -z "$(git status --porcelain -- pkg 2>/dev/null)" ] || rev="$rev+dirty"

benches=(RingsLoop256 RingsAsync256 Naive256)
for r in $(seq 1 "$ROUNDS"); do
  order=("${benches[@]}")
  if [ $((r % 2)) = 0 ]; then order=(Naive256 RingsAsync256 RingsLoop256); fi
  for b in "${order[@]}"; do
    line=$(cd "$work" && GOMAXPROCS=1 RLBENCH_SERVER_CPU="$SERVER_CPU" taskset -c "$CLIENT_CPU" \
      ./rlclient.test -test.run '^$' -test.bench "^Benchmark$b\$" -test.benchtime "${N}x" -test.benchmem |
      grep "^Benchmark$b") || { echo "rlclient.sh: Benchmark$b printed no result" >&2; exit 1; }
    echo "$r $line" | tee -a "$work/raw.txt" >&2
  done
done

python3 - "$work/raw.txt" "$rev" "$ROUNDS" "$N" "$CLIENT_CPU" "$SERVER_CPU" >"$work/out.md" <<'EOF'
import re, statistics as st, sys, time
raw, rev, rounds, n, ccpu, scpu = sys.argv[1:]
rows = {}
for line in open(raw):
    p = line.split()
    r, name = int(p[0]), re.sub(r'^Benchmark|-\d+$', '', p[1])
    m = {}
    for i in range(3, len(p) - 1):
        try:
            m[p[i + 1]] = float(p[i])
        except ValueError:
            pass
    rows[(r, name)] = m
rs = sorted({k[0] for k in rows})
def med(name, k):
    v = [rows[(r, name)][k] for r in rs if k in rows.get((r, name), {})]
    return st.median(v) if v else float('nan')
print(f"# RateLimitly client at 256 in flight (test/bench/rlclient.sh)\n")
print(f"At {rev}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {rounds} rounds of {n} decisions per client,")
print(f"client on CPU {ccpu} with GOMAXPROCS=1, its pkg/rlserver child on CPU {scpu}; medians over the rounds.")
print("Client CPU is the benchmark process's own (getrusage), the server's is apart.\n")
print("| client | ns per decision | client CPU µs per decision | server CPU µs per decision | ctx switches per decision | datagrams per sendmmsg | datagrams per recvmmsg | p99 µs | B/op | allocs/op |")
print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
def f(x, d=3):
    return "–" if x != x else f"{x:.{d}f}"
for name in ("RingsLoop256", "RingsAsync256", "Naive256"):
    print(f"| {name} | {f(med(name,'ns/op'),0)} | {f(med(name,'cpu-µs/op'))} | {f(med(name,'srv-cpu-µs/op'))} | "
          f"{f(med(name,'ctxsw/op'),4)} | {f(med(name,'dgrams/sendmmsg'),1)} | {f(med(name,'dgrams/recvmmsg'),1)} | "
          f"{f(med(name,'p99-µs'),0)} | {f(med(name,'B/op'),0)} | {f(med(name,'allocs/op'),0)} |")
print("\n| naive ÷ batched, per round | client CPU per decision | time per decision |")
print("|---|---|---|")
for name in ("RingsLoop256", "RingsAsync256"):
    cells = []
    for k in ("cpu-µs/op", "ns/op"):
        v = [rows[(r, "Naive256")][k] / rows[(r, name)][k] for r in rs
             if rows.get((r, name), {}).get(k) and rows.get((r, "Naive256"), {}).get(k)]
        cells.append(f"**{st.median(v):.2f}×** median ({', '.join(f'{x:.2f}' for x in v)})" if v else "–")
    print(f"| Naive256 ÷ {name} | {cells[0]} | {cells[1]} |")
print("\nThe data path issues its checks as RingsLoop256 does; the bar: the batched")
print("client costs at most a third of the naive one per decision and decides at")
print("least as many checks per second (time per decision ratio >= 1).")
EOF

if [ "$OUT" = - ]; then cat "$work/out.md"; else cp "$work/out.md" "$OUT"; cat "$OUT"; fi
