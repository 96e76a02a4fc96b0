#!/usr/bin/env bash
# What the memory is, checked on real trainers (a GPU machine with PyTorch):
#  1. the cluster: torchrun starts NPROC agents (every rank on GPU 0), each launching
#     scripts/gpu/train_categories.py (a transformer with AdamW, told to the hook with
#     memsnap_hook.watch; rank 1 leaks 32 MiB a batch; rank 2's agent keeps only
#     ENTRIES events of history), and `memsnap snapshot` asks for one window of 4
#     batches. Checked: every rank's parameters, gradients and optimizer state at its
#     peak within 2% of what the model says they are; rank 1 flagged as leaking 32 MiB
#     a batch at the planting line, and no other; rank 2 flagged as truncated, and no
#     other; every rank's memory outside the allocator reported.
#  2. the same model in a PyTorch Lightning Trainer and 3. in a Hugging Face Trainer,
#     each with memsnap's callback and no call to watch (one standalone agent each,
#     batches [3, 6), merged with `memsnap merge`): the same checks of the categories.
#   MEMSNAP=path/to/memsnap NPROC=3 OUT=dir [PARTS="cluster lightning hf"] scripts/gpu-categories.sh
set -euo pipefail
source "$(dirname "$0")/gpu-common.sh"
NPROC="${NPROC:-3}"; ENTRIES="${ENTRIES:-1500}"; PARTS="${PARTS:-cluster lightning hf}"
work=$(mktemp -d); job=
trap '[ -n "$job" ] && kill $job 2>/dev/null; rm -rf "$work"' EXIT
fails=0

cluster() {
  local run=gpu-categories store="$OUT/cluster/store" known="$OUT/cluster/known"
  mkdir -p "$store" "$known"
  export MEMSNAP_KEY="$("$MEMSNAP" keygen)" MEMSNAP_KNOWN="$known" MEMSNAP_LEAK_RANK=1
  cat >"$work/agent.sh" <<SH
#!/usr/bin/env bash
entries=100000; [ "\$RANK" = 2 ] && entries=$ENTRIES
exec "$MEMSNAP" agent --store "$store" --run-name "$run" --folder "$work/\$RANK" --no-schedule --collect-timeout 60s \
  --max-entries \$entries -- python3 scripts/gpu/train_categories.py 1000 0.02
SH
  chmod +x "$work/agent.sh"
  echo "== 1. the cluster: $NPROC ranks on GPU 0, rank 1 leaking, rank 2 keeping $ENTRIES events"
  MASTER_ADDR=127.0.0.1 MASTER_PORT=29541 python3 -m torch.distributed.run --no-python --nproc_per_node="$NPROC" \
    "$work/agent.sh" >"$OUT/cluster/torchrun.log" 2>&1 &
  job=$!
  if ! "$MEMSNAP" snapshot --join 127.0.0.1:7946 --run "$run" --batches 4 --wait-all --json --timeout 4m \
      >"$OUT/cluster/result.json" 2>"$OUT/cluster/snapshot.log"; then
    echo "snapshot failed:"; tail -20 "$OUT/cluster/snapshot.log"; tail -40 "$OUT/cluster/torchrun.log"; return 1
  fi
  wait $job || true; job=
  grep -E "ran [0-9]+ batches|hook errors" "$OUT/cluster/torchrun.log" || true
  local w; w=$(dirname "$(python3 -c 'import json,sys; print([o for o in json.load(open(sys.argv[1]))["outputs"] if o.endswith(".summary.json")][0])' "$OUT/cluster/result.json")")
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("window %d [%d, %d): %s, ranks %s, missing %s" % (r["window"], r["start"], r["stop"], r["state"], r["ranks"], r.get("missing")))' "$OUT/cluster/result.json"
  cp "$w/merged.summary.json" "$OUT/cluster.summary.json"; cp "$w/merged.html" "$OUT/cluster.html"
  python3 scripts/gpu/check_categories.py "$w/merged.summary.json" "$known" "$NPROC" --leak 1 --truncated 2
}

framework() { # name trainer
  local name=$1 trainer=$2 store="$OUT/$1/store" known="$OUT/$1/known"
  mkdir -p "$store" "$known"
  echo "== $name: one rank, memsnap's callback, no watch"
  MEMSNAP_KNOWN="$known" "$MEMSNAP" agent --standalone --store "$store" --run-name "$name" --folder "$work/$name" --window 3:6 \
    -- python3 "$trainer" 10 >"$OUT/$name/agent.log" 2>&1 || { echo "the $name job failed:"; tail -30 "$OUT/$name/agent.log"; return 1; }
  grep -E "hook errors" "$OUT/$name/agent.log" || true
  "$MEMSNAP" merge -q --out "$OUT/$name/merged" "$store/$name/torch_memory_traces" >"$OUT/$name/merge.log" 2>&1 || { cat "$OUT/$name/merge.log"; return 1; }
  cp "$OUT/$name/merged/merged.summary.json" "$OUT/$name.summary.json"
  python3 scripts/gpu/check_categories.py "$OUT/$name/merged/merged.summary.json" "$known" 1
}

if [ $# -gt 0 ]; then # one part, as the loop below runs it
  trap 'exit 143' TERM
  case $1 in
    cluster) cluster ;;
    lightning) framework lightning scripts/gpu/train_lightning.py ;;
    hf) framework hf scripts/gpu/train_hf.py ;;
    *) echo "unknown part $1"; exit 2 ;;
  esac
  exit
fi
for p in $PARTS; do
  limit=240; [ "$p" = cluster ] && limit=300
  MEMSNAP="$MEMSNAP" OUT="$OUT" NPROC="$NPROC" ENTRIES="$ENTRIES" timeout -k 15 "$limit" bash "$0" "$p" || { echo "== part $p failed ($?)"; fails=$((fails+1)); }
done
echo "== $fails part(s) failed"
[ "$fails" = 0 ]
