import { strict as assert } from "node:assert";
import { createMark, type OwnershipMark } from "../../../provider/common/mark";
import {
  formatAge,
  parseDuration,
  planReaping,
  type BackendListing,
  type ItemOwnership,
  type ListedItem,
  type PlanOptions,
  type StackState,
} from "../../../reaper/plan";

const NOW = new Date("2026-11-29T12:00:00.000Z");
const HOUR = 3_600_000;
const OPTIONS: PlanOptions = { now: NOW, minAgeMs: HOUR, pruneImages: false };

const markOf = (project: string, stack: string, hoursAgo: number): OwnershipMark =>
  createMark({ project, stack, resource: "proxy" }, new Date(NOW.getTime() - hoursAgo * HOUR));

function domain(name: string, ownership: ItemOwnership, backend = "kvm1"): ListedItem {
  return {
    backend,
    host: "kvm1.lan",
    kind: "domain",
    name,
    vmName: name,
    resourceId: `hosts/kvm1.lan/domains/${name}`,
    ownership,
  };
}

const marked = (name: string, project = "web", stack = "prod", hoursAgo = 5): ListedItem =>
  domain(name, { kind: "marked", mark: markOf(project, stack, hoursAgo) });

function state(
  project: string,
  stack: string,
  ids: string[] = [],
  vmNames: string[] = [],
): StackState {
  return { project, stack, source: "test", resourceIds: new Set(ids), vmNames: new Set(vmNames) };
}

const listing = (items: ListedItem[], complete = true, backend = "kvm1"): BackendListing => ({
  backend,
  complete,
  items,
  ...(complete ? {} : { problem: "link lost" }),
});

function actions(plan: ReturnType<typeof planReaping>): Record<string, string> {
  return Object.fromEntries(plan.map((entry) => [entry.item.name, entry.action]));
}

describe("reaper plan (pure)", () => {
  it("reaps a marked domain whose stack state was read and does not have its id", () => {
    const plan = planReaping(
      [listing([marked("proxy-a"), marked("proxy-b")])],
      [state("web", "prod", ["hosts/kvm1.lan/domains/proxy-a"])],
      OPTIONS,
    );
    assert.deepEqual(actions(plan), { "proxy-a": "keep", "proxy-b": "reap" });
    const orphan = plan.find((entry) => entry.item.name === "proxy-b")!;
    assert.equal(orphan.ownerStack, "web/prod");
    assert.match(orphan.why, /not in the state of web\/prod/);
    assert.equal(orphan.ageMs, 5 * HOUR);
  });

  it("keeps a domain the state references by VM name under another host name", () => {
    const plan = planReaping(
      [listing([marked("proxy-a")])],
      [state("web", "prod", ["hosts/10.0.0.5/domains/proxy-a"], ["proxy-a"])],
      OPTIONS,
    );
    assert.equal(plan[0]!.action, "keep");
  });

  it("never touches a mark naming a stack whose state was not given (unknown owner)", () => {
    const plan = planReaping(
      [listing([marked("proxy-x", "web", "staging")])],
      [state("web", "prod")],
      OPTIONS,
    );
    assert.equal(plan[0]!.action, "keep");
    assert.match(plan[0]!.why, /unknown owner: no state given for web\/staging/);
  });

  it("never touches unmarked items or corrupt marks", () => {
    const plan = planReaping(
      [
        listing([
          domain("hand-made", { kind: "unmarked" }),
          domain("broken", { kind: "corrupt", reason: "createdAt is missing" }),
        ]),
      ],
      [state("web", "prod")],
      OPTIONS,
    );
    assert.deepEqual(actions(plan), { "hand-made": "keep", broken: "keep" });
    assert.match(plan[1]!.why, /unreadable ownership mark \(createdAt is missing\)/);
  });

  it("leaves another project's marks alone when --project is given", () => {
    const plan = planReaping([listing([marked("proxy-a", "other")])], [state("other", "prod")], {
      ...OPTIONS,
      project: "web",
    });
    assert.equal(plan[0]!.action, "keep");
    assert.match(plan[0]!.why, /another owner/);
  });

  it("keeps orphans younger than --min-age, and never reaps a future or unreadable creation time", () => {
    const future = domain("future", { kind: "marked", mark: markOf("web", "prod", -2) });
    const garbled: ListedItem = domain("garbled", {
      kind: "marked",
      mark: { ...markOf("web", "prod", 5), createdAt: "yesterday-ish" },
    });
    const plan = planReaping(
      [
        listing([
          marked("young", "web", "prod", 0.5),
          future,
          garbled,
          marked("old", "web", "prod", 1),
        ]),
      ],
      [state("web", "prod")],
      OPTIONS,
    );
    assert.deepEqual(actions(plan), {
      young: "keep",
      future: "keep",
      garbled: "keep",
      old: "reap",
    });
    assert.match(plan[0]!.why, /younger than --min-age/);
    assert.match(plan[1]!.why, /creation time \S+ is in the future: never old enough/);
    assert.match(plan[2]!.why, /creation time "yesterday-ish" unreadable/);
  });

  it("never reaps by a creation time outside the mark's ISO form, though Date.parse reads it as long ago", () => {
    assert.ok(Date.parse("1") < NOW.getTime() - 20 * 365 * 24 * HOUR); // the year 2001
    const odd = (name: string, createdAt: string): ListedItem =>
      domain(name, { kind: "marked", mark: { ...markOf("web", "prod", 5), createdAt } });
    const volume: ListedItem = {
      ...domain("left.qcow2", {
        kind: "attributed",
        owner: { project: "web", stack: "prod" },
        createdAt: "1",
      }),
      kind: "volume",
      vmName: "left",
      resourceId: "hosts/kvm1.lan/domains/left",
    };
    const base: ListedItem = {
      backend: "kvm1",
      host: "kvm1.lan",
      kind: "base-image",
      name: "egress-base-x.qcow2",
      ownership: { kind: "shared", usedBy: [], createdAt: "2001" },
    };
    const plan = planReaping(
      [
        listing([
          odd("year-2001", "1"),
          odd("february-30", "2026-02-30T00:00:00.000Z"),
          odd("no-millis", "2026-01-01T00:00:00Z"),
          volume,
          base,
          marked("old"),
        ]),
      ],
      [state("web", "prod")],
      { ...OPTIONS, pruneImages: true },
    );
    assert.deepEqual(actions(plan), {
      "year-2001": "keep",
      "february-30": "keep",
      "no-millis": "keep",
      "left.qcow2": "keep",
      "egress-base-x.qcow2": "keep",
      old: "reap",
    });
    assert.equal(
      plan[0]!.why,
      'creation time "1" unreadable (the mark writes 2026-01-31T12:00:00.000Z): never old enough',
    );
    assert.equal(plan[0]!.ageMs, undefined);
    assert.match(plan[3]!.why, /creation time "1" unreadable.*never old enough/);
    assert.match(plan[4]!.why, /creation time "2001" unreadable/);
  });

  it("deletes nothing on a backend that was not listed completely, and still reaps on the others", () => {
    const plan = planReaping(
      [
        listing([marked("proxy-a")], false, "kvm1"),
        listing([marked("proxy-b", "web", "prod", 3)], true, "kvm2"),
      ],
      [state("web", "prod")],
      OPTIONS,
    );
    assert.deepEqual(actions(plan), { "proxy-a": "keep", "proxy-b": "reap" });
    assert.match(plan[0]!.why, /kvm1 was not listed completely/);
  });

  it("reaps a volume only when the config attributes it to a stack whose state was read", () => {
    const volume = (name: string, ownership: ItemOwnership): ListedItem => ({
      ...domain(name, ownership),
      kind: "volume",
      vmName: name.replace(/\.qcow2$/, ""),
      resourceId: `hosts/kvm1.lan/domains/${name.replace(/\.qcow2$/, "")}`,
    });
    const created = new Date(NOW.getTime() - 3 * HOUR).toISOString();
    const plan = planReaping(
      [
        listing([
          volume("left-a.qcow2", {
            kind: "attributed",
            owner: { project: "web", stack: "prod" },
            createdAt: created,
          }),
          volume("left-b.qcow2", { kind: "attributed", owner: { project: "web", stack: "prod" } }),
          volume("theirs.qcow2", { kind: "unmarked" }),
        ]),
      ],
      [state("web", "prod")],
      OPTIONS,
    );
    assert.deepEqual(actions(plan), {
      "left-a.qcow2": "reap",
      "left-b.qcow2": "keep",
      "theirs.qcow2": "keep",
    });
    assert.match(plan[0]!.why, /owner from the config/);
    assert.match(plan[2]!.why, /volumes carry no mark: owner unknown \(see unmarkedVolumes\)/);
  });

  it("prunes an unused base image only with --prune-images, never one an overlay backs onto", () => {
    const created = new Date(NOW.getTime() - 48 * HOUR).toISOString();
    const base = (name: string, usedBy: string[]): ListedItem => ({
      backend: "kvm1",
      host: "kvm1.lan",
      kind: "base-image",
      name,
      ownership: { kind: "shared", usedBy, createdAt: created },
    });
    const items = [
      base("egress-base-unused.qcow2", []),
      base("egress-base-used.qcow2", ["proxy-a.qcow2"]),
    ];
    const without = planReaping([listing(items)], [], OPTIONS);
    assert.deepEqual(actions(without), {
      "egress-base-unused.qcow2": "keep",
      "egress-base-used.qcow2": "keep",
    });
    assert.match(without[0]!.why, /--prune-images/);
    const withPrune = planReaping([listing(items)], [], { ...OPTIONS, pruneImages: true });
    assert.deepEqual(actions(withPrune), {
      "egress-base-unused.qcow2": "reap",
      "egress-base-used.qcow2": "keep",
    });
    assert.match(withPrune[1]!.why, /backs proxy-a\.qcow2/);
    const scoped = planReaping([listing(items)], [], {
      ...OPTIONS,
      pruneImages: true,
      project: "web",
    });
    assert.equal(
      scoped[0]!.action,
      "keep",
      "a sweep limited to one project never prunes shared bases",
    );
  });

  it("keeps an item that any of two states of the same stack references", () => {
    const plan = planReaping(
      [listing([marked("proxy-a"), marked("proxy-b"), marked("proxy-c")])],
      [
        state("web", "prod", ["hosts/kvm1.lan/domains/proxy-a"]),
        state("web", "prod", [], ["proxy-b"]),
      ],
      OPTIONS,
    );
    assert.deepEqual(actions(plan), { "proxy-a": "keep", "proxy-b": "keep", "proxy-c": "reap" });
  });

  it("reads durations and prints ages", () => {
    assert.equal(parseDuration("90m"), 90 * 60_000);
    assert.equal(parseDuration("1h"), HOUR);
    assert.equal(parseDuration("2d"), 48 * HOUR);
    assert.equal(parseDuration("30"), 30_000);
    assert.equal(parseDuration("1 hour"), undefined);
    assert.equal(formatAge(5 * 60_000), "5m");
    assert.equal(formatAge(HOUR + 5 * 60_000), "1h05m");
    assert.equal(formatAge(72 * HOUR), "3d");
  });
});
