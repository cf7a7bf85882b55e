/**
 * The egress check of a proxy that spreads a routed IPv6 prefix
 * (docs/many-exit-addresses.md): one answer says nothing about a spread, so
 * the IPv6 URL is fetched `ipv6Samples` times and the distinct exit addresses
 * counted. The guest's dialer falls back to the VM's own address when a
 * prefix address cannot connect (an unrouted prefix looks like that), so a
 * dialer that is not working answers every request, just from one address:
 * that must fail create, not pass as a healthy proxy.
 */
import { ipv6Bytes } from "./ip-families";
import { PermanentError } from "./errors";

/** Enough to tell a spread from one address with certainty (random: 20 draws from 2^64), cheap at create. */
export const DEFAULT_IPV6_SAMPLES = 20;

export interface SampledPrefix {
  prefix: string;
  mode: "random" | "sticky" | "pool";
  count?: number;
}

/** Whether `address` lies in `prefix` (CIDR text); false for anything that does not parse. */
export function inIpv6Prefix(address: string, prefix: string): boolean {
  const [network, lengthText] = prefix.split("/");
  const length = Number(lengthText);
  const a = ipv6Bytes(address);
  const n = ipv6Bytes(network ?? "");
  if (a === undefined || n === undefined || !Number.isInteger(length)) return false;
  for (let bit = 0; bit < length; bit++) {
    const mask = 0x80 >> (bit % 8);
    if ((a[bit >> 3]! & mask) !== (n[bit >> 3]! & mask)) return false;
  }
  return true;
}

/** Whether the mode should give more than one address to one client (sticky gives one per user). */
const spreads = (prefix: SampledPrefix): boolean =>
  prefix.mode === "random" || (prefix.mode === "pool" && (prefix.count ?? 1) > 1);

/**
 * Fetches the remaining samples (the first answer is `first`) and returns how
 * many distinct exit addresses they showed; throws PermanentError when none
 * lay in the prefix, or when a spreading mode showed only one.
 */
export async function sampleIpv6Exits(
  first: string,
  fetchOne: (proxy: { host: string; port: number }) => Promise<string>,
  proxy: { host: string; port: number },
  check: { ipv6Url?: string; ipv6Samples?: number; ipv6Prefix?: SampledPrefix },
): Promise<number> {
  const prefix = check.ipv6Prefix!;
  const samples = check.ipv6Samples ?? DEFAULT_IPV6_SAMPLES;
  const seen = new Set([first]);
  for (let sample = 1; sample < samples; sample++) seen.add(await fetchOne(proxy));
  const where = `egressCheck ${check.ipv6Url} through the proxy at [${proxy.host}]:${proxy.port}`;
  const inside = [...seen].filter((address) => inIpv6Prefix(address, prefix.prefix));
  if (inside.length === 0)
    throw new PermanentError(
      `${where}: none of ${samples} requests left from ${prefix.prefix} (seen: ${[...seen].join(", ")}), so the prefix dialer is not sending from the prefix; check that the prefix is routed to the VM's IPv6 address (ip -6 route add ${prefix.prefix} via <the VM's IPv6 address> dev <bridge>) and that the guest's egress-prefix-dialer unit runs`,
    );
  if (spreads(prefix) && seen.size === 1)
    throw new PermanentError(
      `${where}: all ${samples} requests left from one address, ${first}, though ipv6Prefix.mode is ${prefix.mode}; the prefix dialer is not spreading its connections (check the guest's egress-prefix-dialer unit and the route of ${prefix.prefix} to the VM)`,
    );
  return seen.size;
}
