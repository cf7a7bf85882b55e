import { strict as assert } from "node:assert";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

/** dist/reaper/main.js, as npm links the egress-reaper bin. */
const BIN = resolve(__dirname, "..", "..", "..", "reaper", "main.js");

function reaper(args: string[]) {
  const result = spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", timeout: 30_000 });
  return { status: result.status, stdout: result.stdout, stderr: result.stderr };
}

describe("egress-reaper command line", () => {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), "reaper-cli-"))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  function writeConfig(config: unknown): string {
    const state = join(dir, "state.json");
    writeFileSync(
      state,
      JSON.stringify({
        version: 3,
        deployment: { resources: [{ urn: "urn:pulumi:prod::web::pulumi:pulumi:Stack::web-prod" }] },
      }),
    );
    const file = join(dir, "reaper.json");
    writeFileSync(
      file,
      JSON.stringify(config, (_key, value) => (value === "$STATE" ? state : value)),
    );
    return file;
  }

  it("asks for --config and a readable --min-age (exit 2)", () => {
    const missing = reaper([]);
    assert.equal(missing.status, 2);
    assert.match(missing.stderr, /--config is required/);
    const badAge = reaper(["--config", "x.json", "--min-age", "an hour"]);
    assert.equal(badAge.status, 2);
    assert.match(
      badAge.stderr,
      /--min-age "an hour" is not a duration; write e\.g\. 90m, 1h or 2d/,
    );
  });

  it("names the config field that is wrong (exit 2)", () => {
    const file = writeConfig({
      states: [{ checkpointFile: "$STATE" }],
      kvm: [{ name: "k", pools: [] }],
    });
    const result = reaper(["--config", file]);
    assert.equal(result.status, 2);
    assert.match(
      result.stderr,
      /reaper\.json\.kvm\[0\]\.pools: pools must name at least one storage pool/,
    );
  });

  it("prints the table, and exits 1 when a backend cannot be listed", () => {
    const file = writeConfig({
      states: [{ checkpointFile: "$STATE" }],
      kvm: [{ name: "nowhere", socketPath: join(dir, "no-such-socket"), pools: ["default"] }],
    });
    const table = reaper(["--config", file]);
    assert.equal(table.status, 1, table.stderr);
    assert.match(table.stdout, /^BACKEND\s+HOST\s+KIND\s+NAME\s+OWNER STACK\s+AGE\s+ACTION\s+WHY/);
    assert.match(table.stdout, /! nowhere: not listed completely/);
    assert.match(table.stderr, /nowhere not listed completely/);
    const json = reaper(["--config", file, "--json"]);
    assert.equal(json.status, 1);
    const report = JSON.parse(json.stdout) as {
      backends: Array<{ backend: string; complete: boolean }>;
    };
    assert.deepEqual(
      report.backends.map((backend) => [backend.backend, backend.complete]),
      [["nowhere", false]],
    );
  });

  it("says a static backend has nothing to reap, lists nothing for it, and exits 0 (even with --apply)", () => {
    const file = writeConfig({
      states: [{ checkpointFile: "$STATE" }],
      static: [{ name: "shop" }],
    });
    const table = reaper(["--config", file, "--apply"]);
    assert.equal(table.status, 0, table.stderr);
    assert.match(
      table.stdout,
      /- shop: static proxies are not made by egress-proxies: nothing to reap/,
    );
    const json = reaper(["--config", file, "--json"]);
    assert.equal(json.status, 0, json.stderr);
    const report = JSON.parse(json.stdout) as {
      backends: Array<{ backend: string; complete: boolean; note?: string }>;
      items: unknown[];
    };
    assert.deepEqual(report.backends, [
      {
        backend: "shop",
        complete: true,
        note: "static proxies are not made by egress-proxies: nothing to reap",
      },
    ]);
    assert.deepEqual(report.items, []);
  });
});
