import assert from "node:assert/strict";
import * as provider from "../../provider/proxmox/provider";
import { markFromText } from "../../provider/common/mark";
import { useSimulator } from "./harness";
import { checked, userInputs } from "./fixtures";

describe("ProxmoxProxy lifecycle against the simulator", () => {
  const env = useSimulator({ agentDelayMs: 30 });

  it("creates a fresh proxy: clone, seed, one config write, start, address from the NIC whose MAC is net0", async () => {
    const inputs = await checked(
      userInputs(env.sim, { tags: ["Web", "b"], cores: 2, memoryMiB: 2048 }),
    );
    const { id, outs } = await provider.create(inputs);
    const vmid = outs.vmid;
    assert.equal(id, `nodes/pve/qemu/${vmid}`);
    const vm = env.sim.vms.get(vmid)!;
    assert.equal(vm.config.name, inputs.vmName);
    assert.equal(vm.status, "running");
    assert.equal(vm.config.cores, "2");
    assert.equal(vm.config.memory, "2048");
    assert.equal(vm.config.ide2, `seeds:iso/${inputs.vmName}-seed.iso,media=cdrom`);
    assert.equal(vm.config.boot, "order=scsi0;ide2");
    assert.equal(vm.config.tags, "b;egress-proxies;web");
    const mark = markFromText(vm.config.description);
    assert.equal(mark.kind, "marked");
    assert.equal(outs.mac, /=([0-9A-F:]{17})/.exec(vm.config.net0)![1].toLowerCase());
    assert.match(outs.ip ?? "", /^192\.168\./);
    assert.equal(outs.state, "running");
    assert.ok(env.sim.isoFile("seeds", `${inputs.vmName}-seed.iso`));
  });
});
