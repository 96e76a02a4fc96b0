#!/usr/bin/env bash
# Merge speed and memory, measured in one run:
#  1. memory: merge RANKS64 (default 64) ranks of EVENTS64 (default 20000) events each and
#     compare the merge's peak RSS with the sum of the ranks' decoded sizes;
#  2. speed: merge 8 ranks of EVENTS (default 100000) events each (all five outputs) and
#     compare with CPython merely loading the same 8 pickles; the ratio (ours / CPython)
#     is printed last.
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS="${EVENTS:-100000}"; EVENTS64="${EVENTS64:-20000}"; RANKS64="${RANKS64:-64}"; N="${N:-3}"
base=testdata/snapshots/single/transformer.memory_snapshot.pickle
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/benchtool" ./scripts/benchtool

mkdir "$tmp/r64" "$tmp/r8"
"$tmp/benchtool" gen -events "$EVENTS64" -ranks "$RANKS64" -out "$tmp/r64" "$base" >/dev/null
one=$("$tmp/benchtool" decoded-size "$tmp/r64/rank0.1.memory_snapshot.pickle")
read -r _ rss < <("$tmp/benchtool" merge -n 1 "$tmp/r64")
echo "memory: $RANKS64 ranks x $EVENTS64 events: decoded size of one rank $((one / 1048576)) MiB, of all $((one * RANKS64 / 1048576)) MiB; merge peak RSS $((rss / 1048576)) MiB"
python3 -c "print(f'memory ratio (merge peak RSS / sum of decoded sizes): {$rss / ($one * $RANKS64):.3f}')"

"$tmp/benchtool" gen -events "$EVENTS" -ranks 8 -out "$tmp/r8" "$base" >/dev/null
# CPython re-pickles each rank (pickle.dump, protocol 4), the form torch users upload
python3 - "$tmp/r8" <<'PY'
import glob, pickle, sys
for f in glob.glob(sys.argv[1] + "/*.pickle"):
    s = pickle.load(open(f, "rb")); pickle.dump(s, open(f, "wb"), protocol=4)
PY
read -r ours _ < <("$tmp/benchtool" merge -n "$N" "$tmp/r8")
cpython=$(python3 - "$tmp/r8" "$N" <<'PY'
import glob, pickle, sys, time
files = sorted(glob.glob(sys.argv[1] + "/*.pickle"))
best = 1e9
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    for f in files:
        with open(f, "rb") as fh: pickle.load(fh)
    best = min(best, time.perf_counter() - t)
print(f"{best:.6f}")
PY
)
echo "speed: 8 ranks x $EVENTS events ($(du -sh "$tmp/r8" | cut -f1) of pickles)"
echo "memsnap merge (5 outputs): ${ours}s (best of $N)"
echo "CPython pickle.load x 8:   ${cpython}s (best of $N)"
python3 -c "print(f'ratio (memsnap merge / CPython load): {$ours / $cpython:.3f}')"
