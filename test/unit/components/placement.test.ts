import assert from "node:assert/strict";
import fc from "fast-check";
import {
  placeProxies,
  placementProblems,
  proxiesPerBackend,
  type PlacementBackend,
} from "../../../components/placement";

const backendsArbitrary = fc
  .uniqueArray(fc.stringMatching(/^[a-z][a-z0-9]{0,6}$/), { minLength: 1, maxLength: 5 })
  .chain((names) =>
    fc.tuple(
      ...names.map((name) =>
        fc.record(
          {
            name: fc.constant(name),
            weight: fc.integer({ min: 1, max: 5 }),
            count: fc.integer({ min: 0, max: 4 }),
          },
          { requiredKeys: ["name"] },
        ),
      ),
    ),
  )
  .map((backends) => backends as PlacementBackend[]);

const fixedTotal = (backends: PlacementBackend[]) =>
  backends.reduce((sum, backend) => sum + (backend.count ?? 0), 0);
const hasWeighted = (backends: PlacementBackend[]) =>
  backends.some((backend) => backend.count === undefined);

describe("pool placement", () => {
  it("spreads evenly by default, first backends first", () => {
    const backends = [{ name: "kvm1" }, { name: "kvm2" }, { name: "pve" }];
    assert.deepEqual(Object.fromEntries(proxiesPerBackend(backends, 7)), {
      kvm1: 3,
      kvm2: 2,
      pve: 2,
    });
    assert.deepEqual(
      placeProxies(backends, 4).map((proxy) => proxy.key),
      ["kvm1-0", "kvm1-1", "kvm2-0", "pve-0"],
    );
  });

  it("follows weights and takes fixed counts as given", () => {
    assert.deepEqual(
      Object.fromEntries(
        proxiesPerBackend(
          [{ name: "big", weight: 3 }, { name: "small" }, { name: "pinned", count: 2 }],
          10,
        ),
      ),
      { big: 6, small: 2, pinned: 2 },
    );
    assert.deepEqual(
      Object.fromEntries(
        proxiesPerBackend(
          [
            { name: "a", count: 1 },
            { name: "b", count: 3 },
          ],
          undefined,
        ),
      ),
      { a: 1, b: 3 },
    );
  });

  it("names every problem with the field and the fix", () => {
    const problems = placementProblems(
      [{ name: "KVM_1" }, { name: "b", weight: 0 }, { name: "b", count: 2.5 }],
      undefined,
    );
    assert.equal(problems.length, 5, problems.join("\n"));
    assert.match(problems[0], /^backends\[0\]\.name "KVM_1" must be a short DNS label/);
    assert.match(problems[1], /^backends\[1\]\.weight must be a number above 0/);
    assert.match(problems[2], /^backends\[2\]\.name "b" is used twice/);
    assert.match(problems[3], /^backends\[2\]\.count must be a whole number/);
    assert.match(problems[4], /^count is required .*set count/);
    assert.match(placementProblems([{ name: "a", count: 3 }], 2)[0], /add up to 3/);
    assert.match(
      placementProblems([{ name: "a", count: 3 }, { name: "b" }], 2)[0],
      /already take 3/,
    );
    assert.match(placementProblems([], 1)[0], /at least one/);
  });

  it("property: totals match, and one more proxy never moves an existing one", () => {
    fc.assert(
      fc.property(backendsArbitrary, fc.integer({ min: 0, max: 40 }), (backends, extra) => {
        const total = fixedTotal(backends) + (hasWeighted(backends) ? extra : 0);
        const before = placeProxies(backends, total);
        assert.equal(before.length, total);
        if (!hasWeighted(backends)) return;
        const after = placeProxies(backends, total + 1);
        const afterKeys = new Set(after.map((proxy) => proxy.key));
        assert.equal(after.length, total + 1);
        // Every survivor keeps its key, so its resource name, so it is not replaced.
        for (const proxy of before) assert.ok(afterKeys.has(proxy.key), proxy.key);
        // Keys are unique and dense per backend: 0..n-1.
        assert.equal(afterKeys.size, after.length);
        for (const backend of backends) {
          const indices = after.filter((p) => p.backend === backend.name).map((p) => p.index);
          assert.deepEqual(indices, [...indices.keys()]);
        }
      }),
      { numRuns: 300 },
    );
  });

  it("property: scaling from any count to any other only adds or removes at the ends", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 4 }), { minLength: 1, maxLength: 5 }),
        fc.integer({ min: 0, max: 30 }),
        fc.integer({ min: 0, max: 30 }),
        (weights, from, to) => {
          const backends = weights.map((weight, index) => ({ name: `b${index}`, weight }));
          const small = placeProxies(backends, Math.min(from, to)).map((p) => p.key);
          const large = new Set(placeProxies(backends, Math.max(from, to)).map((p) => p.key));
          assert.ok(small.every((key) => large.has(key)));
        },
      ),
      { numRuns: 300 },
    );
  });

  it("property: equal weights differ by at most one; shares follow weights within one", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 6 }), { minLength: 1, maxLength: 6 }),
        fc.integer({ min: 0, max: 60 }),
        (weights, count) => {
          const backends = weights.map((weight, index) => ({ name: `b${index}`, weight }));
          const split = proxiesPerBackend(backends, count);
          const even = [
            ...proxiesPerBackend(
              backends.map(({ name }) => ({ name })),
              count,
            ).values(),
          ];
          assert.ok(Math.max(...even) - Math.min(...even) <= 1);
          const totalWeight = weights.reduce((a, b) => a + b, 0);
          for (const backend of backends) {
            const ideal = (count * backend.weight) / totalWeight;
            assert.ok(
              Math.abs(split.get(backend.name)! - ideal) < 1.5,
              `${backend.name}: ${split.get(backend.name)} vs ${ideal}`,
            );
          }
        },
      ),
      { numRuns: 300 },
    );
  });
});
