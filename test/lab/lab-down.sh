#!/bin/bash
# Stop the lab started by lab-up.sh. Idempotent. Only processes recorded in $LAB_DIR/pids are signalled,
# each by PID, and only while its command name still matches the recorded name.
#   --purge : also undefine every domain (with NVRAM), delete the pools and their volumes, unmount the
#             tiny pool's tmpfs, remove the netns, the keys and env.json. Without it, running domains are
#             destroyed (stopped) but definitions, pools, volumes and keys stay for the next lab-up.
set -uo pipefail
LAB=${LAB_DIR:-/tmp/egress-lab}
PIDS=$LAB/pids
NS=${LAB_NETNS:-lab}
PURGE=0
[ "${1:-}" = "--purge" ] && PURGE=1
LOG_TAG=lab-down
# shellcheck source-path=SCRIPTDIR source=lab-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lab-lib.sh"

# 1. Stop guests while libvirtd is still up; otherwise their qemu processes would outlive it.
if alive libvirtd libvirtd; then
  V="virsh -q -c qemu:///system"
  for d in $($V list --name --state-running --state-paused 2>/dev/null); do
    $V destroy "$d" >/dev/null && log "destroyed $d"
  done
  if [ $PURGE = 1 ]; then
    for d in $($V list --all --name 2>/dev/null); do
      $V undefine "$d" --nvram >/dev/null 2>&1 || $V undefine "$d" >/dev/null
    done
    for pool in lab lab-tiny; do
      if $V pool-info "$pool" >/dev/null 2>&1; then
        for v in $($V vol-list "$pool" 2>/dev/null | awk '{print $1}'); do $V vol-delete --pool "$pool" "$v" >/dev/null; done
        $V pool-destroy "$pool" >/dev/null 2>&1
        $V pool-undefine "$pool" >/dev/null && log "pool $pool removed"
      fi
    done
  fi
fi

# 2. Stop recorded processes, newest first, by PID.
stop_recorded

# 3. Everything else only with --purge.
if [ $PURGE = 1 ]; then
  mountpoint -q "$LAB/tiny-pool" && umount "$LAB/tiny-pool" && log "tiny pool tmpfs unmounted"
  has_netns "$NS" && ip netns del "$NS" && log "netns $NS deleted"
  rm -rf "$LAB/ssh" "$LAB/env.json" "$LAB/dnsmasq.leases" "$LAB/pool" "$LAB/tiny-pool"
fi
log "down"
