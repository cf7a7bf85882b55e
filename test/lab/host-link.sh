#!/bin/bash
# Gives this machine's root network namespace a leg on the lab bridge, so a provider running here
# reaches lab guests the way it reaches VMs on a real LAN (readiness probes, HTTP through squid):
#   veth lab-host (root netns, 192.0.2.254/24)  <->  lab-host-br (netns "lab", enslaved to br-lab)
# Only 192.0.2.0/24 (TEST-NET-1) routes over it, and nothing on the bridge routes further.
# Idempotent. Removing the lab netns (lab-down.sh --purge) removes both ends.
set -euo pipefail
NS=${LAB_NETNS:-lab}
BR=br-lab
ADDR=192.0.2.254/24
ip netns list | awk '{print $1}' | grep -qx "$NS" || { echo "[host-link] netns $NS is missing: run lab-up.sh first" >&2; exit 1; }
if ! ip link show lab-host >/dev/null 2>&1; then
  ip link add lab-host type veth peer name lab-host-br
  ip link set lab-host-br netns "$NS"
fi
ip -n "$NS" link set lab-host-br master "$BR" up
case "$(ip addr show dev lab-host)" in *"${ADDR%/*}/"*) ;; *) ip addr add "$ADDR" dev lab-host ;; esac
ip link set lab-host up
echo "[host-link] 192.0.2.0/24 reachable through lab-host"
