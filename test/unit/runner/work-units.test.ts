import assert from "node:assert/strict";
import { logFileName } from "../../runner/steps";
import { shard, unitName, workUnits, type Spec } from "../../runner/suites";

const spec = (path: string, weight: number, group?: string): Spec => ({
  path: `dist/test/${path}.test.js`,
  kind: "lab",
  weight,
  ...(group ? { group } : {}),
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
