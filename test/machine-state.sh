#!/usr/bin/env bash
# The machine's state as the test command may change it, to compare before and after a run:
#
#   machine-state.sh snapshot FILE [PID [RUN]]   writes the state to FILE; processes descending from PID
#                                                (the caller's own tree) and from this script are left
#                                                out; RUN (default: $EGRESS_TEST_RUN) names the run
#   machine-state.sh diff BEFORE AFTER           prints what the run made and did not undo ("- gone",
#                                                "+ new"), exit status 1, and before it, as information,
#                                                the differences that are other programs' doing
#
# What is recorded: links, addresses, routes and rules of both families (all tables), network
# namespaces, the firewall (iptables/ip6tables, and nft when installed, counters left out), mounts,
# users and groups, the run's processes and the sockets they listen on, the libvirt state directories
# (a daemon the labs run writes there) and the names directly under /tmp. Lifetimes, counters and other
# values that change on their own are left out, so an idle machine compares equal to itself.
#
# Other programs run beside the test command (a login, a temp cleaner, a contributor's shell), so only
# what can be the run's counts against it:
#   - a process is the run's when it or an ancestor carries EGRESS_TEST_RUN=RUN (the runner sets it for
#     every step) or names a path under /tmp/egress- on its command line (the labs' files); a new one
#     fails, a gone one is ignored (the run stops only what it started);
#   - a listening socket is the run's when one of its processes owns it; likewise new fails, gone is
#     ignored;
#   - under /tmp the run names its own entries egress-* and puts everything else under its TMPDIR
#     (removed before the comparison): a new egress-* entry fails; any other new entry, and any entry
#     gone, is ignored;
#   - everything else (links, addresses, routes, rules, namespaces, the firewall, mounts, users and
#     groups, libvirt's directories) fails both ways: other programs rarely change it under a run, and a
#     run that removes what it should not must be caught.
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
# Mounts, but not those inside a guest image build's root fs (mmdebstrap mounts /proc, /sys and /dev there
# while it installs, and unmounts them itself): `npm test` starts that build before the first snapshot
# (build-image.sh --early), so they may be there before and gone after, whatever the run did.
mounts() { awk '$5 !~ /\/lab-image\/[0-9a-f]+\.build\/rootfs-/ {print $5, $9, $10}' /proc/self/mountinfo; }
accounts() { sed 's|^|passwd |' /etc/passwd; sed 's|^|group |' /etc/group; }
# collect_processes PID RUN: the run's processes into RUN_PROCESS (pid -> "comm pid start-time"), once per
# snapshot (the listening sockets are told by them too). The command-line rule is for libvirtd's qemu,
# which it starts with an environment of its own; descent is for sshd's sessions, whose environment and
# command line sshd overwrites with its title. Not the run's: a contributor's login, the machine's daemons.
declare -A RUN_PROCESS=()
collect_processes() {
  local exclude=$1 run=$2 stat pid rest comm ppid word up hops mine
  local -a fields words
  local -A parent=() marked=() line=()
  for stat in /proc/[0-9]*/stat; do
    pid=${stat#/proc/}
    pid=${pid%/stat}
    { read -r rest <"$stat"; } 2>/dev/null || continue
    comm=${rest#*(}
    comm=${comm%)*}
    read -r -a fields <<<"${rest##*) }"
    ppid=${fields[1]}
    parent[$pid]=$ppid
    line[$pid]="$comm $pid ${fields[19]}"
    words=()
    { mapfile -d '' -t words <"/proc/$pid/cmdline"; } 2>/dev/null || true
    if [[ "${words[*]}" == */tmp/egress-* ]]; then
      marked[$pid]=1
      continue
    fi
    [ -n "$run" ] || continue
    words=()
    { mapfile -d '' -t words <"/proc/$pid/environ"; } 2>/dev/null || true
    for word in "${words[@]}"; do
      if [ "$word" = "EGRESS_TEST_RUN=$run" ]; then
        marked[$pid]=1
        break
      fi
    done
  done
  for pid in "${!line[@]}"; do
    up=$pid hops=0 mine=
    while [ -n "$up" ] && [ "$up" != 0 ] && [ "$up" != "$exclude" ] && [ "$up" != "$$" ] && [ $hops -lt 64 ]; do
      [ -n "${marked[$up]:-}" ] && mine=1
      up=${parent[$up]:-}
      hops=$((hops + 1))
    done
    [ "$up" = "$exclude" ] || [ "$up" = "$$" ] || [ -z "$mine" ] || RUN_PROCESS[$pid]=${line[$pid]}
  done
}
processes() { [ ${#RUN_PROCESS[@]} = 0 ] || printf '%s\n' "${RUN_PROCESS[@]}"; }
# The sockets the run's processes listen on (a socket shared after a fork counts when any owner is the run's).
listening() {
  local netid local_address owners
  while read -r netid _ _ _ local_address _ owners; do
    while [[ $owners =~ pid=([0-9]+)(.*) ]]; do
      owners=${BASH_REMATCH[2]}
      if [ -n "${RUN_PROCESS[${BASH_REMATCH[1]}]:-}" ]; then
        echo "$netid $local_address"
        break
      fi
    done
  done < <(ss -Htlnup)
}
files() {
  local dir
  for dir in /etc/libvirt /var/lib/libvirt /var/log/libvirt /var/cache/libvirt /run/libvirt; do
    [ -e "$dir" ] && find "$dir" -mindepth 1 -printf '%p %y\n'
  done
  find /tmp -mindepth 1 -maxdepth 1 -printf '%p %y\n'
}

snapshot() {
  local out=$1 exclude=${2:-} run=${3:-${EGRESS_TEST_RUN:-}}
  collect_processes "$exclude" "$run"
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
    section process processes
    section file files
  } | LC_ALL=C sort -u >"$out"
}

# attribute: prefixes each change ("- gone"/"+ new" line) with "run " when it counts against the run, or
# "other " when it is another program's doing (the rules at the top).
attribute() {
  awk '{
    if ($2 == "process" || $2 == "listen") mine = ($1 == "+")
    else if ($2 == "file" && $3 ~ /^\/tmp\/[^\/]*$/) mine = ($1 == "+" && $3 ~ /^\/tmp\/egress-/)
    else mine = 1
    print (mine ? "run " : "other ") $0
  }'
}

diff_states() {
  local before=$1 after=$2 changes ours others
  changes=$(LC_ALL=C comm -3 "$before" "$after" | sed -E 's/^\t/+ /; t; s/^/- /' | attribute |
    LC_ALL=C sort -k3,3 -s)
  others=$(sed -n 's/^other /  /p' <<<"$changes")
  ours=$(sed -n 's/^run /  /p' <<<"$changes")
  if [ -n "$others" ]; then
    echo "[machine-state] ignored, not the run's (- gone, + new):"
    echo "$others"
  fi
  # A guest image build's own mounts are left out of both snapshots (a build may run while either is taken),
  # but no build of the run's runs when it ends: one still there is the run's, left by a build stopped half
  # way (a Ctrl-C once left /proc mounted there, which hid from this check and failed the next run's build).
  local build_mounts
  build_mounts=$(awk '$5 ~ /\/lab-image\/[0-9a-f]+\.build\/rootfs-/ { print "  + mount " $5 " (a guest image build stopped half way)" }' /proc/self/mountinfo)
  [ -z "$build_mounts" ] || ours=$(printf '%s\n%s' "$ours" "$build_mounts" | sed '/^$/d')
  if [ -z "$ours" ]; then
    echo "[machine-state] no difference the run made"
    return 0
  fi
  echo "[machine-state] the run changed the machine and did not undo it (- gone, + new):"
  echo "$ours"
  return 1
}

case "${1:-}" in
snapshot) snapshot "$2" "${3:-}" "${4:-}" ;;
diff) diff_states "$2" "$3" ;;
*)
  echo "usage: machine-state.sh snapshot FILE [PID [RUN]] | diff BEFORE AFTER" >&2
  exit 2
  ;;
esac
