/**
 * What one Proxmox API holds that the reaper may have to remove: the VMs on
 * the given nodes that carry our mark (tag + description block), and seed
 * ISOs (`<vm>-seed.iso` on a node's seed storage) whose VM is gone. Listing
 * never throws: a failure makes the listing incomplete, and then nothing is
 * deleted on this backend. A listed VM is deleted through ProxmoxProxy's own
 * delete (provider.ts `remove`), a listed seed here (`deleteSeedLeftover`).
 */
import { Deadline } from "../common/deadline";
import { isNotFound, PermanentError } from "../common/errors";
import type { BackendListing, ItemOwnership, ListedItem } from "../common/leftovers";
import type { DeleteOutcome } from "../common/lifecycle";
import type { OwnerIdentity } from "../common/mark";
import { closeAllProxmoxPools, ProxmoxClient, segment } from "./client";
import { resolveConnection, type ConnectionInputs } from "./connection";
import { resourceId } from "./provider";
import { markOfConfig } from "./vm-config";
import { deleteSeed } from "./seed";
import { getConfig, listVms, type ClusterVmEntry } from "./vm";

export type { ConnectionInputs };

/** Where to list, and under which backend name. */
export interface ProxmoxLeftoverScope {
  name: string;
  apiEndpoint: string;
  /** Each node, and the storage its ProxmoxProxies upload seeds to. */
  nodes: { node: string; seedStorage?: string }[];
  /**
   * Seed ISOs carry no mark. One without a VM whose VM name starts with
   * namePrefix is taken to be owner's; without this it is "owner unknown".
   */
  unmarkedVolumes?: { owner: Pick<OwnerIdentity, "project" | "stack">; namePrefix: string };
}

/** `<vm>-seed.iso`, as seedVolumeId names it (seed.ts). */
const SEED_FILE = /^(.+)-seed\.iso$/;

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
    const all = await listVms(client, deadline);
    const entries = all.filter((entry) => nodes.has(entry.node) && entry.template !== 1);
    // What keeps a seed: a VM of its name anywhere, or a config that mentions the file.
    const inUse = {
      names: new Set(all.map((entry) => entry.name ?? "")),
      configText: [] as string[],
    };
    for (let start = 0; start < entries.length; start += IN_FLIGHT) {
      const batch = entries.slice(start, start + IN_FLIGHT);
      const listed = await Promise.all(
        batch.map((entry) => listedVm(client, config, entry, deadline, options, inUse)),
      );
      for (const item of listed) if (item !== undefined) items.push(item);
    }
    // A nameless entry is mid-clone (F8, docs/proxmox.md section 9): its seed may be on the way.
    const cloning = all.some((entry) => entry.name === undefined || entry.name === "");
    for (const node of config.nodes)
      if (node.seedStorage !== undefined && !cloning)
        items.push(
          ...(await orphanSeeds(client, config, node.node, node.seedStorage, inUse, deadline)),
        );
    return {
      backend: config.name,
      complete: true,
      ...(cloning ? { note: "a VM is being cloned: seed ISOs are listed on the next run" } : {}),
      items,
    };
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
  inUse: { configText: string[] },
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
  inUse.configText.push(Object.values(vmConfig).join("\n"));
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

interface StorageFile {
  volid: string;
  content?: string;
  /** Seconds since the epoch; directory storages report it. */
  ctime?: number;
}

/**
 * Seeds on one node's seed storage whose VM is gone: no VM of that name on the
 * cluster and no VM config that names the file. Age from the file's ctime;
 * owner by `unmarkedVolumes` (seeds carry no mark), else unknown.
 */
async function orphanSeeds(
  client: ProxmoxClient,
  config: ProxmoxLeftoverScope,
  node: string,
  storage: string,
  inUse: { names: ReadonlySet<string>; configText: readonly string[] },
  deadline: Deadline,
): Promise<ListedItem[]> {
  const files = await client.get<StorageFile[]>(
    `/nodes/${segment(node)}/storage/${segment(storage)}/content`,
    { content: "iso" },
    { timeoutMs: deadline.capped(60_000) },
  );
  const items: ListedItem[] = [];
  for (const file of files) {
    const fileName = file.volid.startsWith(`${storage}:iso/`)
      ? file.volid.slice(`${storage}:iso/`.length)
      : undefined;
    const vmName = fileName === undefined ? undefined : SEED_FILE.exec(fileName)?.[1];
    if (fileName === undefined || vmName === undefined) continue;
    if (inUse.names.has(vmName) || inUse.configText.some((text) => text.includes(file.volid)))
      continue;
    const rule = config.unmarkedVolumes;
    const createdAt =
      typeof file.ctime === "number" && file.ctime > 0
        ? new Date(file.ctime * 1000).toISOString()
        : undefined;
    const ownership: ItemOwnership =
      rule !== undefined && vmName.startsWith(rule.namePrefix)
        ? {
            kind: "attributed",
            owner: rule.owner,
            ...(createdAt === undefined ? {} : { createdAt }),
          }
        : { kind: "unmarked" };
    items.push({
      backend: config.name,
      host: node,
      kind: "seed",
      name: fileName,
      pool: storage,
      vmName,
      ownership,
    });
  }
  return items;
}

/**
 * Deletes a listed seed ISO (an imgdel task, F13), unless a VM of its name
 * exists again: then the VM decides, as for a KVM volume.
 */
export async function deleteSeedLeftover(
  client: ProxmoxClient,
  item: ListedItem,
  deleteSeconds: number,
): Promise<DeleteOutcome> {
  if (item.kind !== "seed" || item.pool === undefined || item.vmName === undefined)
    throw new PermanentError(`${item.kind} ${item.name} is not a listed Proxmox seed ISO`);
  const deadline = new Deadline(deleteSeconds * 1000, "deleteTimeoutSeconds");
  const entries = await listVms(client, deadline);
  if (entries.some((entry) => entry.name === item.vmName))
    throw new PermanentError(
      `seed ${item.name} on ${item.host} now has a VM ${item.vmName}; left alone`,
    );
  const volid = `${item.pool}:iso/${item.name}`;
  const files = await client.get<StorageFile[]>(
    `/nodes/${segment(item.host)}/storage/${segment(item.pool)}/content`,
    { content: "iso" },
    { timeoutMs: deadline.capped(60_000) },
  );
  if (!files.some((file) => file.volid === volid)) return "already gone";
  await deleteSeed(client, item.host, volid, deadline);
  return "removed";
}
