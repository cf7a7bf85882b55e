#!/bin/bash
# Stop the lab started by lab-up.sh. Idempotent. Only processes recorded in $LAB_DIR/pids are signalled,
# each by PID, and only while its command name still matches the recorded name.
#   --purge : also take back everything else lab-up.sh did, newest first (the undo list beside the lab
#             directory): the root namespace's leg (host-link.sh), the netns and its bridge, the socket
#             symlinks, the directories it created, and the lab directory with the private libvirt
#             state, pools, keys and logs. After it the machine is as before lab-up.sh.
#             Without it, running guests are destroyed and the daemons stopped; the rest stays.
set -uo pipefail
LAB=${LAB_DIR:-/tmp/egress-lab}
PIDS=$LAB/pids
UNDO=${LAB}.undo
NS=${LAB_NETNS:-lab}
PURGE=0
[ "${1:-}" = "--purge" ] && PURGE=1
LOG_TAG=lab-down
# shellcheck source-path=SCRIPTDIR source=lab-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lab-lib.sh"

# 1. Stop guests while libvirtd is still up; otherwise their qemu processes would outlive it.
if alive libvirtd libvirtd; then
  V="virsh -q -c qemu:///system?socket=$LAB/root/run/libvirt-sock"
  for d in $($V list --name --state-running --state-paused); do
    $V destroy "$d" >/dev/null && log "destroyed $d"
  done
fi

# 2. Stop recorded processes, newest first, by PID, then any guest that outlived its daemon.
stop_recorded
stop_orphan_guests "$LAB"

# 3. Everything else only with --purge.
if [ $PURGE = 1 ]; then
  undo_recorded
  # A lab from before the undo list (or one whose list was lost) still goes completely.
  ip link del lab-host 2>/dev/null && log "veth lab-host removed"
  has_netns "$NS" && ip netns del "$NS" && log "netns $NS deleted"
  release_netns_mount
  rm -rf "$LAB"
fi
log "down"
