#!/usr/bin/env bash
# The machine's state as the test command may change it, to compare before and after a run:
#
#   machine-state.sh snapshot FILE [PID]   writes the state to FILE; processes descending from PID
#                                          (the caller's own tree) and from this script are left out
#   machine-state.sh diff BEFORE AFTER     prints every line that differs ("- gone", "+ new") grouped by
#                                          what it describes; exit status 1 when anything differs
#
# What is recorded: links, addresses, routes and rules of both families (all tables), network
# namespaces, the firewall (iptables/ip6tables, and nft when installed, counters left out), mounts,
# users and groups, listening sockets, the processes a test run may leave (those carrying the test
# runner's EGRESS_TEST_RUN in their environment, and every qemu, libvirtd, virtlogd, dnsmasq and sshd),
# the libvirt state directories (a daemon the labs run writes there) and the names directly under /tmp.
# Lifetimes, counters and other values that change on their own are left out, so an idle machine
# compares equal to itself, whatever else its users run meanwhile.
set -euo pipefail

section() { # section NAME COMMAND...: every output line of COMMAND, prefixed by NAME
  local name=$1
  shift
  "$@" | sed "s|^|$name |"
}

links() { ip -o link show | awk '{name=$2; sub(/@.*/, "", name); sub(/:$/, "", name); print name, $3}'; }
addresses() { ip -o addr show | awk '{print $2, $3, $4}'; }
routes() { # routes FAMILY
  ip "$1" route show table all | sed -E 's/ expires [0-9]+sec//; s/ +$//'
}
rules() { ip "$1" rule show; }
namespaces() { ip netns list | awk '{print $1}'; }
firewall() {
  local save
  for save in iptables-save ip6tables-save; do
    command -v "$save" >/dev/null 2>&1 || continue
    # Comments carry a time stamp; counters change with traffic.
    "$save" | sed -E '/^#/d; s/\[[0-9]+:[0-9]+\]//g' | sed "s|^|$save |"
  done
  if command -v nft >/dev/null 2>&1; then nft -s list ruleset | sed 's|^|nft |'; fi
}
mounts() { awk '{print $5, $9, $10}' /proc/self/mountinfo; }
accounts() { sed 's|^|passwd |' /etc/passwd; sed 's|^|group |' /etc/group; }
listening() { ss -Htlnu | awk '{print $1, $5}'; }
# processes [PID]: "comm pid start-time" of every process a test run may have started, except this
# script's and PID's trees.
processes() {
  local exclude=${1:-} pid stat comm rest ppid start
  declare -A parent=()
  declare -A line=()
  for stat in /proc/[0-9]*/stat; do
    pid=${stat#/proc/}
    pid=${pid%/stat}
    { read -r rest <"$stat"; } 2>/dev/null || continue
    comm=${rest#*(}
    comm=${comm%)*}
    rest=${rest##*) }
    # shellcheck disable=SC2086
    set -- $rest
    ppid=$2
    start=${20}
    parent[$pid]=$ppid
    case $comm in
    qemu-system-*| libvirtd | virtlogd | dnsmasq | sshd) line[$pid]="$comm $pid $start" ;;
    *) grep -qa 'EGRESS_TEST_RUN=' "/proc/$pid/environ" 2>/dev/null && line[$pid]="$comm $pid $start" ;;
    esac
  done
  for pid in "${!line[@]}"; do
    local up=$pid hops=0
    while [ -n "$up" ] && [ "$up" != 0 ] && [ "$up" != "$exclude" ] && [ "$up" != "$$" ] && [ $hops -lt 64 ]; do
      up=${parent[$up]:-}
      hops=$((hops + 1))
    done
    [ "$up" = "$exclude" ] || [ "$up" = "$$" ] || echo "${line[$pid]}"
  done
}
files() {
  local dir
  for dir in /etc/libvirt /var/lib/libvirt /var/log/libvirt /var/cache/libvirt /run/libvirt; do
    [ -e "$dir" ] && find "$dir" -mindepth 1 -printf '%p %y\n'
  done
  find /tmp -mindepth 1 -maxdepth 1 -printf '%p %y\n'
}

snapshot() {
  local out=$1 exclude=${2:-}
  {
    section link links
    section addr addresses
    section route4 routes -4
    section route6 routes -6
    section rule4 rules -4
    section rule6 rules -6
    section netns namespaces
    section firewall firewall
    section mount mounts
    section account accounts
    section listen listening
    section process processes "$exclude"
    section file files
  } | LC_ALL=C sort -u >"$out"
}

diff_states() {
  local before=$1 after=$2 changes
  changes=$(LC_ALL=C comm -3 "$before" "$after" | sed -E 's/^\t/+ /; t; s/^/- /')
  if [ -z "$changes" ]; then
    echo "[machine-state] no difference"
    return 0
  fi
  echo "[machine-state] the machine differs from before the run (- gone, + new):"
  echo "$changes" | LC_ALL=C sort -k2,2 -s | sed 's/^/  /'
  return 1
}

case "${1:-}" in
snapshot) snapshot "$2" "${3:-}" ;;
diff) diff_states "$2" "$3" ;;
*)
  echo "usage: machine-state.sh snapshot FILE [PID] | diff BEFORE AFTER" >&2
  exit 2
  ;;
esac
