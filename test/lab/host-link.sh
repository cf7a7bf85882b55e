#!/bin/bash
# Gives this machine's root network namespace a leg on the lab bridge, so a provider running here
# reaches lab guests the way it reaches VMs on a real LAN (readiness probes, HTTP through squid):
#   veth lab-host (root netns, 198.51.100.254/24)  <->  lab-host-br (netns "lab", enslaved to br-lab)
# Only the lab's subnet routes over it, and nothing on the bridge routes further. The script refuses
# to run when this machine already reaches that subnet some other way (its own uplink, say): traffic
# meant for lab guests must never leave for a real network.
# Idempotent. Removing the lab netns (lab-down.sh --purge) removes both ends.
set -euo pipefail
NS=${LAB_NETNS:-lab}
BR=br-lab
ADDR=198.51.100.254/24
PROBE=198.51.100.1
ip netns list | awk '{print $1}' | grep -qx "$NS" || { echo "[host-link] netns $NS is missing: run lab-up.sh first" >&2; exit 1; }
clash=$(ip -4 -o route show to match "$PROBE" | grep -v '^default' | grep -v 'dev lab-host' || true)
if [ -n "$clash" ]; then
  echo "[host-link] refusing: this machine already routes ${ADDR%.*}.0/24 elsewhere: $clash" >&2
  exit 1
fi
if ! ip link show lab-host >/dev/null 2>&1; then
  ip link add lab-host type veth peer name lab-host-br
  ip link set lab-host-br netns "$NS"
fi
ip -n "$NS" link set lab-host-br master "$BR" up
case "$(ip -4 -o addr show dev lab-host)" in *" $ADDR "*) ;; *) ip addr add "$ADDR" dev lab-host ;; esac
ip link set lab-host up
[ "$(ip -4 -o route get "$PROBE" | grep -o 'dev [^ ]*')" = "dev lab-host" ] || { echo "[host-link] $PROBE does not route through lab-host" >&2; exit 1; }
echo "[host-link] ${ADDR%.*}.0/24 reachable through lab-host"
