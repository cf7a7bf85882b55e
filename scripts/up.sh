#!/usr/bin/env bash
# `npm run up`: the first `pulumi up` of this repository's root program on a fresh machine, complete.
#
#   1. Pulumi CLI present (https://www.pulumi.com/docs/install/).
#   2. A backend: the one you are logged in to, else the local file backend (`pulumi login --local`,
#      state under ~/.pulumi; no account needed).
#   3. On a local backend, secrets (SSH key, proxy password) are encrypted with a passphrase:
#      PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE must be set, or nothing is done.
#   4. The stack ($EGRESS_STACK, default "dev"): selected, or created when it does not exist.
#   5. `pulumi up`, with any arguments given (`npm run up -- --yes`).
# Without stack config the program puts one proxy on this machine's libvirt daemon (Pulumi.example.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
STACK=${EGRESS_STACK:-dev}
fail() {
  echo "[up] $*" >&2
  exit 1
}

command -v pulumi >/dev/null 2>&1 ||
  fail "the Pulumi CLI is not on PATH: install it (https://www.pulumi.com/docs/install/) and run again"
[ -d dist/components ] || fail "dist/ is missing: run 'npm ci' first (it builds the package)"

# Logged in already (Pulumi Cloud, S3, a file backend, PULUMI_BACKEND_URL): keep it. Else: local.
logged_in=0
pulumi whoami >/dev/null 2>&1 && logged_in=1
backend_is_local=1
if [ $logged_in = 1 ]; then
  pulumi whoami --verbose 2>/dev/null | grep -q '^Backend URL: *file:' || backend_is_local=0
fi
if [ $backend_is_local = 1 ] && [ -z "${PULUMI_CONFIG_PASSPHRASE+set}" ] && [ -z "${PULUMI_CONFIG_PASSPHRASE_FILE:-}" ]; then
  fail "a local backend encrypts the stack's secrets with a passphrase: set PULUMI_CONFIG_PASSPHRASE (or PULUMI_CONFIG_PASSPHRASE_FILE) and keep it; every later 'pulumi' command on stack $STACK needs the same one"
fi
if [ $logged_in = 0 ]; then
  echo "[up] not logged in to a Pulumi backend: using the local one (~/.pulumi)"
  pulumi login --local
fi
pulumi stack select --create "$STACK"
exec pulumi up "$@"
