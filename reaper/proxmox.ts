/**
 * The Proxmox side of the reaper: list the VMs on the configured nodes that
 * carry our mark (tag + description block), and delete a planned one through
 * ProxmoxProxy's own delete (which checks the name and the mark again, stops,
 * destroys, and removes the seed). Listing never throws: a failure makes the
 * listing incomplete, and then nothing is deleted on this backend.
 */
import { readFileSync } from "node:fs";
import { Deadline } from "../provider/common/deadline";
import { isNotFound, PermanentError } from "../provider/common/errors";
import { closeAllProxmoxPools, ProxmoxClient } from "../provider/proxmox/client";
import { resolveConnection, type ConnectionInputs } from "../provider/proxmox/connection";
import { deleteProxy, resourceId } from "../provider/proxmox/provider";
import { markOfConfig } from "../provider/proxmox/vm-config";
import { getConfig, listVms, type ClusterVmEntry } from "../provider/proxmox/vm";
import { z } from "zod";
import { NAME_PATTERN } from "./names";
import type { BackendListing, ListedItem, PlanEntry } from "./plan";
import type { DeleteOutcome } from "../provider/common/lifecycle";

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
});

export type ProxmoxBackendConfig = z.output<typeof proxmoxBackendSchema>;

const LIST_BUDGET_MS = 300_000;
const IN_FLIGHT = 8;

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

export function proxmoxClient(inputs: ConnectionInputs): ProxmoxClient {
  return new ProxmoxClient(resolveConnection(inputs, {}));
}

export interface ProxmoxListOptions {
  /** Called after each VM's config is read (tests break the API mid-listing here). */
  onVmRead?: (vmid: number) => void;
}

export async function listProxmoxBackend(
  client: ProxmoxClient,
  config: ProxmoxBackendConfig,
  options: ProxmoxListOptions = {},
): Promise<BackendListing> {
  const deadline = new Deadline(LIST_BUDGET_MS, "the reaper's listing budget");
  const items: ListedItem[] = [];
  const nodes = new Set(config.nodes.map((node) => node.node));
  try {
    const entries = (await listVms(client, deadline)).filter(
      (entry) => nodes.has(entry.node) && entry.template !== 1,
    );
    for (let start = 0; start < entries.length; start += IN_FLIGHT) {
      const batch = entries.slice(start, start + IN_FLIGHT);
      const listed = await Promise.all(
        batch.map((entry) => listedVm(client, config, entry, deadline, options)),
      );
      for (const item of listed) if (item !== undefined) items.push(item);
    }
    return { backend: config.name, complete: true, items };
  } catch (error) {
    return {
      backend: config.name,
      complete: false,
      problem: `listing ${config.apiEndpoint} failed: ${(error as Error).message}`,
      items,
    };
  }
}

async function listedVm(
  client: ProxmoxClient,
  config: ProxmoxBackendConfig,
  entry: ClusterVmEntry,
  deadline: Deadline,
  options: ProxmoxListOptions,
): Promise<ListedItem | undefined> {
  const ref = { node: entry.node, vmid: entry.vmid };
  let vmConfig: Record<string, string | undefined>;
  try {
    vmConfig = await getConfig(client, ref, deadline);
  } catch (error) {
    if (isNotFound(error)) return undefined; // destroyed since the listing
    throw error;
  }
  options.onVmRead?.(entry.vmid);
  const reading = markOfConfig(vmConfig);
  if (reading.kind === "unmarked") return undefined;
  const name = vmConfig.name ?? entry.name ?? `vmid-${entry.vmid}`;
  return {
    backend: config.name,
    host: entry.node,
    kind: "proxmox-vm",
    name,
    vmName: name,
    resourceId: resourceId(ref),
    ownership: reading,
    state: entry.status,
  };
}

/** The links ProxmoxProxy's delete opened, closed after the run. */
export const closeProxmoxLinks = (): Promise<void> => closeAllProxmoxPools();

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
  if (
    item.kind !== "proxmox-vm" ||
    item.resourceId === undefined ||
    item.ownership.kind !== "marked"
  )
    throw new PermanentError(`${item.kind} ${item.name} is not a marked Proxmox VM`);
  const node = config.nodes.find((candidate) => candidate.node === item.host);
  if (node === undefined)
    throw new PermanentError(`node ${item.host} is not in proxmox backend ${config.name}`);
  return deleteProxy(item.resourceId, {
    ...inputs,
    vmName: item.name,
    owner: item.ownership.mark.owner,
    createdAt: item.ownership.mark.createdAt,
    seedStorage: node.seedStorage,
    timeouts: { deleteSeconds: config.deleteTimeoutSeconds },
  });
}
