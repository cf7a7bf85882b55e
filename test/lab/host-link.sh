#!/bin/bash
# Gives this machine's root network namespace a leg on the lab bridge, so a provider running here
# reaches lab guests the way it reaches VMs on a real LAN (readiness probes, HTTP through squid):
#   veth lab-host (root netns, <subnet>.254/24)  <->  lab-host-br (netns "lab", enslaved to br-lab)
# Only the lab's subnet routes over it (lab-up.sh picked one nothing else on this machine uses), and
# nothing on the bridge routes further. As a last guard the script refuses to run when this machine
# reaches that subnet some other way: traffic meant for lab guests must never leave for a real network.
# Idempotent. The veth's removal joins the lab's undo list (lab-down.sh --purge).
set -euo pipefail
LAB=${LAB_DIR:-/tmp/egress-lab}
NS=${LAB_NETNS:-lab}
UNDO=${LAB}.undo
BR=br-lab
LOG_TAG=host-link
# shellcheck source-path=SCRIPTDIR source=lab-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lab-lib.sh"
{ has_netns "$NS" && [ -f "$LAB/subnet" ]; } || fail "the lab is not up: run lab-up.sh first"
SUBNET=$(cat "$LAB/subnet")
ADDR=$SUBNET.254/24
PROBE=$SUBNET.1
clash=$(ip -4 -o route show to match "$PROBE" | grep -v '^default' | grep -v 'dev lab-host' || true)
[ -z "$clash" ] || fail "refusing: this machine already routes $SUBNET.0/24 elsewhere: $clash"
if ! ip link show lab-host >/dev/null 2>&1; then
  ip link add lab-host type veth peer name lab-host-br
  remember_undo ip link del lab-host
  ip link set lab-host-br netns "$NS"
fi
ip -n "$NS" link set lab-host-br master "$BR" up
case "$(ip -4 -o addr show dev lab-host)" in *" $ADDR "*) ;; *) ip addr add "$ADDR" dev lab-host ;; esac
ip link set lab-host up
[ "$(ip -4 -o route get "$PROBE" | grep -o 'dev [^ ]*')" = "dev lab-host" ] || fail "$PROBE does not route through lab-host"
log "$SUBNET.0/24 reachable through lab-host"
