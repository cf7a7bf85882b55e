/**
 * What one KVM host holds that the reaper may have to remove: marked domains,
 * per-VM volumes without a domain, base images, listed over one libvirt link;
 * and the removal of a listed volume or base image. Listing never throws:
 * whatever went wrong makes the listing incomplete, and an incomplete listing
 * deletes nothing on this host (reaper/plan.ts). A domain is deleted through
 * KvmProxy's own delete (provider.ts `remove`), not here.
 */
import { Deadline } from "../common/deadline";
import { isNotFound, PermanentError } from "../common/errors";
import type { BackendListing, ItemOwnership, ListedItem } from "../common/leftovers";
import type { DeleteOutcome } from "../common/lifecycle";
import type { MarkReading, OwnerIdentity } from "../common/mark";
import { allSettledOrFirstFailure } from "../common/settled";
import {
  Procedures,
  type LibvirtConnection,
  type StoragePoolHandle,
  type StorageVolHandle,
} from "../libvirt-rpc-xdr";
import { classifyLibvirtError } from "./classify";
import { closeAllHosts, openPooledLink } from "./connect";
import { LibvirtHost } from "./host";
import { connectionSchema, type KvmProxyInputs } from "./schema";
import {
  BASE_IMAGE_PREFIX,
  baseImageMarkerName,
  hostLabel,
  kvmResourceId,
  vmNameOfVolume,
} from "./naming";

/** Where the host is, in KvmProxy's own connection inputs (defaults not yet applied), and how ids name it. */
export interface KvmDialTarget {
  /** How KvmProxy ids name this host; default hostLabel's rule. */
  label?: string;
  /** KvmProxy's `connection` input; without it the local socket. */
  connection?: Record<string, unknown>;
  socketPath: string;
  /** Where connection.privateKey came from, for a refused login's message (e.g. `ssh.privateKeyFile <path>`). */
  privateKeySource?: string;
}

/** What to list on the host, and under which backend name. */
export interface KvmLeftoverScope {
  name: string;
  pools: string[];
  /** Per-VM volumes without a domain whose VM name starts with namePrefix are taken to be owner's. */
  unmarkedVolumes?: { owner: Pick<OwnerIdentity, "project" | "stack">; namePrefix: string };
}

/** The id KvmProxy gives a VM of this name on this host. */
export function kvmResourceIdOf(target: KvmDialTarget, vmName: string): string {
  return kvmResourceId(labelOf(target), vmName);
}

/** Closes the links KvmProxy's delete opened (the reaper calls it after its run). */
export const closeAllKvmLinks = (): Promise<void> => closeAllHosts();

/** One libvirt link to one host for the whole run. */
export interface KvmSession {
  label: string;
  host: LibvirtHost;
  connection: LibvirtConnection;
  close(): Promise<void>;
}

/** Listing and deleting each get their own budget: a dead host must not hang the run. */
const LIST_BUDGET_MS = 300_000;
const DELETE_BUDGET_MS = 180_000;
const CALL_MS = 60_000;
/**
 * Marks are read pipelined on the one link, this many domains at a time: the
 * daemon works on a few calls of a client at once (max_client_requests, 5 by
 * default) and the rest wait in the socket, so more only queue; this many
 * keeps it busy while our writes still leave in large batches.
 */
const IN_FLIGHT = 128;
/** What the domain listing gives an inactive domain as its id. */
const INACTIVE_DOMAIN_ID = -1;

export function labelOf(config: KvmDialTarget): string {
  return config.label ?? hostLabel(hostTargetOf(config).connection);
}

/** The connection as KvmProxy reads it, defaults applied; a bad one is refused before any dial. */
function hostTargetOf(config: KvmDialTarget): Pick<KvmProxyInputs, "connection" | "socketPath"> {
  if (config.connection === undefined) return { socketPath: config.socketPath };
  const parsed = connectionSchema.safeParse(config.connection);
  if (!parsed.success)
    throw new PermanentError(
      parsed.error.issues.map((issue) => issue.message).join("; ") || "connection is not valid",
    );
  return { connection: parsed.data, socketPath: config.socketPath };
}

/**
 * The host's link from KvmProxy's own pool (provider/kvm/connect.ts): the
 * listing and the deletes after it share it, one link per host for the whole
 * run, ended by closeAllKvmLinks.
 */
export async function openKvmSession(config: KvmDialTarget): Promise<KvmSession> {
  const label = labelOf(config);
  const target = hostTargetOf(config);
  const timeoutMs = (target.connection?.dialTimeoutSeconds ?? 15) * 1000;
  const connection = await openPooledLink(target, timeoutMs, {
    ...(config.privateKeySource === undefined ? {} : { privateKeySource: config.privateKeySource }),
  });
  return { ...sessionOver(connection, label), close: async () => undefined };
}

/** A session over a link someone else dialled (tests use it to hold the link's server side). */
export function sessionOver(connection: LibvirtConnection, label: string): KvmSession {
  const deadline = new Deadline(LIST_BUDGET_MS + DELETE_BUDGET_MS, "the reaper's host budget");
  return {
    label,
    connection,
    host: new LibvirtHost(async () => connection, label, deadline),
    close: () => connection.close(),
  };
}

export interface KvmListOptions {
  pruneImages: boolean;
  /** Called after each domain's mark is read (tests cut the link mid-listing here). */
  onDomainRead?: (name: string) => void;
}

export async function listKvmBackend(
  session: KvmSession,
  config: KvmLeftoverScope,
  options: KvmListOptions,
): Promise<BackendListing> {
  const items: ListedItem[] = [];
  try {
    // Domains and pools are listed side by side; which volumes are orphans is decided once both are in.
    const domainNames = listMarkedDomains(session, config, items, options);
    const poolVolumes = config.pools.map((poolName) => volumesOfPool(session, poolName));
    await allSettledOrFirstFailure([domainNames, ...poolVolumes]);
    for (const [index, poolName] of config.pools.entries())
      await listPool(
        session,
        config,
        poolName,
        await poolVolumes[index]!,
        await domainNames,
        items,
        options,
      );
    return { backend: config.name, complete: true, items };
  } catch (error) {
    return {
      backend: config.name,
      complete: false,
      problem: `listing ${session.label} failed: ${(error as Error).message}`,
      items,
    };
  }
}

/**
 * Every domain name on the host (marked or not: their volumes are not
 * orphans), and the marked ones as items. Each domain costs one call for its
 * mark (the metadata element alone, not the whole definition) and, only when
 * it runs, one for its state: the listing says which are inactive, and an
 * inactive domain is shut off.
 */
async function listMarkedDomains(
  session: KvmSession,
  config: KvmLeftoverScope,
  items: ListedItem[],
  options: KvmListOptions,
): Promise<Set<string>> {
  const { host, label } = session;
  const domains = await host.listDomains();
  const names = new Set(domains.map((dom) => dom.name));
  await inBatches(domains, async (dom) => {
    let reading: MarkReading;
    let state: string;
    try {
      [reading, state] = await Promise.all([
        host.mark(dom),
        dom.id === INACTIVE_DOMAIN_ID ? "stopped" : host.state(dom).then((s) => s.state),
      ]);
    } catch (error) {
      if (isNotFound(error)) return; // undefined since the listing: gone is fine
      throw error;
    }
    options.onDomainRead?.(dom.name);
    if (reading.kind === "unmarked") return;
    items.push({
      backend: config.name,
      host: label,
      kind: "domain",
      name: dom.name,
      vmName: dom.name,
      resourceId: kvmResourceId(label, dom.name),
      ownership: reading,
      state,
    });
  });
  return names;
}

async function volumesOfPool(session: KvmSession, poolName: string): Promise<StorageVolHandle[]> {
  const pool = await session.host.findPool(poolName);
  if (pool === undefined)
    throw new PermanentError(
      `storage pool ${JSON.stringify(poolName)} does not exist on ${session.label}; fix pools in the config`,
    );
  return listVolumes(session, pool);
}

async function listPool(
  session: KvmSession,
  config: KvmLeftoverScope,
  poolName: string,
  volumes: StorageVolHandle[],
  domainNames: ReadonlySet<string>,
  items: ListedItem[],
  options: KvmListOptions,
): Promise<void> {
  const { host, label } = session;
  const bases: StorageVolHandle[] = [];
  const overlays: StorageVolHandle[] = [];
  for (const vol of volumes) {
    if (vol.name.startsWith(BASE_IMAGE_PREFIX)) {
      if (!vol.name.endsWith(".ready")) bases.push(vol);
      continue;
    }
    const perVm = vmNameOfVolume(vol.name);
    if (perVm === undefined) continue;
    if (perVm.kind === "overlay") overlays.push(vol);
    if (domainNames.has(perVm.vmName)) continue; // its domain's; the domain decides
    const rule = config.unmarkedVolumes;
    let ownership: ItemOwnership = { kind: "unmarked" };
    if (rule !== undefined && perVm.vmName.startsWith(rule.namePrefix)) {
      const createdAt = volumeTime(await volumeXml(session, vol));
      ownership = {
        kind: "attributed",
        owner: rule.owner,
        ...(createdAt === undefined ? {} : { createdAt }),
      };
    }
    items.push({
      backend: config.name,
      host: label,
      kind: perVm.kind === "seed" ? "seed" : "volume",
      name: vol.name,
      pool: poolName,
      vmName: perVm.vmName,
      resourceId: kvmResourceId(label, perVm.vmName),
      ownership,
    });
  }
  if (!options.pruneImages) return;
  const backingPaths = new Map<string, string[]>();
  await inBatches(overlays, async (vol) => {
    const backing = backingPathOf(await volumeXml(session, vol));
    if (backing !== undefined)
      backingPaths.set(backing, [...(backingPaths.get(backing) ?? []), vol.name]);
  });
  await inBatches(bases, async (vol) => {
    const path = await host.volumePath(vol);
    const createdAt = volumeTime(await volumeXml(session, vol));
    items.push({
      backend: config.name,
      host: label,
      kind: "base-image",
      name: vol.name,
      pool: poolName,
      ownership: {
        kind: "shared",
        usedBy: backingPaths.get(path) ?? [],
        ...(createdAt === undefined ? {} : { createdAt }),
      },
    });
  });
}

async function listVolumes(
  session: KvmSession,
  pool: StoragePoolHandle,
): Promise<StorageVolHandle[]> {
  try {
    const { vols } = await session.connection.call(
      Procedures.storagePoolListAllVolumes,
      { pool, needResults: 1, flags: 0 },
      { timeoutMs: CALL_MS },
    );
    return vols;
  } catch (error) {
    throw classifyLibvirtError(error, {
      operation: "storagePoolListAllVolumes",
      resource: `pool ${pool.name} on ${session.label}`,
    });
  }
}

async function volumeXml(session: KvmSession, vol: StorageVolHandle): Promise<string> {
  try {
    return await session.connection.call(
      Procedures.storageVolGetXmlDesc,
      { vol, flags: 0 },
      { timeoutMs: CALL_MS },
    );
  } catch (error) {
    throw classifyLibvirtError(error, {
      operation: "storageVolGetXmlDesc",
      resource: `volume ${vol.name} on ${session.label}`,
    });
  }
}

/**
 * When the volume was last written, from the pool's file timestamps (seconds
 * with a fraction): mtime, else ctime. A volume still being written is young.
 */
export function volumeTime(xml: string): string | undefined {
  for (const tag of ["mtime", "ctime"]) {
    const seconds = new RegExp(`<${tag}>([0-9]+(?:\\.[0-9]+)?)</${tag}>`).exec(xml)?.[1];
    if (seconds !== undefined && Number(seconds) > 0)
      return new Date(Number(seconds) * 1000).toISOString();
  }
  return undefined;
}

/** The overlay's backing file, from `<backingStore><path>`. */
export function backingPathOf(xml: string): string | undefined {
  return /<backingStore[^>]*>[\s\S]*?<path>([^<]+)<\/path>/.exec(xml)?.[1]?.trim();
}

async function inBatches<T>(
  values: readonly T[],
  work: (value: T) => Promise<void>,
): Promise<void> {
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < values.length) await work(values[next++]!);
  };
  await Promise.all(Array.from({ length: Math.min(IN_FLIGHT, values.length) }, worker));
}

/**
 * Deletes a listed volume, seed or base image (a domain goes through
 * KvmProxy's own delete). A volume whose VM has a domain again is left alone:
 * the domain decides.
 */
export async function deleteLeftover(
  session: KvmSession,
  scope: KvmLeftoverScope,
  item: ListedItem,
): Promise<DeleteOutcome> {
  const { host, label } = session;
  switch (item.kind) {
    case "volume":
    case "seed": {
      if (item.vmName !== undefined && (await host.findDomain(item.vmName)) !== undefined)
        throw new PermanentError(
          `volume ${item.name} on ${label} now has a domain ${item.vmName}; left alone`,
        );
      return deleteVolumesIn(session, poolsOf(item, scope), [item.name]);
    }
    case "base-image":
      // The marker first: a create that looks now sees an incomplete base and downloads again.
      return deleteVolumesIn(session, poolsOf(item, scope), [
        baseImageMarkerName(item.name),
        item.name,
      ]);
    default:
      throw new PermanentError(`${item.kind} ${item.name} is not a KVM volume`);
  }
}

const poolsOf = (item: ListedItem, scope: KvmLeftoverScope): readonly string[] =>
  item.pool !== undefined ? [item.pool] : scope.pools;

async function deleteVolumesIn(
  session: KvmSession,
  pools: readonly string[],
  names: string[],
): Promise<DeleteOutcome> {
  let removed = false;
  for (const poolName of pools) {
    const pool = await session.host.findPool(poolName);
    if (pool === undefined) continue;
    for (const name of names)
      removed = (await session.host.deleteVolumeNamed(pool, name)) || removed;
  }
  return removed ? "removed" : "already gone";
}
