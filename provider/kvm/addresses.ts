/**
 * Picks the VM's address from what libvirt reports. The address must belong
 * to the VM's own NIC (matched by MAC): a guest may bring up docker0 or a VPN
 * interface first, and those addresses are useless to clients.
 */
import { isRoutableIpv6, pickIpv6, type Ipv6Settings } from "../common/ip-families";

export interface ReportedInterface {
  name: string;
  hwaddr: string | null;
  addrs: Array<{ type: "ipv4" | "ipv6"; addr: string; prefix: number }>;
}

/** Loopback, link-local, unspecified, broadcast and multicast addresses never reach a proxy. */
export function isRoutableIpv4(address: string): boolean {
  const parts = address.split(".").map(Number);
  if (parts.length !== 4 || parts.some((part) => !Number.isInteger(part) || part < 0 || part > 255))
    return false;
  const [a, b] = parts;
  if (a === 0 || a === 127 || a >= 224) return false;
  if (a === 169 && b === 254) return false;
  return true;
}

/** The first routable IPv4 address on the interface whose MAC is ours, or undefined. */
export function addressForMac(
  interfaces: readonly ReportedInterface[],
  mac: string,
): string | undefined {
  const wanted = mac.toLowerCase();
  for (const candidate of interfaces) {
    if (candidate.hwaddr?.toLowerCase() !== wanted) continue;
    const address = candidate.addrs.find(
      (entry) => entry.type === "ipv4" && isRoutableIpv4(entry.addr),
    );
    if (address) return address.addr;
  }
  return undefined;
}

export type AddressSource = "agent" | "lease" | "arp";

export interface AddressLookup {
  ip: string | undefined;
  /** The source that answered, when one did. */
  source: AddressSource | undefined;
  /** Sources that failed (not "had nothing"): reported, never fatal on their own. */
  failures: Array<{ source: AddressSource; message: string }>;
  /** With `wanted.ipv6`: the VM's IPv6 address (common/ip-families.ts pickIpv6); only the agent knows it. */
  ipv6?: string;
}

/** The global IPv6 addresses on the interface whose MAC is ours. */
export function ipv6AddressesForMac(
  interfaces: readonly ReportedInterface[],
  mac: string,
): string[] {
  const wanted = mac.toLowerCase();
  return interfaces
    .filter((candidate) => candidate.hwaddr?.toLowerCase() === wanted)
    .flatMap((candidate) => candidate.addrs.filter((entry) => entry.type === "ipv6"))
    .map((entry) => entry.addr)
    .filter(isRoutableIpv6);
}

/**
 * Tries agent → lease → ARP in order; a source that fails or knows nothing
 * passes to the next. Pure orchestration over a `query` function so the
 * order and the failure handling are tested without a host. With
 * `wanted.ipv6`, the IPv6 address is looked for too (the agent reports it;
 * leases and ARP are IPv4 tables), and the look-up goes on until each
 * wanted family is found or every source was asked.
 */
export async function lookUpAddress(
  mac: string,
  query: (source: AddressSource) => Promise<ReportedInterface[]>,
  wanted: { ipv4: boolean; ipv6: boolean; settings?: Ipv6Settings } = { ipv4: true, ipv6: false },
): Promise<AddressLookup> {
  const failures: AddressLookup["failures"] = [];
  let ip: string | undefined;
  let ipv6: string | undefined;
  let source: AddressSource | undefined;
  for (const each of ["agent", "lease", "arp"] as const) {
    try {
      const interfaces = await query(each);
      if (wanted.ipv4 && ip === undefined) {
        ip = addressForMac(interfaces, mac);
        if (ip !== undefined) source = each;
      }
      if (wanted.ipv6 && ipv6 === undefined) {
        ipv6 = pickIpv6(ipv6AddressesForMac(interfaces, mac), mac, wanted.settings);
        if (ipv6 !== undefined) source ??= each;
      }
    } catch (error) {
      failures.push({
        source: each,
        message: error instanceof Error ? error.message : String(error),
      });
    }
    if ((!wanted.ipv4 || ip !== undefined) && (!wanted.ipv6 || ipv6 !== undefined)) break;
  }
  // An IPv6-only proxy is reached at its IPv6 address.
  const primary = wanted.ipv4 ? ip : ipv6;
  return {
    ip: primary,
    source: primary === undefined ? undefined : source,
    failures,
    ...(wanted.ipv6 ? { ipv6 } : {}),
  };
}

/**
 * The VM's addresses at a refresh, looked up as create did. One address
 * source failing must not blank an address we knew; a stopped VM has none.
 * An agent that answers without an IPv6 address on the NIC means the VM lost
 * it: null, the drift refresh shows (the re-check counts it as a silent IPv6
 * side). `known` are the outputs state holds.
 */
export async function refreshedAddresses(
  state: string,
  mac: string,
  query: (source: AddressSource) => Promise<ReportedInterface[]>,
  known: { ip?: unknown; ipv6Address?: unknown },
  wanted: { ipv4: boolean; ipv6: boolean; settings?: Ipv6Settings },
): Promise<{ ip: string | null; ipv6: string | null }> {
  const kept = (value: unknown) =>
    state === "stopped" || typeof value !== "string" ? null : value;
  if (state !== "running") return { ip: kept(known.ip), ipv6: kept(known.ipv6Address) };
  const lookup = await lookUpAddress(mac, query, wanted);
  const agentFailed = lookup.failures.some((failure) => failure.source === "agent");
  return {
    ip: lookup.ip ?? kept(known.ip),
    ipv6: lookup.ipv6 ?? (agentFailed ? kept(known.ipv6Address) : null),
  };
}
