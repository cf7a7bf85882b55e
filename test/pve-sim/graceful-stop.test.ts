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

async function runningProxy(sim: PveSimulator) {
  const inputs = await checked(userInputs(sim));
  const created = await provider.create(inputs);
  return { inputs, ...created };
}

/** Stops the proxy through `update` and returns the power calls and tasks that it made, in order. */
async function stopThroughUpdate(sim: PveSimulator) {
  const { id, outs, inputs } = await runningProxy(sim);
  const news = await checked(userInputs(sim, { vmName: inputs.vmName, running: false }), {
    ...outs,
  });
  const requestsBefore = sim.requestLog.length;
  const tasksBefore = sim.tasks.size;
  const { outs: updated } = await provider.update(id, { ...outs }, news);
  return {
    updated,
    vm: sim.vms.get(Number(outs.vmid))!,
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
    const inputs = await checked(userInputs(env.sim));
    const { id, outs } = await provider.create(inputs);
    env.sim.hangGuest(Number(outs.vmid));
    const news = await checked(userInputs(env.sim, { vmName: inputs.vmName, running: false }), {
      ...outs,
    });
    const tasksBefore = env.sim.tasks.size;
    const { outs: updated } = await provider.update(id, { ...outs }, news);
    assert.deepEqual(
      [...env.sim.tasks.values()]
        .slice(tasksBefore)
        .map((task) => `${task.type} ${task.exitstatus}`),
      ["qmshutdown VM quit/powerdown failed - got timeout", "qmstop OK"],
    );
    assert.equal(env.sim.vms.get(Number(outs.vmid))!.status, "stopped");
    assert.equal(updated.state, "stopped");
  });

  it("a paused VM: PVE refuses the shutdown, the VM is stopped", async () => {
    const inputs = await checked(userInputs(env.sim));
    const { id, outs } = await provider.create(inputs);
    env.sim.pauseVm(Number(outs.vmid));
    const news = await checked(userInputs(env.sim, { vmName: inputs.vmName, running: false }), {
      ...outs,
    });
    const requestsBefore = env.sim.requestLog.length;
    await provider.update(id, { ...outs }, news);
    assert.deepEqual(
      env.sim.requestLog
        .slice(requestsBefore)
        .filter((line) => /\/status\/(shutdown|stop)$/.test(line))
        .map((line) => line.replace(/^POST .*\/status\//, "")),
      ["shutdown", "stop"],
    );
    assert.equal(env.sim.vms.get(Number(outs.vmid))!.status, "stopped");
  });
});
