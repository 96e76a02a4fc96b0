#!/usr/bin/env bash
# Hosts in network namespaces, for tests of a job spread over several hosts on
# one machine (root only: CI runs as root). Each host is a namespace with one
# address on a bridge of its own; the bridge has no uplink, so nothing in the
# namespaces reaches past this machine, and the machine reaches them through
# the bridge's own address.
#
#   scripts/netns.sh up NAME HOSTS    create hosts NAME0 .. NAME<HOSTS-1> and
#                                     print "machine <ip>", then "<netns> <ip>"
#                                     per host (NAME: 2 to 8 letters or digits)
#   scripts/netns.sh down NAME        remove them (what exists of them)
#   scripts/netns.sh measure [N]      run the failover test in namespaces N
#                                     times (default 5) and print, per run, how
#                                     long after the kill the window was answered
#
# The subnet is 10.<a>.<b>.0/24 with a and b from NAME's checksum; up refuses
# one that this machine routes already.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "netns.sh: $*" >&2; exit 1; }

subnet() { # NAME -> "10.a.b"
  local sum; sum=$(printf '%s' "$1" | cksum | cut -d' ' -f1)
  echo "10.$((200 + sum % 50)).$(((sum / 50) % 250 + 1))"
}

check_name() {
  [[ $1 =~ ^[a-z0-9]{2,8}$ ]] || die "a name of 2 to 8 lowercase letters or digits, not '$1'"
}

up() {
  local name=$1 hosts=$2 net h ns
  check_name "$name"
  [[ $hosts =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 16 ] || die "1 to 16 hosts, not '$hosts'"
  [ "$(id -u)" = 0 ] || die "network namespaces need root"
  command -v ip >/dev/null || die "no 'ip' command (Debian's iproute2)"
  net=$(subnet "$name")
  if ip route show | grep -q "^$net\.0/24"; then die "this machine routes $net.0/24 already (another test's hosts? scripts/netns.sh down $name)"; fi
  trap 'down "$name" >/dev/null 2>&1 || true' ERR
  ip link add "${name}br" type bridge
  ip addr add "$net.254/24" dev "${name}br"
  ip link set "${name}br" up
  for h in $(seq 0 $((hosts - 1))); do
    ns="$name$h"
    ip netns add "$ns"
    ip link add "${name}h$h" type veth peer name "${name}n$h"
    ip link set "${name}n$h" netns "$ns"
    ip -n "$ns" link set "${name}n$h" name eth0
    ip -n "$ns" addr add "$net.$((h + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    ip link set "${name}h$h" master "${name}br"
    ip link set "${name}h$h" up
  done
  trap - ERR
  echo "machine $net.254"
  for h in $(seq 0 $((hosts - 1))); do echo "$name$h $net.$((h + 1))"; done
}

down() {
  local name=$1 ns
  check_name "$name"
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${name}[0-9]+$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns"
  done
  for l in $(ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | grep -E "^${name}(br|h[0-9]+)$" || true); do
    ip link del "$l" 2>/dev/null || true
  done
}

measure() {
  local n=${1:-5}
  export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"
  go test -count="$n" -run '^TestHostsInNamespaces$' -v ./cmd/memsnap 2>&1 | grep -E 'answered .* after the kill|^(--- |ok|FAIL)' | grep -v '^=== '
}

case "${1:-}" in
  up) [ $# -eq 3 ] || die "usage: $0 up NAME HOSTS"; up "$2" "$3" ;;
  down) [ $# -eq 2 ] || die "usage: $0 down NAME"; down "$2" ;;
  measure) measure "${2:-5}" ;;
  *) die "usage: $0 up NAME HOSTS | down NAME | measure [N]" ;;
esac
