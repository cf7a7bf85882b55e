/**
 * An HTTP agent for one image download that connects only to addresses the
 * redirect policy (image-source-policy.ts) has checked. A name is never
 * resolved a second time for the connection: the socket gets the checked
 * addresses, so a DNS answer that changes between check and connect (DNS
 * rebinding) changes nothing. A host nobody checked is refused before any
 * socket exists: a second line behind the policy, should a code path ever
 * skip it.
 */
import type { LookupAddress } from "node:dns";
import type { LookupFunction } from "node:net";
import { Agent, buildConnector } from "undici";
import { ImageSourceRefusedError, type VettedHost } from "./image-source-policy";

export interface PinnedAgent {
  readonly dispatcher: Agent;
  /** Allows connections to this host, to exactly these addresses. */
  pin(host: VettedHost): void;
}

export function createPinnedAgent(connectTimeoutMs: number): PinnedAgent {
  const pins = new Map<string, VettedHost>();
  const base = buildConnector({ timeout: connectTimeoutMs, lookup: pinnedLookup(pins) });
  return {
    dispatcher: new Agent({ connect: pinnedConnector(pins, base) }),
    pin: (host) => pins.set(host.hostname, host),
  };
}

/** Refuses any host that was not pinned; hands the rest to `base` (which resolves through the pins). */
export function pinnedConnector(
  pins: ReadonlyMap<string, VettedHost>,
  base: buildConnector.connector,
): buildConnector.connector {
  return (options, callback) => {
    if (!pins.has(options.hostname)) {
      callback(
        new ImageSourceRefusedError(
          `image download tried to connect to ${options.hostname}, which the redirect policy never checked`,
        ),
        null,
      );
      return;
    }
    base(options, callback);
  };
}

/**
 * The `lookup` a socket uses for a name: the pinned addresses, never DNS.
 * Node asks with `all: true` when it races IPv4 and IPv6 (autoSelectFamily),
 * else for one address.
 */
function pinnedLookup(pins: ReadonlyMap<string, VettedHost>): LookupFunction {
  return (hostname, options, callback) => {
    const wanted = options.family === 4 || options.family === 6 ? options.family : undefined;
    const addresses: LookupAddress[] = (pins.get(hostname)?.addresses ?? []).filter(
      (candidate) => wanted === undefined || candidate.family === wanted,
    );
    if (addresses.length === 0) {
      const error = Object.assign(new Error(`${hostname} has no checked address to connect to`), {
        code: "ENOTFOUND",
      });
      callback(error, "");
      return;
    }
    if (options.all) callback(null, addresses);
    else callback(null, addresses[0]!.address, addresses[0]!.family);
  };
}
