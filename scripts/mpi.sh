#!/usr/bin/env bash
# memsnap under a real Open MPI on one machine: `mpirun -np 4 memsnap agent ... --
# <replay trainer>` forms a cluster through Open MPI's head-node address, a window
# asked with `memsnap snapshot` is published and its manifest printed; then a
# second job runs, whose run name (from its job id) differs from the first's.
# Needs Debian's openmpi-bin (installed when missing, as root).
#   MEMSNAP=path/to/memsnap OUT=dir scripts/mpi.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mpirun >/dev/null; then
  echo "== installing openmpi-bin"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openmpi-bin >/dev/null
fi
MEMSNAP="$(realpath "${MEMSNAP:-.devrun/memsnap}")"
[ -x "$MEMSNAP" ] || { mkdir -p "$(dirname "$MEMSNAP")"; CGO_CFLAGS=-Wno-deprecated-declarations go build -o "$MEMSNAP" ./cmd/memsnap; }
OUT="${OUT:-$(mktemp -d)}"; mkdir -p "$OUT"
SNAP="$PWD/testdata/snapshots/ddp4/rank0.5.memory_snapshot.pickle"
export MEMSNAP_KEY="$("$MEMSNAP" keygen)"
store="$OUT/store"; mkdir -p "$store"
root=(); [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
job=""
trap '[ -n "$job" ] && kill -TERM "$job" 2>/dev/null; wait 2>/dev/null || true' EXIT

launch() { # $1: log name, $2: base port; sets job and run
  mpirun "${root[@]}" --oversubscribe -np 4 -x MEMSNAP_KEY \
    "$MEMSNAP" agent --store "$store" --folder "$OUT/work-$1/{rank}" --no-schedule --collect-timeout 20s --gossip-port "$2" \
    -- "$MEMSNAP" replay --snapshot "$SNAP" --batches 0 --pace 20ms --hold-at 5 >"$OUT/$1.log" 2>&1 &
  job=$!
  run=""
  for _ in $(seq 1 120); do
    run=$(sed -n 's/.*msg="agent listening" rank=0 .* run=\([^ ]*\).*/\1/p' "$OUT/$1.log" | head -1)
    [ -n "$run" ] && break; sleep 0.5
  done
  [ -n "$run" ] || { echo "the agents did not start:"; tail -30 "$OUT/$1.log"; exit 1; }
}

stop() { kill -TERM "$job"; wait "$job" || true; job=""; }

BASE=$((20000 + RANDOM % 20000))
echo "== job 1: mpirun -np 4 memsnap agent -- <replay trainer>"
launch job1 "$BASE"
echo "run name: $run"
"$MEMSNAP" snapshot --join "127.0.0.1:$BASE" --run "$run" --batches 3 --wait-all --json --timeout 3m >"$OUT/result1.json" 2>"$OUT/snapshot1.log" || {
  echo "snapshot failed:"; cat "$OUT/snapshot1.log"; tail -30 "$OUT/job1.log"; exit 1; }
python3 scripts/show-window.py "$OUT/result1.json" 4
stop
run1=$run
echo "== job 2: another mpirun job into the same store"
launch job2 $((BASE + 10))
stop
echo "run names: $run1, $run"
[ "$run" != "$run1" ] || { echo "two Open MPI jobs share the run name $run"; exit 1; }
"$MEMSNAP" ls "$store"
echo "ALL OK"
