#!/usr/bin/env bash
# A real multi-rank job torn down by a failing rank, then relaunched, on a GPU
# machine. torchrun starts one `memsnap agent` per rank (each launching a DDP
# trainer with the hook); `memsnap snapshot` asks for a long window; rank
# FAIL_RANK raises an uncaught exception 10 batches into it; torchrun then stops
# every other worker, as it does when one fails. The checks: the window ended
# failed with the reason, and one crash post-mortem holding every rank that was
# alive is published, naming the failing rank and its exception. Then the same job
# is launched again under the same run name, and a new window is recorded and
# published under the next id; `memsnap ls` shows all of them.
#   MEMSNAP=path/to/memsnap NPROC=8 FAIL_RANK=3 OUT=dir scripts/gpu-crash.sh
# With fewer GPUs than ranks every rank shares GPU 0 (gloo); NCCL_NVLS_ENABLE=0.
set -euo pipefail
source "$(dirname "$0")/gpu-common.sh"
gpu_ranks 8
FAIL_RANK="${FAIL_RANK:-3}"
export MEMSNAP_KEY="$("$MEMSNAP" keygen)"
run=gpu-crash; store="$OUT/store"; work=$(mktemp -d); mkdir -p "$store"
trap 'kill $job 2>/dev/null || true; rm -rf "$work"' EXIT

launch() { # $1: log name, $2: batches to train; the rest: environment for the trainers
  local log=$1 batches=$2; shift 2
  env "$@" MASTER_ADDR=127.0.0.1 MASTER_PORT=29534 python3 -m torch.distributed.run --no-python --nproc_per_node="$NPROC" --max-restarts 0 \
    "$MEMSNAP" agent --store "$store" --run-name "$run" --folder "$work/{rank}" --no-schedule --collect-timeout 60s \
    -- python3 scripts/gpu/train_ddp.py "$batches" 0.02 >"$OUT/$log" 2>&1 &
  job=$!
}

echo "== launch 1: $NPROC ranks on $NGPU GPU(s), backend $BACKEND; rank $FAIL_RANK fails 10 batches into the window"
launch torchrun1.log 100000 MEMSNAP_FAIL_RANK="$FAIL_RANK" MEMSNAP_FAIL_AFTER=10
t0=$(date +%s.%N)
"$MEMSNAP" snapshot --join 127.0.0.1:7946 --run "$run" --batches 150 --wait-all --json --timeout 8m >"$OUT/result1.json" 2>"$OUT/snapshot1.log" || true
echo "window 1 ended after $(python3 -c "import time; print('%.1f s' % (time.time() - $t0))"): $(cat "$OUT/result1.json")"
wait $job || echo "torchrun exited $?"
echo "== the store after launch 1"
"$MEMSNAP" ls "$store" | tee "$OUT/ls1.txt"

echo "== launch 2: the same run name, no failure; the trainers end after 600 batches"
launch torchrun2.log 600
"$MEMSNAP" snapshot --join 127.0.0.1:7946 --run "$run" --batches 3 --wait-all --json --timeout 8m >"$OUT/result2.json" 2>"$OUT/snapshot2.log" || {
  echo "snapshot failed:"; tail -20 "$OUT/snapshot2.log"; tail -40 "$OUT/torchrun2.log"; exit 1; }
wait $job || echo "torchrun exited $?"
echo "== the store after launch 2"
"$MEMSNAP" ls "$store" | tee "$OUT/ls2.txt"
"$MEMSNAP" ls --json "$store" >"$OUT/ls.json"

python3 - "$OUT" "$NPROC" "$FAIL_RANK" <<'PY'
import json, sys
out, world, failing = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r1, r2 = json.load(open(out + "/result1.json")), json.load(open(out + "/result2.json"))
rows = [json.loads(l) for l in open(out + "/ls.json")]
crash = [r for r in rows if r["kind"] == "crash" and r["state"] == "published"]
ok = True
def check(what, cond):
    global ok
    ok = ok and cond
    print("%-70s %s" % (what, "OK" if cond else "FAIL"))
check("window %d ended failed, rank %d's reason: %s" % (r1["window"], failing, r1["missing"].get(str(failing), "")), r1["state"] == "failed")
check("one crash post-mortem published", len(crash) == 1)
if crash:
    m = crash[0]["manifest"]
    print("  %s; ranks merged %s, missing %s" % (m["reason"], m["ranks_merged"], m.get("missing_reasons")))
    check("it names rank %d and its exception" % failing, ("rank %d failed first (exception: RuntimeError: planted failure" % failing) in m["reason"])
    check("it holds every rank that was alive (%d)" % world, m["ranks_merged"] == list(range(world)))
    mine = [i for i in m["inputs"] if i["rank"] == failing]
    check("the failing rank's part is its crash dump", bool(mine) and mine[0]["source"].endswith(".crash.pickle"))
check("the relaunch published window %d (after %d)" % (r2["window"], r1["window"]), r2["state"] == "published" and r2["window"] > r1["window"] and r2["ranks"] == list(range(world)))
print("ALL OK" if ok else "SOME CHECKS FAILED")
sys.exit(0 if ok else 1)
PY
