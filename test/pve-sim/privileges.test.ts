// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import assert from "node:assert/strict";
import * as provider from "../../provider/proxmox/provider";
import { PermanentError } from "../../provider/common/errors";
import { PartialCreateError } from "../../provider/common/partial-create";
import { useSimulator } from "./harness";
import { checked, userInputs } from "./fixtures";
import { PVE9_PROXY_PRIVILEGES, TokenSpec } from "./simulator";

/** Tokens that each lack one privilege of the documented role (F17). */
function tokensLackingOne(privileges: string[]): TokenSpec[] {
  return privileges.map((missing, index) => ({
    id: `proxy@pve!lacks${index}`,
    secret: `secret-${index}-0000`,
    privileges: privileges.filter((privilege) => privilege !== missing),
  }));
}

async function fullLifecycle(inputs: Record<string, unknown>): Promise<void> {
  const { id, outs } = await provider.create(inputs);
  await provider.remove(id, { ...outs });
}

describe("ProxmoxProxy with a least-privilege token (F17)", () => {
  describe("PVE 9", () => {
    const env = useSimulator({
      agentDelayMs: 10,
      tokens: [
        { id: "proxy@pve!full", secret: "full-secret-0000", privileges: PVE9_PROXY_PRIVILEGES },
        ...tokensLackingOne(PVE9_PROXY_PRIVILEGES),
      ],
    });
    // Every flow option on, so every privilege is needed somewhere.
    const overrides = { diskGiB: 4, bridge: "vmbr1", vlanTag: 30 };

    it("the documented role is enough for create and delete", async () => {
      await fullLifecycle(
        await checked(
          userInputs(env.sim, { ...overrides, apiToken: env.sim.tokenFor("proxy@pve!full") }),
        ),
      );
    });

    for (const [index, missing] of PVE9_PROXY_PRIVILEGES.entries()) {
      it(`without ${missing}: fails with an error naming ${missing}`, async () => {
        const token = env.sim.tokenFor(`proxy@pve!lacks${index}`);
        const inputs = await checked(userInputs(env.sim, { ...overrides, apiToken: token }));
        let failure: unknown;
        try {
          await fullLifecycle(inputs);
        } catch (error) {
          failure = error;
        }
        assert.ok(
          failure instanceof PermanentError || failure instanceof PartialCreateError,
          `got ${String(failure)}`,
        );
        const message = (failure as Error).message;
        assert.match(
          message,
          new RegExp(`Permission check failed \\([^,]+, ${missing.replace(".", "\\.")}\\)`),
        );
        assert.match(
          message,
          new RegExp(`grant privilege ${missing.replace(".", "\\.")} on path /`),
        );
        assert.doesNotMatch(message, /secret-\d+-0000/);
      });
    }
  });

  describe("PVE 8", () => {
    const pve8 = PVE9_PROXY_PRIVILEGES.map((privilege) =>
      privilege === "VM.GuestAgent.Audit" ? "VM.Monitor" : privilege,
    );
    const env = useSimulator({
      pveMajor: 8,
      agentDelayMs: 10,
      tokens: [
        { id: "proxy@pve!pve8", secret: "pve8-secret-0000", privileges: pve8 },
        { id: "proxy@pve!pve9role", secret: "pve9-secret-0000", privileges: PVE9_PROXY_PRIVILEGES },
      ],
    });

    it("reads the guest agent with VM.Monitor, and names it when the PVE 9 role is used", async () => {
      await fullLifecycle(
        await checked(userInputs(env.sim, { apiToken: env.sim.tokenFor("proxy@pve!pve8") })),
      );
      const inputs = await checked(
        userInputs(env.sim, { apiToken: env.sim.tokenFor("proxy@pve!pve9role") }),
      );
      await assert.rejects(
        provider.create(inputs),
        /Permission check failed \(\/vms\/\d+, VM\.Monitor\)/,
      );
    });
  });

  it("an ACL on a more specific path replaces the inherited one (F17)", async () => {
    const { PveSimulator } = await import("./simulator");
    const sim = new PveSimulator({
      agentDelayMs: 10,
      tokens: [
        {
          id: "proxy@pve!scoped",
          secret: "scoped-secret-0000",
          privileges: PVE9_PROXY_PRIVILEGES,
          pathPrivileges: { "/storage/seeds": ["Datastore.Audit"] },
        },
      ],
    });
    await sim.listen();
    try {
      const inputs = await checked(userInputs(sim, { apiToken: sim.tokenFor("proxy@pve!scoped") }));
      await assert.rejects(
        provider.create(inputs),
        /Permission check failed \(\/storage\/seeds, Datastore\.AllocateTemplate\)/,
      );
    } finally {
      await sim.settle();
      await sim.close();
    }
  });
});
