#!/bin/bash
# Stops the stock-host profile of stock-host-up.sh. Only processes recorded in $STOCK_LAB_DIR/pids are
# signalled, each by PID and only while its command name still matches. Running guests are destroyed first.
#   --purge : also remove the netns, this machine's veth, the private libvirt state, the keys and the user
#             egress-stock.
set -uo pipefail
STOCK=${STOCK_LAB_DIR:-/tmp/egress-stock-lab}
NS=${STOCK_NETNS:-egress-stock}
SSH_USER=${STOCK_SSH_USER:-egress-stock}
PIDS=$STOCK/pids
SOCK=$STOCK/root/run/libvirt/libvirt-sock
LOG_TAG=stock-down
# shellcheck source-path=SCRIPTDIR source=lab-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lab-lib.sh"

if alive libvirtd libvirtd; then
  V="virsh -q -c qemu:///system?socket=$SOCK"
  for d in $($V list --name --state-running --state-paused 2>/dev/null); do $V destroy "$d" >/dev/null && log "destroyed $d"; done
  $V net-destroy default >/dev/null 2>&1 && log "network default stopped"
fi
stop_recorded
if [ "${1:-}" = "--purge" ]; then
  ip link del stock-host 2>/dev/null && log "veth stock-host removed"
  has_netns "$NS" && ip netns del "$NS" && log "netns $NS deleted"
  rm -rf "$STOCK"
  id "$SSH_USER" >/dev/null 2>&1 && userdel "$SSH_USER" && log "user $SSH_USER removed"
fi
log "down"
