#!/usr/bin/env bash
# Runs every fuzz target in the module for a budget ($1, default 20000x: an
# execution count) beyond its committed seed corpus, which runs in every
# plain `go test`. `make test-fuzz` is the short run; `make fuzz` the long
# one (a duration per target). $2, if given, is a regexp: only the targets
# whose name it matches run (`make fuzz FUZZ=FuzzRequest`).
#
# A target whose inputs are slow sets its own count with a comment line
# right above its func (it applies when $1 is a count):
#   // fuzz.sh budget: 8x
# Counts, not durations, for the short run: with a -fuzztime duration, Go
# 1.26's coordinator can report its own deadline as a failure
# (go.dev/issue/75804, fixed in Go 1.27); a count has no deadline to race.
# A duration still works, with up to two reruns on exactly that message.
#
# Each package's instrumented test binary is built once (`go test -c
# -fuzz`) and then runs its targets one after another, as `go test -fuzz`
# would run it: from the package's directory (so a failing input lands in
# its testdata/fuzz) with the same corpus cache, $GOCACHE/fuzz/IMPORTPATH.
# That saves a go command and a link per target; the fuzzing is the same.
# FUZZJOBS packages (default 2) run at once: a short run is mostly start-up
# (build, coordinator, workers, baseline coverage), which leaves a second
# core idle if one package runs at a time.
set -euo pipefail
t=${1:-20000x}
only=${2:-.}
jobs=${FUZZJOBS:-2}
cd "$(dirname "$0")/.."
root=$PWD
cache=$(go env GOCACHE)/fuzz
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mapfile -t files < <(git ls-files '*_test.go' | xargs grep -l '^func Fuzz' || true)
mapfile -t dirs < <(for f in "${files[@]}"; do dirname "$f"; done | sort -u)

# fuzzpkg DIR ID runs DIR's targets that match $only, one after another,
# and writes how many there are to $work/ID.n; on a failure it prints the
# log and returns 1.
fuzzpkg() {
  local dir=$1 id=$2 file f own tf budget try pkg
  local bin=$work/$id.test log=$work/$id.log targets=()
  for file in "${files[@]}"; do
    [ "$(dirname "$file")" = "$dir" ] || continue
    for f in $(sed -nE 's/^func (Fuzz[A-Za-z0-9_]+)\(.*/\1/p' "$file"); do
      [[ "$f" =~ $only ]] || continue
      own=$(grep -B1 -E "^func ${f}\(" "$file" | sed -nE 's|^// fuzz.sh budget: ([0-9]+x)$|\1|p')
      targets+=("$f:${own}")
    done
  done
  echo "${#targets[@]}" >"$work/$id.n"
  [ ${#targets[@]} -gt 0 ] || return 0
  pkg=$(go list "./$dir") || return 1
  if ! go test -c -fuzz=. -o "$bin" "./$dir" >"$log" 2>&1; then
    cat "$log"; return 1
  fi
  for tf in "${targets[@]}"; do
    f=${tf%%:*} own=${tf#*:}
    budget=$t
    if [ -n "$own" ] && [[ "$t" == *x ]]; then budget=$own; fi
    echo "fuzz $dir $f ($budget)"
    # Go 1.26's fuzz coordinator can report its own -fuzztime deadline as a
    # failure ("context deadline exceeded", no failing input written;
    # go.dev/issue/75804, fixed in Go 1.27). That is no finding about the
    # target: run it again, at most twice. A real crash or hang writes a
    # failing input and fails at once.
    for try in 1 2 3; do
      if (cd "$root/$dir" && "$bin" -test.paniconexit0 -test.run '^$' -test.fuzz "^${f}\$" \
        -test.fuzztime "$budget" -test.fuzzcachedir "$cache/$pkg") >"$log" 2>&1; then
        break
      fi
      if [ "$try" -lt 3 ] && grep -q 'context deadline exceeded' "$log" && ! grep -q 'Failing input written' "$log"; then
        echo "fuzz $dir $f: coordinator deadline race (go.dev/issue/75804), running it again"
        continue
      fi
      echo "fuzz $dir $f: FAIL"; cat "$log"; return 1
    done
  done
  rm -f "$bin"
}

# Up to $jobs packages at once; after a failure no new package starts.
failed() { compgen -G "$work/*.fail" >/dev/null; }
i=0
for dir in "${dirs[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  failed && break
  i=$((i+1))
  { fuzzpkg "$dir" "$i" || touch "$work/$i.fail"; } &
done
wait
failed && exit 1
n=$(cat "$work"/*.n | awk '{s+=$1} END {print s+0}')
[ "$n" -gt 0 ] || { echo "fuzz: no target matches $only" >&2; exit 1; }
echo "fuzz: $n targets ran (budget $t unless a target sets its own)"
