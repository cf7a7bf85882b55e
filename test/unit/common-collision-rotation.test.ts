/**
 * Collision rotation (provider/common/collision-rotation.ts) through each VM
 * resource's real check and diff, as one `pulumi up --refresh` asks them in
 * one provider process: reads note where each member leaves from (here the
 * ledger is told what a refresh found), then check gives the younger member
 * of a shared address an entry for it, and diff replaces it, old VM first.
 */
import { strict as assert } from "node:assert";
import { budgetedMember, disruptionLedger } from "../../provider/common/disruption-budget";
import { memberExitOf, olderSharing } from "../../provider/common/collision-rotation";
import { isYounger } from "../../provider/common/egress-rotation";
import * as kvm from "../../provider/kvm/provider";
import * as proxmox from "../../provider/proxmox/provider";
import { KVM_MINIMAL_INPUTS, PROXMOX_MINIMAL_INPUTS } from "../support/vm-inputs";

type Props = Record<string, unknown>;
const SHARED = "203.0.113.7";
const budget = { group: "crawl", maxUnavailable: 1, onCollision: "rotate" };
const ownerOf = (resource: string) => ({ project: "p", stack: "s", resource });

describe("collision rotation: who is younger, what a refresh notes", () => {
  it("the later creation is younger; at the same moment, the later name", () => {
    const a = { name: "crawl-kvm1-0", createdAt: "2026-11-01T00:00:00Z" };
    const b = { name: "crawl-kvm1-1", createdAt: "2026-11-02T00:00:00Z" };
    assert.equal(isYounger(b, a), true);
    assert.equal(isYounger(a, b), false);
    assert.equal(isYounger({ ...a, createdAt: b.createdAt }, b), false, "same time: by name");
    assert.equal(isYounger(b, { ...a, createdAt: b.createdAt }), true);
  });

  it("notes running members with an exit address, canonical; picks the oldest sibling that shares", () => {
    assert.deepEqual(
      memberExitOf({
        state: "running",
        egressIp: SHARED,
        egressIpv6: "2001:DB8::0:7",
        createdAt: "t",
      }),
      { addresses: [SHARED, "2001:db8::7"], createdAt: "t" },
    );
    assert.equal(memberExitOf({ state: "stopped", egressIp: SHARED, createdAt: "t" }), undefined);
    assert.equal(memberExitOf({ state: "running", egressIp: null, createdAt: "t" }), undefined);
    const exits = new Map([
      ["c", { addresses: [SHARED], createdAt: "2026-11-03T00:00:00Z" }],
      ["b", { addresses: [SHARED], createdAt: "2026-11-02T00:00:00Z" }],
      ["a", { addresses: [SHARED], createdAt: "2026-11-01T00:00:00Z" }],
      ["d", { addresses: ["198.51.100.9"], createdAt: "2026-11-04T00:00:00Z" }],
    ]);
    assert.deepEqual(olderSharing("c", exits), { address: SHARED, older: "a" });
    assert.deepEqual(olderSharing("b", exits), { address: SHARED, older: "a" });
    assert.equal(olderSharing("a", exits), undefined, "the oldest stays");
    assert.equal(olderSharing("d", exits), undefined);
  });
});

const backends = [
  { name: "KvmProxy", provider: kvm, minimal: KVM_MINIMAL_INPUTS },
  { name: "ProxmoxProxy", provider: proxmox, minimal: PROXMOX_MINIMAL_INPUTS },
];

for (const backend of backends)
  describe(`collision rotation: ${backend.name}'s check and diff in one up --refresh`, () => {
    const { provider } = backend;
    beforeEach(() => disruptionLedger.reset());
    after(() => disruptionLedger.reset());

    const program = (resource: string, extra: Props = {}): Props => ({
      owner: ownerOf(resource),
      ...backend.minimal,
      userData: "#cloud-config\n",
      disruptionBudget: budget,
      rotateEgress: {},
      ...extra,
    });
    /** State as create left it, and what this deployment's refresh found of it. */
    async function refreshed(
      resource: string,
      createdAt: string,
      extra: Props = {},
    ): Promise<Props> {
      const checked = await provider.check({}, program(resource, extra));
      assert.deepEqual(checked.failures, []);
      const state = { ...checked.inputs, host: "h", state: "running", egressIp: SHARED, createdAt };
      disruptionLedger.noteExit(budgetedMember(state)!, memberExitOf(state)!);
      return state;
    }
    async function plan(olds: Props, inputs: Props) {
      const checked = await provider.check(olds, inputs);
      assert.deepEqual(checked.failures, []);
      const decision = await provider.diff("id", olds, checked.inputs);
      return { inputs: checked.inputs, ...decision };
    }

    it("the younger of two on one address gets the entry and is replaced, old VM first; the older plans nothing", async () => {
      const older = await refreshed("crawl-0", "2026-11-01T00:00:00Z");
      const younger = await refreshed("crawl-1", "2026-11-02T00:00:00Z");
      const kept = await plan(older, program("crawl-0"));
      assert.deepEqual([kept.changes, kept.replaces], [false, []]);
      const rotated = await plan(younger, program("crawl-1"));
      assert.deepEqual(rotated.inputs.rotateEgress, { [SHARED]: "shared with crawl-0" });
      assert.ok(rotated.replaces?.includes("rotateEgress"), String(rotated.replaces));
      assert.equal(rotated.deleteBeforeReplace, true);
    });

    it("a new VM made for that address that lands on it again (one NAT) is not replaced again", async () => {
      await refreshed("crawl-0", "2026-11-01T00:00:00Z");
      const remade = await refreshed("crawl-1", "2026-12-05T00:00:00Z", {
        rotateEgress: { [SHARED]: "shared with crawl-0" },
      });
      const again = await plan(remade, program("crawl-1"));
      assert.deepEqual([again.changes, again.replaces], [false, []]);
    });

    it("nothing without a refresh in this deployment, without onCollision, or against the user's own entry", async () => {
      const olds = {
        ...(await provider.check({}, program("crawl-1"))).inputs,
        host: "h",
        state: "running",
        egressIp: SHARED,
      };
      assert.deepEqual((await plan(olds, program("crawl-1"))).replaces, [], "no refresh: no notes");
      await refreshed("crawl-0", "2026-11-01T00:00:00Z", {
        disruptionBudget: { group: "crawl", maxUnavailable: 1 },
      });
      const plain = await refreshed("crawl-1", "2026-11-02T00:00:00Z", {
        disruptionBudget: { group: "crawl", maxUnavailable: 1 },
      });
      assert.deepEqual(
        (
          await plan(
            plain,
            program("crawl-1", { disruptionBudget: { group: "crawl", maxUnavailable: 1 } }),
          )
        ).replaces,
        [],
      );
      disruptionLedger.reset();
      await refreshed("crawl-0", "2026-11-01T00:00:00Z");
      const own = await refreshed("crawl-1", "2026-11-02T00:00:00Z", {
        rotateEgress: { [SHARED]: "burned" },
      });
      const planned = await plan(own, program("crawl-1", { rotateEgress: { [SHARED]: "burned" } }));
      assert.deepEqual(
        planned.inputs.rotateEgress,
        { [SHARED]: "burned" },
        "the user's text stays",
      );
      assert.deepEqual(planned.replaces, []);
    });

    it("two younger members on one address and maxUnavailable 1: one replaced now, the other deferred unchanged", async () => {
      await refreshed("crawl-0", "2026-11-01T00:00:00Z");
      const [first, second] = [
        await refreshed("crawl-1", "2026-11-02T00:00:00Z"),
        await refreshed("crawl-2", "2026-11-03T00:00:00Z"),
      ];
      assert.ok((await plan(first, program("crawl-1"))).replaces?.includes("rotateEgress"));
      const deferred = await plan(second, program("crawl-2"));
      assert.deepEqual([deferred.changes, deferred.replaces], [false, []]);
    });
  });
