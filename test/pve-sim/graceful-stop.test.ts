/**
 * ProxmoxProxy `running: false` against the simulator: the VM is shut down
 * (PVE's `status/shutdown`, ACPI or agent) and stopped hard only when the
 * guest does not go in its grace period (a hung guest: the shutdown task times
 * out) or PVE refuses to shut it down (paused). F24 in docs/proxmox.md.
 */
import assert from "node:assert/strict";
import * as provider from "../../provider/proxmox/provider";
import { useSimulator } from "./harness";
import { checked, userInputs } from "./fixtures";
import { PveSimulator } from "./simulator";

/**
 * Creates a running proxy, lets `before` do to its VM what the test needs (hang its guest, pause it),
 * then stops it through `update` and returns the power calls and tasks that made, in order.
 */
async function stopThroughUpdate(sim: PveSimulator, before: (vmid: number) => void = () => {}) {
  const inputs = await checked(userInputs(sim));
  const { id, outs } = await provider.create(inputs);
  const vmid = Number(outs.vmid);
  before(vmid);
  const news = await checked(userInputs(sim, { vmName: inputs.vmName, running: false }), {
    ...outs,
  });
  const requestsBefore = sim.requestLog.length;
  const tasksBefore = sim.tasks.size;
  const { outs: updated } = await provider.update(id, { ...outs }, news);
  return {
    updated,
    vm: sim.vms.get(vmid)!,
    powerCalls: sim.requestLog
      .slice(requestsBefore)
      .filter((line) => /\/status\/(shutdown|stop|start)$/.test(line))
      .map((line) => line.replace(/^POST .*\/status\//, "")),
    tasks: [...sim.tasks.values()]
      .slice(tasksBefore)
      .map((task) => `${task.type} ${task.exitstatus}`),
  };
}

describe("ProxmoxProxy running: false shuts the VM down before it stops it (simulator)", () => {
  const env = useSimulator({ agentDelayMs: 30, shutdownSecondMs: 5 });

  it("a guest that powers off: one shutdown task, no hard stop", async () => {
    const { updated, vm, powerCalls, tasks } = await stopThroughUpdate(env.sim);
    assert.deepEqual(powerCalls, ["shutdown"]);
    assert.deepEqual(tasks, ["qmshutdown OK"]);
    assert.equal(vm.status, "stopped");
    assert.equal(updated.state, "stopped");
    assert.equal(updated.endpoint, null);
  });

  it("a hung guest: the shutdown times out, then the VM is stopped", async () => {
    const { updated, vm, powerCalls, tasks } = await stopThroughUpdate(env.sim, (vmid) =>
      env.sim.hangGuest(vmid),
    );
    assert.deepEqual(powerCalls, ["shutdown", "stop"]);
    assert.deepEqual(tasks, ["qmshutdown VM quit/powerdown failed - got timeout", "qmstop OK"]);
    assert.equal(vm.status, "stopped");
    assert.equal(updated.state, "stopped");
  });

  it("a paused VM: PVE refuses the shutdown before any task, the VM is stopped", async () => {
    const { vm, powerCalls, tasks } = await stopThroughUpdate(env.sim, (vmid) =>
      env.sim.pauseVm(vmid),
    );
    assert.deepEqual(powerCalls, ["shutdown", "stop"]);
    assert.deepEqual(tasks, ["qmstop OK"]);
    assert.equal(vm.status, "stopped");
  });
});
