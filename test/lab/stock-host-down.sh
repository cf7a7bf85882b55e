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
log() { echo "[stock-down] $*"; }
pid_of() { [ -f "$PIDS" ] && awk -v n="$1" '$1==n {p=$2} END {print p}' "$PIDS"; }

lp=$(pid_of libvirtd)
if [ -n "$lp" ] && [ "$(cat "/proc/$lp/comm" 2>/dev/null)" = libvirtd ]; then
  V="virsh -q -c qemu:///system?socket=$SOCK"
  for d in $($V list --name --state-running --state-paused 2>/dev/null); do $V destroy "$d" >/dev/null && log "destroyed $d"; done
  $V net-destroy default >/dev/null 2>&1 && log "network default stopped"
fi
if [ -f "$PIDS" ]; then
  tac "$PIDS" | while read -r name pid; do
    [ -n "$pid" ] || continue
    if [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then
      kill -TERM "$pid"
      for _ in $(seq 50); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
      if [ -d "/proc/$pid" ]; then kill -KILL "$pid"; log "killed -9 $name ($pid)"; else log "stopped $name ($pid)"; fi
    fi
  done
  : >"$PIDS"
fi
if [ "${1:-}" = "--purge" ]; then
  ip link del stock-host 2>/dev/null && log "veth stock-host removed"
  case " $(ip netns list | awk '{print $1}' | tr '\n' ' ') " in *" $NS "*) ip netns del "$NS" && log "netns $NS deleted" ;; esac
  rm -rf "$STOCK"
  id "$SSH_USER" >/dev/null 2>&1 && userdel "$SSH_USER" && log "user $SSH_USER removed"
fi
log "down"
