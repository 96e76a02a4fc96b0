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
#   MEMSNAP=path/to/memsnap OUT=dir scripts/slurm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  echo "== installing slurm-wlm and munge"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi
MEMSNAP="$(realpath "${MEMSNAP:-.devrun/memsnap}")"
[ -x "$MEMSNAP" ] || { CGO_CFLAGS=-Wno-deprecated-declarations go build -o "$MEMSNAP" ./cmd/memsnap; }
OUT="${OUT:-$(mktemp -d)}"; mkdir -p "$OUT"
D=$(mktemp -d /tmp/memsnap-slurm.XXXXXX); chmod 755 "$D"
mkdir -p "$D/state" "$D/spool" "$D/log"
SNAP="$PWD/testdata/snapshots/ddp4/rank0.5.memory_snapshot.pickle"
export SLURM_CONF="$D/slurm.conf" MEMSNAP_KEY="$("$MEMSNAP" keygen)"
BASE=$((20000 + RANDOM % 20000))
store="$OUT/store"; mkdir -p "$store"

cleanup() {
  scancel --quiet --user "$(id -un)" 2>/dev/null || true
  for p in "$D/slurmd.pid" "$D/slurmctld.pid"; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true; done
  [ -n "${munge_pid:-}" ] && kill "$munge_pid" 2>/dev/null || true
}
trap cleanup EXIT

echo "== munge"
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge; chown munge:munge /run/munge
  runuser -u munge -- munged --force
  munge_pid=$(pgrep -u munge munged | head -1)
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
for _ in $(seq 1 60); do sinfo -h -o %T 2>/dev/null | grep -q idle && break; sleep 0.5; done
sinfo

agent_cmd="$MEMSNAP agent --store $store --folder $D/w{run_name}-{rank} --no-schedule --collect-timeout 20s --gossip-port $BASE -- $MEMSNAP replay --snapshot $SNAP --batches 0 --pace 20ms --hold-at 5"

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

echo "== 1. srun -n 4"
srun --overcommit -n 4 -J ms-srun bash -c "$agent_cmd" >"$OUT/srun.job.log" 2>&1 &
id=$(job_id ms-srun); echo "job $id"
window "$id" srun
grep -h "agent listening" "$OUT/srun.job.log" | head -1
scancel "$id"; wait || true

echo "== 2. sbatch"
cat >"$D/job.sh" <<JOB
#!/bin/bash
#SBATCH -n 4 --overcommit -J ms-sbatch -o $OUT/sbatch.job.log
srun bash -c '$agent_cmd'
JOB
sbatch -Q "$D/job.sh"
id=$(job_id ms-sbatch); echo "job $id"
window "$id" sbatch
scancel "$id"

echo "== 3. a requeued job"
sed -e 's/-J ms-sbatch/-J ms-requeue --requeue/' -e "s#sbatch.job.log#requeue.job.log#" "$D/job.sh" >"$D/requeue.sh"
sbatch -Q "$D/requeue.sh"
id=$(job_id ms-requeue); echo "job $id"
window "$id" before-requeue
scontrol requeue "$id"
# a requeued job, once its steps ended, waits out a begin time before it runs
# again: now, here
for _ in $(seq 1 120); do [ "$(squeue -h -j "$id" -o %T)" = PENDING ] && break; sleep 0.5; done
scontrol update JobId="$id" StartTime=now
for _ in $(seq 1 240); do
  [ "$(scontrol show job "$id" | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')" = 1 ] && squeue -h -j "$id" -t R | grep -q . && break; sleep 0.5
done
scontrol show job "$id" | grep -o "Restarts=[0-9]*"
window "$id" after-requeue
scancel "$id"
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
