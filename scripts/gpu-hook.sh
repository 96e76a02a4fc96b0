#!/usr/bin/env bash
# The hook on a GPU machine with real PyTorch and PyTorch Lightning:
#  1. the Lightning callback numbers batches by trainer.global_step: a run of 12
#     steps recording batches [6, 9), then a run resumed from its checkpoint
#     recording [16, 18) (batches 12 on counted on), then accumulation over 2
#     batches recording [6, 8): each snapshot's marks are exactly those batches;
#  2. its early warnings with real torch imported: no agent at the socket, and
#     watch() given what is no module and no optimizer, one RuntimeWarning each.
#   MEMSNAP=path/to/memsnap OUT=dir scripts/gpu-hook.sh
set -euo pipefail
source "$(dirname "$0")/gpu-common.sh"
fails=0
marks() { # $1: run name; prints the batches of its one snapshot's marks
  python3 - "$OUT/store/$1/torch_memory_traces" <<'PY'
import glob, json, sys
metas = glob.glob(sys.argv[1] + "/*.memsnap.json")
print(" ".join(str(b["batch"]) for m in metas for b in json.load(open(m)).get("batches", [])))
PY
}
run() { # $1: run name, $2: window, then the trainer's args
  local name=$1 window=$2; shift 2
  "$MEMSNAP" agent --standalone --store "$OUT/store" --run-name "$name" --folder "$OUT/spool-$name" --window "$window" \
    -- python3 scripts/gpu/train_lightning_steps.py "$@" >"$OUT/$name.log" 2>&1 || { echo "FAIL: $name"; tail -20 "$OUT/$name.log"; fails=1; }
  grep -E "global_step|hook errors" "$OUT/$name.log" || true
}
check() { # $1: run name, $2: the batches wanted
  local got; got=$(marks "$1")
  if [ "$got" = "$2" ]; then echo "$1: batches $got: OK"; else echo "$1: batches '$got', want '$2': FAIL"; fails=1; fi
}
echo "== 1. Lightning numbers batches by global_step"
run first 6:9 12 1 "$OUT/ckpt" ""
check first "6 7 8"
run resumed 16:18 20 1 "" "$OUT/ckpt"
check resumed "16 17"
run accumulated 6:8 6 2 "" ""
check accumulated "6 7"
echo "== 2. early warnings with real torch"
w=$(MEMSNAP_SOCKET=/nonexistent/memsnap.sock python3 -c "
import torch, memsnap_hook
memsnap_hook.batch_start(0); memsnap_hook.batch_end(0); memsnap_hook.batch_start(1)
memsnap_hook.watch(object(), object())
memsnap_hook.watch(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
" 2>&1)
echo "$w"
n=$(echo "$w" | grep -c "RuntimeWarning" || true)
if [ "$n" = 3 ] && echo "$w" | grep -q "no agent listens at /nonexistent/memsnap.sock" && echo "$w" | grep -q "not a torch.nn.Module" && echo "$w" | grep -q "not a torch optimizer"; then
  echo "warnings: OK"
else
  echo "warnings: $n, want 3: FAIL"; fails=1
fi
[ $fails = 0 ] && echo "ALL OK"
exit $fails
