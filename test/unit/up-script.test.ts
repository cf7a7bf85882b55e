/**
 * scripts/up.sh (`npm run up`, the README's main command) with a fake `pulumi`
 * on PATH that records every call: the order of login, stack and up, their
 * flags, and what happens without a CLI or without a passphrase. The fake
 * keeps the CLI's one piece of state that matters here: whether `login` ran.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  chmodSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

const REPOSITORY = resolve(__dirname, "..", "..", "..");
const SCRIPT = join(REPOSITORY, "scripts", "up.sh");

/** The CLI's behaviour that up.sh relies on: whoami fails until a login; --verbose names the backend. */
const FAKE_PULUMI = `#!/bin/bash
echo "$* | cwd=$PWD | passphrase=\${PULUMI_CONFIG_PASSPHRASE-unset}" >>"$FAKE_DIR/calls"
case "$1" in
  whoami)
    [ -f "$FAKE_DIR/logged-in" ] || { echo "error: not logged in" >&2; exit 255; }
    if [ "$2" = --verbose ]; then printf 'User: someone\\nOrganizations: \\nBackend URL: %s\\n' "$(cat "$FAKE_DIR/logged-in")"; else echo someone; fi ;;
  login) [ "$2" = --local ] && echo "file://~" >"$FAKE_DIR/logged-in" ;;
esac
exit 0
`;

interface Run {
  status: number | null;
  stderr: string;
  /** Each pulumi call as "args | cwd=… | passphrase=…". */
  calls: string[];
}

describe("npm run up (scripts/up.sh) with a recording fake pulumi", () => {
  let dir: string;
  let bin: string;

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), "egress-up-"));
    bin = join(dir, "bin");
    // Only what the script needs besides pulumi, so a real CLI on this machine cannot take part.
    mkdirSync(bin);
    for (const tool of ["dirname", "grep", "cat"]) symlinkSync(`/usr/bin/${tool}`, join(bin, tool));
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  function installFake(loggedInTo?: string): void {
    writeFileSync(join(bin, "pulumi"), FAKE_PULUMI);
    chmodSync(join(bin, "pulumi"), 0o755);
    if (loggedInTo !== undefined) writeFileSync(join(dir, "logged-in"), loggedInTo);
  }

  function up(env: Record<string, string>, ...args: string[]): Run {
    const result = spawnSync("/bin/bash", [SCRIPT, ...args], {
      cwd: dir,
      encoding: "utf8",
      env: { PATH: bin, FAKE_DIR: dir, HOME: dir, ...env },
    });
    let calls: string[] = [];
    try {
      calls = readFileSync(join(dir, "calls"), "utf8").trim().split("\n");
    } catch {
      // no call at all
    }
    return { status: result.status, stderr: result.stderr, calls };
  }

  const args = (calls: string[]) => calls.map((call) => call.split(" | ")[0]);

  it("on a fresh machine: logs in locally, creates the dev stack, then runs pulumi up in the repository", () => {
    installFake();
    const run = up({ PULUMI_CONFIG_PASSPHRASE: "correct horse" }, "--yes");
    assert.equal(run.status, 0, run.stderr);
    assert.deepEqual(args(run.calls), [
      "whoami",
      "login --local",
      "stack select --create dev",
      "up --yes",
    ]);
    for (const call of run.calls.slice(1)) {
      assert.ok(call.includes(`cwd=${REPOSITORY} `), call);
      assert.ok(call.endsWith("passphrase=correct horse"), call);
    }
  });

  it("keeps the backend the user is logged in to and the stack named by EGRESS_STACK", () => {
    installFake("https://api.pulumi.com");
    // A cloud backend keeps secrets itself: no passphrase needed.
    const run = up({ EGRESS_STACK: "crawl-prod" });
    assert.equal(run.status, 0, run.stderr);
    assert.deepEqual(args(run.calls), [
      "whoami",
      "whoami --verbose",
      "stack select --create crawl-prod",
      "up",
    ]);
  });

  it("refuses to start on a local backend without a passphrase, before touching anything", () => {
    installFake();
    const fresh = up({});
    assert.notEqual(fresh.status, 0);
    assert.match(fresh.stderr, /set PULUMI_CONFIG_PASSPHRASE \(or PULUMI_CONFIG_PASSPHRASE_FILE\)/);
    assert.deepEqual(args(fresh.calls), ["whoami"], "no login, no stack, no up");

    rmSync(join(dir, "calls"));
    writeFileSync(join(dir, "logged-in"), "file:///srv/pulumi-state");
    const local = up({});
    assert.notEqual(local.status, 0);
    assert.deepEqual(args(local.calls), ["whoami", "whoami --verbose"]);

    rmSync(join(dir, "calls"));
    writeFileSync(join(dir, "passphrase"), "from a file\n");
    const fromFile = up({ PULUMI_CONFIG_PASSPHRASE_FILE: join(dir, "passphrase") });
    assert.equal(fromFile.status, 0, fromFile.stderr);
    assert.deepEqual(args(fromFile.calls).slice(-2), ["stack select --create dev", "up"]);
  });

  it("says where to get the Pulumi CLI when there is none", () => {
    const run = up({ PULUMI_CONFIG_PASSPHRASE: "x" });
    assert.notEqual(run.status, 0);
    assert.match(run.stderr, /Pulumi CLI is not on PATH.*pulumi\.com\/docs\/install/);
    assert.deepEqual(run.calls, []);
  });
});
