#!/usr/bin/env bash
# What the memory is, checked on a real trainer: torchrun starts NPROC agents (every
# rank on GPU 0), each with scripts/gpu/train_categories.py (a transformer with
# AdamW, told to the hook with memsnap_hook.watch; rank 1 leaks 64 MiB a batch; rank
# 2's agent keeps only 2,000 events of history). One window of 4 batches is asked
# for; the checks: every rank's parameters, gradients and optimizer state at its
# peak within 2% of what the model says they are, rank 1 flagged as leaking 64 MiB a
# batch at the planting line, rank 2 flagged as truncated, every rank's memory
# outside the allocator reported, and the diff naming a category.
#   MEMSNAP=path/to/memsnap NPROC=3 OUT=dir scripts/gpu-categories.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MEMSNAP="$(realpath "${MEMSNAP:-.devrun/memsnap}")"
OUT="${OUT:-$(mktemp -d)}"; mkdir -p "$OUT"
NPROC="${NPROC:-3}"
export PYTHONPATH="$PWD/rankagent/hook${PYTHONPATH:+:$PYTHONPATH}"
export MEMSNAP_KEY="$("$MEMSNAP" keygen)" MEMSNAP_KNOWN="$OUT" MEMSNAP_LEAK_RANK=1
run=gpu-categories; store="$OUT/store"; work=$(mktemp -d); mkdir -p "$store"
cat >"$work/agent.sh" <<SH
#!/usr/bin/env bash
entries=100000; [ "\$RANK" = 2 ] && entries=2000
exec "$MEMSNAP" agent --store "$store" --run-name "$run" --folder "$work/\$RANK" --no-schedule --collect-timeout 60s \
  --max-entries \$entries -- python3 scripts/gpu/train_categories.py 400 0.02
SH
chmod +x "$work/agent.sh"
echo "== $NPROC ranks on GPU 0"
MASTER_ADDR=127.0.0.1 MASTER_PORT=29541 python3 -m torch.distributed.run --no-python --nproc_per_node="$NPROC" \
  "$work/agent.sh" >"$OUT/torchrun.log" 2>&1 &
job=$!
trap 'kill $job 2>/dev/null || true; rm -rf "$work"' EXIT
# a window that starts after the warm-up (the optimizer's state exists from step 1)
"$MEMSNAP" snapshot --join 127.0.0.1:7946 --run "$run" --batches 4 --wait-all --json --timeout 5m >"$OUT/result.json" 2>"$OUT/snapshot.log" || {
  echo "snapshot failed:"; tail -20 "$OUT/snapshot.log"; tail -40 "$OUT/torchrun.log"; exit 1; }
kill -TERM $job; wait $job || true
python3 - "$OUT/result.json" "$NPROC" "$OUT" <<'PY'
import json, os, sys
res, world, out = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
print("window %d [%d, %d): %s, ranks %s" % (res["window"], res["start"], res["stop"], res["state"], res["ranks"]))
ok = res["state"] == "published" and res["ranks"] == list(range(world))
summary = json.load(open([o for o in res["outputs"] if o.endswith(".summary.json")][0]))
mib = lambda n: "%.1f MiB" % (n / 2**20)
for r in summary["ranks"]:
    known = json.load(open(os.path.join(out, "known.%d.json" % r["rank"])))
    cats = (r.get("categories") or {}).get("at_peak", {})
    line = []
    for k in ("parameters", "gradients", "optimizer_state"):
        got, want = cats.get(k, 0), known[k]
        good = abs(got - want) <= 0.02 * want
        ok = ok and good
        line.append("%s %s (model: %s) %s" % (k, mib(got), mib(want), "OK" if good else "FAIL"))
    print("rank %d peak %s in %s: %s; activations %s, temporaries %s, unknown %s" % (
        r["rank"], mib(r["peak_allocated_bytes"]), r.get("peak_allocated_phase"), "; ".join(line),
        mib(cats.get("activations", 0)), mib(cats.get("temporaries", 0)), mib(cats.get("unknown", 0))))
    o = r.get("outside_allocator")
    print("  outside the allocator at the peak: %s" % (mib(o["at_peak_bytes"]) if o else "none"))
    ok = ok and o is not None and o["at_peak_bytes"] > 0
    leak, trunc = r.get("leak"), r.get("truncated")
    if r["rank"] == 1:
        good = leak is not None and leak["per_batch_bytes"] == 64 << 20 and leak["sites"] and "train_categories.py" in leak["sites"][0]["site"]
        print("  leak: %s -> %s" % (leak and "%s per batch, %s" % (mib(leak["per_batch_bytes"]), leak["sites"][:1]), "OK" if good else "FAIL"))
        ok = ok and good
    elif leak is not None:
        print("  a steady rank flagged as leaking: FAIL"); ok = False
    if r["rank"] == 2:
        good = trunc is not None
        print("  truncated: %s -> %s" % (trunc, "OK" if good else "FAIL"))
        ok = ok and good
d = summary.get("diff") or {}
print("diff: %s against %s, categories %s" % (d.get("other", {}).get("label"), d.get("base", {}).get("label"), (d.get("categories") or [])[:2]))
print("ALL OK" if ok else "SOME CHECKS FAILED")
sys.exit(0 if ok else 1)
PY
