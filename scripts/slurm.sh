#!/usr/bin/env bash
# memsnap under a real SLURM on one machine: starts munge and a single-host SLURM
# (slurmctld + slurmd, a minimal config in a scratch folder, on loopback), then
#   1. `srun -n 4 memsnap agent ... -- <replay trainer>`: asks for a window with
#      `memsnap snapshot` and prints the published manifest;
#   2. the same job as an `sbatch` script;
#   3. a requeued sbatch job (the same SLURM_JOB_ID, SLURM_RESTART_COUNT 1): a window
#      before and one after the requeue, both published under the one run name,
#      the second's id continuing the first's;
# checking that identity, the join address (the first host of SLURM_JOB_NODELIST)
# and the run name (SLURM_JOB_ID) come from SLURM's own environment. Needs root
# (or the daemons' users) and Debian's slurm-wlm and munge (installed when missing).
# Every job ends by scancel, which must be no incident (it ends in seconds and the
# run's log gains no crash post-mortem); 1b tears CYCLES (4) jobs down at once.
# The daemons it started (munged, slurmctld, slurmd, job steps) are stopped at its end.
#   MEMSNAP=path/to/memsnap OUT=dir [CYCLES=4] scripts/slurm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  echo "== installing slurm-wlm and munge"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi
MEMSNAP="$(realpath "${MEMSNAP:-.devrun/memsnap}")"
[ -x "$MEMSNAP" ] || { CGO_CFLAGS=-Wno-deprecated-declarations go build -o "$MEMSNAP" ./cmd/memsnap; }
OUT="${OUT:-$(mktemp -d)}"; mkdir -p "$OUT"
CYCLES="${CYCLES:-4}"
D=$(mktemp -d /tmp/memsnap-slurm.XXXXXX); chmod 755 "$D"
mkdir -p "$D/state" "$D/spool" "$D/log"
SNAP="$PWD/testdata/snapshots/ddp4/rank0.5.memory_snapshot.pickle"
export SLURM_CONF="$D/slurm.conf" MEMSNAP_KEY="$("$MEMSNAP" keygen)"
BASE=$((20000 + RANDOM % 20000))
store="$OUT/store"; mkdir -p "$store"

alive() { # whether any of the processes runs (a zombie does not)
  local p st
  for p in "$@"; do st=$(ps -o stat= -p "$p" 2>/dev/null) && [[ $st != Z* ]] && return 0; done
  return 1
}
started=() # the daemons this script started, stopped (and waited for) at its end
cleanup() {
  scancel --quiet --user "$(id -un)" 2>/dev/null || true
  local pids=()
  for p in "$D/slurmd.pid" "$D/slurmctld.pid"; do [ -s "$p" ] && pids+=("$(cat "$p")"); done
  # a job step's slurmstepd outlives slurmd unless stopped: only ours run here
  [ ${#started[@]} -gt 0 ] && pids+=($(pgrep -x slurmstepd || true))
  [ -n "${munge_pid:-}" ] && pids+=("$munge_pid")
  [ ${#pids[@]} -gt 0 ] || return 0
  kill "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 40); do alive "${pids[@]}" || break; sleep 0.25; done
  kill -9 "${pids[@]}" 2>/dev/null || true
}
trap cleanup EXIT

echo "== munge"
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge; chown munge:munge /run/munge
  rm -f /run/munge/munged.pid
  runuser -u munge -- munged --force
  for _ in $(seq 1 40); do [ -s /run/munge/munged.pid ] && break; sleep 0.25; done
  munge_pid=$(cat /run/munge/munged.pid)
fi
munge -n | unmunge | grep -q Success

echo "== slurm (single host, on loopback)"
host=$(hostname -s); cpus=$(slurmd -C | sed -n 's/.*CPUs=\([0-9]*\).*/\1/p'); mem=$(( $(free -m | awk '/Mem:/{print $2}') / 2 ))
cat >"$D/slurm.conf" <<CONF
ClusterName=memsnaptest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/ctld.log
SlurmdLogFile=$D/log/d.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
JobRequeue=1
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
slurmctld -f "$D/slurm.conf" -c
slurmd -f "$D/slurm.conf" -c
started=(slurmctld slurmd)
for _ in $(seq 1 60); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 0.5; done
sinfo

agent_cmd="$MEMSNAP agent --store $store --folder $D/w{run_name}-{rank} --no-schedule --collect-timeout 20s --gossip-port $BASE -- $MEMSNAP replay --snapshot $SNAP --batches 0 --pace 20ms --hold-at 5"

listening() { # $1: a job's log, $2: how many "agent listening" lines to wait for
  local n
  for _ in $(seq 1 240); do
    n=$(grep -c 'agent listening' "$1" 2>/dev/null || true); [ "${n:-0}" -ge "$2" ] && return; sleep 0.25
  done
  echo "the agents did not start:"; tail -30 "$1"; exit 1
}

window() { # $1: job id (the run name); $2: a label; prints the manifest
  local res="$OUT/$2.json"
  "$MEMSNAP" snapshot --join "127.0.0.1:$BASE" --run "$1" --batches 3 --wait-all --json --timeout 3m >"$res" 2>"$OUT/$2.log" || {
    echo "snapshot failed:"; cat "$OUT/$2.log"; tail -30 "$OUT/$2.job.log" 2>/dev/null; exit 1; }
  python3 scripts/show-window.py "$res" 4
}

job_id() { # waits for the job named $1 to run; prints its id
  for _ in $(seq 1 120); do
    id=$(squeue -h -n "$1" -t R -o %i | head -1); [ -n "$id" ] && { echo "$id"; return; }; sleep 0.5
  done
  echo "job $1 did not start" >&2; squeue >&2; exit 1
}

# teardown $1 (job id) [$2 (srun's pid)]: scancel the job, as a user or a
# scheduler ends it, and check that it is no incident: the job ends within a few
# seconds, no agent says its trainer's stopping is one, and the run's log holds no
# window past the ones asked for (no crash post-mortem)
plans() { { ls "$store/$1/memsnap/plans" 2>/dev/null || true; } | wc -l; }
teardown() {
  local id=$1 pid=${2:-} log=$3 t0 t1 windows
  windows=$(plans "$id")
  t0=$(date +%s.%N)
  scancel "$id"
  if [ -n "$pid" ]; then wait "$pid" || true
  else for _ in $(seq 1 240); do squeue -h -j "$id" 2>/dev/null | grep -q . || break; sleep 0.25; done; fi
  t1=$(date +%s.%N)
  awk -v id="$id" -v a="$t0" -v b="$t1" 'BEGIN { printf "job %s ended %.1f s after scancel\n", id, b - a }'
  if grep -E 'msg="(the trainer is being stopped|.*post-mortem)"' "$log"; then
    echo "FAIL: the teardown of job $id was called an incident"; exit 1
  fi
  local now; now=$(plans "$id")
  [ "$now" = "$windows" ] || { echo "FAIL: job $id's log gained $((now - windows)) window(s) at its teardown"; ls "$store/$id/memsnap/plans"; exit 1; }
}

echo "== 1. srun -n 4"
srun --overcommit -n 4 -J ms-srun bash -c "$agent_cmd" >"$OUT/srun.job.log" 2>&1 &
srun_pid=$!
id=$(job_id ms-srun); echo "job $id"
listening "$OUT/srun.job.log" 4
window "$id" srun
grep -h "agent listening" "$OUT/srun.job.log" | head -1
teardown "$id" "$srun_pid" "$OUT/srun.job.log"

echo "== 1b. srun jobs torn down at once, $CYCLES times"
for c in $(seq 1 "$CYCLES"); do
  srun --overcommit -n 4 -J ms-cycle bash -c "$agent_cmd" >"$OUT/cycle$c.job.log" 2>&1 &
  srun_pid=$!
  id=$(job_id ms-cycle)
  listening "$OUT/cycle$c.job.log" 4
  teardown "$id" "$srun_pid" "$OUT/cycle$c.job.log"
done

echo "== 2. sbatch"
cat >"$D/job.sh" <<JOB
#!/bin/bash
#SBATCH -n 4 --overcommit -J ms-sbatch -o $OUT/sbatch.job.log
srun bash -c '$agent_cmd'
JOB
sbatch -Q "$D/job.sh"
id=$(job_id ms-sbatch); echo "job $id"
listening "$OUT/sbatch.job.log" 4
window "$id" sbatch
teardown "$id" "" "$OUT/sbatch.job.log"

echo "== 3. a requeued job"
sed -e 's/-J ms-sbatch/-J ms-requeue --requeue/' -e "s#sbatch.job.log#requeue.job.log#" "$D/job.sh" >"$D/requeue.sh"
sbatch -Q "$D/requeue.sh"
id=$(job_id ms-requeue); echo "job $id"
listening "$OUT/requeue.job.log" 4
window "$id" before-requeue
scontrol requeue "$id"
# a requeued job, once its steps ended, waits out a begin time before it runs
# again: now, here
for _ in $(seq 1 120); do [ "$(squeue -h -j "$id" -o %T)" = PENDING ] && break; sleep 0.5; done
mv "$OUT/requeue.job.log" "$OUT/requeue-first.job.log" # the second run writes it anew
scontrol update JobId="$id" StartTime=now
for _ in $(seq 1 240); do
  [ "$(scontrol show job "$id" | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')" = 1 ] && squeue -h -j "$id" -t R | grep -q . && break; sleep 0.5
done
scontrol show job "$id" | grep -o "Restarts=[0-9]*"
listening "$OUT/requeue.job.log" 4
window "$id" after-requeue
teardown "$id" "" "$OUT/requeue.job.log"
python3 - "$OUT" <<'PY'
import json, sys
a, b = (json.load(open(sys.argv[1] + "/%s.json" % n)) for n in ("before-requeue", "after-requeue"))
ok = b["window"] > a["window"] and b["state"] == "published"
print("after the requeue, window %d follows window %d under the same run name: %s" % (b["window"], a["window"], "OK" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY
echo "== memsnap ls"
"$MEMSNAP" ls "$store"
echo "ALL OK"
