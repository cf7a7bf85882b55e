#!/bin/bash
# Bring up the project's libvirt lab on this machine, idempotently and without systemd.
#
#   netns "lab"     : isolated network namespace with no uplink. Holds bridge br-lab <subnet>.1/24,
#                     dnsmasq DHCP .100-.199 (DNS off), virtlogd, libvirtd and therefore every qemu
#                     process and tap. Nothing routes out of it. The /24 is picked when the lab comes up
#                     (test/lab/free-subnet.py): one that no route, address, resolver or package registry
#                     of this machine uses. IPv6: a unique-local /64 (test/lab/free-ula.py) on br-lab with
#                     router advertisements for SLAAC (a second dnsmasq, dnsmasq:ra, no default route),
#                     set up by host-link.sh at the end of this script, or by the first suite on a lab
#                     brought up before it had IPv6.
#   libvirt state   : virtlogd and libvirtd run in a private mount namespace where /etc/libvirt,
#                     /run/libvirt, /var/lib/libvirt, /var/cache/libvirt and /var/log/libvirt are
#                     directories under $LAB_DIR/root: the machine's own libvirt files are never touched.
#                     From this machine's namespaces the socket is reachable at the default path,
#                     /var/run/libvirt/libvirt-sock, a symlink made here and removed by lab-down.sh.
#   pool "lab"      : dir pool at $LAB_DIR/pool.
#   pool "lab-tiny" : dir pool on an 8 MiB tmpfs at $LAB_DIR/tiny-pool, mounted only in the daemon's
#                     mount namespace. A dir pool does not enforce a volume's capacity, so tests make
#                     the daemon fail a stream for real by filling this.
#   sshd            : 127.0.0.1:2222 in the root netns, its own ed25519 + ecdsa + rsa host keys,
#                     key-only root login, AllowStreamLocalForwarding. Client keys: client_key (no
#                     passphrase) and client_key_pass (passphrase in client_key_pass.passphrase).
#                     known_hosts pins all three host keys as [127.0.0.1]:2222.
#
# Every process started is recorded as "NAME PID" in $LAB_DIR/pids, and every change outside
# $LAB_DIR as an undo command; lab-down.sh --purge takes all of it back. A lab whose processes are not
# all alive any more (a killed earlier run) is purged first, never reused. $LAB_DIR/env.json describes
# the lab for tests. Prerequisites are Debian packages installed by test/setup-host.sh; this script
# installs nothing.
set -euo pipefail
LAB=${LAB_DIR:-/tmp/egress-lab}
PIDS=$LAB/pids
UNDO=${LAB}.undo
NS=${LAB_NETNS:-lab}
BR=br-lab
SSH_PORT=${LAB_SSH_PORT:-2222}
SOCK=/var/run/libvirt/libvirt-sock
ROOT=$LAB/root
TINY_MIB=8
LOG_TAG=lab-up
LOGS=$LAB/logs
HERE=$(dirname "${BASH_SOURCE[0]}")
# shellcheck source-path=SCRIPTDIR source=lab-lib.sh
source "$HERE/lab-lib.sh"
now() { date +%s%N; }
ms_since() { echo $((($(now) - $1) / 1000000)); }

[ "$(id -u)" = 0 ] || fail "the lab needs root (network namespaces, libvirtd system mode, tmpfs mount)"
for bin in ip setsid unshare /usr/bin/python3 /usr/sbin/libvirtd /usr/sbin/virtlogd virsh /usr/sbin/dnsmasq /usr/sbin/sshd ssh-keygen qemu-system-x86_64; do
  command -v "$bin" >/dev/null 2>&1 || fail "$bin is missing: run 'bash test/setup-host.sh' as root first"
done

# ---- 0. a complete running lab is reused; anything less is a leftover, removed first ------------------
if [ -f "$LAB/env.json" ] && alive virtlogd virtlogd && alive libvirtd libvirtd && alive dnsmasq dnsmasq &&
  alive sshd sshd && has_netns "$NS"; then
  log "already up"
  exit 0
fi
if [ -e "$LAB" ] || [ -f "$UNDO" ] || has_netns "$NS"; then
  log "removing a lab left by an earlier run"
  bash "$HERE/lab-down.sh" --purge
fi
if [ -S /run/libvirt/libvirt-sock ] || [ -L /run/libvirt/libvirt-sock ]; then
  fail "/run/libvirt/libvirt-sock exists: a libvirtd this lab did not start runs here (or ran); stop it first"
fi

mkdir -p "$LAB" "$LAB/pool" "$LAB/tiny-pool" "$LAB/ssh" "$LOGS"
chmod 700 "$LAB/ssh"
: >"$PIDS"
remember_undo rm -rf "$LAB"

# ---- 1. network namespace + bridge on a free /24 ------------------------------------------------------
STOCK_SUBNET=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["subnet"])' \
  "${STOCK_LAB_DIR:-/tmp/egress-stock-lab}/env.json" 2>/dev/null || true)
SUBNET=$(pick_subnet "$STOCK_SUBNET")
echo "$SUBNET" >"$LAB/subnet"
log "lab subnet $SUBNET.0/24 (used by nothing on this machine)"
claim_netns_mount
ip netns add "$NS"
remember_undo release_netns_mount
remember_undo ip netns del "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" link add "$BR" type bridge
ip -n "$NS" link set "$BR" up
ip -n "$NS" addr add "$SUBNET.1/24" dev "$BR"

# ---- 2. /dev/kvm: nothing to do; the daemons never see it (in_private_root, lab-lib.sh) ---------------
# ---- 3. virtlogd + libvirtd inside the netns, on private libvirt state ----------------------------------
make_private_root "$ROOT"
make_dir_undone /run/libvirt # the mount point of the private /run/libvirt, and home of the socket links
# The tiny pool's tmpfs exists only in the daemons' mount namespace.
PRIVATE_MOUNTS="mount -t tmpfs -o size=${TINY_MIB}m,mode=0711 egress-lab-tiny '$LAB/tiny-pool'"
export -f in_private_root
start_daemon "$LOGS/virtlogd.out" bash -c 'in_private_root "$@"' sh "$NS" "$ROOT" "" \
  /usr/sbin/virtlogd -p "$LAB/virtlogd.pid"
wait_for 50 virtlogd test -S "$ROOT/run/virtlogd-sock"
record virtlogd "$(cat "$LAB/virtlogd.pid")"
t=$(now)
LIBVIRT_LOG_OUTPUTS="3:file:$LOGS/libvirtd.log" start_daemon "$LOGS/libvirtd.out" \
  bash -c 'in_private_root "$@"' sh "$NS" "$ROOT" "$PRIVATE_MOUNTS" /usr/sbin/libvirtd -p "$LAB/libvirtd.pid"
wait_for 150 libvirtd test -S "$ROOT/run/libvirt-sock"
wait_for 50 libvirtd test -s "$LAB/libvirtd.pid"
record libvirtd "$(cat "$LAB/libvirtd.pid")"
# The default socket path, from this machine's namespaces (virsh, sshd's forward, the provider).
for s in libvirt-sock libvirt-sock-ro; do
  ln -s "$ROOT/run/$s" "/run/libvirt/$s"
  remember_undo rm -f "/run/libvirt/$s"
done
V="virsh -q -c qemu:///system"
wait_for 150 libvirtd $V uri
log "libvirtd ready in $(ms_since "$t") ms"
# shellcheck disable=SC2086 # $V is a command line
require_no_kvm $V
log "libvirtd offers qemu (emulated) guests only: no KVM, as on a machine without /dev/kvm"

# ---- 4. storage pools ------------------------------------------------------------------------------
define_pool() { # define_pool NAME PATH
  printf "<pool type='dir'><name>%s</name><target><path>%s</path></target></pool>\n" "$1" "$2" >"$LAB/pool-$1.xml"
  $V pool-define "$LAB/pool-$1.xml" >/dev/null
  $V pool-start "$1" >/dev/null
}
define_pool lab "$LAB/pool"
grep -q " $LAB/tiny-pool tmpfs " "/proc/$(pid_of libvirtd)/mounts" ||
  fail "libvirtd does not see the tmpfs at $LAB/tiny-pool; see $LOGS/libvirtd.out"
define_pool lab-tiny "$LAB/tiny-pool"

# ---- 5. dnsmasq DHCP on br-lab inside the netns -------------------------------------------------------
start_daemon "$LOGS/dnsmasq.out" ip netns exec "$NS" /usr/sbin/dnsmasq --keep-in-foreground \
  --conf-file=/dev/null --user=root --port=0 --interface="$BR" --bind-interfaces --except-interface=lo \
  --dhcp-range="$SUBNET.100,$SUBNET.199,255.255.255.0,1h" --dhcp-authoritative \
  --dhcp-leasefile="$LAB/dnsmasq.leases" --log-dhcp --log-facility="$LOGS/dnsmasq.log"
record dnsmasq $!

# ---- 6. sshd on 127.0.0.1:$SSH_PORT (root netns) ----------------------------------------------------
for type in ed25519 ecdsa rsa; do
  ssh-keygen -q -t "$type" -N '' -f "$LAB/ssh/host_$type" -C "lab-host-$type"
done
ssh-keygen -q -t ed25519 -N '' -f "$LAB/ssh/client_key" -C lab-client
head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$LAB/ssh/client_key_pass.passphrase"
ssh-keygen -q -t ed25519 -N "$(cat "$LAB/ssh/client_key_pass.passphrase")" -f "$LAB/ssh/client_key_pass" -C lab-client-pass
cat "$LAB/ssh/client_key.pub" "$LAB/ssh/client_key_pass.pub" >"$LAB/ssh/authorized_keys"
chmod 600 "$LAB/ssh/authorized_keys"
cat >"$LAB/ssh/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $LAB/ssh/host_ed25519
HostKey $LAB/ssh/host_ecdsa
HostKey $LAB/ssh/host_rsa
PidFile $LAB/ssh/sshd.pid
AuthorizedKeysFile $LAB/ssh/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
MaxStartups 100:30:200
MaxSessions 50
LogLevel VERBOSE
EOF
start_sshd "$LAB/ssh/sshd_config" "$SSH_PORT"
for type in ed25519 ecdsa rsa; do
  echo "[127.0.0.1]:$SSH_PORT $(cut -d' ' -f1,2 "$LAB/ssh/host_$type.pub")"
done >"$LAB/ssh/known_hosts"
ssh -p "$SSH_PORT" -i "$LAB/ssh/client_key" -o UserKnownHostsFile="$LAB/ssh/known_hosts" \
  -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=10 root@127.0.0.1 true ||
  fail "ssh to 127.0.0.1:$SSH_PORT failed; see $LOGS/sshd.log"

# ---- 7. a description for tests ----------------------------------------------------------------------
cat >"$LAB/env.json" <<EOF
{
  "labDir": "$LAB",
  "libvirtSocket": "$SOCK",
  "uri": "qemu:///system",
  "pool": "lab",
  "tinyPool": "lab-tiny",
  "tinyPoolMiB": $TINY_MIB,
  "bridge": "$BR",
  "netns": "$NS",
  "subnet": "$SUBNET.0/24",
  "bridgeAddress": "$SUBNET.1",
  "hostAddress": "$SUBNET.254",
  "sshHost": "127.0.0.1",
  "sshPort": $SSH_PORT,
  "sshUser": "root",
  "clientKey": "$LAB/ssh/client_key",
  "clientKeyWithPassphrase": "$LAB/ssh/client_key_pass",
  "clientKeyPassphraseFile": "$LAB/ssh/client_key_pass.passphrase",
  "knownHosts": "$LAB/ssh/known_hosts",
  "hostKeys": ["$LAB/ssh/host_ed25519.pub", "$LAB/ssh/host_ecdsa.pub", "$LAB/ssh/host_rsa.pub"],
  "pidsFile": "$PIDS"
}
EOF
$V list --all >/dev/null
# This machine's leg on the bridge now rather than when the first suite asks for it: from here on the
# lab's /24 is routed in this namespace, so no picker of the same run (another lab, a test's claim)
# can take it while the lab suites start.
LAB_NETNS=$NS LAB_DIR=$LAB bash "$(dirname "${BASH_SOURCE[0]}")/host-link.sh"
log "up. pids: $(tr '\n' ' ' <"$PIDS")"
