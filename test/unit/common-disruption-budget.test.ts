/**
 * The disruption budget (provider/common/disruption-budget.ts and
 * disruption-rules.ts): the ledger's own rules, then each VM resource's real
 * check, diff and step wrappers in one "deployment" (a fresh ledger), as the
 * engine calls them: members asking for a replacement or a restart beyond
 * `maxUnavailable` are deferred and change nothing; what asked stays, so a
 * later deployment gets to them; a delete nobody planned waits its turn.
 */
import { strict as assert } from "node:assert";
import { Deadline } from "../../provider/common/deadline";
import {
  budgetedMember,
  disruptionLedger,
  DisruptionLedger,
} from "../../provider/common/disruption-budget";
import {
  createReleasingBudget,
  deleteWithinBudget,
  updateReleasingBudget,
} from "../../provider/common/disruption-rules";
import { EGRESS_PROBLEM_KEY } from "../../provider/common/egress-recheck";
import * as kvm from "../../provider/kvm/provider";
import * as proxmox from "../../provider/proxmox/provider";
import { KVM_MINIMAL_INPUTS, PROXMOX_MINIMAL_INPUTS } from "../support/vm-inputs";

type Props = Record<string, unknown>;
const budget = { group: "crawl", maxUnavailable: 1 };
/** What a refresh records for a proxy that did not answer its re-check. */
const SILENT = {
  [EGRESS_PROBLEM_KEY]: { kind: "unanswered", reason: "timeout", since: "2026-12-05T00:00:00Z" },
};
const ownerOf = (resource: string) => ({ project: "p", stack: "s", resource });
const member = (resource: string, maxUnavailable = 1) =>
  budgetedMember({
    owner: ownerOf(resource),
    disruptionBudget: { group: "crawl", maxUnavailable },
  })!;

describe("disruption budget: the ledger", () => {
  it("grants up to maxUnavailable members of a group, again to a holder, and frees a grant when its step ends", () => {
    const ledger = new DisruptionLedger();
    const [a, b, c] = [member("a", 2), member("b", 2), member("c", 2)];
    assert.deepEqual(ledger.admit(a, "delete"), { granted: true, holders: ["a"] });
    assert.deepEqual(ledger.admit(b, "update"), { granted: true, holders: ["a", "b"] });
    assert.deepEqual(ledger.admit(c, "delete"), { granted: false, holders: ["a", "b"] });
    // Asking again is free for a holder.
    assert.equal(ledger.admit(a, "delete").granted, true);
    // Only the step the grant waits for frees it (a replaced VM's create does not, its delete does)...
    ledger.release(a, "create");
    assert.equal(ledger.holds(a), true);
    ledger.release(a, "delete");
    assert.equal(ledger.holds(a), false);
    // ...or any step of it that failed.
    ledger.release(b, "create", true);
    assert.equal(ledger.holds(b), false);
    assert.equal(ledger.admit(c, "delete").granted, true);
  });

  it("keeps groups and stacks apart", () => {
    const ledger = new DisruptionLedger();
    const other = budgetedMember({
      owner: ownerOf("b"),
      disruptionBudget: { group: "other", maxUnavailable: 1 },
    })!;
    const otherStack = budgetedMember({
      owner: { project: "p", stack: "prod", resource: "c" },
      disruptionBudget: budget,
    })!;
    assert.equal(ledger.admit(member("a"), "delete").granted, true);
    assert.equal(ledger.admit(other, "delete").granted, true);
    assert.equal(ledger.admit(otherStack, "delete").granted, true);
    assert.equal(ledger.admit(member("d"), "delete").granted, false);
  });

  it("no budget, or one that is not valid, is no member of any group", () => {
    assert.equal(budgetedMember({ owner: ownerOf("a") }), undefined);
    assert.equal(
      budgetedMember({ owner: ownerOf("a"), disruptionBudget: { group: "g", maxUnavailable: 0 } }),
      undefined,
    );
  });

  it("suspects the runner when more than half of at least three re-checked members gave no answer", () => {
    const ledger = new DisruptionLedger();
    const note = (name: string, silent: boolean) => ledger.noteRecheck(member(name), silent);
    note("a", true);
    note("b", true);
    assert.equal(ledger.runnerSuspected(member("a")), undefined, "two members say nothing yet");
    note("c", false);
    assert.deepEqual(ledger.runnerSuspected(member("a")), { silent: 2, rechecked: 3 });
    note("d", false);
    assert.equal(ledger.runnerSuspected(member("a")), undefined, "half is not most");
    // A member re-checked again counts once, as its last answer.
    note("a", false);
    note("d", true);
    assert.equal(ledger.runnerSuspected(member("a")), undefined);
  });

  it("a delete nobody planned waits for a free place, and goes anyway (said) once its wait is over", async () => {
    const ledger = new DisruptionLedger();
    const [a, b, c] = [member("a"), member("b"), member("c")];
    ledger.admit(a, "delete");
    const waited: string[][] = [];
    let done = false;
    const waiting = ledger
      .admitDelete(b, Deadline.afterSeconds(30, "t"), (holders) => waited.push(holders))
      .then((outcome) => ((done = true), outcome));
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.equal(done, false, "the delete waits while a holds the only place");
    assert.deepEqual(waited, [["a"]]);
    ledger.release(a, "delete");
    assert.deepEqual(await waiting, { overran: false });
    assert.equal(ledger.holds(b), true);
    // b holds the place and never frees it: c waits out its deadline, then goes.
    assert.deepEqual(
      await ledger.admitDelete(c, Deadline.afterSeconds(0.2, "t"), () => undefined),
      { overran: true },
    );
  });
});

const backends = [
  {
    name: "KvmProxy",
    raw: (resource: string): Props => ({
      owner: ownerOf(resource),
      ...KVM_MINIMAL_INPUTS,
      userData: "#cloud-config\n",
      egressRecheck: true,
      disruptionBudget: budget,
    }),
    provider: kvm,
    id: "kvm1.lan/m-0",
  },
  {
    name: "ProxmoxProxy",
    raw: (resource: string): Props => ({
      owner: ownerOf(resource),
      ...PROXMOX_MINIMAL_INPUTS,
      userData: "#cloud-config\n",
      egressRecheck: true,
      disruptionBudget: budget,
    }),
    provider: proxmox,
    id: "nodes/pve/qemu/101",
  },
];

for (const backend of backends)
  describe(`disruption budget: ${backend.name}'s check, diff and steps`, () => {
    const { provider } = backend;
    beforeEach(() => disruptionLedger.reset());
    after(() => disruptionLedger.reset());

    /** The state create would have written for member `name`, plus `outputs`. */
    async function created(name: string, extra: Props = {}, outputs: Props = {}): Promise<Props> {
      const checked = await provider.check({}, { ...backend.raw(name), ...extra });
      assert.deepEqual(checked.failures, []);
      return { ...checked.inputs, host: "h", state: "running", ...outputs };
    }
    async function plan(olds: Props, program: Props) {
      const checked = await provider.check(olds, program);
      assert.deepEqual(checked.failures, []);
      const decision = await provider.diff("id", olds, checked.inputs);
      return { inputs: checked.inputs, changes: decision.changes, replaces: decision.replaces };
    }

    it("a new rotate text on every member: one is replaced, the others keep their name and plan nothing", async () => {
      const olds = await Promise.all(["m-0", "m-1", "m-2"].map((name) => created(name)));
      const plans = [];
      for (const [index, old] of olds.entries())
        plans.push(await plan(old, { ...backend.raw(`m-${index}`), rotation: "2026-12-05" }));
      assert.equal(plans[0]!.changes, true);
      assert.ok(plans[0]!.replaces?.includes("rotation"));
      assert.notEqual(plans[0]!.inputs.vmName, olds[0]!.vmName, "the granted one gets a new name");
      for (const [index, deferred] of plans.slice(1).entries()) {
        assert.deepEqual([deferred.changes, deferred.replaces], [false, []]);
        // What state keeps for it is the old text and name: the next deployment asks again.
        assert.equal(deferred.inputs.rotation, undefined);
        assert.equal(deferred.inputs.vmName, olds[index + 1]!.vmName);
      }
      // The next deployment, once the first replacement is done: the second member goes.
      disruptionLedger.reset();
      const second = await plan(olds[1]!, { ...backend.raw("m-1"), rotation: "2026-12-05" });
      assert.ok(second.replaces?.includes("rotation"));
    });

    it("state asking for it (burned exit addresses): one replaced, the others only what changes in place", async () => {
      const burned = { "203.0.113.9": "burned" };
      const olds = await Promise.all(
        ["m-0", "m-1"].map((name) => created(name, {}, { egressIp: "203.0.113.9" })),
      );
      const first = await plan(olds[0]!, { ...backend.raw("m-0"), rotateEgress: burned });
      assert.deepEqual(first.replaces, ["rotateEgress"]);
      // m-1 is deferred; a change that only updates in place (readiness) still goes through.
      const second = await plan(olds[1]!, {
        ...backend.raw("m-1"),
        rotateEgress: burned,
        readiness: { mode: "none" },
      });
      assert.deepEqual([second.changes, second.replaces], [true, []]);
    });

    it("silent proxies: the first is restarted, the others are left alone in this deployment", async () => {
      const olds = await Promise.all(
        ["m-0", "m-1", "m-2"].map((name) => created(name, {}, SILENT)),
      );
      const plans = [];
      for (const [index, old] of olds.entries())
        plans.push(await plan(old, backend.raw(`m-${index}`)));
      assert.deepEqual(
        plans.map((planned) => planned.changes),
        [true, false, false],
      );
    });

    it("the end of a step frees its grant: a replaced VM's delete, a restart's update, a failed create", async () => {
      const a = member("m-0");
      const steps = {
        create: createReleasingBudget(async () => ({ id: "x" })),
        failingCreate: createReleasingBudget(async () => {
          throw new Error("no room on the host");
        }),
        update: updateReleasingBudget(async () => ({ outs: {} })),
        remove: deleteWithinBudget(async () => undefined),
      };
      const props = await created("m-0");
      disruptionLedger.admit(a, "delete");
      await steps.create(props);
      assert.equal(disruptionLedger.holds(a), true, "the new VM is up; the old one is still to go");
      await steps.remove("id", props);
      assert.equal(disruptionLedger.holds(a), false);
      disruptionLedger.admit(a, "update");
      await steps.update("id", props, props);
      assert.equal(disruptionLedger.holds(a), false);
      disruptionLedger.admit(a, "delete");
      await assert.rejects(steps.failingCreate(props), /no room/);
      assert.equal(disruptionLedger.holds(a), false, "a failed replacement frees its place");
    });

    it("a scale-down delete waits while the budget is held, then goes", async () => {
      const holder = member("m-0");
      disruptionLedger.admit(holder, "delete");
      const removed: string[] = [];
      const remove = deleteWithinBudget(async (id: string) => void removed.push(id));
      const gone = remove("vm-3", await created("m-3"));
      await new Promise((resolve) => setTimeout(resolve, 50));
      assert.deepEqual(removed, []);
      disruptionLedger.release(holder, "delete");
      await gone;
      assert.deepEqual(removed, ["vm-3"]);
      assert.equal(disruptionLedger.holds(member("m-3")), false);
    });

    /** A delete of `props` as the engine runs it, with the VM deletion it reaches recorded. */
    function deleting(props: Props) {
      const removed: string[] = [];
      const started = Date.now();
      const done = deleteWithinBudget(async (id: string) => void removed.push(id))(
        "vm",
        props,
      ).then(() => Date.now() - started);
      return { removed, done };
    }
    const drained = (props: Props, drainSeconds: number): Props => ({
      ...props,
      disruptionBudget: { ...budget, drainSeconds },
    });

    it("drain: a member that carried traffic stays up drainSeconds before its VM goes, scaled down or replaced new-VM-first", async () => {
      for (const grant of [undefined, "delete"] as const) {
        disruptionLedger.reset();
        const props = drained(await created("m-1"), 1);
        if (grant !== undefined) disruptionLedger.admit(member("m-1"), grant);
        const { removed, done } = deleting(props);
        await new Promise((resolve) => setTimeout(resolve, 400));
        assert.deepEqual(removed, [], `still draining (${grant ?? "scale-down"})`);
        // Node may fire a timer a millisecond early by the wall clock.
        const took = await done;
        assert.ok(took >= 990, `deleted only after the drain (${took} ms)`);
        assert.deepEqual(removed, ["vm"]);
        assert.equal(
          disruptionLedger.holds(member("m-1")),
          false,
          "the drain held its place until the delete",
        );
      }
    });

    it("drain: none for a member that carried no traffic, a replacement that deletes first, or `pulumi destroy`", async () => {
      // An hour's drain: any of these that drained would time the test out.
      for (const outputs of [SILENT, { state: "stopped" }]) {
        const { removed, done } = deleting(drained(await created("m-1", {}, outputs), 3600));
        await done;
        assert.deepEqual(removed, ["vm"]);
      }
      const deleteFirst = drained(await created("m-2"), 3600);
      disruptionLedger.admit(member("m-2"), "create");
      await deleting(deleteFirst).done;
      const destroyed = drained(await created("m-3"), 3600);
      disruptionLedger.reset();
      const { removed, done } = deleting(destroyed);
      await done;
      assert.deepEqual(removed, ["vm"]);
    });

    it("a new drainSeconds is an in-place update that reaches state and touches no VM", async () => {
      const olds = drained(await created("m-0"), 30);
      const program = { ...backend.raw("m-0"), disruptionBudget: { ...budget, drainSeconds: 5 } };
      const planned = await plan(olds, program);
      assert.deepEqual([planned.changes, planned.replaces], [true, []]);
      // No host is reachable here (kvm1.lan, no Proxmox API): an update that went to one would fail.
      const { outs } = await provider.update(backend.id, olds, planned.inputs);
      assert.deepEqual(outs.disruptionBudget, { ...budget, drainSeconds: 5 });
    });

    it("`pulumi destroy` (no member of the pool registered in this deployment): deletes do not wait", async () => {
      const props = await created("m-3");
      disruptionLedger.reset();
      disruptionLedger.admit(member("m-0"), "delete");
      const removed: string[] = [];
      await deleteWithinBudget(async (id: string) => void removed.push(id))("vm-3", props);
      assert.deepEqual(removed, ["vm-3"]);
    });
  });
