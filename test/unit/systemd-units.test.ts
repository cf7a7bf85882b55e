/**
 * The systemd units docs/systemd ships parse cleanly with systemd's own
 * checker (`systemd-analyze verify`), in a throwaway root that holds the
 * machine's stock units, stand-ins for the commands they run, and ours.
 * Every complaint that names one of our files fails the test; a unit with a
 * misspelt key is shown to produce one, so the check can fail.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  chmodSync,
  cpSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const UNITS = join(__dirname, "..", "..", "..", "docs", "systemd");
const STOCK_UNITS = "/usr/lib/systemd/system";
/** What the units run, present as stand-ins so verify checks the rest. */
const COMMANDS = ["/usr/local/bin/egress-proxies", "/usr/local/bin/pulumi"];

function verify(root: string, units: string[]): string {
  const run = spawnSync("systemd-analyze", [`--root=${root}`, "verify", ...units], {
    encoding: "utf8",
    env: { ...process.env, SYSTEMD_LOG_LEVEL: "notice" },
    timeout: 30_000,
  });
  if (run.error) throw new Error(`systemd-analyze: ${run.error.message} (Debian package systemd)`);
  return `${run.stdout}${run.stderr}`;
}

describe("docs/systemd units", function () {
  this.timeout(120_000);
  let root: string;
  const units = readdirSync(UNITS).filter((name) => /\.(service|timer)$/.test(name));

  before(() => {
    root = mkdtempSync(join(tmpdir(), "egress-systemd-"));
    mkdirSync(join(root, "usr/lib/systemd"), { recursive: true });
    cpSync(STOCK_UNITS, join(root, "usr/lib/systemd/system"), { recursive: true });
    mkdirSync(join(root, "etc/systemd/system"), { recursive: true });
    for (const command of COMMANDS) {
      mkdirSync(join(root, command, ".."), { recursive: true });
      writeFileSync(join(root, command), "#!/bin/sh\n");
      chmodSync(join(root, command), 0o755);
    }
  });

  after(() => rmSync(root, { recursive: true, force: true }));

  it("ships the exporter service and the resync service and timer", () => {
    assert.deepEqual(units.sort(), [
      "egress-check-exporter.service",
      "egress-pool-resync.service",
      "egress-pool-resync.timer",
    ]);
  });

  it("systemd-analyze verify has nothing to say about any of them", () => {
    for (const unit of units) cpSync(join(UNITS, unit), join(root, "etc/systemd/system", unit));
    const output = verify(root, units);
    const ours = output.split("\n").filter((line) => units.some((unit) => line.includes(unit)));
    assert.deepEqual(ours, [], output);
  });

  it("the same check reports a misspelt key and a bad value (it can fail)", () => {
    writeFileSync(
      join(root, "etc/systemd/system", "egress-broken.timer"),
      "[Timer]\nOnBootSecc=5min\nPersistent=maybe\n[Install]\nWantedBy=timers.target\n",
    );
    writeFileSync(
      join(root, "etc/systemd/system", "egress-broken.service"),
      "[Service]\nType=oneshot\nExecStart=/bin/true\n",
    );
    const output = verify(root, ["egress-broken.timer"]);
    assert.match(output, /egress-broken\.timer:\d+: Unknown key 'OnBootSecc'/);
    assert.match(output, /egress-broken\.timer:\d+: Failed to parse boolean value/);
  });
});
