// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
/**
 * Create never leaks, for ProxmoxProxy: a create that fails at any step leaves on
 * the node exactly what Pulumi's state records. A failure the simulator makes
 * for real (a task that ends in error, an agent that never answers, a VM
 * removed behind our back) either leaves nothing, or hands the engine a
 * partial create naming everything there is; the next `up` (update) then
 * continues it on the same VMID, and `destroy` (delete) removes it.
 */
import { strict as assert } from "node:assert";
import { isIncompleteCreate, PartialCreateError } from "../../provider/common/partial-create";
import * as provider from "../../provider/proxmox/provider";
import { useSimulator } from "./harness";
import { checked, userInputs, vmsNamed } from "./fixtures";
import type { PveSimulator, TaskType } from "./simulator";

/** What the engine sends: the checked inputs plus the serialized provider. */
const SERIALIZED_PROVIDER = "exports.handler = () => provider; // captured under mocks";

interface Holdings {
  vms: number[];
  seeds: string[];
}

/** What the node holds for one VM name: VMIDs carrying the name, and its seed ISO. */
function holdings(sim: PveSimulator, vmName: string): Holdings {
  const seed = `${vmName}-seed.iso`;
  return {
    vms: vmsNamed(sim, vmName).sort(),
    seeds: sim.isoFile("seeds", seed) === undefined ? [] : [`seeds:iso/${seed}`],
  };
}

/** What state would record after the failure: nothing, or the partial create's VMID and seed. */
function recorded(error: Error): Holdings {
  if (!(error instanceof PartialCreateError)) return { vms: [], seeds: [] };
  const vmid = Number(/qemu\/(\d+)$/.exec(error.id)![1]);
  return { vms: [vmid], seeds: [String(error.properties.seedVolume)] };
}

function show(label: string, held: Holdings): void {
  console.log(`      ${label}: vms=[${held.vms.join(",")}] seeds=[${held.seeds.join(",")}]`);
}

async function rejection(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected a rejection, but the promise resolved");
}

/** The node holds exactly what state records (a seed not uploaded yet is fine: delete skips it). */
function assertHoldsWhatStateRecords(sim: PveSimulator, vmName: string, error: Error): void {
  const held = holdings(sim, vmName);
  const inState = recorded(error);
  show("after ", held);
  show("state ", inState);
  assert.deepEqual(held.vms, inState.vms, "VMs on the node = VMs in state");
  for (const seed of held.seeds)
    assert.ok(inState.seeds.includes(seed), `seed ${seed} on the node is named in state`);
}

describe("ProxmoxProxy create never leaks (failures injected in the simulator)", () => {
  const env = useSimulator({ agentDelayMs: 30 });

  async function request(vmName: string, overrides: Record<string, unknown> = {}) {
    const inputs = await checked(userInputs(env.sim, { vmName, ...overrides }));
    return { ...inputs, __provider: SERIALIZED_PROVIDER };
  }

  function failing(type: TaskType, message: string): void {
    env.sim.options.failTask = (taskType) => (taskType === type ? message : undefined);
  }

  it("a clone task that fails leaves nothing (PVE removes the half-made VM) and nothing in state", async () => {
    const news = await request("noleak-clone");
    show("before", holdings(env.sim, "noleak-clone"));
    failing("qmclone", "clone failed: storage 'local-lvm' is full");
    const error = await rejection(provider.create(news));
    assert.ok(!(error instanceof PartialCreateError), `nothing to record: ${error}`);
    assert.match(error.message, /storage 'local-lvm' is full/);
    await env.sim.settle();
    assertHoldsWhatStateRecords(env.sim, "noleak-clone", error);
    assert.deepEqual(holdings(env.sim, "noleak-clone"), { vms: [], seeds: [] });
  });

  const afterClone: Array<{ step: string; inject: (sim: PveSimulator) => void; why: RegExp }> = [
    {
      step: "seed upload",
      inject: () => failing("imgcopy", "import failed: No space left on device"),
      why: /No space left on device/,
    },
    {
      step: "config write",
      inject: () => failing("qmconfig", "unable to parse value of 'net0'"),
      why: /unable to parse value/,
    },
    {
      step: "start",
      inject: () => failing("qmstart", "bridge 'vmbr9' does not exist"),
      why: /bridge 'vmbr9' does not exist/,
    },
    {
      step: "readiness (the agent never answers)",
      inject: (sim) => (sim.options.agentNeverUp = true),
      why: /timeouts\.readySeconds/,
    },
  ];

  for (const { step, inject, why } of afterClone) {
    it(`a failure at ${step} records the VM; the next up continues it on the same VMID, destroy removes everything`, async () => {
      const vmName = `noleak-${step.split(" ")[0]}`;
      const news = await request(vmName, {
        timeouts: { createSeconds: 20, readySeconds: 1, deleteSeconds: 30 },
      });
      show("before", holdings(env.sim, vmName));
      inject(env.sim);
      const error = await rejection(provider.create(news));
      assert.ok(error instanceof PartialCreateError, `expected a partial create, got ${error}`);
      assert.match(error.message, why);
      await env.sim.settle();
      assertHoldsWhatStateRecords(env.sim, vmName, error);
      // The record can be deleted and continued: it carries the provider and says it is incomplete.
      assert.equal(error.properties.__provider, SERIALIZED_PROVIDER);
      assert.ok(isIncompleteCreate(error.properties));

      // The next `up`: the engine calls update on the record (it has init errors).
      env.sim.options.failTask = undefined;
      env.sim.options.agentNeverUp = false;
      const { outs } = await provider.update(error.id, error.properties, news);
      assert.equal(`nodes/pve/qemu/${String(outs.vmid)}`, error.id, "same VMID, same id");
      assert.equal(outs.state, "running");
      assert.match(String(outs.ip), /^192\.168\./);
      assert.ok(!isIncompleteCreate(outs), "complete now");
      assert.deepEqual(holdings(env.sim, vmName), {
        vms: [outs.vmid as number],
        seeds: [`seeds:iso/${vmName}-seed.iso`],
      });

      await provider.remove(error.id, outs);
      await env.sim.settle();
      show("deleted", holdings(env.sim, vmName));
      assert.deepEqual(holdings(env.sim, vmName), { vms: [], seeds: [] });
    });
  }

  it("a deadline that passes while the clone task runs records the clone; the next up waits for it and continues", async function () {
    this.timeout(120_000);
    const news = await request("noleak-slowclone", {
      timeouts: { createSeconds: 10, readySeconds: 5, deleteSeconds: 30 },
    });
    env.sim.options.taskMs = { qmclone: 12_000 };
    const error = await rejection(provider.create(news));
    assert.ok(error instanceof PartialCreateError, `expected a partial create, got ${error}`);
    assert.match(error.message, /timeouts\.createSeconds/);
    const held = holdings(env.sim, "noleak-slowclone");
    show("after ", held);
    // Mid-clone the VM has no name yet (F8): it is the VMID state records.
    assert.ok(env.sim.vms.has(recorded(error).vms[0]!), "the VMID in state holds the clone");
    env.sim.options.taskMs = undefined;
    const { outs } = await provider.update(error.id, error.properties, news);
    assert.equal(`nodes/pve/qemu/${String(outs.vmid)}`, error.id);
    assert.deepEqual(holdings(env.sim, "noleak-slowclone").vms, [outs.vmid]);
    await provider.remove(error.id, outs);
    await env.sim.settle();
    assert.deepEqual(holdings(env.sim, "noleak-slowclone"), { vms: [], seeds: [] });
  });

  it("destroy of a partial create removes the VM and its seed", async () => {
    const news = await request("noleak-destroy", {
      timeouts: { createSeconds: 20, readySeconds: 1, deleteSeconds: 30 },
    });
    env.sim.options.agentNeverUp = true;
    const error = await rejection(provider.create(news));
    assert.ok(error instanceof PartialCreateError, String(error));
    assertHoldsWhatStateRecords(env.sim, "noleak-destroy", error);
    assert.equal(holdings(env.sim, "noleak-destroy").seeds.length, 1, "the seed was uploaded");
    await provider.remove(error.id, error.properties);
    await env.sim.settle();
    assert.deepEqual(holdings(env.sim, "noleak-destroy"), { vms: [], seeds: [] });
  });

  it("continues a partial create whose VM was removed behind our back on the VMID state records", async () => {
    const news = await request("noleak-gone", {
      timeouts: { createSeconds: 20, readySeconds: 1, deleteSeconds: 30 },
    });
    failing("qmstart", "start failed: out of memory");
    const error = await rejection(provider.create(news));
    assert.ok(error instanceof PartialCreateError, String(error));
    await env.sim.settle();
    const vmid = recorded(error).vms[0]!;
    env.sim.removeVmOutOfBand(vmid);
    env.sim.options.failTask = undefined;
    const { outs } = await provider.update(error.id, error.properties, news);
    assert.equal(outs.vmid, vmid, "cloned again into the VMID state records");
    assert.deepEqual(holdings(env.sim, "noleak-gone").vms, [vmid]);
    await provider.remove(error.id, outs);
    await env.sim.settle();
    assert.deepEqual(holdings(env.sim, "noleak-gone"), { vms: [], seeds: [] });
  });

  it("a continued create that fails again stays recorded, on the same id", async () => {
    const news = await request("noleak-again", {
      timeouts: { createSeconds: 20, readySeconds: 1, deleteSeconds: 30 },
    });
    failing("qmstart", "start failed: out of memory");
    const first = await rejection(provider.create(news));
    assert.ok(first instanceof PartialCreateError, String(first));
    const second = await rejection(provider.update(first.id, first.properties, news));
    assert.ok(second instanceof PartialCreateError, String(second));
    assert.equal(second.id, first.id);
    assert.equal(second.properties.__provider, SERIALIZED_PROVIDER);
    await env.sim.settle();
    assertHoldsWhatStateRecords(env.sim, "noleak-again", second);
    await provider.remove(second.id, second.properties);
    await env.sim.settle();
    assert.deepEqual(holdings(env.sim, "noleak-again"), { vms: [], seeds: [] });
  });
});
