#!/usr/bin/env bash
# Install and run a MinIO server on loopback for memsnap's tests and demos.
#
#   scripts/minio.sh install   build the pinned MinIO once into the cache folder; print its path
#   scripts/minio.sh start     start a new server on a free 127.0.0.1 port with a new temporary
#                              data folder; print the environment to use it:
#                                eval "$(scripts/minio.sh start)"
#                              sets the tests' MEMSNAP_TEST_S3_*, the CLI's S3_ENDPOINT_URL,
#                              AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, and
#                              MEMSNAP_MINIO_STATE, the server's own state folder
#   scripts/minio.sh stop      stop the server MEMSNAP_MINIO_STATE names and remove its folder;
#                              without it, the one server of this user's that start left running
#                              (start records each in the cache folder's servers/)
#   scripts/minio.sh stop all  stop every server of this user's that start left running
#
# Every start makes its own server: two runs (or two users) never share one. With
# MEMSNAP_MINIO_STATE set, start reuses the server in that folder if it still runs.
#
# MinIO is AGPL: it is only ever run as a separate process, never imported.
set -euo pipefail

MINIO_VERSION="v0.0.0-20260212201848-7aac2a2c5b7c"
CACHE="${MEMSNAP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/memsnap}"
BIN="$CACHE/minio-$MINIO_VERSION/minio"
STATE="${MEMSNAP_MINIO_STATE:-}"
SERVERS="$CACHE/servers" # one file per server start left running: its state folder's path

log() { echo "minio.sh: $*" >&2; }

install() {
  if [ -x "$BIN" ]; then echo "$BIN"; return; fi
  log "building github.com/minio/minio@$MINIO_VERSION into $(dirname "$BIN") (a few minutes, once)"
  mkdir -p "$(dirname "$BIN")"
  local tmp; tmp=$(mktemp -d)
  (cd "$tmp" && GOBIN="$(dirname "$BIN")" GOFLAGS=-mod=mod go install "github.com/minio/minio@$MINIO_VERSION") >&2
  rm -rf "$tmp"
  [ -x "$BIN" ] || { log "build failed: $BIN missing"; exit 1; }
  echo "$BIN"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null && return
  echo $(( 20000 + RANDOM % 20000 ))
}

live() {
  if command -v curl >/dev/null; then curl -fsS -o /dev/null --max-time 1 "http://127.0.0.1:$1/minio/health/live" 2>/dev/null
  else (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; fi
}

start() {
  install >/dev/null
  if [ -n "$STATE" ] && [ -f "$STATE/pid" ] && kill -0 "$(cat "$STATE/pid")" 2>/dev/null && [ -f "$STATE/env" ]; then
    cat "$STATE/env"; return
  fi
  if [ -z "$STATE" ]; then
    STATE=$(mktemp -d "${TMPDIR:-/tmp}/memsnap-minio.XXXXXX")
  else
    rm -rf "$STATE"; mkdir -p "$STATE"
  fi
  chmod 700 "$STATE"; mkdir -p "$STATE/data"
  local port user pass
  port=$(free_port)
  user="memsnap-test"
  pass="$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  MINIO_ROOT_USER="$user" MINIO_ROOT_PASSWORD="$pass" MINIO_BROWSER=off MINIO_UPDATE=off \
    nohup "$BIN" server --quiet --address "127.0.0.1:$port" "$STATE/data" >"$STATE/log" 2>&1 &
  echo $! >"$STATE/pid"
  mkdir -p "$SERVERS" && echo "$STATE" >"$SERVERS/$(basename "$STATE")"
  for _ in $(seq 1 150); do
    if live "$port"; then
      cat >"$STATE/env" <<ENV
export MEMSNAP_MINIO_STATE=$STATE
export MEMSNAP_TEST_S3_ENDPOINT=http://127.0.0.1:$port
export MEMSNAP_TEST_S3_ACCESS_KEY=$user
export MEMSNAP_TEST_S3_SECRET_KEY=$pass
export S3_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_ACCESS_KEY_ID=$user
export AWS_SECRET_ACCESS_KEY=$pass
ENV
      chmod 600 "$STATE/env"
      log "MinIO listening on 127.0.0.1:$port (data in $STATE/data; stop it with: scripts/minio.sh stop)"
      cat "$STATE/env"
      return
    fi
    if ! kill -0 "$(cat "$STATE/pid")" 2>/dev/null; then break; fi
    sleep 0.2
  done
  log "MinIO did not come up; its log:"; cat "$STATE/log" >&2
  stop; exit 1
}

# alive PID: the MinIO server this script started still runs as PID (a pid reused
# by another program, or one that exited unreaped, is not)
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  [ -r "/proc/$1/stat" ] || return 0
  [ "$(cut -d' ' -f3 <"/proc/$1/stat")" != Z ] || return 1
  tr '\0' ' ' <"/proc/$1/cmdline" | grep -q -- ' server --quiet --address 127.0.0.1:'
}

# describe STATE: the server's pid, address and data folder, as stop reports them
describe() {
  local addr
  addr=$(sed -n 's|^export MEMSNAP_TEST_S3_ENDPOINT=http://||p' "$1/env" 2>/dev/null || true)
  echo "MinIO pid $(cat "$1/pid" 2>/dev/null || echo '?') on ${addr:-an unknown address} (data in $1/data)"
}

# stop_state STATE: stop the server in STATE, remove its folder and its record
stop_state() {
  local st=$1 what
  what=$(describe "$st")
  if [ -f "$st/pid" ]; then
    local pid; pid=$(cat "$st/pid")
    if alive "$pid"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.1; done
      if alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
      log "stopped $what"
    else
      log "$what had already exited; removed its folder"
    fi
  fi
  rm -rf "$st"
  rm -f "$SERVERS/$(basename "$st")"
}

# running: the state folders of this user's servers that still run, one a line;
# records of servers that exited are removed with their folders
running() {
  local rec st
  for rec in "$SERVERS"/*; do
    [ -f "$rec" ] || continue
    st=$(cat "$rec")
    if [ -z "$st" ]; then rm -f "$rec"; continue; fi
    if [ -f "$st/pid" ] && alive "$(cat "$st/pid")"; then echo "$st"
    else rm -rf "$st"; rm -f "$rec"; fi
  done
}

stop() {
  if [ -n "$STATE" ]; then stop_state "$STATE"; return; fi
  local states; states=$(running)
  if [ -z "$states" ]; then
    log "nothing to stop: no MinIO that scripts/minio.sh start began runs (none recorded in $SERVERS)"; return
  fi
  if [ "$(echo "$states" | wc -l)" -gt 1 ] && [ "${1:-}" != all ]; then
    log "several MinIO servers run; stop one with MEMSNAP_MINIO_STATE=FOLDER scripts/minio.sh stop, or all with scripts/minio.sh stop all:"
    while read -r st; do log "  $st: $(describe "$st")"; done <<<"$states"
    exit 1
  fi
  while read -r st; do stop_state "$st"; done <<<"$states"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop "${2:-}" ;;
  *) echo "usage: $0 install|start|stop [all]" >&2; exit 2 ;;
esac
