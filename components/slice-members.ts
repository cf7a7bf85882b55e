/**
 * Who the pool's EndpointSlices list, as the pool hands it to the exporter
 * that writes them: the Secret's key `endpoints.json`, `{ port, ipv4: [...],
 * ipv6?: [...] }`. Pulumi writes this key (and the Secret) alone; the
 * exporter writes the slices alone, from this list and its own checks
 * (docs/egress.md, "Who writes what"). Pure: both sides use it.
 */
import { isIP } from "node:net";

/** The Secret's key the exporter reads the members from. */
export const SLICE_MEMBERS_KEY = "endpoints.json";

export interface SliceMembers {
  port: number;
  ipv4: string[];
  /** Present when the pool's proxies take IPv6 (their own slice). */
  ipv6?: string[];
}

export function sliceMembersJson(members: SliceMembers): string {
  return JSON.stringify({
    port: members.port,
    ipv4: members.ipv4,
    ...(members.ipv6 === undefined ? {} : { ipv6: members.ipv6 }),
  });
}

export class SliceMembersError extends Error {}

/** The document back, checked: the exporter must not write a slice from a list it cannot trust. */
export function parseSliceMembers(text: string, source: string): SliceMembers {
  let document: unknown;
  try {
    document = JSON.parse(text);
  } catch (error) {
    throw new SliceMembersError(`${source} is not JSON: ${(error as Error).message}`);
  }
  const { port, ipv4, ipv6 } = (document ?? {}) as Record<string, unknown>;
  if (typeof port !== "number" || !Number.isInteger(port) || port < 1 || port > 65_535)
    throw new SliceMembersError(`${source}: port must be a whole number from 1 to 65535`);
  const addresses = (value: unknown, family: 4 | 6, field: string): string[] => {
    if (
      !Array.isArray(value) ||
      value.some((each) => typeof each !== "string" || isIP(each) !== family)
    )
      throw new SliceMembersError(`${source}: ${field} must be a list of IPv${family} addresses`);
    return value as string[];
  };
  return {
    port,
    ipv4: addresses(ipv4, 4, "ipv4"),
    ...(ipv6 === undefined ? {} : { ipv6: addresses(ipv6, 6, "ipv6") }),
  };
}
