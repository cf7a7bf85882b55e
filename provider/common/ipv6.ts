/**
 * IPv6 address text as numbers, the one parser the providers and the
 * pool's builders share. It needs nothing beyond node:net (the pool's pure
 * builders load it on their own).
 */
import { isIP } from "node:net";

/**
 * The eight 16-bit groups of an IPv6 address in any form (`::`, a dotted
 * IPv4 tail, upper case, a zone id), or undefined when it is none.
 */
export function ipv6Groups(address: string): number[] | undefined {
  const bare = address.replace(/%.*$/, "");
  if (isIP(bare) !== 6) return undefined;
  // The URL parser writes every IPv6 form one canonical way: hex groups, at most one `::`.
  const canonical = new URL(`http://[${bare}]/`).hostname.slice(1, -1);
  const [head, tail] = canonical.split("::") as [string, string | undefined];
  const part = (text: string | undefined) => (text ? text.split(":") : []);
  const left = part(head);
  const right = part(tail);
  const fill = tail === undefined ? [] : Array<string>(8 - left.length - right.length).fill("0");
  return [...left, ...fill, ...right].map((group) => parseInt(group, 16));
}
