/**
 * What a libvirt host answers for all its domains and volumes in one call,
 * shared by the Reads of a refresh (common/shared-listing.ts, issue 32): the
 * domains with their state and which of them autostart, the host's pools,
 * and a pool's volume names. Without sharing, every member paid a look-up by
 * UUID, a state, an autostart and a pool and volume look-up per volume.
 *
 * This module holds the listings and decides which calls forget them; it
 * imports nothing that talks to libvirt, so host-rpc.ts (through which every
 * call goes) can forget a host's listings without an import circle. The
 * questions themselves are asked by LibvirtHost (host.ts).
 */
import { SharedListings } from "../common/shared-listing";
import type { DomainHandle, StoragePoolHandle } from "../libvirt-rpc-xdr";

/**
 * How long after it was asked a host's listing may still answer a Read: 5 s,
 * half a Proxmox node's (proxmox/node-listings.ts: its calls are slower, each
 * through pvedaemon or the guest agent). The engine runs a
 * refresh's Reads `--parallel` at a time (4 × the CPUs by default,
 * docs/scale.md). A KvmProxy Read of a domain then costs two calls of its
 * own on a link already open (the XML, the disk's size: a few ms each on a
 * LAN), so a 200-member refresh fits one window with room for a slow host.
 * A longer window buys a refresh nothing and keeps a change made behind a
 * long-lived process's back (an engine test refreshing twice on one server)
 * hidden for longer; our own writes never hide, they forget.
 */
export const HOST_LISTING_WINDOW_MS = 5_000;

/** A domain as the host's listing reports it: what read needs without asking the domain. */
export interface ListedDomain {
  handle: DomainHandle;
  /** virDomainState (state.state of the STATE stats group); undefined if the host left it out. */
  state: number | undefined;
  autostart: boolean;
}

export interface DomainListing {
  /** By UUID in lower-case hex without dashes. */
  byUuid: ReadonlyMap<string, ListedDomain>;
  byName: ReadonlyMap<string, ListedDomain>;
}

export const uuidKey = (uuid: Buffer | string): string =>
  (typeof uuid === "string" ? uuid.replace(/-/g, "") : uuid.toString("hex")).toLowerCase();

const domainListings = new SharedListings<DomainListing>({ windowMs: HOST_LISTING_WINDOW_MS });
const poolListings = new SharedListings<ReadonlyMap<string, StoragePoolHandle>>({
  windowMs: HOST_LISTING_WINDOW_MS,
});
const volumeListings = new SharedListings<ReadonlySet<string>>({
  windowMs: HOST_LISTING_WINDOW_MS,
});

const volumeKey = (hostKey: string, poolName: string) => `${hostKey}\u0000${poolName}`;

/** The host's domains, asked once per window (and after each write of ours) for all Reads. */
export function sharedDomainListing(
  hostKey: string,
  list: () => Promise<DomainListing>,
): Promise<DomainListing> {
  return domainListings.get(hostKey, list);
}

/** The host's pools by name (inactive ones too, as a look-up by name finds them). */
export function sharedPoolListing(
  hostKey: string,
  list: () => Promise<ReadonlyMap<string, StoragePoolHandle>>,
): Promise<ReadonlyMap<string, StoragePoolHandle>> {
  return poolListings.get(hostKey, list);
}

/** The names of a pool's volumes as libvirt holds them (what a look-up by name consults). */
export function sharedVolumeListing(
  hostKey: string,
  poolName: string,
  list: () => Promise<ReadonlySet<string>>,
): Promise<ReadonlySet<string>> {
  return volumeListings.get(volumeKey(hostKey, poolName), list, hostKey);
}

/** The host changed (a write of ours): every later Read asks its listings again. */
export function forgetHostListings(hostKey: string): void {
  domainListings.forget(hostKey);
  poolListings.forget(hostKey);
  volumeListings.forget(hostKey);
}

/** How many listings of each kind were asked of the host (tests and benches). */
export function listingsAsked(hostKey: string): {
  domains: number;
  pools: number;
  volumes: number;
} {
  let volumes = 0;
  for (const [key, count] of volumeListings.asked)
    if (key.startsWith(volumeKey(hostKey, ""))) volumes += count;
  return {
    domains: domainListings.asked.get(hostKey) ?? 0,
    pools: poolListings.asked.get(hostKey) ?? 0,
    volumes,
  };
}

/**
 * libvirt procedures that only look: everything else (define, start,
 * destroy, undefine, autostart, metadata, volume create, upload, resize,
 * delete, pool and network changes) forgets the host's listings.
 */
const READ_ONLY_PROCEDURES: ReadonlySet<string> = new Set([
  "connectGetHostname",
  "connectGetLibVersion",
  "connectGetCapabilities",
  "connectGetDomainCapabilities",
  "connectGetAllDomainStats",
  "connectListAllDomains",
  "connectListAllStoragePools",
  "connectListAllNetworks",
  "connectListAllInterfaces",
  "connectSupportsFeature",
  "domainLookupByName",
  "domainLookupByUuid",
  "domainGetXmlDesc",
  "domainGetState",
  "domainGetAutostart",
  "domainGetMetadata",
  "domainGetHostname",
  "domainInterfaceAddresses",
  "storagePoolLookupByName",
  "storagePoolGetInfo",
  "storagePoolIsActive",
  "storagePoolListAllVolumes",
  "storageVolLookupByName",
  "storageVolGetInfo",
  "storageVolGetPath",
  "storageVolGetXmlDesc",
  "storageVolDownload",
  "networkLookupByName",
  "networkIsActive",
  "networkGetDhcpLeases",
]);

/**
 * Guest-agent commands that only look inside the guest. The others (file
 * writes, exec, shutdown) change the guest, not what libvirt lists, but they
 * forget too: what a Read reads after one of ours must not predate it.
 */
const READ_ONLY_AGENT_COMMANDS: ReadonlySet<string> = new Set([
  "guest-ping",
  "guest-sync",
  "guest-sync-delimited",
  "guest-info",
  "guest-network-get-interfaces",
  "guest-exec-status",
]);

const AGENT_COMMAND = "qemuDomainAgentCommand";

/** Whether a call may change what the host's listings say (decided here only). */
export function forgetsHostListings(procedure: string, args: unknown): boolean {
  if (procedure === AGENT_COMMAND) return !READ_ONLY_AGENT_COMMANDS.has(agentExecute(args));
  return !READ_ONLY_PROCEDURES.has(procedure);
}

function agentExecute(args: unknown): string {
  const cmd = (args as { cmd?: unknown } | undefined)?.cmd;
  if (typeof cmd !== "string") return "";
  try {
    const execute = (JSON.parse(cmd) as { execute?: unknown }).execute;
    return typeof execute === "string" ? execute : "";
  } catch {
    return "";
  }
}
