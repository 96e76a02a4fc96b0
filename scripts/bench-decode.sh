#!/usr/bin/env bash
# Decode speed: memsnap's decoder against CPython's C unpickler, on the same bytes,
# measured in the same run. Makes a snapshot of EVENTS (default 100000) trace events
# with real frames from a recorded one, times the best of N runs of each, and prints
# the ratio (ours / CPython) last: below 1 means memsnap is faster.
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS="${EVENTS:-100000}"; N="${N:-15}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/benchtool" ./scripts/benchtool
"$tmp/benchtool" gen -events "$EVENTS" -out "$tmp" testdata/snapshots/single/transformer.memory_snapshot.pickle
f="$tmp/rank0.1.memory_snapshot.pickle"
# CPython re-pickles it as torch users' files are (pickle.dump, protocol 4), so both
# sides read the layout torch users upload
python3 -c "import pickle,sys; s=pickle.load(open(sys.argv[1],'rb')); pickle.dump(s, open(sys.argv[1]+'.py','wb'), protocol=4)" "$f"
ours=$("$tmp/benchtool" decode -n "$N" "$f.py")
cpython=$(python3 -c "
import pickle, sys, time
data = open(sys.argv[1], 'rb').read()
best = 1e9
for _ in range(int(sys.argv[2])):
    t = time.perf_counter(); pickle.loads(data); best = min(best, time.perf_counter() - t)
print(f'{best:.6f}')" "$f.py" "$N")
echo "events:         $EVENTS ($(stat -c %s "$f.py") bytes as CPython pickles it)"
echo "memsnap decode: ${ours}s (best of $N)"
echo "CPython loads:  ${cpython}s (best of $N)"
python3 -c "print(f'ratio (memsnap / CPython): {$ours / $cpython:.3f}')"
