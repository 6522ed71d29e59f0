#!/usr/bin/env bash
# The non-race pass of `make test`: runs every allocation test
# (testing.AllocsPerRun) without -race, where their counts mean something.
# Convention, checked here so that no allocation test silently drops out of
# both passes: a test file that calls AllocsPerRun starts with
# `//go:build !race` (the race pass leaves it out), and every Test function
# in such a file has "Alloc" in its name (this pass selects them by it).
set -euo pipefail
cd "$(dirname "$0")/.."
bad=0
mapfile -t calling < <(git ls-files --cached --others --exclude-standard '*_test.go' | xargs grep -l 'testing\.AllocsPerRun' || true)
for f in "${calling[@]}"; do
  if [ "$(head -1 "$f")" != "//go:build !race" ]; then
    echo "$f: calls testing.AllocsPerRun but does not start with //go:build !race" >&2
    bad=1
  fi
done
mapfile -t norace < <(git ls-files --cached --others --exclude-standard '*_test.go' | xargs grep -lx '//go:build !race' || true)
pkgs=()
for f in "${norace[@]}"; do
  while IFS= read -r name; do
    case "$name" in *Alloc*) ;; *)
      echo "$f: $name is in a !race file but has no \"Alloc\" in its name (the non-race pass would not run it)" >&2
      bad=1 ;;
    esac
  done < <(grep -oE '^func Test[A-Za-z0-9_]*' "$f" | sed 's/^func //')
  grep -q '^func Test' "$f" && pkgs+=("./$(dirname "$f")")
done
[ "$bad" = 0 ] || exit 1
mapfile -t pkgs < <(printf '%s\n' "${pkgs[@]}" | sort -u)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
go test -count=1 -v -run 'Alloc' "${pkgs[@]}" >"$log" 2>&1 || { cat "$log"; exit 1; }
if grep -E '^\s*--- SKIP' "$log"; then
  echo "allocation tests skipped (above): the non-race pass must run them all" >&2
  exit 1
fi
ran=$(grep -cE '^--- PASS: Test' "$log" || true)
echo "test-alloc: $ran allocation tests passed without -race in ${#pkgs[@]} packages"
