/**
 * A pool whose VM proxies take IPv6 (docs/egress.md, "IPv6 and dual stack"):
 * what its arguments must say, and which of its members' addresses and URLs
 * it publishes. Kept apart from pool.ts so the pool's constructor only asks.
 */
import { isIP } from "node:net";
import { ipFamiliesShape, type IpFamily } from "../provider/common/ip-families";

/** What of the pool's arguments decides its families (structural: pool.ts imports this module). */
export interface PoolIpFamilyArgs {
  ipFamilies?: unknown;
  squid?: { allowedClientCidrs?: readonly string[] };
  backends?: readonly object[];
}

/** The pool's own `ipFamilies` and squid's client ranges, each problem naming the field and the fix. */
export function poolIpFamilyProblems(args: PoolIpFamilyArgs): string[] {
  const problems: string[] = [];
  if (args.ipFamilies !== undefined) {
    const parsed = ipFamiliesShape.ipFamilies.safeParse(args.ipFamilies);
    if (!parsed.success) problems.push(...parsed.error.issues.map((issue) => issue.message));
  }
  if (poolTakesIpv6(args)) {
    const cidrs = args.squid?.allowedClientCidrs;
    if (cidrs === undefined || !cidrs.some((cidr) => isIP(cidr.split("/")[0]!) === 6))
      problems.push(
        'squid.allowedClientCidrs lists no IPv6 range, so squid would refuse every client that comes over IPv6; add your clients\' prefix, e.g. allowedClientCidrs: ["10.0.0.0/8", "fd00::/8"]',
      );
  }
  return problems;
}

/**
 * Whether any VM member takes IPv6, from the values known when the pool is
 * declared (the pool's ipFamilies, or a backend's written as a plain list):
 * it decides the Kubernetes objects, which must not change for a pool that
 * takes no IPv6.
 */
export function poolTakesIpv6(args: PoolIpFamilyArgs): boolean {
  const asks = (families: unknown): boolean =>
    Array.isArray(families) && (families as unknown[]).includes("ipv6");
  return (
    asks(args.ipFamilies) ||
    // A backend's settings sit under its kind's key; whichever kind it is, its ipFamilies count.
    (args.backends ?? []).some((backend) =>
      Object.values(backend).some(
        (settings) =>
          typeof settings === "object" &&
          settings !== null &&
          asks((settings as { ipFamilies?: unknown }).ipFamilies),
      ),
    )
  );
}

/** The pool's ipFamilies for a member whose backend sets none (a backend's own wins). */
export function memberIpFamilies(
  pool: IpFamily[] | undefined,
  backend: unknown,
): { ipFamilies?: IpFamily[] } {
  return pool === undefined || backend !== undefined ? {} : { ipFamilies: pool };
}

/** A member's URLs in publishing order: its primary one, then its IPv6 one when that is another address. */
export function memberUrls(primary: string | null, ipv6: string | null | undefined): string[] {
  return [primary, ipv6].flatMap((url) => (url === null || url === undefined ? [] : [url]));
}
