#!/bin/bash
# The "stock host" lab profile: what Debian 12's packages leave on a fresh hypervisor, beside (not instead
# of) the regular lab of lab-up.sh. Everything has its own name, so both run at once:
#
#   netns "egress-stock"  : no uplink. libvirtd + virtlogd (and so every qemu, tap and dnsmasq) run here.
#   private libvirt state : libvirtd and virtlogd run in their own mount namespace where /etc/libvirt,
#                           /run/libvirt, /var/lib/libvirt, /var/cache/libvirt and /var/log/libvirt are
#                           directories under $STOCK_LAB_DIR/root; the regular lab's daemon never sees them.
#                           From outside, the socket is $STOCK_LAB_DIR/root/run/libvirt-sock.
#   network "default"     : defined, NOT started, NOT autostarted: Debian's default.xml (NAT, virbr0, DHCP)
#                           but on a /24 picked when the profile comes up (test/lab/free-subnet.py: one that
#                           no route, address, resolver or package registry of this machine uses, and not the
#                           regular lab's) instead of 192.168.122.0/24.
#   no storage pool       : as on Debian and Ubuntu (virt-install/virt-manager create "default" on first use);
#                           /var/lib/libvirt/images exists, empty, as the package leaves it.
#   socket                : root:libvirt 0770 (Debian's libvirtd.socket unit gives the group access; without
#                           systemd and polkit here, libvirtd.conf says the same: unix_sock_group, auth none).
#   user "egress-stock"   : a non-root user in group libvirt; sshd on 127.0.0.1:$STOCK_SSH_PORT lets it in
#                           with a key (AllowStreamLocalForwarding, the OpenSSH default, spelled out).
#   host leg              : veth "stock-host" <subnet>.254/24 in the root netns, its peer "stock-host-br"
#                           in the netns. `stock-host-up.sh link` enslaves the peer to virbr0 once the
#                           network "default" runs (before that there is no bridge): then this machine
#                           reaches guests the way it reaches VMs on a LAN. The address is on the veth from
#                           the start, so the subnet never follows the default route to the uplink.
#
# PIDs are recorded in $STOCK_LAB_DIR/pids ("NAME PID") and every change outside $STOCK_LAB_DIR as an undo
# command; stock-host-down.sh stops the processes by PID after checking the command name and, with
# --purge, takes everything back. A profile whose processes are not all alive (a killed earlier run) is
# purged first, never reused. $STOCK_LAB_DIR/env.json describes the profile for tests. Needs root and the
# packages of test/setup-host.sh.
set -euo pipefail
STOCK=${STOCK_LAB_DIR:-/tmp/egress-stock-lab}
NS=${STOCK_NETNS:-egress-stock}
SSH_PORT=${STOCK_SSH_PORT:-2223}
SSH_USER=${STOCK_SSH_USER:-egress-stock}
VETH=${STOCK_VETH:-stock-host} # this machine's leg; its peer in the netns is $VETH-br (15 characters at most)
ROOT=$STOCK/root
PIDS=$STOCK/pids
UNDO=${STOCK}.undo
SOCK=$ROOT/run/libvirt-sock
LOG_TAG=stock-up
LOGS=$STOCK/logs
HERE=$(dirname "${BASH_SOURCE[0]}")
# shellcheck source-path=SCRIPTDIR source=lab-lib.sh
source "$HERE/lab-lib.sh"

[ "$(id -u)" = 0 ] || fail "the stock-host lab needs root (namespaces, a system libvirtd, a user account)"
for bin in ip setsid unshare /usr/bin/python3 /usr/sbin/libvirtd /usr/sbin/virtlogd virsh /usr/sbin/dnsmasq /usr/sbin/iptables /usr/sbin/sshd ssh-keygen; do
  command -v "$bin" >/dev/null 2>&1 || fail "$bin is missing: run 'bash test/setup-host.sh' as root first"
done
getent group libvirt >/dev/null || fail "group libvirt is missing (libvirt-daemon-system creates it)"

V() { virsh -q -c "qemu:///system?socket=$SOCK" "$@"; }

# `stock-host-up.sh link`: attach this machine's leg to virbr0 (after `egress-proxies doctor --fix`).
if [ "${1:-}" = link ]; then
  SUBNET=$(cat "$STOCK/subnet")
  ip -n "$NS" link show virbr0 >/dev/null 2>&1 || fail "virbr0 does not exist: the network default is not running"
  ip -n "$NS" link set "$VETH-br" master virbr0 up
  [ "$(ip -4 -o route get "$SUBNET.1" | grep -o 'dev [^ ]*')" = "dev $VETH" ] || fail "$SUBNET.1 does not route through $VETH"
  log "$SUBNET.0/24 reachable through $VETH (bridged to virbr0)"
  exit 0
fi

# `stock-host-up.sh reboot`: what a host reboot does to libvirt, without rebooting this machine: every
# guest powered off, libvirtd stopped, the run directory's once-per-boot markers gone (a boot empties
# /run; libvirtd autostarts domains, networks and pools only when they are missing), libvirtd started
# again, which autostarts what has autostart on. The new PID is recorded, so stock-host-down.sh stops it.
if [ "${1:-}" = reboot ]; then
  alive libvirtd libvirtd || fail "libvirtd of $STOCK is not running"
  for d in $(V list --name --state-running --state-paused); do V destroy "$d" >/dev/null; done
  old=$(pid_of libvirtd)
  kill -TERM "$old"
  for _ in $(seq 100); do [ -d "/proc/$old" ] || break; sleep 0.1; done
  [ -d "/proc/$old" ] && fail "libvirtd ($old) did not stop within 10 s"
  rm -f "$ROOT"/run/*/autostarted "$STOCK/libvirtd.pid"
  export -f in_private_root
  LIBVIRT_LOG_OUTPUTS="3:file:$LOGS/libvirtd.log" start_daemon "$LOGS/libvirtd.out" \
    bash -c 'in_private_root "$@"' sh "$NS" "$ROOT" "" /usr/sbin/libvirtd -p "$STOCK/libvirtd.pid"
  wait_for 150 libvirtd V uri
  wait_for 50 libvirtd test -s "$STOCK/libvirtd.pid"
  record libvirtd "$(cat "$STOCK/libvirtd.pid")"
  log "rebooted: libvirtd $(pid_of libvirtd) (was $old); running: $(V list --name | tr '\n' ' ')"
  exit 0
fi

# `stock-host-up.sh reset`: back to the packages' state (network default inactive and not autostarted,
# no pools), undoing what `doctor --fix` and a test's proxies left (domains included: this host is
# the tests' own).
if [ "${1:-}" = reset ]; then
  for d in $(V list --all --name); do
    V destroy "$d" >/dev/null 2>&1 || true # "domain is not running" is fine
    V undefine "$d" --nvram >/dev/null 2>&1 || V undefine "$d" >/dev/null
  done
  V net-destroy default >/dev/null 2>&1 || true # "network is not active" is fine
  V net-autostart default --disable >/dev/null
  for pool in $(V pool-list --all --name); do # the packages define none
    if [ "$(V pool-info "$pool" | awk '$1=="State:" {print $2}')" = running ]; then
      for v in $(V vol-list "$pool" | awk '{print $1}'); do V vol-delete --pool "$pool" "$v" >/dev/null; done
      V pool-destroy "$pool" >/dev/null
    fi
    V pool-undefine "$pool" >/dev/null
  done
  log "reset: network default inactive, no pools"
  exit 0
fi

# ---- 0. a complete running profile is reused; anything less is a leftover, removed first -------------
if [ -f "$STOCK/env.json" ] && alive virtlogd virtlogd && alive libvirtd libvirtd && alive sshd sshd && has_netns "$NS"; then
  log "already up"
  exit 0
fi
if [ -e "$STOCK" ] || [ -f "$UNDO" ] || has_netns "$NS"; then
  log "removing a stock-host profile left by an earlier run"
  bash "$HERE/stock-host-down.sh" --purge
fi
mkdir -p "$LOGS" "$STOCK/ssh"
remember_undo rm -rf "$STOCK"
chmod 755 "$STOCK"
chmod 711 "$STOCK/ssh" # sshd reads authorized_keys as the user; the client key itself stays 600
: >"$PIDS"

# ---- 1. network namespace and this machine's leg, on a free /24 ----------------------------------------
LAB_SUBNET=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["subnet"])' \
  "${LAB_DIR:-/tmp/egress-lab}/env.json" 2>/dev/null || true)
# A second profile (test/lab/reboot-host.sh) keeps off the first one's subnet too.
OTHER_STOCK_SUBNET=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["subnet"])' \
  /tmp/egress-stock-lab/env.json 2>/dev/null || true)
[ "$STOCK" = /tmp/egress-stock-lab ] && OTHER_STOCK_SUBNET=
SUBNET=$(pick_subnet "$LAB_SUBNET" "$OTHER_STOCK_SUBNET")
echo "$SUBNET" >"$STOCK/subnet"
HOST_ADDR=$SUBNET.254/24
log "stock-host subnet $SUBNET.0/24 (used by nothing on this machine)"
claim_netns_mount
ip netns add "$NS"
remember_undo release_netns_mount
remember_undo ip netns del "$NS"
ip -n "$NS" link set lo up
ip link add "$VETH" type veth peer name "$VETH-br"
remember_undo ip link del "$VETH"
ip link set "$VETH-br" netns "$NS"
ip addr add "$HOST_ADDR" dev "$VETH"
ip link set "$VETH" up
ip -n "$NS" link set "$VETH-br" up

# ---- 2. the user, as an administrator would add one -------------------------------------------------
if ! id "$SSH_USER" >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir "$STOCK/home" --shell /bin/sh "$SSH_USER"
  remember_undo userdel "$SSH_USER"
  usermod -p '*' "$SSH_USER" # no password, but not locked: sshd refuses locked accounts even with a key
  log "user $SSH_USER created"
fi
if ! id -nG "$SSH_USER" | tr ' ' '\n' | grep -qx libvirt; then
  usermod -aG libvirt "$SSH_USER"
  remember_undo gpasswd -d "$SSH_USER" libvirt
fi
mkdir -p "$STOCK/home"
chown "$SSH_USER" "$STOCK/home"

# ---- 3. private libvirt state, as the packages leave it ----------------------------------------------
make_private_root "$ROOT"
chmod 755 "$ROOT" "$ROOT/run"
cat >>"$ROOT/etc/libvirtd.conf" <<'CONF'

# stock-host lab: what Debian's libvirtd.socket unit and polkit rule give group libvirt under systemd.
unix_sock_group = "libvirt"
unix_sock_ro_perms = "0770"
unix_sock_rw_perms = "0770"
auth_unix_ro = "none"
auth_unix_rw = "none"
CONF
# Debian's /usr/share/libvirt/networks/default.xml on the picked subnet; defined (a file), neither
# started nor autostarted (no autostart link), as libvirt-daemon-config-network leaves it when nothing
# starts it.
cat >"$ROOT/etc/qemu/networks/default.xml" <<XML
<network>
  <name>default</name>
  <forward mode='nat'/>
  <bridge name='virbr0' stp='on' delay='0'/>
  <ip address='$SUBNET.1' netmask='255.255.255.0'>
    <dhcp>
      <range start='$SUBNET.100' end='$SUBNET.199'/>
    </dhcp>
  </ip>
</network>
XML
make_dir_undone /run/libvirt # the mount point of the private /run/libvirt
export -f in_private_root
start_daemon "$LOGS/virtlogd.out" bash -c 'in_private_root "$@"' sh "$NS" "$ROOT" "" \
  /usr/sbin/virtlogd -p "$STOCK/virtlogd.pid"
wait_for 50 virtlogd test -s "$STOCK/virtlogd.pid"
record virtlogd "$(cat "$STOCK/virtlogd.pid")"
LIBVIRT_LOG_OUTPUTS="3:file:$LOGS/libvirtd.log" start_daemon "$LOGS/libvirtd.out" \
  bash -c 'in_private_root "$@"' sh "$NS" "$ROOT" "" /usr/sbin/libvirtd -p "$STOCK/libvirtd.pid"
wait_for 150 libvirtd V uri
wait_for 50 libvirtd test -s "$STOCK/libvirtd.pid"
record libvirtd "$(cat "$STOCK/libvirtd.pid")"
require_no_kvm V
[ "$(stat -c %G:%a "$SOCK")" = libvirt:770 ] || fail "$SOCK is $(stat -c %G:%a "$SOCK"), not libvirt:770"

# ---- 4. sshd on 127.0.0.1:$SSH_PORT for the non-root user --------------------------------------------
ssh-keygen -q -t ed25519 -N '' -f "$STOCK/ssh/host_ed25519" -C stock-host
ssh-keygen -q -t ed25519 -N '' -f "$STOCK/ssh/client_key" -C stock-client
cp "$STOCK/ssh/client_key.pub" "$STOCK/ssh/authorized_keys"
chmod 644 "$STOCK/ssh/authorized_keys"
cat >"$STOCK/ssh/sshd_config" <<CONF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $STOCK/ssh/host_ed25519
PidFile $STOCK/ssh/sshd.pid
AuthorizedKeysFile $STOCK/ssh/authorized_keys
AllowUsers $SSH_USER
PermitRootLogin no
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowStreamLocalForwarding yes
MaxStartups 100:30:200
LogLevel VERBOSE
CONF
start_sshd "$STOCK/ssh/sshd_config" "$SSH_PORT"
echo "[127.0.0.1]:$SSH_PORT $(cut -d' ' -f1,2 "$STOCK/ssh/host_ed25519.pub")" >"$STOCK/ssh/known_hosts"
ssh -p "$SSH_PORT" -i "$STOCK/ssh/client_key" -o UserKnownHostsFile="$STOCK/ssh/known_hosts" \
  -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=10 "$SSH_USER@127.0.0.1" true ||
  fail "ssh as $SSH_USER to 127.0.0.1:$SSH_PORT failed; see $LOGS/sshd.log"

cat >"$STOCK/env.json" <<JSON
{
  "labDir": "$STOCK",
  "libvirtSocket": "$SOCK",
  "libvirtRunDir": "$ROOT/run",
  "imagesDir": "$ROOT/var-lib/images",
  "netns": "$NS",
  "subnet": "$SUBNET.0/24",
  "hostAddress": "${HOST_ADDR%/*}",
  "sshHost": "127.0.0.1",
  "sshPort": $SSH_PORT,
  "sshUser": "$SSH_USER",
  "clientKey": "$STOCK/ssh/client_key",
  "knownHosts": "$STOCK/ssh/known_hosts",
  "pidsFile": "$PIDS"
}
JSON
log "up. pids: $(tr '\n' ' ' <"$PIDS")"
