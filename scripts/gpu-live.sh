#!/usr/bin/env bash
# Live memory on a GPU machine with real PyTorch (docs/metrics.md):
#  1. the agent's metrics are torch's own figures (memory_stats at the batch they
#     name) and NVML's device figures, and the hook's cost per step with a report;
#  2. a job of two ranks, rank 1 leaking 64 MiB a batch under a 5% memory cap: the
#     growth trigger takes a window of both ranks before rank 1 runs out of
#     memory, its reason naming rank 1, its findings the leaking line.
#   MEMSNAP=path/to/memsnap OUT=dir scripts/gpu-live.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MEMSNAP="$(realpath "${MEMSNAP:-.devrun/memsnap}")"
OUT="$(realpath -m "${OUT:-$(mktemp -d)}")"; mkdir -p "$OUT"
export PYTHONPATH="$PWD/rankagent/hook${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
fails=0
echo "== 1. the agent's figures are torch's"
"$MEMSNAP" agent --standalone --store "$OUT/store1" --run-name figures --folder "$OUT/spool1" --metrics-addr 127.0.0.1:9400 \
  -- python3 scripts/gpu/live_trainer.py figures http://127.0.0.1:9400/metrics >"$OUT/figures.log" 2>&1 || fails=1
grep -E "figures|device used|hook cost|FAIL" "$OUT/figures.log" || true
grep -q "figures: OK" "$OUT/figures.log" || { tail -20 "$OUT/figures.log"; fails=1; }

echo "== 2. a leaking rank: the growth trigger before its OOM"
"$MEMSNAP" keygen >"$OUT/key"; chmod 600 "$OUT/key"
pids=()
for r in 0 1; do
  join=""; [ $r = 1 ] && join="--join 127.0.0.1:27100"
  RANK=$r "$MEMSNAP" agent --key-file "$OUT/key" --run-name leak --rank $r --local-rank $r --world-size 2 --local-world-size 2 \
    --bind 127.0.0.1 --gossip-port 27100 $join --store "$OUT/store2" --spool "$OUT/spool2-$r" --no-schedule --no-postmortem \
    --figures-every 1s --trigger-growth 512MiB/10 \
    -- python3 scripts/gpu/live_trainer.py leak 64 >"$OUT/leak$r.log" 2>&1 &
  pids+=($!)
done
# rank 1 runs out of memory (its agent exits with its trainer's status); rank 0 trains on
wait "${pids[1]}" || true
kill -TERM "${pids[0]}" 2>/dev/null || true; wait "${pids[0]}" 2>/dev/null || true
grep -E "crossed a trigger|OutOfMemoryError" "$OUT"/leak*.log | head -5 || true
leakline=$(grep -n "# the leak" scripts/gpu/live_trainer.py | cut -d: -f1)
python3 - "$OUT/store2/leak/torch_memory_traces" "live_trainer.py:$leakline" <<'PY' || fails=1
import glob, json, sys
found = None
for p in glob.glob(sys.argv[1] + "/window*/merged.manifest.json"):
    m = json.load(open(p))
    if m.get("kind") == "trigger":
        found = m
if found is None:
    print("no trigger window: FAIL"); sys.exit(1)
print("kind:", found["kind"], "| reason:", found["reason"], "| ranks:", found["ranks_merged"], "| batches:", found.get("batches"))
for f in found.get("findings", []):
    print("  finding:", f)
text = " ".join(found.get("findings", []))
ok = found["reason"].startswith("trigger: rank 1: growing") and found["ranks_merged"] == [0, 1] and sys.argv[2] in text
print("trigger window: OK" if ok else "trigger window: FAIL")
sys.exit(0 if ok else 1)
PY
[ $fails = 0 ] && echo "ALL OK"
exit $fails
