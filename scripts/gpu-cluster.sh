#!/usr/bin/env bash
# A real multi-rank job on a GPU machine, with the cluster: torchrun starts one
# `memsnap agent` per rank (each launching a DDP trainer with the hook), the agents
# form an encrypted memberlist cluster on loopback, `memsnap snapshot --wait-all --json`
# asks for one on-demand window, and the checks say whether every rank recorded the
# same batches, whether each rank's NVML samples show more device memory in use than
# PyTorch's allocator reserved (the CUDA context's and NCCL's memory), and whether the
# merged report shows every rank. With one GPU per rank the job uses NCCL; with fewer
# GPUs than ranks, gloo with every rank on GPU 0.
#   MEMSNAP=path/to/memsnap NPROC=<ranks, default: the GPUs> OUT=dir scripts/gpu-cluster.sh
# Leave NCCL's NVLink multicast off (NCCL_NVLS_ENABLE=0 is set unless already set).
set -euo pipefail
source "$(dirname "$0")/gpu-common.sh"
gpu_ranks
export MEMSNAP_KEY="$("$MEMSNAP" keygen)"
run=gpu-cluster; store="$OUT/store"; work=$(mktemp -d); mkdir -p "$store"
echo "== $NPROC ranks on $NGPU GPU(s), backend $BACKEND"
MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 python3 -m torch.distributed.run --no-python --nproc_per_node="$NPROC" \
  "$MEMSNAP" agent --store "$store" --run-name "$run" --folder "$work/{rank}" --no-schedule --collect-timeout 60s \
  -- python3 scripts/gpu/train_ddp.py 100000 0.02 >"$OUT/torchrun.log" 2>&1 &
job=$!
trap 'kill $job 2>/dev/null || true; rm -rf "$work"' EXIT
echo "== memsnap snapshot --wait-all --json (3 batches)"
"$MEMSNAP" snapshot --join 127.0.0.1:7946 --run "$run" --batches 3 --wait-all --json --timeout 8m >"$OUT/result.json" 2>"$OUT/snapshot.log" || {
  echo "snapshot failed:"; tail -20 "$OUT/snapshot.log"; tail -40 "$OUT/torchrun.log"; exit 1; }
kill -TERM $job; wait $job || true
python3 - "$OUT/result.json" "$NPROC" "$store/$run/torch_memory_traces" <<'PY'
import glob, json, os, sys
res, world, prefix = json.load(open(sys.argv[1])), int(sys.argv[2]), sys.argv[3]
print("window %d [%d, %d): %s, ranks %s, missing %s" % (res["window"], res["start"], res["stop"], res["state"], res["ranks"], res["missing"]))
ok = res["state"] == "published" and res["ranks"] == list(range(world))
summary = json.load(open([o for o in res["outputs"] if o.endswith(".summary.json")][0]))
html = open([o for o in res["outputs"] if o.endswith(".html")][0]).read()
peak_reserved = {r["rank"]: r["peak_reserved_bytes"] for r in summary["ranks"]}
marks = set()
for r in range(world):
    meta = json.load(open(os.path.join(prefix, "rank%d.%d.memory_snapshot.memsnap.json" % (r, res["stop"]))))
    batches = tuple(b["batch"] for b in meta["batches"])
    marks.add(batches)
    s = meta.get("nvml_samples") or []
    dev = max((x["device_used_bytes"] for x in s), default=0)
    proc = max((x.get("process_used_bytes", 0) for x in s), default=0)
    good = dev > peak_reserved[r] and (proc == 0 or proc > peak_reserved[r])
    ok = ok and good and ("rank %d" % r) in html
    print("rank %d: batches %s, allocator reserved %.1f MiB, NVML device used %.1f MiB, process used %.1f MiB, %d samples, stall %.1f ms, in the report: %s -> %s" % (
        r, list(batches), peak_reserved[r] / 2**20, dev / 2**20, proc / 2**20, len(s), meta.get("stall_us", 0) / 1000, ("rank %d" % r) in html, "OK" if good else "FAIL"))
ok = ok and len(marks) == 1
print("every rank recorded the same batches:", len(marks) == 1)
print("ALL OK" if ok else "SOME CHECKS FAILED")
sys.exit(0 if ok else 1)
PY
cp "$(ls "$store/$run/torch_memory_traces/window"*/merged.summary.json)" "$(ls "$store/$run/torch_memory_traces/window"*/merged.html)" "$OUT/" 2>/dev/null || true
