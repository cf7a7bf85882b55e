/**
 * What one Proxmox API holds that the reaper may have to remove: the VMs on
 * the given nodes that carry our mark (tag + description block). Listing
 * never throws: a failure makes the listing incomplete, and then nothing is
 * deleted on this backend. A listed VM is deleted through ProxmoxProxy's own
 * delete (provider.ts `deleteProxy`).
 */
import { Deadline } from "../common/deadline";
import { isNotFound } from "../common/errors";
import type { BackendListing, ListedItem } from "../common/leftovers";
import { closeAllProxmoxPools, ProxmoxClient } from "./client";
import { resolveConnection, type ConnectionInputs } from "./connection";
import { resourceId } from "./provider";
import { markOfConfig } from "./vm-config";
import { getConfig, listVms, type ClusterVmEntry } from "./vm";

export type { ConnectionInputs };

/** Where to list, and under which backend name. */
export interface ProxmoxLeftoverScope {
  name: string;
  apiEndpoint: string;
  nodes: { node: string }[];
}

const LIST_BUDGET_MS = 300_000;
const IN_FLIGHT = 8;

/** Closes the links the listing and ProxmoxProxy's delete opened (after the reaper's run). */
export const closeAllProxmoxLinks = (): Promise<void> => closeAllProxmoxPools();

export function proxmoxClient(inputs: ConnectionInputs): ProxmoxClient {
  return new ProxmoxClient(resolveConnection(inputs, {}));
}

export interface ProxmoxListOptions {
  /** Called after each VM's config is read (tests break the API mid-listing here). */
  onVmRead?: (vmid: number) => void;
}

export async function listProxmoxBackend(
  client: ProxmoxClient,
  config: ProxmoxLeftoverScope,
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
  config: ProxmoxLeftoverScope,
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
