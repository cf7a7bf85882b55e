/**
 * What an image download may reach. The image server is untrusted input: it
 * picks where a redirect goes, and the download runs on the machine that runs
 * `pulumi up`, which may sit next to a cloud metadata service or a local
 * admin port. An https image may come without `sha256`, so whatever the last
 * hop answers could become a base image. The policy:
 *
 * - at most {@link MAX_IMAGE_REDIRECTS} redirects, each Location resolved
 *   against the URL that sent it;
 * - only http and https, and never from https down to http (an https image
 *   may have no digest: the scheme is what vouches for it);
 * - never to a URL with user:password@ (it would be sent as credentials);
 * - never to a loopback, link-local, cloud metadata, unspecified or IPv6
 *   unique-local address, by literal, by a well-known name, or by what a name
 *   resolves to, unless image.url itself reaches that kind of address (a lab
 *   mirror on loopback keeps its own redirects); an IPv4 address written
 *   inside IPv6 (mapped, translated, compatible, 6to4, Teredo, NAT64) is
 *   judged as the IPv4 address it reaches;
 * - each host is resolved once, and the connection is pinned to the
 *   addresses checked here (see pinned-agent.ts), so DNS cannot answer
 *   differently for the connect than for the check.
 *
 * Refusals are {@link ImageSourceRefusedError}s; classify.ts makes them
 * Permanent: no retry turns a refused redirect into an allowed one.
 */
import { lookup as systemDnsLookup } from "node:dns/promises";
import { isIP } from "node:net";
import { redactUrl } from "../common/redact";
import { ipv6Groups } from "../common/ipv6";

export const MAX_IMAGE_REDIRECTS = 5;

/** The address kinds a redirect may not reach unless image.url reaches the same kind. */
export type GuardedAddressKind =
  "loopback" | "link-local" | "metadata" | "unspecified" | "unique-local";

const KIND_DESCRIPTION: Record<GuardedAddressKind, string> = {
  loopback: "a loopback address",
  "link-local": "a link-local address",
  metadata: "a cloud metadata address",
  unspecified: "an unspecified address (it reaches this machine)",
  "unique-local": "an IPv6 unique-local address (fc00::/7, a private network)",
};

/**
 * Metadata services by address. Most live inside 169.254/16 and are
 * link-local anyway; listing them as their own kind means a link-local mirror
 * still cannot redirect into one. 100.100.100.200 sits in shared address
 * space (100.64/10) and is guarded only by this list.
 */
const METADATA_V4: ReadonlySet<string> = new Set([
  "169.254.169.254", // AWS, GCP, Azure, OpenStack, Oracle, DigitalOcean, Hetzner, ...
  "169.254.170.2", // AWS ECS task metadata and credentials
  "169.254.170.23", // AWS EKS Pod Identity agent
  "169.254.0.23", // Tencent Cloud
  "169.254.42.42", // Scaleway
  "100.100.100.200", // Alibaba Cloud
  "192.0.0.192", // Oracle Cloud Classic
]);
const METADATA_V6: readonly string[] = [
  "fd00:ec2::254", // AWS IMDS over IPv6
  "fd00:ec2::23", // AWS EKS Pod Identity agent over IPv6
  "fd00:42::42", // Scaleway
];
/** Names that reach a metadata service through a cloud's own resolver. */
const METADATA_NAMES: ReadonlySet<string> = new Set([
  "metadata",
  "metadata.google.internal",
  "metadata.goog",
  "instance-data",
  "instance-data.ec2.internal",
  "metadata.tencentyun.com",
]);

export interface ResolvedAddress {
  address: string;
  family: 4 | 6;
}

/** Resolves a host name to all its addresses; must give up when `signal` aborts. */
export type HostLookup = (hostname: string, signal: AbortSignal) => Promise<ResolvedAddress[]>;

/** A redirect or address the policy refuses. Permanent (classify.ts). */
export class ImageSourceRefusedError extends Error {
  override readonly name = "ImageSourceRefusedError";
}

/** A host that passed the policy, with the addresses the connection is pinned to. */
export interface VettedHost {
  /** As the connector sees it: no brackets around IPv6 literals. */
  hostname: string;
  addresses: ResolvedAddress[];
  /** The guarded kinds among its name and addresses (empty for an ordinary host). */
  kinds: ReadonlySet<GuardedAddressKind>;
}

/** Which guarded kinds a hop may reach: any for image.url itself, else those image.url reached. */
export type AllowedKinds = "any" | ReadonlySet<GuardedAddressKind>;

/** The guarded kind of an IP address literal, or undefined for an ordinary address. */
export function addressKind(address: string): GuardedAddressKind | undefined {
  const bare = address.replace(/%.*$/, ""); // an IPv6 zone id says nothing about the address
  if (isIP(bare) === 4) return ipv4Kind(bare.split(".").map(Number));
  const groups = ipv6Groups(bare);
  return groups === undefined ? undefined : ipv6Kind(groups);
}

function ipv4Kind(octets: number[]): GuardedAddressKind | undefined {
  if (METADATA_V4.has(octets.join("."))) return "metadata";
  if (octets[0] === 0) return "unspecified"; // 0.0.0.0/8: Linux connects 0.0.0.0 to this machine
  if (octets[0] === 127) return "loopback";
  if (octets[0] === 169 && octets[1] === 254) return "link-local";
  return undefined;
}

function ipv6Kind(groups: number[]): GuardedAddressKind | undefined {
  if (METADATA_V6_GROUPS.some((listed) => listed.every((g, i) => g === groups[i])))
    return "metadata";
  const zeros = (count: number) => groups.slice(0, count).every((g) => g === 0);
  if (zeros(8)) return "unspecified";
  if (zeros(7) && groups[7] === 1) return "loopback";
  if ((groups[0]! & 0xffc0) === 0xfe80) return "link-local";
  const carried = embeddedIpv4Forms(groups);
  if (carried.length > 0) return carried.map(ipv4Kind).find((kind) => kind !== undefined);
  // Unique-local is IPv6's private space, where clouds put metadata services
  // (fd00:ec2::/32); unlike 10/8 in IPv4, nothing serves public images there.
  if ((groups[0]! & 0xfe00) === 0xfc00) return "unique-local";
  return undefined;
}

/**
 * The IPv4 addresses an IPv6 address reaches: mapped (::ffff:a.b.c.d),
 * translated (::ffff:0:a.b.c.d, RFC 7915), the old compatible form
 * (::a.b.c.d), 6to4 (2002:aabb:ccdd::/48), Teredo's client (2001::/32, the
 * last 32 bits inverted) and NAT64 (the well-known 64:ff9b::/96 and the
 * local-use 64:ff9b:1::/48, as a /96 when bits 48–95 are zero, else as a /48
 * per RFC 6052 first and a /96 next: an operator may split it either way).
 */
function embeddedIpv4Forms(groups: number[]): number[][] {
  const zeros = (from: number, to: number) => groups.slice(from, to).every((g) => g === 0);
  const octets = (high: number, low: number) => [high >> 8, high & 0xff, low >> 8, low & 0xff];
  const tail = octets(groups[6]!, groups[7]!);
  if (zeros(0, 5) && groups[5] === 0xffff) return [tail];
  if (zeros(0, 4) && groups[4] === 0xffff && groups[5] === 0) return [tail];
  if (zeros(0, 6)) return [tail];
  if (groups[0] === 0x2002) return [octets(groups[1]!, groups[2]!)];
  if (groups[0] === 0x2001 && groups[1] === 0)
    return [octets(groups[6]! ^ 0xffff, groups[7]! ^ 0xffff)];
  if (groups[0] === 0x64 && groups[1] === 0xff9b) {
    if (zeros(2, 6)) return [tail];
    if (groups[2] === 1) {
      if (zeros(3, 6)) return [tail];
      const asPrefix48 = [groups[3]! >> 8, groups[3]! & 0xff, groups[4]! & 0xff, groups[5]! >> 8];
      return [asPrefix48, tail];
    }
  }
  return [];
}

const METADATA_V6_GROUPS = METADATA_V6.map((address) => ipv6Groups(address)!);

/** The guarded kind a host name announces by itself, before any lookup. */
export function hostNameKind(hostname: string): GuardedAddressKind | undefined {
  const name = hostname.toLowerCase().replace(/\.$/, "");
  if (name === "localhost" || name.endsWith(".localhost")) return "loopback"; // RFC 6761
  if (METADATA_NAMES.has(name)) return "metadata";
  return undefined;
}

/** The system resolver (what the connection would use), stopped by `signal`. */
export const systemLookup: HostLookup = (hostname, signal) =>
  new Promise<ResolvedAddress[]>((resolve, reject) => {
    if (signal.aborted) return reject(signal.reason as Error);
    const onAbort = () => reject(signal.reason as Error);
    signal.addEventListener("abort", onAbort, { once: true });
    systemDnsLookup(hostname, { all: true })
      .then(
        (answers) =>
          resolve(
            answers.map(({ address, family }) => ({ address, family: family === 6 ? 6 : 4 })),
          ),
        reject,
      )
      .finally(() => signal.removeEventListener("abort", onAbort));
  });

/**
 * How a URL the image server chose appears in messages: no userinfo, no
 * query (signed CDN URLs carry tokens there), bounded in length. image.url
 * itself is the user's own text and is shown whole, minus userinfo.
 */
export function describeImageUrl(url: URL): string {
  const copy = new URL(url.href);
  const hadQuery = copy.search !== "";
  copy.search = "";
  copy.hash = "";
  const shown = redactUrl(copy.href);
  return (shown.length > 200 ? `${shown.slice(0, 200)}…` : shown) + (hadQuery ? "?…" : "");
}

/**
 * The URL a redirect leads to, or a refusal: a missing or unreadable
 * Location, too many hops, a scheme other than http(s), https to http, or
 * userinfo. `redirectNumber` counts from 1.
 */
export function redirectTarget(
  original: URL,
  current: URL,
  location: string | string[] | undefined,
  redirectNumber: number,
): URL {
  const refuse = (why: string) =>
    new ImageSourceRefusedError(`image.url ${redactUrl(original.href)} ${why}`);
  const where = `was redirected by ${describeImageUrl(current)}`;
  const values = location === undefined ? [] : [location].flat();
  if (values.length === 0 || values[0] === "")
    throw refuse(`${where} without a Location header; point image.url at the image itself`);
  if (values.some((value) => value !== values[0]))
    throw refuse(
      `${where} with ${values.length} different Location headers; point image.url at the image itself`,
    );
  let next: URL;
  try {
    next = new URL(values[0]!, current);
  } catch {
    throw refuse(`${where} to something that is not a URL; point image.url at the image itself`);
  }
  const to = `${where} to ${describeImageUrl(next)}`;
  if (redirectNumber > MAX_IMAGE_REDIRECTS)
    throw refuse(
      `was redirected more than ${MAX_IMAGE_REDIRECTS} times (the last one to ${describeImageUrl(next)}); point image.url at the image's final location`,
    );
  if (next.protocol !== "http:" && next.protocol !== "https:")
    throw refuse(
      `${to}: only http and https redirects are followed; point image.url at the image's final location`,
    );
  if (current.protocol === "https:" && next.protocol === "http:")
    throw refuse(
      `${to}: a redirect from https down to plain http is never followed (nothing would vouch for the image); point image.url at the image's final location`,
    );
  if (next.username !== "" || next.password !== "")
    throw refuse(
      `${to}: a redirect carrying credentials (user:password@) is never followed; the image must be downloadable without credentials`,
    );
  next.hash = "";
  return next;
}

/**
 * Checks the host of `url` against the policy and returns the addresses the
 * connection may use. A literal is checked as is; a name is checked by
 * itself (localhost, metadata names) before any lookup, then every address
 * it resolves to is checked: one guarded address among ordinary ones refuses
 * the host, because the connection could pick any of them.
 */
export async function vetHost(
  url: URL,
  allowed: AllowedKinds,
  context: { original: URL; lookup: HostLookup; signal: AbortSignal },
): Promise<VettedHost> {
  const hostname = url.hostname.replace(/^\[(.*)\]$/, "$1");
  const refuse = (kind: GuardedAddressKind, via: string) =>
    new ImageSourceRefusedError(
      `image.url ${redactUrl(context.original.href)} was redirected to ${describeImageUrl(url)}${via}, ${KIND_DESCRIPTION[kind]}: redirects may reach loopback, link-local, metadata, unspecified or unique-local addresses only when image.url itself points at one; point image.url at the image's final location if this redirect is intended`,
    );
  const permits = (kind: GuardedAddressKind) => allowed === "any" || allowed.has(kind);
  const family = isIP(hostname);
  if (family !== 0) {
    const kind = addressKind(hostname);
    if (kind !== undefined && !permits(kind)) throw refuse(kind, "");
    return {
      hostname,
      addresses: [{ address: hostname, family: family === 6 ? 6 : 4 }],
      kinds: new Set(kind === undefined ? [] : [kind]),
    };
  }
  const kinds = new Set<GuardedAddressKind>();
  const nameKind = hostNameKind(hostname);
  if (nameKind !== undefined) {
    if (!permits(nameKind)) throw refuse(nameKind, "");
    kinds.add(nameKind);
  }
  const addresses = await context.lookup(hostname, context.signal);
  if (addresses.length === 0)
    throw Object.assign(new Error(`${hostname} resolved to no address`), { code: "ENOTFOUND" });
  for (const { address } of addresses) {
    const kind = addressKind(address);
    if (kind === undefined) continue;
    if (!permits(kind)) throw refuse(kind, ` (${hostname} resolves to ${address})`);
    kinds.add(kind);
  }
  return { hostname, addresses, kinds };
}
