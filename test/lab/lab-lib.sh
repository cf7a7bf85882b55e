# shellcheck shell=bash
# Sourced by lab-up.sh, lab-down.sh, stock-host-up.sh and stock-host-down.sh: what both lab profiles
# share. The sourcing script sets:
#   LOG_TAG : the prefix of every line it logs (e.g. lab-up)
#   PIDS    : its "NAME PID" file
#   LOGS    : the directory a failure of wait_for points to (up scripts only)
#
# Nothing a lab sets up may outlive it: every change outside the lab's own directory is recorded when it
# is made (an "undo" line in $STATE_DIR/undo) and taken back by `undo_recorded`, newest first, on
# `--purge`. A recorded PID counts only while its command name still matches, so a PID reused by
# another process is never signalled. A second process of one command is recorded as COMM:ROLE (e.g.
# dnsmasq:ra); its command name is the part before the colon.

log() { echo "[$LOG_TAG] $*"; }
fail() {
  echo "[$LOG_TAG] FAILED: $*" >&2
  exit 1
}

pid_of() { [ -f "$PIDS" ] && awk -v n="$1" '$1==n {p=$2} END {print p}' "$PIDS"; }
alive() { # alive NAME COMM: the process recorded as NAME runs and is still COMM
  local p
  p=$(pid_of "$1")
  [ -n "$p" ] && [ -d "/proc/$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ]
}
record() { # record NAME PID
  grep -v "^$1 " "$PIDS" >"$PIDS.tmp" || true
  echo "$1 $2" >>"$PIDS.tmp"
  mv "$PIDS.tmp" "$PIDS"
}
wait_for() { # wait_for TENTHS DESCRIPTION COMMAND...
  local tenths=$1 what=$2
  shift 2
  for _ in $(seq "$tenths"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  fail "$what did not come up within $((tenths / 10)) s; see $LOGS"
}

# Stops every recorded process, newest first, by PID (TERM, then KILL after 5 s), and empties $PIDS.
stop_recorded() {
  [ -f "$PIDS" ] || return 0
  tac "$PIDS" | while read -r name pid; do
    [ -n "$pid" ] || continue
    if [ -d "/proc/$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${name%%:*}" ]; then
      kill -TERM "$pid"
      for _ in $(seq 50); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
      if [ -d "/proc/$pid" ]; then
        kill -KILL "$pid"
        log "killed -9 $name ($pid)"
      else
        log "stopped $name ($pid)"
      fi
    fi
  done
  : >"$PIDS"
}

has_netns() { case " $(ip netns list | awk '{print $1}' | tr '\n' ' ') " in *" $1 "*) return 0 ;; esac; return 1; }

# ---- changes outside the lab directory, and their undoing ------------------------------------------
# The undo list lives outside the lab directory (that directory is removed last), one command per line.
remember_undo() { # remember_undo COMMAND...: run by undo_recorded, newest first
  printf '%q ' "$@" >>"$UNDO"
  echo >>"$UNDO"
}
undo_recorded() {
  [ -f "$UNDO" ] || return 0
  local line
  tac "$UNDO" | while IFS= read -r line; do
    [ -n "$line" ] || continue
    eval "$line" || log "could not undo: $line"
  done
  rm -f "$UNDO"
}

# Creates a directory that may not exist yet, and records its removal (only if it is empty by then).
make_dir_undone() { # make_dir_undone PATH
  [ -d "$1" ] && return 0
  mkdir -p "$1"
  remember_undo rmdir --ignore-fail-on-non-empty "$1"
}

# `ip netns add` turns /run/netns into a shared bind mount the first time and never undoes it. Claimed
# once per machine (a marker beside it): the last lab down undoes it when no namespace is left.
NETNS_CLAIM=/run/egress-lab-netns-mount
claim_netns_mount() {
  [ -f "$NETNS_CLAIM" ] && return 0
  if ! mountpoint -q /run/netns 2>/dev/null; then
    if [ -d /run/netns ]; then echo mount >"$NETNS_CLAIM"; else echo dir >"$NETNS_CLAIM"; fi
  fi
}
release_netns_mount() {
  [ -f "$NETNS_CLAIM" ] || return 0
  [ -z "$(ip netns list)" ] || return 0
  mountpoint -q /run/netns && umount /run/netns && log "/run/netns unmounted (as before the labs)"
  [ "$(cat "$NETNS_CLAIM")" = dir ] && rmdir /run/netns 2>/dev/null
  rm -f "$NETNS_CLAIM"
}

# A /24 that nothing on this machine routes, uses or needs (test/lab/free-subnet.py).
pick_subnet() { # pick_subnet [EXCLUDED_CIDR]...
  local args=() cidr
  for cidr in "$@"; do [ -n "$cidr" ] && args+=(--exclude "$cidr"); done
  /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/free-subnet.py" "${args[@]}" ||
    fail "no free /24 for the lab (see above); free one of the candidates or set the lab's range by hand"
}

# Runs "$@" in netns $1 with a private mount namespace where libvirt's directories are the lab's own
# ($2/etc, $2/run, $2/var-lib, $2/var-cache, $2/var-log): a lab's daemons never write to the machine's
# /etc/libvirt or /var/lib/libvirt. $3 is a shell command run there first (extra mounts), or "". The
# mount points must exist (the packages make all but /run/libvirt: make_dir_undone it first).
#
# There, /dev/kvm (when the machine has one) is a device node of mode 000: libvirt tests it as the qemu
# user, who may not open it, finds KVM unusable and offers only `qemu` guests, as on a machine without
# /dev/kvm. Not /dev/null itself: a node the qemu user can open passes libvirt's "KVM usable" test
# while QEMU's probe finds no KVM, and libvirt then throws its capability cache away and probes QEMU
# again on every lookup (a define took 24-50 s). Not a regular file: libvirt carries the mounts under
# /dev into each guest's own /dev, and cannot carry a file mounted over a device node. The labs'
# guests are emulated anyway; hiding KVM gives every machine, with KVM or without, the same host to
# test against (the doctor's rows, the domain types the capabilities list), and proves the no-KVM
# path on every run. require_no_kvm checks that the daemon sees it so.
in_private_root() { # in_private_root NETNS ROOT SETUP COMMAND...
  local ns=$1 root=$2 setup=$3
  shift 3
  exec ip netns exec "$ns" unshare --mount --propagation private -- /bin/sh -c '
    R=$1 SETUP=$2; shift 2
    mount --bind "$R/etc" /etc/libvirt && mount --bind "$R/run" /run/libvirt &&
      mount --bind "$R/var-lib" /var/lib/libvirt && mount --bind "$R/var-cache" /var/cache/libvirt &&
      mount --bind "$R/var-log" /var/log/libvirt &&
      { [ ! -e /dev/kvm ] || { rm -f "$R/no-kvm" && mknod -m 000 "$R/no-kvm" c 1 3 &&
        mount --bind "$R/no-kvm" /dev/kvm; }; } &&
      eval "$SETUP" && exec "$@"' sh "$root" "$setup" "$@"
}

# Fails unless the lab's libvirtd (reached with the virsh command line in "$@") offers no KVM guests:
# every lab is a host without KVM, whatever this machine has (in_private_root).
require_no_kvm() { # require_no_kvm VIRSH...
  local caps
  caps=$("$@" capabilities) || fail "virsh capabilities failed on the lab's libvirtd; see $LOGS"
  if grep -q "<domain type='kvm'" <<<"$caps"; then
    fail "the lab's libvirtd offers KVM guests although /dev/kvm is hidden from it; see $LOGS"
  fi
  grep -q "<domain type='qemu'" <<<"$caps" || fail "the lab's libvirtd offers no qemu (emulated) guests; see $LOGS"
}

# The private root's /etc/libvirt: the packages' configuration files, without the machine's pools,
# domains, networks or secrets.
make_private_root() { # make_private_root ROOT
  local root=$1
  mkdir -p "$root"/{etc,run,var-lib,var-cache,var-log}
  if [ ! -f "$root/etc/libvirtd.conf" ]; then
    cp -a /etc/libvirt/. "$root/etc/"
    rm -rf "$root/etc/storage" "$root/etc/qemu" "$root/etc/secrets"
    mkdir -p "$root/etc/storage/autostart" "$root/etc/qemu/networks/autostart"
  fi
  mkdir -p "$root/var-lib"/{boot,dnsmasq,images,qemu,sanlock}
  chmod 711 "$root/var-lib/boot" "$root/var-lib/images"
  chmod 700 "$root/var-lib/sanlock"
  chown libvirt-qemu:libvirt-qemu "$root/var-lib/qemu" && chmod 750 "$root/var-lib/qemu"
}

# qemu processes whose command line names a file under DIR: guests of a lab whose libvirtd died before
# it could destroy them. Only a lab's own files are under DIR, so these are the lab's own processes.
stop_orphan_guests() { # stop_orphan_guests DIR
  local cmdline pid
  for cmdline in /proc/[0-9]*/cmdline; do
    pid=${cmdline#/proc/}
    pid=${pid%/cmdline}
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = qemu-system-x86 ] || continue
    if tr '\0' '\n' <"$cmdline" 2>/dev/null | grep -q "$1/"; then
      kill -KILL "$pid" && log "killed qemu $pid, a guest of this lab left without its libvirtd"
    fi
  done
}

# Checks CONFIG, starts sshd with it (detached, recorded as sshd) and waits until 127.0.0.1:PORT accepts.
start_sshd() { # start_sshd CONFIG PORT
  make_dir_undone /run/sshd # sshd's privilege separation directory (systemd's tmpfiles make it elsewhere)
  /usr/sbin/sshd -t -f "$1"
  start_daemon "$LOGS/sshd.log" /usr/sbin/sshd -D -e -f "$1"
  record sshd $!
  wait_for 50 sshd bash -c "exec 3<>/dev/tcp/127.0.0.1/$2"
}

# Starts "$@" detached from the caller's session (a test runner's Ctrl-C or process-group kill must not
# reach the lab's daemons: they are stopped by lab-down.sh, guests first).
start_daemon() { # start_daemon LOGFILE COMMAND...
  local out=$1
  shift
  setsid nohup "$@" >"$out" 2>&1 </dev/null &
}
