/**
 * How a host is written. Configuration may give an IPv6 literal bare
 * (`2001:db8::10`) or bracketed (`[2001:db8::10]`, as in URLs); sockets and
 * known_hosts want it bare, and anything that appends a port needs the
 * brackets or `2001:db8::10:2222` reads as another address.
 */
import { isIP } from "node:net";

/** The host without URL brackets: what a socket connects to. */
export const bareHost = (host: string): string => host.replace(/^\[(.*)\]$/, "$1");

/**
 * An IPv6 literal in its one canonical spelling (RFC 5952: lower case,
 * longest zero run as `::`), as ssh-keyscan writes it into known_hosts;
 * anything else as given, without brackets.
 */
export function canonicalHost(host: string): string {
  const bare = bareHost(host);
  if (isIP(bare) !== 6 || bare.includes("%")) return bare;
  return new URL(`http://[${bare}]/`).hostname.slice(1, -1);
}

/** `host:port`, an IPv6 literal bracketed (`[2001:db8::10]:2222`). */
export function hostAndPort(host: string, port: number): string {
  const bare = bareHost(host);
  return `${isIP(bare) === 6 ? `[${bare}]` : bare}:${port}`;
}

/** The host alone as it appears beside other text: an IPv6 literal bracketed, anything else as given. */
export function bracketedHost(host: string): string {
  const bare = bareHost(host);
  return isIP(bare) === 6 ? `[${bare}]` : bare;
}
