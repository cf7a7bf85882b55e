#!/bin/bash
# Build the lab's proxy image: a small bootable Debian 12 cloud-like qcow2 (Debian apt repos only),
# without loop devices, mounts or a bootloader run inside a VM:
#   mmdebstrap -> directory rootfs -> mkfs.ext4 -d (at a byte offset inside a raw file)
#   BIOS:  grub i386-pc boot.img + core.img written with dd into the MBR gap
#   UEFI:  FAT ESP (mkfs.fat --offset + mcopy) with a grub x86_64-efi image as \EFI\BOOT\BOOTX64.EFI
# Guest contents: linux-image-cloud-amd64, systemd with dbus (so logind handles the power button and the
# agent's guest-shutdown works, as in Debian's cloud images), cloud-init (NoCloud only), qemu-guest-agent,
# squid, ifupdown + isc-dhcp-client. Root password "lab" (serial console debugging only).
# The guest has no route out of the lab, so everything a test VM runs must already be in here.
#
# The image is cached by the content of this recipe: $CACHE/lab-image/<sha256 of this file>/
# debian-proxy-base.qcow2 (2 GiB virtual, ~500 MiB on disk) with its .sha256 beside it, where CACHE is
# $EGRESS_LAB_CACHE or ~/.cache/egress-proxies. A cached image is used as it is; a change to this file
# builds a new one and removes the images of older recipes. The cache is the one thing the test command
# keeps on the machine (like npm's cache); the build's scratch space is removed whether it succeeds or not.
#
# NOTE: Debian's *cloud* kernel has no AHCI driver: attach the NoCloud seed cdrom on bus='ide'
# (i440fx/'pc' machine) or bus='scsi' (virtio-scsi controller, works on q35), NOT bus='sata'.
#
# One build at a time per recipe (a lock beside the cache): a second caller waits for the first and then
# finds its image, so the test command can start the build early and its suites need not know.
#
# Usage: build-image.sh             build unless cached; print the image's path last
#        build-image.sh --path      print the path the image has (or will have), build nothing
#        build-image.sh --early LOG start the build in the background, as root only, and return at once;
#                                   its PID goes to LOG.pid (the test command does this before it compiles:
#                                   on a fresh machine the build is minutes of downloads that need no CPU)
#        build-image.sh --join LOG  like no argument, after waiting for an --early build and printing its
#                                   LOG (a failed early build is built again here, its errors shown)
#        build-image.sh --stop-early LOG
#                                   stop an --early build that still runs (its process group, by the PID
#                                   in LOG.pid, only while that PID is still this script); its scratch
#                                   space goes with it
set -euo pipefail
RECIPE=$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-16)
CACHE_ROOT=${EGRESS_LAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies}/lab-image
IMG_DIR=$CACHE_ROOT/$RECIPE
OUT=$IMG_DIR/debian-proxy-base.qcow2
LOCK=$CACHE_ROOT/$RECIPE.lock
case "${1:-}" in
--path)
  echo "$OUT"
  exit 0
  ;;
--early)
  # The full test command needs root (it says so itself); without root nothing is built early.
  [ "$(id -u)" = 0 ] || exit 0
  mkdir -p "$(dirname "$2")"
  rm -f "$2.pid"
  # Its own process group, so the test runner can stop all of it by PID when a run is cut short.
  setsid bash "${BASH_SOURCE[0]}" >"$2" 2>&1 </dev/null &
  echo $! >"$2.pid"
  echo "[build-image] building in the background (pid $!) while the project compiles; log: $2"
  exit 0
  ;;
--stop-early)
  pid=$(cat "$2.pid" 2>/dev/null || true)
  # A build that already ended has no /proc entry: nothing to stop (and no error to show).
  cmdline=""
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && cmdline=$(tr '\0' ' ' 2>&1 <"/proc/$pid/cmdline" || true)
  if [[ "$cmdline" == *build-image.sh* ]]; then
    kill -TERM -- "-$pid" && echo "[build-image] stopped the early build (process group $pid)"
    for _ in $(seq 100); do [ -d "/proc/$pid" ] || break; sleep 0.1; done
  fi
  rm -f "$2.pid"
  exit 0
  ;;
--join) JOINED_LOG=$2 ;;
esac
mkdir -p "$CACHE_ROOT"
exec 9>"$LOCK"
started_wait=$(date +%s)
flock 9
if [ -n "${JOINED_LOG:-}" ] && [ -f "$JOINED_LOG" ]; then
  echo "[build-image] the early build's log ($JOINED_LOG), after $(($(date +%s) - started_wait)) s waiting for it:"
  sed 's/^/  | /' "$JOINED_LOG"
fi
if [ -f "$OUT" ] && [ -f "$OUT.sha256" ]; then
  echo "[build-image] cached: $OUT"
  echo "$OUT"
  exit 0
fi
WORK=$CACHE_ROOT/$RECIPE.build
ROOTFS=$WORK/rootfs-proxy
DISK_SIZE_MIB=2048
ESP_START=2048            # sectors
ESP_SECTORS=131072        # 64 MiB
ROOT_START=$((ESP_START + ESP_SECTORS))
# mmdebstrap mounts /proc, /sys and /dev inside the root it builds and unmounts them when it ends; a
# build stopped half way (a Ctrl-C, the runner's --stop-early) left /proc mounted there, and the next
# build's rm -rf failed on it ("Read-only file system") and failed the image. So whatever is mounted under
# the scratch space is unmounted first (deepest first), and rm never crosses into a file system of its own.
remove_work() {
  local mounted
  mounted=$(awk -v work="$WORK/" 'index($2, work) == 1 { print $2 }' /proc/self/mounts | sort -r)
  if [ -n "$mounted" ]; then
    while read -r point; do
      umount "$point" || umount -l "$point" || echo "[build-image] could not unmount $point" >&2
    done <<<"$mounted"
  fi
  rm -rf --one-file-system "$WORK"
}
remove_work
trap remove_work EXIT
# A signal ends the script through its EXIT trap (bash skips it on a signal it does not trap).
trap 'exit 143' TERM INT HUP
started=$(date +%s)

need() { for c in "$@"; do command -v "$c" >/dev/null || { echo "missing $c" >&2; exit 1; }; done; }
if ! command -v mmdebstrap >/dev/null || ! command -v sfdisk >/dev/null || ! command -v mkfs.fat >/dev/null \
   || [ ! -d /usr/lib/grub/i386-pc ] || [ ! -d /usr/lib/grub/x86_64-efi ] || ! command -v mcopy >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o Acquire::Retries=5 --no-install-recommends \
    mmdebstrap e2fsprogs fdisk dosfstools mtools grub-pc-bin grub-efi-amd64-bin grub2-common qemu-utils
fi
need mmdebstrap sfdisk mkfs.ext4 mkfs.fat mcopy mmd grub-mkimage qemu-img

mkdir -p "$WORK"
cd "$WORK"

# ---------- 1. rootfs (~2 min, ~460 MiB) ----------
cat > "$WORK/customize.sh" <<'EOF'
#!/bin/sh
set -e
R="$1"
echo 'root:lab' | chroot "$R" chpasswd
printf 'LABEL=labroot / ext4 defaults,discard 0 1\n' > "$R/etc/fstab"
mkdir -p "$R/etc/cloud/cloud.cfg.d"
# Only NoCloud (seed ISO, label cidata); C.UTF-8 avoids the locale module error (no 'locales' pkg).
printf 'datasource_list: [ NoCloud, None ]\nlocale: C.UTF-8\n' > "$R/etc/cloud/cloud.cfg.d/90-lab.cfg"
printf 'auto lo\niface lo inet loopback\nsource /etc/network/interfaces.d/*\n' > "$R/etc/network/interfaces"
mkdir -p "$R/etc/network/interfaces.d"
: > "$R/etc/hostname"
# mmdebstrap keeps its --aptopt lines in the image. A lab guest is offline by design: an apt-get update
# there (cloud-init runs one for any packages: list) fails at once, and five retries with back-off
# (1+2+4+8+16 s) added half a minute to every boot. No retries inside the guest.
printf 'Acquire::Retries "0";\n' > "$R/etc/apt/apt.conf.d/99zz-lab-offline"
# Nothing a lab guest needs, and every emulated boot paid for it: e2scrub_reap took 12 s of a 57 s boot
# (systemd-analyze blame), and the timers wake apt and friends in the middle of a test.
# getty-static starts five text consoles nobody logs in to, and binfmt has nothing to register: a second
# each of an emulated boot. The serial console's getty stays (root password above, for debugging).
chroot "$R" systemctl mask e2scrub_reap.service e2scrub_all.timer fstrim.timer apt-daily.timer \
  apt-daily-upgrade.timer man-db.timer getty-static.service systemd-binfmt.service >/dev/null
EOF
chmod +x "$WORK/customize.sh"
# Before the kernel is installed, so that its one initramfs is built this way: only the drivers a lab
# guest's root disk needs (virtio; the seed cdrom is read after the switch to the root fs) instead of
# "most", which unpacked 15 MiB on every emulated boot. A hook, not /etc/initramfs-tools/modules: that
# is the package's conffile, and dpkg stops to ask about one that is already there.
cat > "$WORK/initramfs.sh" <<'EOF'
#!/bin/sh
set -e
R="$1"
mkdir -p "$R/etc/initramfs-tools/conf.d" "$R/etc/initramfs-tools/hooks"
printf 'MODULES=list\n' > "$R/etc/initramfs-tools/conf.d/lab-guest.conf"
printf '%s\n' '#!/bin/sh' 'case "$1" in prereqs) exit 0 ;; esac' \
  '. /usr/share/initramfs-tools/hook-functions' 'manual_add_modules virtio_pci virtio_blk virtio_scsi sd_mod' \
  > "$R/etc/initramfs-tools/hooks/lab-guest"
chmod +x "$R/etc/initramfs-tools/hooks/lab-guest"
EOF
chmod +x "$WORK/initramfs.sh"
# Use the host's own apt sources (deb822 file) so no mirror host is hard-coded here.
SOURCES=/etc/apt/sources.list.d/debian.sources
[ -f "$SOURCES" ] || SOURCES=/etc/apt/sources.list
# Acquire::Retries: a transient network error while fetching a package is retried, not fatal.
# force-unsafe-io: dpkg syncs every file it unpacks, most of the build on a busy machine's disk; this root
# fs is scratch until the image is written whole (an interrupted build starts again). Documentation,
# manual pages and translations are never read in a lab guest: not unpacked.
mmdebstrap --variant=minbase \
  --aptopt='APT::Install-Recommends "false"' --aptopt='Acquire::Retries "5"' \
  --dpkgopt=force-unsafe-io --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --include=systemd-sysv,dbus,udev,kmod,e2fsprogs,linux-image-cloud-amd64,initramfs-tools,cloud-init,qemu-guest-agent,squid,ifupdown,isc-dhcp-client,iproute2,netbase,procps,iputils-ping \
  --essential-hook="$WORK/initramfs.sh \"\$1\"" \
  --customize-hook="$WORK/customize.sh \"\$1\"" \
  bookworm "$ROOTFS" "$SOURCES"
# mmdebstrap copies the build host's resolver; a lab guest has none (no route out), and a resolver that
# never answers makes squid's start and apt time out for minutes. Empty: lookups fail at once.
: > "$ROOTFS/etc/resolv.conf"

# ---------- 2. grub files inside the root fs ----------
mkdir -p "$ROOTFS/boot/grub/i386-pc" "$ROOTFS/boot/grub/x86_64-efi"
cp /usr/lib/grub/i386-pc/*.mod /usr/lib/grub/i386-pc/*.lst "$ROOTFS/boot/grub/i386-pc/"
cp /usr/lib/grub/x86_64-efi/*.mod /usr/lib/grub/x86_64-efi/*.lst "$ROOTFS/boot/grub/x86_64-efi/"
# quiet: under emulation every line the kernel and systemd print on the consoles costs boot time; the
# journal and dmesg keep them all.
cat > "$ROOTFS/boot/grub/grub.cfg" <<'EOF'
set timeout=0
set default=0
serial --unit=0 --speed=115200
terminal_input serial console
terminal_output serial console
menuentry 'lab' {
  insmod part_msdos
  insmod ext2
  search --no-floppy --label labroot --set=root
  linux /vmlinuz root=LABEL=labroot ro quiet console=tty0 console=ttyS0,115200
  initrd /initrd.img
}
EOF
rm -f "$ROOTFS/boot/grub/grub.cfg.old"

# ---------- 3. raw disk: MBR, p1 = ESP (FAT), p2 = root (ext4, bootable) ----------
rm -f disk.raw
truncate -s ${DISK_SIZE_MIB}M disk.raw
printf 'label: dos\nstart=%d, size=%d, type=ef\nstart=%d, type=83, bootable\n' \
  $ESP_START $ESP_SECTORS $ROOT_START | sfdisk -q disk.raw
ROOT_BYTES=$(( DISK_SIZE_MIB*1024*1024 - ROOT_START*512 ))
mkfs.ext4 -q -F -L labroot -O ^metadata_csum_seed,^orphan_file \
  -E offset=$((ROOT_START*512)) -d "$ROOTFS" disk.raw $((ROOT_BYTES/1024))k

# BIOS: boot.img (first 440 bytes of MBR, keeps the partition table) + core.img right after the MBR.
mkdir -p grubsetup
grub-mkimage -O i386-pc -d /usr/lib/grub/i386-pc -o grubsetup/core.img \
  -p '(hd0,msdos2)/boot/grub' biosdisk part_msdos ext2
dd if=/usr/lib/grub/i386-pc/boot.img of=disk.raw bs=440 count=1 conv=notrunc status=none
dd if=grubsetup/core.img of=disk.raw bs=512 seek=1 conv=notrunc status=none

# UEFI: FAT ESP at ESP_START holding \EFI\BOOT\BOOTX64.EFI (grub with an embedded search config).
cat > grubsetup/efi-early.cfg <<'EOF'
search --no-floppy --label labroot --set=root
set prefix=($root)/boot/grub
configfile ($root)/boot/grub/grub.cfg
EOF
grub-mkimage -O x86_64-efi -d /usr/lib/grub/x86_64-efi -o grubsetup/BOOTX64.EFI \
  -c grubsetup/efi-early.cfg -p /boot/grub \
  part_msdos part_gpt fat ext2 search search_label configfile normal linux echo serial terminal efi_gop all_video
mkfs.fat -F 16 -n ESP --offset=$ESP_START disk.raw $((ESP_SECTORS/2)) >/dev/null 2>&1
mmd -i disk.raw@@$((ESP_START*512)) ::/EFI ::/EFI/BOOT
mcopy -i disk.raw@@$((ESP_START*512)) grubsetup/BOOTX64.EFI ::/EFI/BOOT/BOOTX64.EFI

# ---------- 4. qcow2, its digest, and only this recipe's image in the cache ----------
mkdir -p "$IMG_DIR"
qemu-img convert -f raw -O qcow2 disk.raw "$WORK/image.qcow2"
sha256sum "$WORK/image.qcow2" | cut -d' ' -f1 >"$WORK/image.qcow2.sha256"
mv "$WORK/image.qcow2" "$OUT"
mv "$WORK/image.qcow2.sha256" "$OUT.sha256" # last: an image with its digest is complete
for old in "$CACHE_ROOT"/*; do
  [ "$old" = "$IMG_DIR" ] || [ "$old" = "$WORK" ] || [ "$old" = "$LOCK" ] || rm -rf "$old"
done
qemu-img info "$OUT" | sed -n '1,4p'
echo "[build-image] built in $(($(date +%s) - started)) s: $OUT"
echo "$OUT"
