/**
 * Picks the VM's address from what libvirt reports. The address must belong
 * to the VM's own NIC (matched by MAC): a guest may bring up docker0 or a VPN
 * interface first, and those addresses are useless to clients.
 */

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
}

/**
 * Tries agent → lease → ARP in order; a source that fails or knows nothing
 * passes to the next. Pure orchestration over a `query` function so the
 * order and the failure handling are tested without a host.
 */
export async function lookUpAddress(
  mac: string,
  query: (source: AddressSource) => Promise<ReportedInterface[]>,
): Promise<AddressLookup> {
  const failures: AddressLookup["failures"] = [];
  for (const source of ["agent", "lease", "arp"] as const) {
    try {
      const ip = addressForMac(await query(source), mac);
      if (ip !== undefined) return { ip, source, failures };
    } catch (error) {
      failures.push({ source, message: error instanceof Error ? error.message : String(error) });
    }
  }
  return { ip: undefined, source: undefined, failures };
}
