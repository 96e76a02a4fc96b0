#!/usr/bin/env bash
# Live memory on a GPU machine with real PyTorch (docs/metrics.md):
#  1. the agent's metrics are torch's own figures (memory_stats at the batch they
#     name) and NVML's device figures, and the hook's cost per step with a report;
#  2. a job of two ranks, rank 1 leaking 64 MiB a batch under a 5% memory cap: the
#     growth trigger takes a window of both ranks before rank 1 runs out of
#     memory, its reason naming rank 1, its findings led by rank 1 and the leaking
#     line; once planning batches to come, once with --record-always (every
#     rank's history at once); and the headroom trigger (30%), measured against
#     the 5% cap (set_per_process_memory_fraction), not the device;
#  3. an OOM with memory free in pieces (scripts/gpu/frag_trainer.py): the window's
#     summary tells the largest free block at the OOM as torch's own segments do,
#     though the trainer trains on after it, and the findings call it fragmentation.
#   MEMSNAP=path/to/memsnap OUT=dir [STEPS="1 3"] scripts/gpu-live.sh
set -euo pipefail
source "$(dirname "$0")/gpu-common.sh"
fails=0
step() { [[ " ${STEPS:-1 2 3} " == *" $1 "* ]]; }
if step 1; then
echo "== 1. the agent's figures are torch's"
"$MEMSNAP" agent --standalone --store "$OUT/store1" --run-name figures --folder "$OUT/spool1" --metrics-addr 127.0.0.1:9400 \
  -- python3 scripts/gpu/live_trainer.py figures http://127.0.0.1:9400/metrics >"$OUT/figures.log" 2>&1 || fails=1
grep -E "figures|device used|hook cost|FAIL" "$OUT/figures.log" || true
grep -q "figures: OK" "$OUT/figures.log" || { tail -20 "$OUT/figures.log"; fails=1; }
python3 scripts/gpu/device_choice.py || fails=1   # two GPUs or more: the figures of cuda:N without set_device
fi

if step 2; then
"$MEMSNAP" keygen >"$OUT/key"; chmod 600 "$OUT/key"
port=27100
for mode in window record-always headroom; do
echo "== 2. a leaking rank: the growth trigger before its OOM ($mode)"
extra="--trigger-growth 512MiB/10"; [ $mode = record-always ] && extra="$extra --record-always"
[ $mode = headroom ] && extra="--trigger-headroom 30%"
pids=()
for r in 0 1; do
  join=""; [ $r = 1 ] && join="--join 127.0.0.1:$port"
  RANK=$r "$MEMSNAP" agent --key-file "$OUT/key" --run-name leak --rank $r --local-rank $r --world-size 2 --local-world-size 2 \
    --bind 127.0.0.1 --gossip-port $port $join --store "$OUT/store2-$mode" --spool "$OUT/spool2-$mode-$r" --no-schedule --no-postmortem \
    --figures-every 1s $extra \
    -- python3 scripts/gpu/live_trainer.py leak 64 >"$OUT/leak-$mode-$r.log" 2>&1 &
  pids+=($!)
done
# rank 1 runs out of memory (its agent exits with its trainer's status); rank 0 trains on
wait "${pids[1]}" || true
kill -TERM "${pids[0]}" 2>/dev/null || true; wait "${pids[0]}" 2>/dev/null || true
grep -E "crossed a trigger|OutOfMemoryError" "$OUT"/leak-$mode-*.log | head -5 || true
leakline=$(grep -n "# the leak" scripts/gpu/live_trainer.py | cut -d: -f1)
python3 - "$OUT/store2-$mode/leak/torch_memory_traces" "live_trainer.py:$leakline" "$mode" <<'PY' || fails=1
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
fs = found.get("findings", [])
want = "trigger: rank 1: headroom" if sys.argv[3] == "headroom" else "trigger: rank 1: growing"
ok = (found["reason"].startswith(want) and found["ranks_merged"] == [0, 1] and fs
      and fs[0].startswith("rank 1, which this window was taken for (crossed a trigger") and sys.argv[2] in fs[0]
      and (sys.argv[3] != "record-always" or not found.get("batches")))
print("trigger window (%s): %s" % (sys.argv[3], "OK" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
port=$((port + 10))
done
fi

if step 3; then
echo "== 3. an OOM with memory free in pieces: the largest free block"
"$MEMSNAP" agent --standalone --store "$OUT/store3" --run-name frag --folder "$OUT/spool3" --window 5:11 --no-postmortem \
  -- python3 scripts/gpu/frag_trainer.py >"$OUT/frag.log" 2>&1 || fails=1
"$MEMSNAP" merge --out "$OUT/frag-merged" "$OUT/store3/frag/torch_memory_traces" >"$OUT/frag-merge.log" 2>&1 || fails=1
python3 - "$OUT/frag-merged" "$OUT/frag.log" "$OUT/frag-merge.log" <<'PY' || fails=1
import glob, json, sys
torch_says = None
for line in open(sys.argv[2]):
    if line.startswith("FRAG "):
        torch_says = json.loads(line[5:])
sums = glob.glob(sys.argv[1] + "/*.summary.json")
if torch_says is None or not sums:
    print("no OOM figures from torch, or no merged summary: FAIL"); sys.exit(1)
s = json.load(open(sums[0]))
ooms = s["ranks"][0]["ooms"]
findings = [l.strip() for l in open(sys.argv[3]) if "ran out of memory" in l]
print("torch at the OOM:", torch_says)
print("the summary's OOMs:", ooms, "| free at the peak:", s["ranks"][0].get("free_at_peak"))
for f in findings:
    print("  finding:", f)
o = ooms[0] if ooms else {}
ok = (o.get("size") == torch_says["asked"] and o.get("reserved_bytes") == torch_says["reserved"]
      and o.get("allocated_bytes") == torch_says["allocated"] and o.get("largest_free_block_bytes") == torch_says["largest_free"]
      and any("fragmentation" in f and "the largest free block" in f for f in findings))
print("largest free block: OK" if ok else "largest free block: FAIL")
sys.exit(0 if ok else 1)
PY
fi
[ $fails = 0 ] && echo "ALL OK"
exit $fails
