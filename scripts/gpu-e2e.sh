#!/usr/bin/env bash
# End-to-end on a GPU machine (PyTorch and an NVIDIA driver there): a real 4-rank
# torchrun job (gloo, all ranks on GPU 0) with the trainer hook and one memsnap agent
# per rank writing to a folder store; then checks that each rank's snapshot covers
# exactly the asked batches, decodes with memsnap's codec, and carries NVML samples;
# merges the ranks; and measures the hook's per-batch overhead with real torch loaded.
#   MEMSNAP=path/to/memsnap OUT=dir scripts/gpu-e2e.sh
set -euo pipefail
source "$(dirname "$0")/gpu-common.sh"
NPROC="${NPROC:-4}"; START="${START:-3}"; STOP="${STOP:-6}"
store="$OUT/store"; mkdir -p "$store"
echo "== torchrun: $NPROC ranks, each under 'memsnap agent --window $START:$STOP'"
python3 -m torch.distributed.run --no-python --nproc_per_node="$NPROC" \
  "$MEMSNAP" agent --standalone --store "$store" --run-name gpu-e2e --folder "$OUT/spool" --window "$START:$STOP" \
  -- python3 scripts/gpu/train_ddp.py 12 2>&1 | grep -v "deprecated" | tee "$OUT/torchrun.log" | grep -E "GPU|window armed|uploaded|error|Error|hook errors" || true
echo "== checks"
python3 scripts/gpu/check.py "$MEMSNAP" "$store/gpu-e2e/torch_memory_traces" "$NPROC" "$START" "$STOP"
echo "== merge"
"$MEMSNAP" merge -q --out "$store/gpu-e2e/merged" "$store/gpu-e2e/torch_memory_traces"
echo "== hook overhead (real torch imported, no window armed)"
python3 rankagent/hook/bench_hook.py 1000000
