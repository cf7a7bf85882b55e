/**
 * What the pool says about each member once its outputs are known: the
 * `proxies` output, and the checks the Kubernetes publishing derives from it.
 */
import { isIP } from "node:net";
import * as pulumi from "@pulumi/pulumi";
import type { IpFamily } from "../provider/common/ip-families";
import type { PoolMember } from "./backend-kind";
import type { PlacedProxy } from "./placement";
import type { EndpointCheck } from "./published-checks";
import { publishedReadiness } from "./published-checks";

export interface ProxyDetails {
  /** The proxy's key in the pool: `<backend>-<index>`. */
  name: string;
  backend: string;
  /** The backend's kind: its key in the pool's backends (kvm, proxmox, …). */
  kind: string;
  vmName: string;
  host: string;
  ip: string | null;
  /** The resource's provider id. */
  id: string;
  /** http://ip:port, or null while the address is unknown. */
  endpoint: string | null;
  /** The address targets see through this proxy (egress check at create); null without a check. */
  egressIp: string | null;
  /** When the exit address (or readiness) was last established, ISO 8601; null if nothing was checked. */
  checkedAt: string | null;
  /** Why the last egress re-check failed; null when it passed or none ran. */
  egressProblem: string | null;
  /**
   * What kind of failure: "unanswered" (no answer; the next `up` restarts it),
   * "egress" (an answer without an address; reported only), "path-unknown"
   * (no answer from the runner that refreshed, but its guest listens: never
   * restarted for it); null when it passed or none ran.
   */
  egressProblemKind: "unanswered" | "egress" | "path-unknown" | null;
  /** When the VM was created, ISO 8601; null for a static proxy. */
  createdAt: string | null;
  /** With rotateAfterDays: when the VM becomes due for rotation by age, ISO 8601; else null. */
  rotateAfter: string | null;
  /**
   * true when readiness checked that the proxy answers; false when the last
   * create or refresh found it not running (stopped, paused, crashed,
   * unreachable); null when nothing checked it (readiness "address"/"none").
   */
  ready: boolean | null;
  /** The resource's `state` as the last create or refresh found it; null in state from before it was reported. */
  state: string | null;
  /** Only for a member that takes IPv6: its IPv6 address, URL and exit address (null while unknown). */
  ipv6Address?: string | null;
  endpointIpv6?: string | null;
  egressIpv6?: string | null;
  /** `ready` for the IPv6 URL: a member whose last re-check found only IPv6 silent is ready on IPv4 only. */
  readyIpv6?: boolean | null;
  /** Only for a member that spreads a prefix (ipv6Prefix): its /64 (or its own prefix), to route to ipv6Address. */
  ipv6Prefix?: string;
}

/** When a VM created at `createdAt` becomes due for rotation by age (the provider's rule: common/egress-recheck.ts). */
function rotateAfterOf(
  createdAt: string | null | undefined,
  days: number | undefined,
): string | null {
  if (days === undefined || typeof createdAt !== "string") return null;
  const born = Date.parse(createdAt);
  return Number.isNaN(born) ? null : new Date(born + days * 86_400_000).toISOString();
}

const familyOf = (ip: string | null | undefined): IpFamily =>
  typeof ip === "string" && isIP(ip) === 6 ? "ipv6" : "ipv4";

/** What the Kubernetes publishing says about each proxy with an address. */
export function endpointChecks(proxies: readonly ProxyDetails[]): EndpointCheck[] {
  // One check per published URL, in the same order (proxies.json pairs them by position).
  return proxies.flatMap((proxy) => [
    ...(proxy.endpoint === null
      ? []
      : [
          {
            address: proxy.ip ?? proxy.host,
            ready: proxy.ready,
            egressIp: proxy.egressIp,
            checkedAt: proxy.checkedAt,
          },
        ]),
    // The IPv6 URL of a dual-stack member, checked over IPv6 (memberUrls' order).
    ...(proxy.endpointIpv6 === null || proxy.endpointIpv6 === undefined
      ? []
      : [
          {
            address: proxy.ipv6Address ?? proxy.host,
            ready: proxy.readyIpv6 === undefined ? proxy.ready : proxy.readyIpv6,
            egressIp: proxy.egressIpv6 ?? null,
            checkedAt: proxy.checkedAt,
          },
        ]),
  ]);
}

/** What `proxies` says about one member, once its outputs are known. */
export function proxyDetailsOf(
  member: PoolMember,
  proxy: PlacedProxy,
  kind: string,
  pool: { checked: boolean; rotateAfterDays?: number },
): pulumi.Output<ProxyDetails> {
  const checked = pool.checked;
  return pulumi
    .all([
      member.vmName,
      member.host,
      member.ip,
      member.resource.id,
      member.egressIp,
      member.checkedAt,
      member.endpoint,
      pulumi.all([
        member.state,
        member.egressProblem,
        member.createdAt,
        pulumi.all([member.ipv6.address, member.ipv6.endpoint, member.ipv6.egressIp]),
      ]),
    ])
    .apply(
      ([
        vmName,
        host,
        ip,
        id,
        egressIp,
        checkedAt,
        endpoint,
        [state, problem, createdAt, [ipv6Address, endpointIpv6, egressIpv6]],
      ]) => ({
        name: proxy.key,
        backend: proxy.backend,
        kind,
        vmName,
        host,
        ip: ip ?? null,
        id,
        endpoint: endpoint ?? null,
        // Absent in state written before the egress check existed.
        egressIp: egressIp ?? null,
        checkedAt: checkedAt ?? null,
        egressProblem: problem?.reason ?? null,
        egressProblemKind: problem?.kind ?? null,
        createdAt: createdAt ?? null,
        rotateAfter: rotateAfterOf(createdAt, pool.rotateAfterDays),
        // The primary URL's family: an IPv6-only member's `ip` is its IPv6 address.
        ready: publishedReadiness(state, checkedAt, checked, problem, familyOf(ip)),
        state: state ?? null,
        // An IPv4-only member's details stay as they were.
        ...(ipv6Address === undefined
          ? {}
          : {
              ipv6Address,
              endpointIpv6: endpointIpv6 ?? null,
              egressIpv6: egressIpv6 ?? null,
              readyIpv6: publishedReadiness(state, checkedAt, checked, problem, "ipv6"),
            }),
      }),
    );
}
