/**
 * The vendor-data script that installs and starts the QEMU guest agent.
 *
 * Why a script and not cloud-config `packages:`: cloud-init merges vendor-data
 * cloud-config *under* the user's and drops every key the user also defines,
 * so a user's own `packages:` list silently removed the agent in the earlier
 * system. A vendor script runs from its own handler (scripts-vendor), after the
 * user's packages and before the user's runcmd, whatever the user wrote.
 *
 * Shape rules: POSIX sh (dash), idempotent, logs to stdout (cloud-init keeps
 * it), never stops half way: no package manager or no init system is reported
 * and the script exits 0; a failed install exits 1 so `cloud-init status`
 * shows it.
 */
export const GUEST_AGENT_SCRIPT_NAME = "egress-proxies-guest-agent.sh";

export const GUEST_AGENT_SCRIPT = `#!/bin/sh
# egress-proxies: install and start the QEMU guest agent (cloud-init vendor-data).
# Idempotent; safe to run again. Logs go to stdout (cloud-init-output.log).
set -u

log() { echo "egress-proxies guest-agent: $*"; }
have() { command -v "$1" >/dev/null 2>&1; }

agent_installed() {
  have qemu-ga || [ -x /usr/bin/qemu-ga ] || [ -x /usr/sbin/qemu-ga ]
}

install_agent() {
  if agent_installed; then
    log "already installed"
    return 0
  fi
  if have apt-get; then
    log "installing qemu-guest-agent with apt-get"
    # A fresh cloud image often has empty package lists: update only when the first try fails.
    DEBIAN_FRONTEND=noninteractive apt-get install -y qemu-guest-agent ||
      { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y qemu-guest-agent; }
  elif have dnf; then
    log "installing qemu-guest-agent with dnf"
    dnf install -y qemu-guest-agent
  elif have yum; then
    log "installing qemu-guest-agent with yum"
    yum install -y qemu-guest-agent
  elif have zypper; then
    log "installing qemu-guest-agent with zypper"
    zypper --non-interactive install qemu-guest-agent
  elif have apk; then
    log "installing qemu-guest-agent with apk"
    apk add --no-cache qemu-guest-agent
  else
    log "no supported package manager (apt-get, dnf, yum, zypper, apk); install qemu-guest-agent in the image"
    return 2
  fi
}

start_agent() {
  if have systemctl && [ -d /run/systemd/system ]; then
    # Running already: the boot started it (Debian's unit follows the agent's virtio port, and the
    # package starts it on install), so it starts the same way next boot. Enabling a unit that also
    # has a SysV script runs update-rc.d, seconds on a slow guest, for nothing.
    if systemctl is-active --quiet qemu-guest-agent; then
      log "qemu-guest-agent is running"
      return 0
    fi
    log "starting qemu-guest-agent with systemd"
    # Debian's unit is static (enable fails harmlessly); RHEL's needs enabling.
    systemctl enable qemu-guest-agent >/dev/null 2>&1 || true
    systemctl start qemu-guest-agent
  elif have rc-service; then
    log "starting qemu-guest-agent with OpenRC"
    rc-update add qemu-guest-agent default >/dev/null 2>&1 || true
    rc-service qemu-guest-agent start
  else
    log "neither systemd nor OpenRC found; start qemu-ga by hand"
    return 0
  fi
}

install_agent
status=$?
case $status in
  0) ;;
  2) exit 0 ;;
  *) log "installing the agent failed (exit $status)"; exit 1 ;;
esac
if ! start_agent; then
  log "starting the agent failed"
  exit 1
fi
log "done"
exit 0
`;
