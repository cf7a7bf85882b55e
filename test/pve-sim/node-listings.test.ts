// Fn name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import assert from "node:assert/strict";
import { Deadline } from "../../provider/common/deadline";
import { NotFoundError, PermanentError } from "../../provider/common/errors";
import { seedIsPresent } from "../../provider/proxmox/damage";
import { waitForTask } from "../../provider/proxmox/tasks";
import { statusFromNodeIndex } from "../../provider/proxmox/vm";
import { useSimulator } from "./harness";
import { PVE9_PROXY_PRIVILEGES } from "./simulator";

/**
 * Read's status and seed come from listings shared per node
 * (provider/proxmox/node-listings.ts): asked once for many Reads, never
 * handed out after this process changed the node, and a VM the index lacks
 * is asked as before the index was shared. Each test has a simulator of its
 * own (its own endpoint), so no listing of another test is in hand.
 */
const deadline = () => new Deadline(10_000, "timeouts.readSeconds");

describe("pve-sim: node listings shared by Reads", () => {
  const env = useSimulator({ agentDelayMs: 20 });
  const asked = (line: string) => env.sim.requestLog.filter((entry) => entry === line).length;
  const INDEX = "GET /api2/json/nodes/pve/qemu";

  it("answers many Reads of one node with one VM index and one seed listing, paused seen through qmpstatus (F25)", async () => {
    for (const vmid of [501, 502, 503]) env.sim.addForeignVm(vmid, `vm-${vmid}`);
    env.sim.pauseVm(502);
    env.sim.putIsoFile("seeds", "vm-501-seed.iso", Buffer.from("seed"));
    const client = env.client();
    const statuses = await Promise.all(
      [501, 502, 503, 501].map((vmid) =>
        statusFromNodeIndex(client, { node: "pve", vmid }, deadline()),
      ),
    );
    assert.deepEqual(
      statuses.map((status) => `${status.status}/${status.qmpstatus}`),
      ["running/running", "running/paused", "running/running", "running/running"],
    );
    const seeds = await Promise.all(
      ["vm-501-seed.iso", "vm-502-seed.iso"].map((file) =>
        seedIsPresent(env.client(), "pve", `seeds:iso/${file}`, deadline()),
      ),
    );
    assert.deepEqual(seeds, [true, false]);
    assert.equal(asked(INDEX), 1);
    assert.equal(asked("GET /api2/json/nodes/pve/storage/seeds/content"), 1);
    assert.equal(asked("GET /api2/json/nodes/pve/qemu/501/status/current"), 0);
  });

  it("asks again after a write this process sent to the node, and after a task it waited for there", async () => {
    env.sim.addForeignVm(511, "vm-511");
    const client = env.client();
    const ref = { node: "pve", vmid: 511 };
    assert.equal((await statusFromNodeIndex(client, ref, deadline())).status, "running");
    const stop = await client.post<string>("/nodes/pve/qemu/511/status/stop");
    assert.equal(asked(INDEX), 1);
    // Asked while the stop runs: the write has been forgotten, the task has not ended.
    await statusFromNodeIndex(client, ref, deadline());
    assert.equal(asked(INDEX), 2);
    await waitForTask(client, stop, { deadline: deadline() });
    assert.equal((await statusFromNodeIndex(client, ref, deadline())).status, "stopped");
    assert.equal(asked(INDEX), 3, "the task's end forgot the listing asked while it ran");
  });

  it("a VM the index lacks is asked status/current: gone is F2's NotFound, another token's VM its 403", async () => {
    const gone = statusFromNodeIndex(env.client(), { node: "pve", vmid: 599 }, deadline());
    await assert.rejects(gone, NotFoundError);
    assert.equal(asked(INDEX), 1);
    assert.equal(asked("GET /api2/json/nodes/pve/qemu/599/status/current"), 1);
  });

  it("a VM hidden from the token by the index gets status/current's 403, classified as before", async () => {
    env.sim.addForeignVm(521, "vm-521");
    env.sim.tokens.set("narrow@pve!t", {
      id: "narrow@pve!t",
      secret: "s3cr3t",
      privileges: PVE9_PROXY_PRIVILEGES,
      pathPrivileges: { "/vms/521": ["VM.PowerMgmt"] },
    });
    const hidden = statusFromNodeIndex(
      env.client("narrow@pve!t=s3cr3t"),
      { node: "pve", vmid: 521 },
      deadline(),
    );
    await assert.rejects(hidden, (error: unknown) => {
      assert.ok(error instanceof PermanentError, String(error));
      assert.match(error.message, /VM\.Audit/);
      return true;
    });
    // Another token's index is its own: the full token's Read still sees the VM.
    const seen = await statusFromNodeIndex(env.client(), { node: "pve", vmid: 521 }, deadline());
    assert.equal(seen.status, "running");
    assert.equal(asked(INDEX), 2);
  });
});
