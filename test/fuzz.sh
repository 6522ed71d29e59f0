#!/usr/bin/env bash
# Runs every fuzz target in the module for a short time ($1, default 5s).
# The committed seed corpora run in every plain `go test`; this adds
# coverage-guided exploration on top.
set -euo pipefail
t=${1:-5s}
cd "$(dirname "$0")/.."
n=0
while IFS= read -r file; do
  dir=$(dirname "$file")
  for f in $(grep -oE '^func (Fuzz[A-Za-z0-9_]+)\(' "$file" | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/'); do
    echo "fuzz $dir $f ($t)"
    go test -run '^$' -fuzz "^${f}\$" -fuzztime "$t" "./$dir" >/tmp/fuzz-$f.log 2>&1 || { cat /tmp/fuzz-$f.log; exit 1; }
    n=$((n+1))
  done
done < <(git ls-files '*_test.go' | xargs grep -l '^func Fuzz' || true)
echo "fuzz: $n targets ran for $t each"
