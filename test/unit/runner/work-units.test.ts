import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { logFileName } from "../../runner/steps";
import {
  findSpecs,
  kindOfSpec,
  MAX_GUESTS_AT_ONCE,
  shard,
  takeNextUnit,
  unitName,
  workUnits,
  type Spec,
} from "../../runner/suites";

const spec = (path: string, weight: number, group?: string, guests = 0): Spec => ({
  path: `dist/test/${path}.test.js`,
  kind: "lab",
  weight,
  ...(group ? { group } : {}),
  ...(guests > 0 ? { guests } : {}),
});

describe("the test runner's units of lab work", () => {
  const specs = [
    spec("lab/small", 10),
    spec("engine/stock-host", 150, "stock-host"),
    spec("lab/doctor", 10, "stock-host"),
    spec("engine/root-program", 170),
    spec("lab/egress", 130),
  ];

  it("keeps a group's suites in one unit and queues the heaviest first", () => {
    const units = workUnits(specs);
    assert.deepEqual(units.map(unitName), [
      "engine/root-program",
      "stock-host (2 suites)",
      "lab/egress",
      "lab/small",
    ]);
    assert.deepEqual(
      units[1]!.map((s) => s.path),
      ["dist/test/engine/stock-host.test.js", "dist/test/lab/doctor.test.js"],
    );
  });

  it("shards into the lightest shard, never splitting a group", () => {
    const shards = shard(specs, 2).map((group) => group.map((s) => s.path.split("/").at(-1)));
    assert.deepEqual(shards, [
      ["root-program.test.js", "small.test.js"],
      ["stock-host.test.js", "doctor.test.js", "egress.test.js"],
    ]);
  });
});

describe("the test runner's step logs", () => {
  it("names a lab suite's log file without a directory separator or a space", () => {
    assert.equal(logFileName("lab engine/root-program"), "lab_engine_root-program.log");
    assert.equal(logFileName("lab stock-host (2 suites)"), "lab_stock-host_2_suites_.log");
  });
});

describe("the lab queue's guests at once", () => {
  it("takes the heaviest unit whose guests fit beside the booting ones, else waits", () => {
    assert.equal(MAX_GUESTS_AT_ONCE, 4);
    const queue = workUnits([
      spec("engine/rotate", 240, undefined, 2),
      spec("lab/egress", 200, undefined, 2),
      spec("lab/dual-stack", 180, undefined, 1),
      spec("lab/small", 10),
    ]);
    const first = takeNextUnit(queue, 0);
    assert.equal(first && unitName(first), "engine/rotate");
    // Three guests boot: the other two-guest suite waits, the one-guest suite goes ahead of it.
    const second = takeNextUnit(queue, 3);
    assert.equal(second && unitName(second), "lab/dual-stack");
    const third = takeNextUnit(queue, 4);
    assert.equal(third && unitName(third), "lab/small", "a suite without guests always fits");
    assert.equal(takeNextUnit(queue, 4), undefined, "nothing fits: wait");
    const last = takeNextUnit(queue, 2);
    assert.equal(last && unitName(last), "lab/egress");
    assert.equal(queue.length, 0);
  });

  it("runs a unit that boots more guests than allowed only when nothing else boots", () => {
    const queue = workUnits([spec("lab/huge", 100, undefined, 5)]);
    assert.equal(takeNextUnit(queue, 1), undefined);
    const unit = takeNextUnit(queue, 0);
    assert.equal(unit && unitName(unit), "lab/huge");
  });

  it("knows which lab suites boot the guest image: a call of ensureProxyImage in their closure", () => {
    const dir = mkdtempSync(join(tmpdir(), "egress-kind-"));
    try {
      const write = (path: string, source: string) => {
        mkdirSync(join(dir, path, ".."), { recursive: true });
        writeFileSync(join(dir, path), source);
      };
      write("lab/fixture.js", "");
      // The definition alone (every importer of kvm-support sees it) is not a call.
      write("lab/kvm-support.js", 'async function ensureProxyImage() { run("build-image.sh"); }');
      write(
        "lab/prefix-support.js",
        'const k = require("./kvm-support"); (0, k.ensureProxyImage)();',
      );
      write("lab/boots.test.js", 'require("./fixture"); require("./prefix-support");');
      write("lab/ssh.test.js", 'require("./fixture"); require("./kvm-support");');
      write(
        "unit/pure.test.js",
        'const k = require("../lab/kvm-support"); (0, k.ensureProxyImage)();',
      );
      assert.deepEqual(kindOfSpec(join(dir, "lab/boots.test.js"), dir), {
        kind: "lab",
        needsImage: true,
      });
      assert.deepEqual(kindOfSpec(join(dir, "lab/ssh.test.js"), dir), { kind: "lab" });
      assert.deepEqual(kindOfSpec(join(dir, "unit/pure.test.js"), dir), { kind: "quick" });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("the test runner's specs", () => {
  it("are the compiled specs whose TypeScript source still exists (a deleted one left in dist is not run)", () => {
    const repo = mkdtempSync(join(tmpdir(), "egress-specs-"));
    try {
      const write = (path: string) => {
        mkdirSync(join(repo, path, ".."), { recursive: true });
        writeFileSync(join(repo, path), "");
      };
      // Joined, so the repository's own path check does not read it as a file of ours.
      write(join("test", "unit", "kept.test.ts"));
      write("dist/test/unit/kept.test.js");
      write("dist/test/lab/deleted.test.js");
      assert.deepEqual(
        findSpecs(join(repo, "dist", "test"), repo).map((spec) => spec.path),
        ["dist/test/unit/kept.test.js"],
      );
    } finally {
      rmSync(repo, { recursive: true, force: true });
    }
  });
});
