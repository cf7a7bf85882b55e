import * as provider from "../../provider/proxmox/provider";
import { PveSimulator } from "./simulator";

export const OWNER = { project: "egress", stack: "test", resource: "proxy-a" };

/** Inputs as a user would write them, pointed at the simulator. */
export function userInputs(
  sim: PveSimulator,
  overrides: Record<string, unknown> = {},
): Record<string, unknown> {
  return {
    apiEndpoint: sim.endpoint,
    apiToken: "apiToken" in overrides ? overrides.apiToken : sim.tokenFor(),
    caCertPem: sim.caCertPem,
    node: sim.node,
    templateVmid: 9000,
    diskStorage: "local-lvm",
    seedStorage: "seeds",
    owner: OWNER,
    readiness: { mode: "address" },
    timeouts: { createSeconds: 30, readySeconds: 10, deleteSeconds: 30 },
    userData: "#cloud-config\npackages: [squid]\n",
    ...overrides,
  };
}

/** check, as the engine runs it before create; fails the test on check failures. */
export async function checked(inputs: Record<string, unknown>, olds: Record<string, unknown> = {}) {
  const result = await provider.check(olds, inputs);
  if (result.failures.length > 0)
    throw new Error(`check failed: ${JSON.stringify(result.failures)}`);
  return result.inputs;
}

export function vmsNamed(sim: PveSimulator, name: string): number[] {
  return [...sim.vms.values()].filter((vm) => vm.config.name === name).map((vm) => vm.vmid);
}
