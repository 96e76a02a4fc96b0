#!/usr/bin/env bash
# memsnap's long fuzzing run: every fuzz target of every package (or of the
# packages named), FUZZTIME each, one after another. scripts/test.sh gives each
# target a short budget in CI; this is the longer one.
#   scripts/fuzz.sh                          every target, 5m each
#   FUZZTIME=30m scripts/fuzz.sh ./merge/... the targets of some packages
#   FUZZ='Manifest|Meta' scripts/fuzz.sh     only the targets whose name matches (grep -E)
#   FUZZPARALLEL=8 scripts/fuzz.sh           workers per target (default: GOMAXPROCS)
# Prints a line per target: its executions, and whether it found a failing input
# (written under the package's testdata/fuzz/<target>/, kept as a regression test
# once fixed). Every target's full output goes to FUZZLOG (default a new temporary
# folder). Exits non-zero if any target failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
FUZZTIME="${FUZZTIME:-5m}"
FUZZ="${FUZZ:-.}"
FUZZLOG="${FUZZLOG:-$(mktemp -d "${TMPDIR:-/tmp}/memsnap-fuzz.XXXXXX")}"
mkdir -p "$FUZZLOG"
parallel=()
if [ -n "${FUZZPARALLEL:-}" ]; then parallel=(-parallel "$FUZZPARALLEL"); fi
[ $# -gt 0 ] || set -- ./...

echo "== fuzz ($FUZZTIME each; logs in $FUZZLOG)"
targets=0 failed=0
for pkg in $(go list "$@"); do
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u | grep -E -- "$FUZZ" || true); do
    targets=$((targets + 1))
    log="$FUZZLOG/$(echo "$pkg" | tr '/' '_').$f.log"
    rc=0
    go test -run '^$' -fuzz "^$f\$" -fuzztime "$FUZZTIME" "${parallel[@]}" "$pkg" >"$log" 2>&1 || rc=$?
    # the last progress line holds the totals: "fuzz: elapsed: 5m0s, execs: N (R/sec), new interesting: K (total: T)"
    last=$(grep '^fuzz: elapsed: .*execs: ' "$log" | tail -n 1 || true)
    elapsed=$(sed -n 's/^fuzz: elapsed: \([^,]*\),.*/\1/p' <<<"$last")
    execs=$(sed -n 's/.*execs: \([0-9]*\) .*/\1/p' <<<"$last")
    interesting=$(sed -n 's/.*new interesting: \([0-9]*\).*/\1/p' <<<"$last")
    if [ "$rc" = 0 ]; then
      printf 'ok    %s %s: %s execs in %s, %s new interesting, nothing found\n' "$pkg" "$f" "${execs:-0}" "${elapsed:-?}" "${interesting:-0}"
      continue
    fi
    failed=$((failed + 1))
    crasher=$(sed -n 's/.*Failing input written to \(.*\)$/\1/p' "$log" | tail -n 1)
    if [ -n "$crasher" ]; then
      printf 'FAIL  %s %s: found a failing input after %s execs in %s: %s/%s\n' "$pkg" "$f" "${execs:-0}" "${elapsed:-?}" "$dir" "$crasher"
    else
      printf 'FAIL  %s %s: exit status %s before any failing input (a seed failed or it did not build)\n' "$pkg" "$f" "$rc"
    fi
    grep -E -- '--- FAIL|_test\.go:[0-9]+:|^panic:|go test -run=' "$log" | head -n 12 | sed 's/^/      /' || true
  done
done
echo "== $targets targets, $failed failed"
[ "$failed" = 0 ]
