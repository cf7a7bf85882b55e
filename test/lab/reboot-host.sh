#!/bin/bash
# A private hypervisor for the host-reboot test (test/engine/kvm-reboot.test.ts): a second stock-host
# profile under its own names (directory, netns, veth, user, SSH port), so its libvirtd can be
# restarted while the shared lab's, which serves every other lab suite, keeps running.
#   reboot-host.sh up      : bring it up (stock-host-up.sh), or reuse it when it is complete
#   reboot-host.sh reboot  : guests off, libvirtd restarted with empty boot markers (autostart runs)
#   reboot-host.sh down    : take it down completely (stock-host-down.sh --purge); idempotent, and
#                            run by the test command's teardown too
set -euo pipefail
export STOCK_LAB_DIR=${REBOOT_HOST_DIR:-/tmp/egress-reboot-host}
export STOCK_NETNS=egress-reboot
export STOCK_VETH=reboot-host
export STOCK_SSH_USER=egress-reboot
export STOCK_SSH_PORT=${REBOOT_HOST_SSH_PORT:-2226}
HERE=$(dirname "${BASH_SOURCE[0]}")
case "${1:-}" in
up) exec bash "$HERE/stock-host-up.sh" ;;
reboot) exec bash "$HERE/stock-host-up.sh" reboot ;;
down) exec bash "$HERE/stock-host-down.sh" --purge ;;
*)
  echo "usage: $0 up|reboot|down" >&2
  exit 2
  ;;
esac
