// Fn names the Proxmox behaviours listed in docs/proxmox.md, section 9.
/**
 * A token the server refuses (401, F22) or that lacks a privilege (403, F17)
 * ends the call at once: the refused request is the last one the simulator
 * sees, and the error is Permanent and names the token id (never its secret)
 * and, for a 403, the privilege and path PVE named.
 */
import assert from "node:assert/strict";
import { isPermanent } from "../../provider/common/errors";
import * as provider from "../../provider/proxmox/provider";
import { checked, userInputs } from "./fixtures";
import { useSimulator } from "./harness";
import { PveSimulator } from "./simulator";

const SECRET = "0d1e2f3a-rejected-secret-value";

async function failure(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected a rejection, but the promise resolved");
}

/** The requests the simulator saw while `work` ran. */
async function requestsDuring(
  sim: PveSimulator,
  work: () => Promise<unknown>,
): Promise<{ requests: string[]; error: Error }> {
  const before = sim.requestLog.length;
  const error = await failure(work());
  return { requests: sim.requestLog.slice(before), error };
}

describe("pve-sim: a rejected credential stops at once", () => {
  const env = useSimulator({
    agentDelayMs: 5,
    tokens: [
      { id: "automation@pve!egress", secret: "right-secret-0000", privileges: "all" },
      // Everything the flow needs except cloning the template.
      { id: "proxy@pve!noclone", secret: SECRET, privileges: ["VM.Audit", "VM.Allocate"] },
    ],
  });

  it("F22: create with a wrong secret sends exactly one request and fails Permanent, naming the token id", async () => {
    const inputs = await checked(
      userInputs(env.sim, { apiToken: `automation@pve!egress=${SECRET}` }),
    );
    const { requests, error } = await requestsDuring(env.sim, () => provider.create(inputs));
    assert.deepEqual(requests, ["GET /api2/json/cluster/resources"]);
    assert.ok(isPermanent(error), String(error));
    assert.match(error.message, /401 Authentication failed!/);
    assert.match(error.message, /API token automation@pve!egress \(from apiToken\)/);
    assert.ok(!error.message.includes(SECRET));
  });

  it("F22: read and delete with a wrong secret send exactly one request each", async () => {
    const inputs = await checked(
      userInputs(env.sim, { apiToken: `automation@pve!egress=${SECRET}` }),
    );
    const id = "nodes/pve/qemu/20001";
    const props = { ...inputs, vmid: 20001 };
    for (const [what, call] of [
      ["read", () => provider.read(id, props)],
      ["delete", () => provider.remove(id, props)],
    ] as const) {
      const { requests, error } = await requestsDuring(env.sim, call);
      assert.equal(requests.length, 1, `${what}: ${requests.join(", ")}`);
      assert.ok(isPermanent(error), `${what}: ${String(error)}`);
      assert.match(error.message, /API token automation@pve!egress/, what);
    }
  });

  it("F17: a clone refused with 403 is the last request; the error names the token, the privilege and the path", async () => {
    const inputs = await checked(userInputs(env.sim, { apiToken: `proxy@pve!noclone=${SECRET}` }));
    const { requests, error } = await requestsDuring(env.sim, () => provider.create(inputs));
    // Before the refusal: the lookup and the VMID check; after it, nothing (no look for a clone left behind).
    assert.equal(requests.at(-1), "POST /api2/json/nodes/pve/qemu/9000/clone");
    assert.equal(requests.filter((request) => request.endsWith("/clone")).length, 1);
    assert.ok(isPermanent(error), String(error));
    assert.match(error.message, /403 Permission check failed \(\/vms\/9000, VM\.Clone\)/);
    assert.match(
      error.message,
      /Proxmox refused API token proxy@pve!noclone \(from apiToken\): grant privilege VM\.Clone on path \/vms\/9000/,
    );
    assert.ok(!error.message.includes(SECRET));
    assert.equal(env.sim.vms.size, 1); // only the template
  });
});
