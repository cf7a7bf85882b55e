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
import { ProxmoxClient } from "../provider/proxmox/client";
import { resolveConnection, type ConnectionInputs } from "../provider/proxmox/connection";
import { deleteProxy, resourceId } from "../provider/proxmox/provider";
import { markOfConfig } from "../provider/proxmox/vm-config";
import { getConfig, getStatus, listVms, type ClusterVmEntry } from "../provider/proxmox/vm";
import type { ProxmoxBackendConfig } from "./config";
import type { BackendListing, ListedItem, PlanEntry } from "./plan";
import type { DeleteOutcome } from "./kvm";

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

/** ProxmoxProxy's delete with the owner from the mark: it refuses a VM whose mark changed. */
export async function deleteProxmoxEntry(
  client: ProxmoxClient,
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
  const ref = { node: item.host, vmid: Number(item.resourceId.split("/").pop()) };
  const deadline = Deadline.afterSeconds(config.deleteTimeoutSeconds, "deleteTimeoutSeconds");
  const present = await getStatus(client, ref, deadline).then(
    () => true,
    (error) => {
      if (isNotFound(error)) return false;
      throw error;
    },
  );
  await deleteProxy(item.resourceId, {
    ...inputs,
    vmName: item.name,
    owner: item.ownership.mark.owner,
    seedStorage: node.seedStorage,
    timeouts: { deleteSeconds: config.deleteTimeoutSeconds },
  });
  return present ? "removed" : "already gone";
}
