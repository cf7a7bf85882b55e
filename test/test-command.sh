#!/usr/bin/env bash
# `npm test`: the guest image build starts in the background (on a fresh machine it is minutes of
# downloads that need little CPU), TypeScript compiles meanwhile, then the test runner runs everything
# (test/runner/main.ts; its guest-image step joins that build). A build or a run cut short stops the
# background build too, by the PID it recorded: nothing of the test command outlives it.
set -euo pipefail
cd "$(dirname "$0")/.."
EGRESS_TEST_STARTED_MS=$(date +%s%3N)
export EGRESS_TEST_STARTED_MS
EARLY=.tmp/guest-image-early.log
stop_early() { bash test/lab/build-image.sh --stop-early "$EARLY"; }
bash test/lab/build-image.sh --early "$EARLY"
trap 'stop_early; exit 130' INT
trap 'stop_early; exit 143' TERM
if ! npm run build; then
  stop_early
  exit 1
fi
trap - INT TERM
exec node dist/test/runner/main.js
