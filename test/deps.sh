#!/usr/bin/env bash
# Installs the Debian packages that the tests, benchmarks and demo use, when
# they are missing and we are root. Without root it only reports what is
# missing; the tests that need a missing tool skip with a reason (or fail
# under RL_TPROXY_STRICT=1, as .ci/run sets).
set -euo pipefail
# command -> Debian package
declare -A need=(
  [clang-14]=clang-14 # pinned: bpf/doc.go's go:generate compiles with it
  [llvm-strip-14]=llvm-14
  [nginx]=nginx
  [wrk]=wrk
  [h2load]=nghttp2-client # HTTP/2 side by side (test/bench/h2.sh)
  [dnsmasq]=dnsmasq-base
  [haproxy]=haproxy
  [caddy]=caddy
  [perf]=linux-perf
  [promtool]=prometheus
  [goaccess]=goaccess
  [gnuplot]=gnuplot-nox
  [curl]=curl
  [ssh]=openssh-client
  [ip]=iproute2
  [systemd-analyze]=systemd
  [bpftool]=bpftool
  [kubectl]=kubernetes-client
  [setpriv]=util-linux
  [nsenter]=util-linux
)
missing=()
for cmd in "${!need[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
# headers for the eBPF build
[ -e /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
[ -e /usr/include/linux/bpf.h ] || missing+=(linux-libc-dev)
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" != 0 ]; then
  echo "test/deps.sh: not root; missing Debian packages: ${missing[*]} (tests needing them will skip, or fail under RL_TPROXY_STRICT=1)" >&2
  exit 0
fi
echo "test/deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >/dev/null
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
# nginx from Debian starts its default site on install in some images; the
# tests run their own instances and never need it. Stop only that service
# (never `pkill nginx`: other nginx processes on the machine are not ours).
if [[ " ${missing[*]} " == *" nginx "* ]]; then
  systemctl disable --now nginx >/dev/null 2>&1 || true
  # without systemd the package's init script may have started it: stop
  # the daemon the package's pid file names, and only that one
  if [ -s /run/nginx.pid ]; then kill "$(cat /run/nginx.pid)" 2>/dev/null || true; fi
fi
