#!/bin/bash
# The "stock host" lab profile: what Debian 12's packages leave on a fresh hypervisor, beside (not instead
# of) the regular lab of lab-up.sh. Everything has its own name, so both run at once:
#
#   netns "egress-stock"  : no uplink. libvirtd + virtlogd (and so every qemu, tap and dnsmasq) run here.
#   private libvirt state : libvirtd and virtlogd run in their own mount namespace where /etc/libvirt,
#                           /run/libvirt, /var/lib/libvirt, /var/cache/libvirt and /var/log/libvirt are
#                           directories under $STOCK_LAB_DIR/root; the regular lab's daemon never sees them.
#                           From outside, the socket is $STOCK_LAB_DIR/root/run/libvirt/libvirt-sock.
#   network "default"     : defined, NOT started, NOT autostarted: Debian's default.xml (NAT, virbr0, DHCP)
#                           but on 203.0.113.0/24 (TEST-NET-3) instead of 192.168.122.0/24.
#   no storage pool       : as on Debian and Ubuntu (virt-install/virt-manager create "default" on first use);
#                           /var/lib/libvirt/images exists, empty, as the package leaves it.
#   socket                : root:libvirt 0770 (Debian's libvirtd.socket unit gives the group access; without
#                           systemd and polkit here, libvirtd.conf says the same: unix_sock_group, auth none).
#   user "egress-stock"   : a non-root user in group libvirt; sshd on 127.0.0.1:$STOCK_SSH_PORT lets it in
#                           with a key (AllowStreamLocalForwarding, the OpenSSH default, spelled out).
#   host leg              : veth "stock-host" 203.0.113.254/24 in the root netns, its peer "stock-host-br"
#                           in the netns. `stock-host-up.sh link` enslaves the peer to virbr0 once the
#                           network "default" runs (before that there is no bridge): then this machine
#                           reaches guests the way it reaches VMs on a LAN. The address is on the veth from
#                           the start, so 203.0.113.0/24 never follows the default route to the uplink.
#
# PIDs are recorded in $STOCK_LAB_DIR/pids ("NAME PID"); stock-host-down.sh stops them by PID after checking
# the command name. $STOCK_LAB_DIR/env.json describes the profile for tests. Needs root and the packages
# of test/setup-host.sh. Idempotent.
set -euo pipefail
STOCK=${STOCK_LAB_DIR:-/tmp/egress-stock-lab}
NS=${STOCK_NETNS:-egress-stock}
SSH_PORT=${STOCK_SSH_PORT:-2223}
SSH_USER=${STOCK_SSH_USER:-egress-stock}
SUBNET=203.0.113
HOST_ADDR=$SUBNET.254/24
ROOT=$STOCK/root
PIDS=$STOCK/pids
SOCK=$ROOT/run/libvirt/libvirt-sock
LOG_TAG=stock-up
LOGS=$STOCK/logs
# shellcheck source-path=SCRIPTDIR source=lab-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lab-lib.sh"

[ "$(id -u)" = 0 ] || fail "the stock-host lab needs root (namespaces, a system libvirtd, a user account)"
for bin in ip unshare /usr/sbin/libvirtd /usr/sbin/virtlogd virsh /usr/sbin/dnsmasq /usr/sbin/iptables /usr/sbin/sshd ssh-keygen; do
  command -v "$bin" >/dev/null 2>&1 || fail "$bin is missing: run 'bash test/setup-host.sh' as root first"
done
getent group libvirt >/dev/null || fail "group libvirt is missing (libvirt-daemon-system creates it)"

V() { virsh -q -c "qemu:///system?socket=$SOCK" "$@"; }

# `stock-host-up.sh link`: attach this machine's leg to virbr0 (after `egress-proxies doctor --fix`).
if [ "${1:-}" = link ]; then
  ip -n "$NS" link show virbr0 >/dev/null 2>&1 || fail "virbr0 does not exist: the network default is not running"
  ip -n "$NS" link set stock-host-br master virbr0 up
  [ "$(ip -4 -o route get $SUBNET.1 | grep -o 'dev [^ ]*')" = "dev stock-host" ] || fail "$SUBNET.1 does not route through stock-host"
  log "$SUBNET.0/24 reachable through stock-host (bridged to virbr0)"
  exit 0
fi

# `stock-host-up.sh reset`: back to the packages' state (network default inactive and not autostarted,
# no pools), undoing what `doctor --fix` and a test's proxies left (domains included: this host is
# the tests' own).
if [ "${1:-}" = reset ]; then
  for d in $(V list --all --name 2>/dev/null); do
    V destroy "$d" >/dev/null 2>&1 || true
    V undefine "$d" --nvram >/dev/null 2>&1 || V undefine "$d" >/dev/null
  done
  V net-destroy default >/dev/null 2>&1 || true
  V net-autostart default --disable >/dev/null 2>&1 || true
  for pool in $(V pool-list --all --name 2>/dev/null); do # the packages define none
    if [ "$(V pool-info "$pool" | awk '$1=="State:" {print $2}')" = running ]; then
      for v in $(V vol-list "$pool" 2>/dev/null | awk '{print $1}'); do V vol-delete --pool "$pool" "$v" >/dev/null; done
      V pool-destroy "$pool" >/dev/null
    fi
    V pool-undefine "$pool" >/dev/null
  done
  log "reset: network default inactive, no pools"
  exit 0
fi

mkdir -p "$STOCK/logs" "$STOCK/ssh" "$ROOT"/{etc,run/libvirt,var-lib,var-cache,var-log}
chmod 755 "$STOCK" "$ROOT" "$ROOT/run" "$ROOT/run/libvirt"
chmod 711 "$STOCK/ssh" # sshd reads authorized_keys as the user; the client key itself stays 600
touch "$PIDS"

# ---- 1. network namespace and this machine's leg ----------------------------------------------------
clash=$(ip -4 -o route show to match $SUBNET.1 | grep -v '^default' | grep -v 'dev stock-host' || true)
[ -z "$clash" ] || fail "this machine already routes $SUBNET.0/24 elsewhere: $clash"
has_netns "$NS" || ip netns add "$NS"
ip -n "$NS" link set lo up
if ! ip link show stock-host >/dev/null 2>&1; then
  ip link add stock-host type veth peer name stock-host-br
  ip link set stock-host-br netns "$NS"
fi
case "$(ip -4 -o addr show dev stock-host)" in *" $HOST_ADDR "*) ;; *) ip addr add "$HOST_ADDR" dev stock-host ;; esac
ip link set stock-host up
ip -n "$NS" link set stock-host-br up

# ---- 2. the user, as an administrator would add one -------------------------------------------------
if ! id "$SSH_USER" >/dev/null 2>&1; then
  useradd --system --no-create-home --home-dir "$STOCK/home" --shell /bin/sh "$SSH_USER"
  usermod -p '*' "$SSH_USER" # no password, but not locked: sshd refuses locked accounts even with a key
  log "user $SSH_USER created"
fi
id -nG "$SSH_USER" | tr ' ' '\n' | grep -qx libvirt || usermod -aG libvirt "$SSH_USER"
mkdir -p "$STOCK/home"
chown "$SSH_USER" "$STOCK/home"

# ---- 3. private libvirt state, as the packages leave it ----------------------------------------------
if [ ! -f "$ROOT/etc/libvirtd.conf" ]; then
  cp -a /etc/libvirt/. "$ROOT/etc/"
  # Only the package's configuration files: no pools, domains or networks of the regular lab.
  rm -rf "$ROOT/etc/storage" "$ROOT/etc/qemu" "$ROOT/etc/secrets"
  mkdir -p "$ROOT/etc/storage/autostart" "$ROOT/etc/qemu/networks/autostart"
  cat >>"$ROOT/etc/libvirtd.conf" <<'EOF'

# stock-host lab: what Debian's libvirtd.socket unit and polkit rule give group libvirt under systemd.
unix_sock_group = "libvirt"
unix_sock_ro_perms = "0770"
unix_sock_rw_perms = "0770"
auth_unix_ro = "none"
auth_unix_rw = "none"
EOF
  # Debian's /usr/share/libvirt/networks/default.xml, on TEST-NET-3; defined (a file), neither started
  # nor autostarted (no autostart link), as libvirt-daemon-config-network leaves it when nothing starts it.
  cat >"$ROOT/etc/qemu/networks/default.xml" <<EOF
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
EOF
  mkdir -p "$ROOT/var-lib"/{boot,dnsmasq,images,qemu,sanlock} "$ROOT/var-cache" "$ROOT/var-log"
  chmod 711 "$ROOT/var-lib/boot" "$ROOT/var-lib/images"
  chmod 700 "$ROOT/var-lib/sanlock"
  chown libvirt-qemu:libvirt-qemu "$ROOT/var-lib/qemu" && chmod 750 "$ROOT/var-lib/qemu"
fi

# Runs "$@" in the netns with the private libvirt directories mounted where libvirt looks for them.
in_stock_root() {
  ip netns exec "$NS" unshare --mount --propagation private -- /bin/sh -c '
    R=$1; shift
    mount --bind "$R/etc" /etc/libvirt && mount --bind "$R/run/libvirt" /run/libvirt &&
      mount --bind "$R/var-lib" /var/lib/libvirt && mkdir -p /var/cache/libvirt /var/log/libvirt &&
      mount --bind "$R/var-cache" /var/cache/libvirt && mount --bind "$R/var-log" /var/log/libvirt &&
      exec "$@"' sh "$ROOT" "$@"
}

if ! alive virtlogd virtlogd; then
  nohup bash -c "$(declare -f in_stock_root); NS=$NS ROOT=$ROOT in_stock_root /usr/sbin/virtlogd -p $STOCK/virtlogd.pid" \
    >"$STOCK/logs/virtlogd.out" 2>&1 &
  wait_for 50 virtlogd test -S "$ROOT/run/libvirt/virtlogd-sock"
  record virtlogd "$(cat "$STOCK/virtlogd.pid")"
fi
if ! alive libvirtd libvirtd; then
  LIBVIRT_LOG_OUTPUTS="3:file:$STOCK/logs/libvirtd.log" \
    nohup bash -c "$(declare -f in_stock_root); NS=$NS ROOT=$ROOT in_stock_root /usr/sbin/libvirtd -p $STOCK/libvirtd.pid" \
    >"$STOCK/logs/libvirtd.out" 2>&1 &
  wait_for 150 libvirtd V uri
  record libvirtd "$(cat "$STOCK/libvirtd.pid")"
fi
[ "$(stat -c %G:%a "$SOCK")" = libvirt:770 ] || fail "$SOCK is $(stat -c %G:%a "$SOCK"), not libvirt:770"

# ---- 4. sshd on 127.0.0.1:$SSH_PORT for the non-root user --------------------------------------------
[ -f "$STOCK/ssh/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$STOCK/ssh/host_ed25519" -C stock-host
[ -f "$STOCK/ssh/client_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$STOCK/ssh/client_key" -C stock-client
cp "$STOCK/ssh/client_key.pub" "$STOCK/ssh/authorized_keys"
chmod 644 "$STOCK/ssh/authorized_keys"
cat >"$STOCK/ssh/sshd_config" <<EOF
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
EOF
mkdir -p /run/sshd
if ! alive sshd sshd; then
  /usr/sbin/sshd -t -f "$STOCK/ssh/sshd_config"
  nohup /usr/sbin/sshd -D -e -f "$STOCK/ssh/sshd_config" >"$STOCK/logs/sshd.log" 2>&1 &
  record sshd $!
  wait_for 50 sshd bash -c "exec 3<>/dev/tcp/127.0.0.1/$SSH_PORT"
fi
echo "[127.0.0.1]:$SSH_PORT $(cut -d' ' -f1,2 "$STOCK/ssh/host_ed25519.pub")" >"$STOCK/ssh/known_hosts"
ssh -p "$SSH_PORT" -i "$STOCK/ssh/client_key" -o UserKnownHostsFile="$STOCK/ssh/known_hosts" \
  -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=10 "$SSH_USER@127.0.0.1" true ||
  fail "ssh as $SSH_USER to 127.0.0.1:$SSH_PORT failed; see $STOCK/logs/sshd.log"

cat >"$STOCK/env.json" <<EOF
{
  "labDir": "$STOCK",
  "libvirtSocket": "$SOCK",
  "libvirtRunDir": "$ROOT/run/libvirt",
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
EOF
log "up. pids: $(tr '\n' ' ' <"$PIDS")"
