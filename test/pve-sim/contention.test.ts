// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import assert from "node:assert/strict";
import * as provider from "../../provider/proxmox/provider";
import { useSimulator } from "./harness";
import { checked, userInputs } from "./fixtures";

describe("ProxmoxProxy: ten parallel creates in one pulumi up", () => {
  // Clones hold the storage lock long enough that some waiters time out (got timeout).
  const env = useSimulator({
    agentDelayMs: 20,
    taskMs: { qmclone: 60 },
    storageLockHoldMs: 80,
    storageLockTimeoutMs: 200,
  });

  it("never clash on VMIDs and retry storage-lock timeouts instead of surfacing them", async () => {
    // A narrow range makes name hashes collide, so the F4 path is exercised too.
    const inputs = await Promise.all(
      Array.from({ length: 10 }, (_, index) =>
        checked(
          userInputs(env.sim, {
            vmName: `proxy-par-${index}`,
            vmidRange: { first: 20000, last: 20011 },
            timeouts: { createSeconds: 60, readySeconds: 10, deleteSeconds: 30 },
          }),
        ),
      ),
    );
    const results = await Promise.all(inputs.map((input) => provider.create(input)));
    const vmids = results.map((result) => result.outs.vmid);
    assert.equal(new Set(vmids).size, 10, `VMIDs clash: ${vmids.join(",")}`);
    for (const [index, result] of results.entries()) {
      const vm = env.sim.vms.get(result.outs.vmid)!;
      assert.equal(vm.config.name, `proxy-par-${index}`);
      assert.equal(vm.status, "running");
    }
    const lockTimeouts = [...env.sim.tasks.values()].filter(
      (task) =>
        task.type === "qmclone" &&
        /pve-storage-local-lvm' - got timeout/.test(task.exitstatus ?? ""),
    );
    assert.ok(lockTimeouts.length > 0, "the test must actually produce storage-lock contention");
    assert.equal(env.sim.vms.size, 11);
  });
});
