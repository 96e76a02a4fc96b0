#!/usr/bin/env bash
# Whole-process speed: memsnap's CLI against a whole CPython process, each started
# cold, alternating, in the same run (the machine's load hits both alike).
#  1. `memsnap inspect --json FILE` of one snapshot of EVENTS (default 100000) events
#     against `python3 -c 'pickle.load(...)'` of the same file;
#  2. `memsnap merge --out DIR` of 8 such ranks against one python3 process merely
#     loading the 8 files.
# The snapshots are synthesised from a recorded one and re-pickled by CPython
# (protocol 4), the form torch users upload. Each command runs N (default 11) times;
# the median and the best are printed, and the ratios (ours / CPython, medians) last.
# BASELINE=path/to/an/older/memsnap adds that binary to the same alternation;
# MEMSNAP and BENCHTOOL name prebuilt binaries to use instead of building them.
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS="${EVENTS:-100000}"; N="${N:-11}"; RANKS="${RANKS:-8}"
base=testdata/snapshots/single/transformer.memory_snapshot.pickle
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
if [ -n "${MEMSNAP:-}" ]; then cp "$MEMSNAP" "$tmp/memsnap"; else go build -o "$tmp/memsnap" ./cmd/memsnap; fi
if [ -n "${BENCHTOOL:-}" ]; then cp "$BENCHTOOL" "$tmp/benchtool"; else go build -o "$tmp/benchtool" ./scripts/benchtool; fi
mkdir "$tmp/r"
"$tmp/benchtool" gen -events "$EVENTS" -ranks "$RANKS" -out "$tmp/r" "$base" >/dev/null
python3 - "$tmp/r" <<'PY'
import glob, pickle, sys
for f in glob.glob(sys.argv[1] + "/*.pickle"):
    s = pickle.load(open(f, "rb")); pickle.dump(s, open(f, "wb"), protocol=4)
PY
one="$tmp/r/rank0.1.memory_snapshot.pickle"
echo "snapshot: $EVENTS events, $(stat -c %s "$one") bytes; merge: $RANKS ranks, $(du -sh "$tmp/r" | cut -f1)"

python3 - "$tmp" "$one" "$N" "${BASELINE:-}" <<'PY'
import os, shutil, statistics, subprocess, sys, time
tmp, one, n, baseline = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ranks = sorted(os.path.join(tmp, "r", f) for f in os.listdir(os.path.join(tmp, "r")))
load = "import pickle,sys\nfor f in sys.argv[1:]:\n    pickle.load(open(f,'rb'))"
out = os.path.join(tmp, "out")
cases = {
    "inspect": [
        ("memsnap inspect --json", [os.path.join(tmp, "memsnap"), "inspect", "--json", one]),
        ("python3 pickle.load", ["python3", "-c", load, one]),
    ],
    "merge": [
        ("memsnap merge --out", [os.path.join(tmp, "memsnap"), "merge", "-q", "--out", out] + ranks),
        ("python3 pickle.load x%d" % len(ranks), ["python3", "-c", load] + ranks),
    ],
}
if baseline:
    cases["inspect"].append(("baseline inspect --json", [baseline, "inspect", "--json", one]))
    cases["merge"].append(("baseline merge --out", [baseline, "merge", "-q", "--out", out] + ranks))
def once(cmd):
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t
ratios = []
for name, cmds in cases.items():
    times = {label: [] for label, _ in cmds}
    for label, cmd in cmds:  # warm the page cache and the binaries
        once(cmd)
    for _ in range(n):
        for label, cmd in cmds:
            times[label].append(once(cmd))
    for label, _ in cmds:
        ts = times[label]
        print(f"{label:28s} median {statistics.median(ts):.3f}s  best {min(ts):.3f}s  (n={n})")
    py = cmds[1][0]
    for label, _ in cmds[:1] + cmds[2:]:
        ratios.append((name, label.split()[0], statistics.median(times[label]) / statistics.median(times[py]),
                       min(times[label]) / min(times[py])))
for name, who, med, best in ratios:
    print(f"ratio {name} ({who} / CPython): median {med:.3f}  best {best:.3f}")
PY
