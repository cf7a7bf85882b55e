/**
 * The KVM side of the reaper: list what one host holds (marked domains,
 * per-VM volumes without a domain, base images), and delete one planned
 * entry through the same LibvirtHost calls KvmProxy's delete uses. Listing
 * never throws: whatever went wrong makes the listing incomplete, and an
 * incomplete listing deletes nothing on this host (plan.ts).
 */
import { readFileSync } from "node:fs";
import { Deadline } from "../provider/common/deadline";
import { isNotFound, PermanentError } from "../provider/common/errors";
import { type MarkReading } from "../provider/common/mark";
import { classifyLibvirtError } from "../provider/kvm/classify";
import { parseDomainXml } from "../provider/kvm/domain-xml";
import { LibvirtHost } from "../provider/kvm/host";
import {
  BASE_IMAGE_PREFIX,
  baseImageMarkerName,
  hostLabel,
  kvmResourceId,
  vmNameOfVolume,
} from "../provider/kvm/naming";
import {
  Procedures,
  type LibvirtConnection,
  type StoragePoolHandle,
  type StorageVolHandle,
} from "../provider/libvirt-rpc-xdr";
import type { DeleteOutcome } from "../provider/common/lifecycle";
import { SecretValue } from "../provider/common/redact";
import { closeAllHosts } from "../provider/kvm/connect";
import { remove as removeKvmProxy } from "../provider/kvm/provider";
import { openLibvirtOverSsh, openLocalLibvirt } from "../provider/ssh";
import { z } from "zod";
import { NAME_PATTERN } from "./names";
import type { BackendListing, ItemOwnership, ListedItem, PlanEntry } from "./plan";

const ownerSchema = z.strictObject({
  project: z.string().min(1, { error: "project must not be empty" }),
  stack: z.string().min(1, { error: "stack must not be empty" }),
});

/** One KVM host in the reaper config (`kvm: [...]`). */
export const kvmBackendSchema = z.strictObject({
  name: z
    .string()
    .regex(NAME_PATTERN, { error: "name must be letters, digits, _ . - (e.g. kvm1)" }),
  /** How KvmProxy ids name this host (`host`, `host:port` or `local`); defaults to that rule. */
  label: z.string().min(1).optional(),
  /** Without a connection the local socket is used. */
  connection: z
    .strictObject({
      host: z.string().min(1, { error: "host must be the hypervisor's name or address" }),
      port: z.number().int().min(1).max(65535).default(22),
      user: z.string().min(1).default("root"),
      privateKeyFile: z.string().optional(),
      /** Name of an environment variable holding the key's passphrase. */
      passphraseEnv: z.string().optional(),
      knownHostsFile: z.string().optional(),
      insecureIgnoreHostKey: z.boolean().default(false),
      agentSocket: z.string().optional(),
      dialTimeoutSeconds: z.number().int().min(1).max(600).default(15),
    })
    .optional(),
  socketPath: z.string().default("/var/run/libvirt/libvirt-sock"),
  pools: z
    .array(z.string().regex(NAME_PATTERN, { error: "each pool must be a libvirt pool name" }))
    .min(1, { error: 'pools must name at least one storage pool, e.g. ["default"]' }),
  /**
   * Volumes carry no mark. Per-VM volumes without a domain whose VM name starts
   * with namePrefix are taken to be this stack's; without this they are
   * reported as "unknown owner" and never touched.
   */
  unmarkedVolumes: z
    .strictObject({ owner: ownerSchema, namePrefix: z.string().default("") })
    .optional(),
});

export type KvmBackendConfig = z.output<typeof kvmBackendSchema>;

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
/** Marks are read pipelined on the one link, this many in flight. */
const IN_FLIGHT = 32;

export function labelOf(config: KvmBackendConfig): string {
  return config.label ?? hostLabel(config.connection);
}

export async function openKvmSession(config: KvmBackendConfig): Promise<KvmSession> {
  const label = labelOf(config);
  const { connection: ssh } = config;
  let connection: LibvirtConnection;
  try {
    connection =
      ssh === undefined
        ? await openLocalLibvirt({ socketPath: config.socketPath })
        : await openLibvirtOverSsh(
            {
              host: ssh.host,
              port: ssh.port,
              username: ssh.user,
              socketPath: config.socketPath,
              ...(ssh.privateKeyFile !== undefined
                ? { privateKey: new SecretValue(readFileSync(ssh.privateKeyFile, "utf8")) }
                : {}),
              ...(ssh.passphraseEnv !== undefined && process.env[ssh.passphraseEnv] !== undefined
                ? { passphrase: new SecretValue(process.env[ssh.passphraseEnv]!) }
                : {}),
              ...(ssh.knownHostsFile !== undefined ? { knownHostsFile: ssh.knownHostsFile } : {}),
              ...(ssh.agentSocket !== undefined ? { agentSocket: ssh.agentSocket } : {}),
              insecureSkipHostKeyVerification: ssh.insecureIgnoreHostKey,
            },
            { handshakeTimeoutMs: ssh.dialTimeoutSeconds * 1000 },
          );
  } catch (error) {
    throw classifyLibvirtError(error, { operation: "connect", resource: label });
  }
  return sessionOver(connection, label);
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
  config: KvmBackendConfig,
  options: KvmListOptions,
): Promise<BackendListing> {
  const items: ListedItem[] = [];
  try {
    const domainNames = await listMarkedDomains(session, config, items, options);
    for (const poolName of config.pools)
      await listPool(session, config, poolName, domainNames, items, options);
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

/** Every domain name on the host (marked or not: their volumes are not orphans). */
async function listMarkedDomains(
  session: KvmSession,
  config: KvmBackendConfig,
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
      // From the domain XML, as KvmProxy's delete reads it: DOMAIN_GET_METADATA answers the
      // element without its namespace declaration, which LibvirtHost.mark then reads as unmarked.
      reading = parseDomainXml(await host.domainXml(dom)).mark;
      state = (await host.state(dom)).state;
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

async function listPool(
  session: KvmSession,
  config: KvmBackendConfig,
  poolName: string,
  domainNames: ReadonlySet<string>,
  items: ListedItem[],
  options: KvmListOptions,
): Promise<void> {
  const { host, label } = session;
  const pool = await host.findPool(poolName);
  if (pool === undefined)
    throw new PermanentError(
      `storage pool ${JSON.stringify(poolName)} does not exist on ${label}; fix pools in the config`,
    );
  const volumes = await listVolumes(session, pool);
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

export type { DeleteOutcome };

/**
 * Deletes one planned entry. The mark is read again first: a domain that was
 * replaced since the listing is somebody's new VM, not the orphan we planned.
 */
export async function deleteKvmEntry(
  session: KvmSession,
  config: KvmBackendConfig,
  entry: PlanEntry,
): Promise<DeleteOutcome> {
  const { host, label } = session;
  const { item } = entry;
  switch (item.kind) {
    case "domain":
      return deleteDomainEntry(config, entry);
    case "volume":
    case "seed": {
      if (item.vmName !== undefined && (await host.findDomain(item.vmName)) !== undefined)
        throw new PermanentError(
          `volume ${item.name} on ${label} now has a domain ${item.vmName}; left alone`,
        );
      return deleteVolumesIn(session, poolsOf(item, config), [item.name]);
    }
    case "base-image":
      // The marker first: a create that looks now sees an incomplete base and downloads again.
      return deleteVolumesIn(session, poolsOf(item, config), [
        baseImageMarkerName(item.name),
        item.name,
      ]);
    default:
      throw new PermanentError(`${item.kind} ${item.name} is not a KVM item`);
  }
}

/**
 * KvmProxy's own delete, given what its state would record of the listed
 * domain: the host's connection, the owner and creation time from the mark
 * (a domain made since under that name is not the one listed: it refuses),
 * and the pool. It destroys, undefines, and removes the per-VM volumes, even
 * when the domain is already gone; then the other configured pools are swept
 * of this VM's volumes, as the reaper lists all of them.
 */
async function deleteDomainEntry(
  config: KvmBackendConfig,
  entry: PlanEntry,
): Promise<DeleteOutcome> {
  const { item } = entry;
  if (item.ownership.kind !== "marked")
    throw new PermanentError(`domain ${item.name} has no readable mark; left alone`);
  const { mark } = item.ownership;
  if (`${mark.owner.project}/${mark.owner.stack}` !== entry.ownerStack)
    throw new PermanentError(
      `domain ${item.name} is planned for another stack than its mark's; left alone`,
    );
  const [firstPool, ...otherPools] = config.pools;
  const props = {
    ...kvmTargetOf(config),
    pool: firstPool,
    owner: mark.owner,
    createdAt: mark.createdAt,
    timeouts: { deleteSeconds: DELETE_BUDGET_MS / 1000 },
  };
  const outcome = await removeKvmProxy(kvmResourceId(labelOf(config), item.name), props);
  let removed = outcome === "removed";
  for (const pool of otherPools) {
    const more = await removeKvmProxy(kvmResourceId(labelOf(config), item.name), {
      ...props,
      pool,
    });
    removed = more === "removed" || removed;
  }
  return removed ? "removed" : "already gone";
}

/** The host as KvmProxy's inputs spell it; key, passphrase and known_hosts read from where the config says. */
function kvmTargetOf(config: KvmBackendConfig): Record<string, unknown> {
  const ssh = config.connection;
  if (ssh === undefined) return { socketPath: config.socketPath };
  return {
    socketPath: config.socketPath,
    connection: {
      host: ssh.host,
      port: ssh.port,
      user: ssh.user,
      insecureIgnoreHostKey: ssh.insecureIgnoreHostKey,
      dialTimeoutSeconds: ssh.dialTimeoutSeconds,
      ...(ssh.privateKeyFile !== undefined
        ? { privateKey: readFileSync(ssh.privateKeyFile, "utf8") }
        : {}),
      ...(ssh.passphraseEnv !== undefined && process.env[ssh.passphraseEnv] !== undefined
        ? { passphrase: process.env[ssh.passphraseEnv] }
        : {}),
      ...(ssh.knownHostsFile !== undefined
        ? { knownHosts: readFileSync(ssh.knownHostsFile, "utf8") }
        : {}),
      ...(ssh.agentSocket !== undefined ? { agentSocket: ssh.agentSocket } : {}),
    },
  };
}

/** The links KvmProxy's delete opened, closed after the run. */
export const closeKvmLinks = (): Promise<void> => closeAllHosts();

const poolsOf = (item: ListedItem, config: KvmBackendConfig): readonly string[] =>
  item.pool !== undefined ? [item.pool] : config.pools;

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
