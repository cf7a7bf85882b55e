import assert from "node:assert/strict";
import {
  desiredSlices,
  MANAGED_BY,
  parseServiceRef,
  sliceNeedsApply,
} from "../../../cli/check/endpointslice";
import type { CheckReport } from "../../../cli/check/report";
import { parseSliceMembers, sliceMembersJson } from "../../../components/slice-members";

const report = (results: [string, boolean][]): CheckReport => ({
  checkedAt: "2026-12-02T21:00:00.000Z",
  results: results.map(([endpoint, up]) => ({
    name: endpoint,
    endpoint,
    family: endpoint.startsWith("[") ? ("ipv6" as const) : ("ipv4" as const),
    up,
  })),
});
const SERVICE = {
  namespace: "crawlers",
  name: "egress",
  uid: "0b4e1c9a-1111-4222-8333-944455556666",
  labels: { "app.kubernetes.io/instance": "egress" },
};

describe("check --endpointslices: the slices the exporter writes", () => {
  it("lists every member of each family, ready as the last check found it, unknown when unchecked", () => {
    const members = {
      port: 3128,
      ipv4: ["10.0.0.5", "10.0.0.6", "10.0.0.7"],
      ipv6: ["2001:db8::8"],
    };
    const slices = desiredSlices(
      SERVICE,
      members,
      report([
        ["10.0.0.5:3128", true],
        ["10.0.0.6:3128", false],
        ["[2001:db8::8]:3128", false],
        // A member the pool no longer lists: not written back.
        ["10.0.0.9:3128", true],
      ]),
    );
    assert.deepEqual(slices.ipv4.endpoints, [
      { addresses: ["10.0.0.5"], conditions: { ready: true } },
      { addresses: ["10.0.0.6"], conditions: { ready: false } },
      { addresses: ["10.0.0.7"], conditions: {} },
    ]);
    assert.deepEqual(slices.ipv6?.endpoints, [
      { addresses: ["2001:db8::8"], conditions: { ready: false } },
    ]);
    assert.equal(slices.ipv4.metadata.name, "egress-checked");
    assert.equal(slices.ipv6?.metadata.name, "egress-checked-ipv6");
    assert.deepEqual(slices.ipv4.metadata.labels, {
      "app.kubernetes.io/instance": "egress",
      "kubernetes.io/service-name": "egress",
      "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
    });
    assert.deepEqual(slices.ipv4.metadata.ownerReferences, [
      { apiVersion: "v1", kind: "Service", name: "egress", uid: SERVICE.uid },
    ]);
    assert.deepEqual(slices.ipv4.ports, [{ name: "http-proxy", port: 3128, protocol: "TCP" }]);
    assert.equal(desiredSlices(SERVICE, { port: 3128, ipv4: [] }, undefined).ipv6, undefined);
  });

  it("asks for a write only when the live slice says something else (a healthy pool sees none)", () => {
    const desired = desiredSlices(
      SERVICE,
      { port: 3128, ipv4: ["10.0.0.5"] },
      report([["10.0.0.5:3128", true]]),
    ).ipv4;
    // What the API server gives back: the applied fields plus its own, and labels others added.
    const live = {
      metadata: {
        labels: { ...desired.metadata.labels, "someone-else": "x" },
        ownerReferences: [{ uid: SERVICE.uid }],
        resourceVersion: "12",
      },
      addressType: "IPv4",
      ports: [{ name: "http-proxy", port: 3128, protocol: "TCP" }],
      endpoints: [{ addresses: ["10.0.0.5"], conditions: { ready: true, serving: true } }],
    };
    assert.equal(sliceNeedsApply(live, desired), false);
    assert.equal(sliceNeedsApply(undefined, desired), true, "missing: created");
    const flipped = {
      ...live,
      endpoints: [{ addresses: ["10.0.0.5"], conditions: { ready: false } }],
    };
    assert.equal(sliceNeedsApply(flipped, desired), true);
    assert.equal(sliceNeedsApply({ ...live, endpoints: [] }, desired), true);
    assert.equal(
      sliceNeedsApply(
        { ...live, metadata: { ...live.metadata, ownerReferences: [{ uid: "other" }] } },
        desired,
      ),
      true,
      "a Service made anew owns its slices anew",
    );
    assert.equal(
      sliceNeedsApply(
        { ...live, ports: [{ name: "http-proxy", port: 8080, protocol: "TCP" }] },
        desired,
      ),
      true,
    );
  });

  it("takes <namespace>/<service> and nothing else", () => {
    assert.deepEqual(parseServiceRef("crawlers/egress"), { namespace: "crawlers", name: "egress" });
    for (const bad of ["egress", "a/b/c", "Crawlers/x", "crawlers/", "/x", "crawlers/egress.vms"])
      assert.throws(
        () => parseServiceRef(bad),
        /--endpointslices must be <namespace>\/<service>/,
        bad,
      );
  });

  it("reads back the member list the pool writes, and refuses one it cannot trust", () => {
    const members = { port: 3128, ipv4: ["10.0.0.5"], ipv6: ["2001:db8::8"] };
    assert.deepEqual(parseSliceMembers(sliceMembersJson(members), "x"), members);
    assert.deepEqual(parseSliceMembers(sliceMembersJson({ port: 1, ipv4: [] }), "x"), {
      port: 1,
      ipv4: [],
    });
    assert.throws(() => parseSliceMembers("{", "S endpoints.json"), /S endpoints.json is not JSON/);
    assert.throws(() => parseSliceMembers('{"port":0,"ipv4":[]}', "S"), /S: port must be/);
    assert.throws(
      () => parseSliceMembers('{"port":3128,"ipv4":["2001:db8::1"]}', "S"),
      /ipv4 must be a list of IPv4/,
    );
    assert.throws(
      () => parseSliceMembers('{"port":3128,"ipv4":[],"ipv6":["10.0.0.1"]}', "S"),
      /ipv6 must be a list of IPv6/,
    );
  });
});
