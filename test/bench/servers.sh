# Shared by the side-by-side scripts that run servers pinned to one CPU
# (bigbody.sh, upload.sh); sourced, not run. The caller sets $me (its name,
# for messages) and $SERVER_CPU before sourcing. Defines $work (a temporary
# directory removed on exit, with every server started by `start`) and the
# helpers below.

work=$(mktemp -d "/tmp/rl-${me%.sh}.XXXXXX")
pids=()
cleanup() {
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
wait_http() { # url: until it answers 2xx (10 s at most)
  for _ in $(seq 1 500); do
    curl -fsS -o /dev/null --max-time 2 "$1" 2>/dev/null && return 0
    sleep 0.02
  done
  echo "$me: $1 not answering 2xx" >&2; exit 1
}
start() { # command...: runs it on the server CPU, pid in $last
  taskset -c "$SERVER_CPU" "$@" >"$work/log.$#.$RANDOM" 2>&1 &
  last=$!; pids+=("$last")
}
pidlist() { # pid: the process and its children, comma-separated
  local l="$1" c
  for c in $(pgrep -P "$1" || true); do l="$l,$c"; done
  echo "$l"
}
