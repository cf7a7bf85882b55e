#!/bin/bash
# Stops the stock-host profile of stock-host-up.sh. Only processes recorded in $STOCK_LAB_DIR/pids are
# signalled, each by PID and only while its command name still matches. Running guests are destroyed first.
#   --purge : also take back everything else stock-host-up.sh did, newest first (its undo list): this
#             machine's veth, the netns, the user egress-stock and its group membership, the directories
#             it created, and the profile's directory with its private libvirt state and keys.
set -uo pipefail
STOCK=${STOCK_LAB_DIR:-/tmp/egress-stock-lab}
NS=${STOCK_NETNS:-egress-stock}
SSH_USER=${STOCK_SSH_USER:-egress-stock}
VETH=${STOCK_VETH:-stock-host}
PIDS=$STOCK/pids
UNDO=${STOCK}.undo
SOCK=$STOCK/root/run/libvirt-sock
LOG_TAG=stock-down
# shellcheck source-path=SCRIPTDIR source=lab-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lab-lib.sh"

if alive libvirtd libvirtd; then
  V="virsh -q -c qemu:///system?socket=$SOCK"
  for d in $($V list --name --state-running --state-paused); do $V destroy "$d" >/dev/null && log "destroyed $d"; done
  $V net-destroy default >/dev/null 2>&1 && log "network default stopped"
fi
stop_recorded
stop_orphan_guests "$STOCK"
if [ "${1:-}" = "--purge" ]; then
  undo_recorded
  # A profile from before the undo list (or one whose list was lost) still goes completely.
  ip link del "$VETH" 2>/dev/null && log "veth $VETH removed"
  has_netns "$NS" && ip netns del "$NS" && log "netns $NS deleted"
  release_netns_mount
  rm -rf "$STOCK"
  # Only the profile's own account (its home is the profile's): never a user of the same name.
  if [ "$(getent passwd "$SSH_USER" | cut -d: -f6)" = "$STOCK/home" ]; then
    userdel "$SSH_USER" && log "user $SSH_USER removed"
  fi
fi
log "down"
