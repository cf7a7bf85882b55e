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
)
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup-host] installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "[setup-host] Debian packages present"
