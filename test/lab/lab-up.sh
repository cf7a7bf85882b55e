#!/bin/bash
# Bring up the project's libvirt lab on this machine, idempotently and without systemd.
#
#   netns "lab"     : isolated network namespace with no uplink. Holds bridge br-lab 198.51.100.1/24
#                     (TEST-NET-2: this machine's own uplink may sit in TEST-NET-1), dnsmasq DHCP
#                     .100-.199 (DNS off), virtlogd,
#                     libvirtd and therefore every qemu process and tap. Nothing routes out of it.
#   libvirtd        : monolithic daemon (qemu driver, TCG when there is no /dev/kvm), started inside the
#                     netns; its unix socket /var/run/libvirt/libvirt-sock is a file, usable from outside.
#   pool "lab"      : dir pool at $LAB_DIR/pool.
#   pool "lab-tiny" : dir pool on an 8 MiB tmpfs at $LAB_DIR/tiny-pool. A dir pool does not enforce a
#                     volume's capacity, so tests make the daemon fail a stream for real by filling this.
#   sshd            : 127.0.0.1:2222 in the root netns, its own ed25519 + ecdsa + rsa host keys,
#                     key-only root login, AllowStreamLocalForwarding. Client keys: client_key (no
#                     passphrase) and client_key_pass (passphrase in client_key_pass.passphrase).
#                     known_hosts pins all three host keys as [127.0.0.1]:2222.
#
# Every process started is recorded as "NAME PID" in $LAB_DIR/pids; lab-down.sh (and the mocha fixture)
# stop them by PID after checking the command name. $LAB_DIR/env.json describes the lab for tests.
# Prerequisites are Debian packages installed by test/setup-host.sh; this script installs nothing.
set -euo pipefail
LAB=${LAB_DIR:-/tmp/egress-lab}
PIDS=$LAB/pids
NS=${LAB_NETNS:-lab}
BR=br-lab
BR_CIDR=198.51.100.1/24
DHCP_RANGE=198.51.100.100,198.51.100.199,255.255.255.0,1h
SSH_PORT=${LAB_SSH_PORT:-2222}
SOCK=/var/run/libvirt/libvirt-sock
TINY_MIB=8
LOG_TAG=lab-up
LOGS=$LAB/logs
# shellcheck source-path=SCRIPTDIR source=lab-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lab-lib.sh"
now() { date +%s%N; }
ms_since() { echo $((($(now) - $1) / 1000000)); }

[ "$(id -u)" = 0 ] || fail "the lab needs root (network namespaces, libvirtd system mode, tmpfs mount)"
for bin in ip /usr/sbin/libvirtd /usr/sbin/virtlogd virsh /usr/sbin/dnsmasq /usr/sbin/sshd ssh-keygen qemu-system-x86_64; do
  command -v "$bin" >/dev/null 2>&1 || fail "$bin is missing: run 'bash test/setup-host.sh' as root first"
done
mkdir -p "$LAB" "$LAB/pool" "$LAB/tiny-pool" "$LAB/ssh" "$LAB/logs"
chmod 700 "$LAB/ssh"
touch "$PIDS"

# ---- 1. network namespace + bridge ----------------------------------------------------------------
has_netns "$NS" || ip netns add "$NS"
ip -n "$NS" link set lo up
ip -n "$NS" link show "$BR" >/dev/null 2>&1 || ip -n "$NS" link add "$BR" type bridge
ip -n "$NS" link set "$BR" up
# Exactly one address on the bridge (a lab from an older layout may carry another).
if [ "$(ip -n "$NS" -4 -o addr show dev "$BR" | awk '{print $4}')" != "$BR_CIDR" ]; then
  ip -n "$NS" addr flush dev "$BR"
  ip -n "$NS" addr add "$BR_CIDR" dev "$BR"
fi

# ---- 2. /dev/kvm permissions -----------------------------------------------------------------------
# Without udev, a /dev/kvm node may be root-only. libvirt probes QEMU as root (KVM works) but checks the
# cached probe as the qemu user (KVM unusable), so it throws the cache away and re-probes QEMU for
# 4-8 s on every define, start and capabilities call. Give the node the ownership udev would.
if [ -c /dev/kvm ] && getent group kvm >/dev/null && [ "$(stat -c %G:%a /dev/kvm)" != kvm:660 ]; then
  chgrp kvm /dev/kvm && chmod 660 /dev/kvm && log "/dev/kvm given to group kvm (mode 660), as udev would"
fi

# ---- 3. virtlogd + libvirtd inside the netns -------------------------------------------------------
# The tiny pool's tmpfs is mounted first: `ip netns exec` gives libvirtd its own mount namespace, and a
# mount made after it started would not be visible to it (it would write into the directory underneath).
mountpoint -q "$LAB/tiny-pool" || mount -t tmpfs -o size=${TINY_MIB}m,mode=0711 egress-lab-tiny "$LAB/tiny-pool"
# libvirt's NAT network "default" must never start: it would try to reach an uplink.
rm -f /etc/libvirt/qemu/networks/autostart/default.xml
# A pid file left by a killed libvirtd may name a PID that now belongs to something else: check the name.
if [ -f /run/libvirtd.pid ] && [ "$(cat "/proc/$(cat /run/libvirtd.pid)/comm" 2>/dev/null)" = libvirtd ] &&
  ! alive libvirtd libvirtd; then
  fail "a libvirtd this lab did not start is running (pid $(cat /run/libvirtd.pid)); stop it first"
fi
if ! alive virtlogd virtlogd; then
  nohup ip netns exec "$NS" /usr/sbin/virtlogd >"$LAB/logs/virtlogd.out" 2>&1 &
  record virtlogd $!
  wait_for 50 virtlogd test -S /var/run/libvirt/virtlogd-sock
fi
V="virsh -q -c qemu:///system"
if ! alive libvirtd libvirtd; then
  t=$(now)
  LIBVIRT_LOG_OUTPUTS="3:file:$LAB/logs/libvirtd.log" \
    nohup ip netns exec "$NS" /usr/sbin/libvirtd >"$LAB/logs/libvirtd.out" 2>&1 &
  record libvirtd $!
  wait_for 150 libvirtd $V uri
  log "libvirtd ready in $(ms_since "$t") ms"
fi

# ---- 4. storage pools ------------------------------------------------------------------------------
ensure_pool() { # ensure_pool NAME PATH
  if ! $V pool-info "$1" >/dev/null 2>&1; then
    printf "<pool type='dir'><name>%s</name><target><path>%s</path></target></pool>\n" "$1" "$2" >"$LAB/pool-$1.xml"
    $V pool-define "$LAB/pool-$1.xml" >/dev/null
  fi
  case "$($V pool-info "$1")" in *running*) ;; *) $V pool-start "$1" >/dev/null ;; esac
  $V pool-refresh "$1" >/dev/null
}
ensure_pool lab "$LAB/pool"
grep -q " $LAB/tiny-pool tmpfs " "/proc/$(pid_of libvirtd)/mounts" ||
  fail "libvirtd does not see the tmpfs at $LAB/tiny-pool (it started before the mount): run lab-down.sh, then lab-up.sh"
ensure_pool lab-tiny "$LAB/tiny-pool"

# ---- 5. dnsmasq DHCP on br-lab inside the netns -------------------------------------------------------
if ! alive dnsmasq dnsmasq; then
  nohup ip netns exec "$NS" /usr/sbin/dnsmasq --keep-in-foreground --conf-file=/dev/null --user=root --port=0 \
    --interface="$BR" --bind-interfaces --except-interface=lo --dhcp-range="$DHCP_RANGE" --dhcp-authoritative \
    --dhcp-leasefile="$LAB/dnsmasq.leases" --log-dhcp --log-facility="$LAB/logs/dnsmasq.log" \
    >"$LAB/logs/dnsmasq.out" 2>&1 &
  record dnsmasq $!
fi

# ---- 6. sshd on 127.0.0.1:$SSH_PORT (root netns) ----------------------------------------------------
for type in ed25519 ecdsa rsa; do
  [ -f "$LAB/ssh/host_$type" ] || ssh-keygen -q -t "$type" -N '' -f "$LAB/ssh/host_$type" -C "lab-host-$type"
done
[ -f "$LAB/ssh/client_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$LAB/ssh/client_key" -C lab-client
if [ ! -f "$LAB/ssh/client_key_pass" ]; then
  head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$LAB/ssh/client_key_pass.passphrase"
  ssh-keygen -q -t ed25519 -N "$(cat "$LAB/ssh/client_key_pass.passphrase")" -f "$LAB/ssh/client_key_pass" -C lab-client-pass
fi
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
mkdir -p /run/sshd
if ! alive sshd sshd; then
  /usr/sbin/sshd -t -f "$LAB/ssh/sshd_config"
  nohup /usr/sbin/sshd -D -e -f "$LAB/ssh/sshd_config" >"$LAB/logs/sshd.log" 2>&1 &
  record sshd $!
  wait_for 50 sshd bash -c "exec 3<>/dev/tcp/127.0.0.1/$SSH_PORT"
fi
: >"$LAB/ssh/known_hosts.tmp"
for type in ed25519 ecdsa rsa; do
  echo "[127.0.0.1]:$SSH_PORT $(cut -d' ' -f1,2 "$LAB/ssh/host_$type.pub")" >>"$LAB/ssh/known_hosts.tmp"
done
mv "$LAB/ssh/known_hosts.tmp" "$LAB/ssh/known_hosts"
ssh -p "$SSH_PORT" -i "$LAB/ssh/client_key" -o UserKnownHostsFile="$LAB/ssh/known_hosts" \
  -o StrictHostKeyChecking=yes -o BatchMode=yes -o ConnectTimeout=10 root@127.0.0.1 true ||
  fail "ssh to 127.0.0.1:$SSH_PORT failed; see $LAB/logs/sshd.log"

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
log "up. pids: $(tr '\n' ' ' <"$PIDS")"
