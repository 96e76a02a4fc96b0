#!/usr/bin/env bash
# stress.sh for a many-core machine (the GPU machine's 16 cores): each slot is a
# pair of cores that runs one test binary over and over for LIMIT seconds, with two
# CPU burners pinned to the same pair (a loaded 2-core CI machine, 8 at a time).
# The binaries are built beforehand, where Go is (the GPU machine needs none):
#   go test -c -o .devrun/cmd.test ./cmd/memsnap
#   go test -c -o .devrun/coord.test ./coordinator
#   (gzip -9 them to carry them; BIN names the folder, .devrun by default)
# then, there:  LIMIT=300 OUTD=/tmp/stress bash scripts/stress-slots.sh
# A failing run's log is kept in $OUT (or $OUTD).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.devrun}; OUTD=${OUTD:-/tmp/stress-slots}; LIMIT=${LIMIT:-300}
KEEP=${OUT:-$OUTD}
mkdir -p "$OUTD" "$KEEP"
for b in cmd coord; do
  if [ -f "$BIN/$b.test.gz" ]; then gunzip -c "$BIN/$b.test.gz" > "/tmp/$b.test"; else cp "$BIN/$b.test" "/tmp/$b.test"; fi
  chmod +x "/tmp/$b.test"
done
slot() { # cores binary package-dir regex name
  local cores=$1 bin=$2 dir=$3 re=$4 name=$5 i=0 pass=0 fail=0 t0=$SECONDS
  export TMPDIR=/tmp/slot-$name XDG_RUNTIME_DIR=/tmp/slot-$name/run; mkdir -p "$XDG_RUNTIME_DIR"; chmod 700 "$XDG_RUNTIME_DIR"
  taskset -c "$cores" bash -c 'while :; do :; done' & local b1=$!
  taskset -c "$cores" bash -c 'while :; do :; done' & local b2=$!
  while [ $((SECONDS - t0)) -lt "$LIMIT" ]; do
    i=$((i+1))
    if (cd "$dir" && timeout 250 taskset -c "$cores" "/tmp/$bin.test" -test.count=1 -test.run "$re" >"$OUTD/$name.$i.log" 2>&1); then
      pass=$((pass+1)); rm -f "$OUTD/$name.$i.log"
    else
      fail=$((fail+1)); cp "$OUTD/$name.$i.log" "$KEEP/fail-$name-$i.log" 2>/dev/null
    fi
  done
  kill "$b1" "$b2"
  echo "slot $name ($re): $pass passed, $fail failed, $((SECONDS - t0)) s"
}
FAULTS='TestFault|TestSnapshotSays|TestProgressThrough|TestClusterCommands|TestClocksMeasured|TestJoinThroughMasterAddr'
COORD='TestLeaderDiesDuringPublication|TestPartition|TestImplausible|TestEveryWindowEnds|TestForged|TestMetadataGossiped|TestEveryShutdown|TestRunAfterShutdown|TestSecondRun|TestShutdownIs|TestLeaderDiesMidWindow|TestOOMPostmortem|TestAnotherRanks|TestJoinName'
n=0
for c in 0,1 2,3 4,5 6,7 8,9 10,11; do n=$((n+1)); slot "$c" cmd cmd/memsnap "$FAULTS" "cmd$n" & done
for c in 12,13 14,15; do n=$((n+1)); slot "$c" coord coordinator "$COORD" "coord$n" & done
wait
