#!/usr/bin/env bash
# Cluster scale, measured in one process: SIZES (default 64,256,1024) members of one
# run on memberlist over an in-memory network, with the real coordinator code and a
# simulated trainer per rank that uploads real snapshots to a folder store. For each
# size: REPEATS (default 5) on-demand windows asked by a client member, as
# `memsnap snapshot` does, then FAILOVERS (default 3) windows whose leader is killed
# once every rank has acked. It prints a table, one column per size, and each
# figure's growth from the first size to the last, then the issue's targets.
#   EVENTS     trace events of each rank's snapshot, per size (default 100000,20000,5000;
#              0: the recorded 549-event snapshots of testdata/snapshots/ddp4)
#   STEP       the simulated job's batch time (default 250ms)
#   IDLE       how long the idle cluster's load is measured (default 10s)
#   SETTLE     how long, at most, the formed cluster's gossip of its forming is
#              given to die down before the idle load is measured (default 3m;
#              0: measured at once, the forming's gossip in it)
#   LATENCY    latency added to every store request (default 0: the folder store)
#   COMPRESS   memberlist's gossip compression (default false; memberlist's own default is true)
#   FIGURES    how often each member sends its memory figures to the leader (default 5s,
#              as agents do; 0: never), to compare the idle traffic with and without
#   PRODUCTION 1: every member on production's timers (DefaultConfig) at every size; on
#              2 cores the simulation slows failure detection above 256 members
#              (coordinator/sim_test.go's simTune), a machine with 16 cores need not
#   BIN        a coordinator test binary built beforehand (go test -c ./coordinator),
#              for a machine without Go: the GPU machine's 16 cores, e.g.
#              BIN=.devrun/coord.test PRODUCTION=1 scripts/bench-scale.sh
#   OWNCORES   1 (default): each simulated rank's analysis of its snapshot takes the
#              time it takes on one core, as on the rank's own host, without using the
#              cores every member shares here (computed once per snapshot and timed);
#              0: every rank analyses its own snapshot on the shared cores
#   SIMTMP     where the simulation's folder store lives (default /dev/shm when it is
#              writable, else $TMPDIR): 1,024 ranks' uploads would otherwise queue on
#              one disk's fsyncs, where a real job's go to an object store over the
#              network; LATENCY adds that network's latency to every request
#   LOOPBACK   1: members on memberlist's own UDP/TCP transport over 127.0.0.1 instead
#              of the in-memory network (packets are then not counted), e.g.
#              LOOPBACK=1 SIZES=8,64 EVENTS=100000,100000 scripts/bench-scale.sh
#   PROFILE    a path: a CPU profile of each size's timed windows goes to
#              PROFILE-<size>.prof; its samples carry the label member=rankR (that
#              rank's agent and every goroutine it started), trainerR or client, e.g.
#              go tool pprof -tagfocus member=rank0 coordinator.test PROFILE-1024.prof;
#              the failovers go to PROFILE-<size>-failover.prof
#   LEADERLOG  a path: every leader's own log records (plans, progress, recoveries),
#              with the member that wrote each, are appended to it
# Every member shares this machine's cores, so the figures include the whole
# cluster's gossip competing for them; "idle load" and "CPU time per window" say how
# much that is.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
SIZES="${SIZES:-64,256,1024}"; EVENTS="${EVENTS:-100000,20000,5000}"; REPEATS="${REPEATS:-5}"; FAILOVERS="${FAILOVERS:-3}"
STEP="${STEP:-250ms}"; IDLE="${IDLE:-10s}"; LATENCY="${LATENCY:-0}"; COMPRESS="${COMPRESS:-false}"; LOOPBACK="${LOOPBACK:-0}"
PRODUCTION="${PRODUCTION:-0}"; OWNCORES="${OWNCORES:-1}"; PROFILE="${PROFILE:-}"; LEADERLOG="${LEADERLOG:-}"
case $PROFILE in ''|/*) ;; *) PROFILE="$PWD/$PROFILE" ;; esac
case $LEADERLOG in ''|/*) ;; *) LEADERLOG="$PWD/$LEADERLOG" ;; esac
if [ -z "${SIMTMP:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ]; then SIMTMP=/dev/shm; fi
SIMTMP="${SIMTMP:-${TMPDIR:-/tmp}}"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if [ -n "${BIN:-}" ]; then
  case $BIN in *.gz) gunzip -c "$BIN" >"$tmp/coordinator.test" ;; *) cp "$BIN" "$tmp/coordinator.test" ;; esac
  chmod +x "$tmp/coordinator.test"
else
  go test -c -o "$tmp/coordinator.test" ./coordinator
fi
echo "== $(nproc) cores; sizes $SIZES, events $EVENTS, $REPEATS windows and $FAILOVERS failovers each, production timers: $([ "$PRODUCTION" = 1 ] && echo yes || echo 'no (simTune)'); rank analyses: $([ "$OWNCORES" = 1 ] && echo 'a core each' || echo 'on the shared cores'); store in $SIMTMP"
cd coordinator
# the test binary runs in its package's folder, as go test runs it; its own
# temporary folders (the store) go under $TMPDIR
TMPDIR="$SIMTMP" "$tmp/coordinator.test" -test.run '^$' -test.bench '^BenchmarkScale$' -test.benchtime 1x -test.timeout 0 \
  -sim.sizes "$SIZES" -sim.events "$EVENTS" -sim.repeats "$REPEATS" -sim.failovers "$FAILOVERS" \
  -sim.step "$STEP" -sim.idle "$IDLE" -sim.settle "${SETTLE:-3m}" -sim.figures "${FIGURES:-5s}" -sim.store-latency "$LATENCY" -sim.compress="$COMPRESS" -sim.production="$([ "$PRODUCTION" = 1 ] && echo true || echo false)" -sim.loopback="$([ "$LOOPBACK" = 1 ] && echo true || echo false)" -sim.own-cores="$([ "$OWNCORES" = 1 ] && echo true || echo false)" \
  -sim.cpuprofile "$PROFILE" -sim.leader-log "$LEADERLOG"
