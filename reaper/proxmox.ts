/**
 * The Proxmox side of the reaper: its config schema, and deletes. What an API
 * holds is listed by provider/proxmox/leftovers.ts; a planned VM is deleted
 * through ProxmoxProxy's own delete, which checks the name, the owner and the
 * creation time again, stops, destroys, and removes the seed.
 */
import { readFileSync } from "node:fs";
import { z } from "zod";
import { PermanentError } from "../provider/common/errors";
import type { DeleteOutcome } from "../provider/common/lifecycle";
import {
  closeAllProxmoxLinks,
  deleteSeedLeftover,
  proxmoxClient,
  type ConnectionInputs,
} from "../provider/proxmox/leftovers";
import { remove as removeProxmoxProxy } from "../provider/proxmox/provider";
import { NAME_PATTERN } from "./names";
import type { PlanEntry } from "./plan";

export {
  listProxmoxBackend,
  proxmoxClient,
  type ProxmoxListOptions,
} from "../provider/proxmox/leftovers";

/** One Proxmox API in the reaper config (`proxmox: [...]`). */
export const proxmoxBackendSchema = z.strictObject({
  name: z
    .string()
    .regex(NAME_PATTERN, { error: "name must be letters, digits, _ . - (e.g. pve1)" }),
  apiEndpoint: z
    .string({ error: 'apiEndpoint must be a URL, e.g. "https://pve.lan:8006"' })
    .regex(/^https?:\/\/[^/\s]+/, {
      error: 'apiEndpoint must be a URL, e.g. "https://pve.lan:8006"',
    }),
  /** Name of an environment variable holding `user@realm!tokenid=secret`. */
  apiTokenEnv: z.string().default("PROXMOX_VE_API_TOKEN"),
  apiTokenFile: z.string().optional(),
  caCertFile: z.string().optional(),
  insecure: z.boolean().default(false),
  nodes: z
    .array(
      z.strictObject({
        node: z.string().min(1, { error: "node must be the Proxmox node name" }),
        /** Where this node's seeds live (the ProxmoxProxy seedStorage). */
        seedStorage: z.string().min(1, { error: "seedStorage must be a storage id, e.g. local" }),
      }),
    )
    .min(1, { error: "nodes must list at least one node" }),
  deleteTimeoutSeconds: z.number().int().min(10).max(3600).default(300),
  /**
   * Seed ISOs carry no mark. A seed without a VM whose VM name starts with
   * namePrefix is taken to be this stack's; without this it is reported as
   * "owner unknown" and never touched (as KVM volumes).
   */
  unmarkedVolumes: z
    .strictObject({
      owner: z.strictObject({
        project: z.string().min(1, { error: "project must not be empty" }),
        stack: z.string().min(1, { error: "stack must not be empty" }),
      }),
      namePrefix: z.string().default(""),
    })
    .optional(),
});

export type ProxmoxBackendConfig = z.output<typeof proxmoxBackendSchema>;

/** The connection as ProxmoxProxy's inputs spell it; the token comes from a file or the environment. */
export function connectionInputsOf(
  config: ProxmoxBackendConfig,
  env: NodeJS.ProcessEnv = process.env,
): ConnectionInputs {
  const token =
    config.apiTokenFile !== undefined
      ? readFileSync(config.apiTokenFile, "utf8").trim()
      : env[config.apiTokenEnv];
  if (token === undefined || token === "")
    throw new PermanentError(
      `proxmox backend ${config.name}: no API token; set ${config.apiTokenEnv} or apiTokenFile`,
    );
  return {
    apiEndpoint: config.apiEndpoint,
    apiToken: token,
    apiTokenSource:
      config.apiTokenFile !== undefined
        ? `apiTokenFile ${config.apiTokenFile}`
        : config.apiTokenEnv,
    insecure: config.insecure,
    ...(config.caCertFile !== undefined
      ? { caCertPem: readFileSync(config.caCertFile, "utf8") }
      : {}),
  };
}

/** The links ProxmoxProxy's delete opened, closed after the run. */
export const closeProxmoxLinks = (): Promise<void> => closeAllProxmoxLinks();

/**
 * ProxmoxProxy's own delete, given what its state would record of the listed
 * VM: the connection, name, owner and creation time from the mark (a VM
 * made since at that VMID is not the one listed, and is left alone), and the
 * node's seed storage.
 */
export async function deleteProxmoxEntry(
  inputs: ConnectionInputs,
  config: ProxmoxBackendConfig,
  entry: PlanEntry,
): Promise<DeleteOutcome> {
  const { item } = entry;
  if (item.kind === "seed")
    return deleteSeedLeftover(proxmoxClient(inputs), item, config.deleteTimeoutSeconds);
  if (
    item.kind !== "proxmox-vm" ||
    item.resourceId === undefined ||
    item.ownership.kind !== "marked"
  )
    throw new PermanentError(`${item.kind} ${item.name} is not a marked Proxmox VM`);
  const node = config.nodes.find((candidate) => candidate.node === item.host);
  if (node === undefined)
    throw new PermanentError(`node ${item.host} is not in proxmox backend ${config.name}`);
  return removeProxmoxProxy(item.resourceId, {
    ...inputs,
    vmName: item.name,
    owner: item.ownership.mark.owner,
    createdAt: item.ownership.mark.createdAt,
    seedStorage: node.seedStorage,
    timeouts: { deleteSeconds: config.deleteTimeoutSeconds },
  });
}
