import assert from "node:assert/strict";
import { parseSliceRef, readinessPatch } from "../../../cli/check/endpointslice";
import type { CheckReport } from "../../../cli/check/report";

const report = (results: [string, boolean][]): CheckReport => ({
  checkedAt: "2026-12-02T21:00:00.000Z",
  results: results.map(([endpoint, up]) => ({
    name: endpoint,
    endpoint,
    family: endpoint.startsWith("[") ? ("ipv6" as const) : ("ipv4" as const),
    up,
  })),
});

describe("check --endpointslice: the patch that brings the slice to the last check", () => {
  it("changes only members whose ready condition disagrees, after testing the resourceVersion", () => {
    const slice = {
      metadata: { resourceVersion: "7" },
      endpoints: [
        { addresses: ["10.0.0.5"], conditions: { ready: true } },
        { addresses: ["10.0.0.6"], conditions: {} },
        { addresses: ["10.0.0.7"] },
        { addresses: ["2001:db8::8"], conditions: { ready: false } },
        { addresses: ["10.0.0.9"], conditions: { ready: true } },
      ],
    };
    const checked = report([
      ["10.0.0.5:3128", true],
      ["10.0.0.6:3128", false],
      ["10.0.0.7:3128", true],
      ["[2001:db8::8]:3128", true],
    ]);
    assert.deepEqual(readinessPatch(slice, checked), [
      { op: "test", path: "/metadata/resourceVersion", value: "7" },
      { op: "add", path: "/endpoints/1/conditions/ready", value: false },
      { op: "add", path: "/endpoints/2/conditions", value: { ready: true } },
      { op: "add", path: "/endpoints/3/conditions/ready", value: true },
    ]);
  });

  it("is empty when the slice already says what the check found (no write at all)", () => {
    const slice = {
      metadata: { resourceVersion: "7" },
      endpoints: [{ addresses: ["10.0.0.5"], conditions: { ready: true } }],
    };
    assert.deepEqual(readinessPatch(slice, report([["10.0.0.5:3128", true]])), []);
    assert.deepEqual(readinessPatch({ endpoints: null }, report([["10.0.0.5:3128", false]])), []);
  });

  it("takes <namespace>/<name> and nothing else", () => {
    assert.deepEqual(parseSliceRef("crawlers/egress-vms"), {
      namespace: "crawlers",
      name: "egress-vms",
    });
    for (const bad of ["egress-vms", "a/b/c", "Crawlers/x", "crawlers/", "/x"])
      assert.throws(() => parseSliceRef(bad), /--endpointslice must be <namespace>\/<name>/, bad);
  });
});
