#!/bin/bash
# Gives this machine's root network namespace a leg on the lab bridge, so a provider running here
# reaches lab guests the way it reaches VMs on a real LAN (readiness probes, HTTP through squid):
#   veth lab-host (root netns, <subnet>.254/24)  <->  lab-host-br (netns "lab", enslaved to br-lab)
# Only the lab's subnet routes over it (lab-up.sh picked one nothing else on this machine uses), and
# nothing on the bridge routes further. As a last guard the script refuses to run when this machine
# reaches that subnet some other way: traffic meant for lab guests must never leave for a real network.
#
# IPv6 the same way: a unique-local /64 (test/lab/free-ula.py: a random global ID that no route or
# address of this machine overlaps), kept in $LAB/subnet6. br-lab gets <prefix>::1, this machine's leg
# <prefix>::fe, and a second dnsmasq (recorded as dnsmasq:ra) sends router advertisements on br-lab so
# guests configure themselves by SLAAC. Its advertisements say "no default router" (lifetime 0) and the
# leg accepts none: nothing routes IPv6 beyond the /64, in the lab or here.
#
# Idempotent, also on a lab brought up before IPv6 (the suites call it). The veth's removal joins the
# lab's undo list (lab-down.sh --purge); the bridge address goes with the netns, the prefix file with
# the lab directory, and dnsmasq:ra with the lab's other recorded processes.
set -euo pipefail
LAB=${LAB_DIR:-/tmp/egress-lab}
NS=${LAB_NETNS:-lab}
UNDO=${LAB}.undo
PIDS=$LAB/pids
LOGS=$LAB/logs
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

# ---- IPv6 ------------------------------------------------------------------------------------------
if [ ! -s "$LAB/subnet6" ]; then
  /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/free-ula.py" >"$LAB/subnet6.tmp" ||
    fail "no free IPv6 /64 for the lab (see above)"
  mv "$LAB/subnet6.tmp" "$LAB/subnet6"
fi
PREFIX6=$(cat "$LAB/subnet6")
clash6=$(ip -6 -o route show to match "$PREFIX6::1" | grep -v '^default' | grep -v 'dev lab-host' || true)
[ -z "$clash6" ] || fail "refusing: this machine already routes $PREFIX6::/64 elsewhere: $clash6"
# Before any address: the leg must never take a router (or an address) from the lab's advertisements.
sysctl -qw "net.ipv6.conf.lab-host.accept_ra=0" "net.ipv6.conf.lab-host.autoconf=0"
case "$(ip -n "$NS" -6 -o addr show dev "$BR")" in
*" $PREFIX6::1/64 "*) ;;
*) ip -n "$NS" addr add "$PREFIX6::1/64" dev "$BR" nodad ;;
esac
case "$(ip -6 -o addr show dev lab-host)" in
*" $PREFIX6::fe/64 "*) ;;
*) ip addr add "$PREFIX6::fe/64" dev lab-host nodad ;;
esac
if ! alive dnsmasq:ra dnsmasq; then
  mkdir -p "$LOGS"
  # ra-only: addresses by SLAAC, no DHCPv6; ra-param lifetime 0: this router is no default route.
  start_daemon "$LOGS/dnsmasq-ra.out" ip netns exec "$NS" /usr/sbin/dnsmasq --keep-in-foreground \
    --conf-file=/dev/null --user=root --port=0 --interface="$BR" --bind-interfaces --except-interface=lo \
    --enable-ra --ra-param="$BR,10,0" --dhcp-range="::,constructor:$BR,ra-only,64,1h" \
    --log-facility="$LOGS/dnsmasq-ra.log"
  record dnsmasq:ra $!
  wait_for 50 "dnsmasq (router advertisements)" alive dnsmasq:ra dnsmasq
fi
[ "$(ip -6 -o route get "$PREFIX6::1" | grep -o 'dev [^ ]*')" = "dev lab-host" ] ||
  fail "$PREFIX6::1 does not route through lab-host"
log "$PREFIX6::/64 reachable through lab-host (router advertisements on $BR)"
