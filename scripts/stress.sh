#!/usr/bin/env bash
# Run tests many times in a row with CPU-burning processes beside them, as a shared
# CI machine would: a test that waits for time instead of a state fails here.
#   scripts/stress.sh [-n 20] [-burn 2] [-race] PKG TESTREGEX [PKG TESTREGEX ...]
# Needs MinIO for the tests that use it (eval "$(scripts/minio.sh start)").
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
n=20; burn=2; race=""
while [ $# -gt 0 ]; do
  case "$1" in
    -n) n=$2; shift 2 ;;
    -burn) burn=$2; shift 2 ;;
    -race) race=-race; shift ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { echo "usage: $0 [-n N] [-burn K] [-race] PKG TESTREGEX ..." >&2; exit 2; }
tmp=$(mktemp -d); pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
for _ in $(seq 1 "$burn"); do (while :; do :; done) & pids+=($!); done
fail=0
while [ $# -ge 2 ]; do
  pkg=$1; re=$2; shift 2
  go test $race -c -o "$tmp/t.test" "$pkg"
  dir=$(go list -f '{{.Dir}}' "$pkg")
  for i in $(seq 1 "$n"); do
    if ! (cd "$dir" && "$tmp/t.test" -test.count=1 -test.run "$re" >"$tmp/out" 2>&1); then
      keep="${TMPDIR:-/tmp}/stress-fail-$$-$i.log"; cp "$tmp/out" "$keep"
      echo "FAIL $pkg $re (run $i of $n; whole output in $keep):"
      grep -E -- "^(=== RUN|\s*--- FAIL|FAIL)|_test\.go:[0-9]+: " "$keep" | grep -v "testutil.go:[0-9]*: time=" | head -40
      fail=1; break
    fi
  done
  [ $fail = 0 ] && echo "ok   $pkg $re: $n runs with $burn CPU burners"
done
exit $fail
