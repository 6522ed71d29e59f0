#!/usr/bin/env bash
# Metric series across reloads: the binary BIN runs a policy of 10,000
# limited locations (50 zones), reloads it renamed, then the original
# again, and prints the /metrics scrape size and the process's RSS after
# each, and the Go heap in use (live objects and garbage not yet
# collected). With the series of removed locations deleted, the third scrape is
# the size of the first (docs/metrics.md, "Policy and reload").
#
#   test/bench/reloadseries.sh BIN
#
# Loopback only; needs curl and python3. The proxy runs at most 300 s.
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
gen() {
	python3 - "$1" "$port" <<'PY'
import sys
prefix, port = sys.argv[1], sys.argv[2]
out = ["ratelimitly: {embedded: true}", "zones:"]
for z in range(50):
    out.append(f'  {prefix}z{z}: {{bucket: "k:{{remote_addr}}", rate: 10/s}}')
out += ["services:", "  - name: web", f"    listen: 127.0.0.1:{port}", "    upstream: 127.0.0.1:1", "    locations:"]
for i in range(10000):
    out.append(f"      - {{name: {prefix}{i}, match: {{path_prefix: /{prefix}{i}/}}, limit: [{prefix}z{i % 50}]}}")
print("\n".join(out))
PY
}
gen a >"$dir/a.yaml"
gen b >"$dir/b.yaml"
cp "$dir/a.yaml" "$dir/policy.yaml"
timeout 300 "$bin" run --policy "$dir/policy.yaml" --admin 127.0.0.1:0 --log-format json --event-loops 1 2>"$dir/log" &
tpid=$!
trap 'kill $tpid 2>/dev/null; wait $tpid 2>/dev/null; rm -rf "$dir"' EXIT
pid=
for _ in $(seq 50); do
	pid=$(pgrep -P $tpid || true)
	[ -n "$pid" ] && break
	sleep 0.1
done
[ -n "$pid" ] || { echo "the proxy did not start" >&2; exit 1; }
admin=
for _ in $(seq 150); do
	admin=$(grep -o '"admin listener","addr":"[^"]*"' "$dir/log" | sed 's/.*"addr":"//;s/"//' || true)
	[ -n "$admin" ] && break
	sleep 0.2
done
[ -n "$admin" ] || { echo "no admin listener" >&2; exit 1; }
waitgen() {
	for _ in $(seq 150); do
		curl -s "http://$admin/metrics" >"$dir/scrape" || true
		grep -q "^rl_tproxy_policy_generation $1\$" "$dir/scrape" && return 0
		sleep 0.2
	done
	echo "generation $1 never came" >&2
	exit 1
}
report() {
	curl -s "http://$admin/metrics" >"$dir/scrape"
	echo "$1: scrape $(wc -c <"$dir/scrape") bytes, rss $(awk '/VmRSS/ {print $2 " kB"}' /proc/$pid/status)," \
		"Go heap in use $(awk '$1 == "go_memstats_heap_inuse_bytes" {printf "%.0f MB", $2 / 1e6}' "$dir/scrape")"
}
swap() {
	cp "$dir/$1.yaml" "$dir/policy.yaml.tmp"
	mv "$dir/policy.yaml.tmp" "$dir/policy.yaml"
	kill -HUP $pid
}
waitgen 1; report "generation 1 (a)"
swap b; waitgen 2; report "generation 2 (b, renamed)"
swap a; waitgen 3; report "generation 3 (a again)"
