/**
 * What the published endpoints say about each proxy: what readiness and the
 * egress check found at deploy time, not a constant. Pure functions the
 * Kubernetes publishing uses for the Secret's proxies.json and the
 * EndpointSlice.
 */
import { isPathUnknown, isUnanswered } from "../provider/common/egress-recheck";
import type { IpFamily } from "../provider/common/ip-families";

/** What was checked about one proxy when it was created. */
export interface EndpointCheck {
  /** The VM's address (the key that ties the check to a URL and a slice endpoint). */
  address: string;
  /** true: readiness checked the proxy answers; null: nothing checked that (readiness "address"). */
  ready: boolean | null;
  /** The address targets see, from the egress check; null without one. */
  egressIp: string | null;
  /** When it was checked, ISO 8601; null when nothing was. */
  checkedAt: string | null;
}

/** What a proxy's `state` output says when it can carry traffic (VMs: "running"; static proxies: "reachable"). */
const SERVING_STATES = new Set(["running", "reachable"]);

/**
 * Whether the pool publishes a proxy as ready: a proxy whose last read
 * (create, or a refresh) found it stopped, paused, crashed or unreachable is
 * not (false: Kubernetes sends it no traffic), whatever was checked at create;
 * nor is one that did not answer its last egress re-check (an `egressProblem`
 * of kind "unanswered"; one that answered without an address is reported,
 * not withdrawn: an echo service down would fail every proxy alike); one
 * silent here whose guest listens ("path-unknown") is unknown (null); otherwise
 * what readiness checked then (true), or nothing checked (null).
 * `state` is absent in state written before it was reported: judged as before.
 */
export function publishedReadiness(
  state: string | null | undefined,
  checkedAt: string | null | undefined,
  readinessChecksTheProxy: boolean,
  egressProblem?: unknown,
  /** The family of the URL judged: a dual-stack proxy silent on one family stays ready on the other. */
  family?: IpFamily,
): boolean | null {
  if (typeof state === "string" && !SERVING_STATES.has(state)) return false;
  if (isUnanswered(egressProblem, family)) return false;
  // Silent from the runner, listening in the guest: nobody knows; Kubernetes reads "unknown" as ready.
  if (isPathUnknown(egressProblem, family)) return null;
  return checkedAt && readinessChecksTheProxy ? true : null;
}

/** One entry of the Secret's proxies.json. */
export interface PublishedProxy {
  url: string;
  ready: boolean | null;
  egressIp: string | null;
  checkedAt: string | null;
}

/**
 * proxies.json: one object per proxy, `url` first. `urls[i]` and `checks[i]`
 * describe the same proxy (the pool builds both from one list). `checkedAt`
 * is null: the time of the last check moves with every refresh, and a
 * Secret that carried it would change at every resync (it is in the stack
 * output `proxies[].checkedAt`, and the exporter's metrics).
 */
export function proxiesJson(
  urls: readonly string[],
  checks: readonly EndpointCheck[] = [],
  /** false: readiness is kept elsewhere (the exporter's slices); `ready` and `checkedAt` are null. */
  { readiness }: { readiness: boolean } = { readiness: true },
): string {
  const entries: PublishedProxy[] = urls.map((url, index) => ({
    url,
    ready: readiness ? (checks[index]?.ready ?? null) : null,
    egressIp: checks[index]?.egressIp ?? null,
    checkedAt: null,
  }));
  return JSON.stringify(entries);
}

/**
 * An EndpointSlice endpoint. `conditions.ready` is what readiness found;
 * unknown is left out, which Kubernetes reads as ready (the documented
 * meaning of an absent condition), so a pool with readiness "address" keeps
 * receiving traffic as before.
 */
export function sliceEndpoint(
  address: string,
  check: EndpointCheck | undefined,
): { addresses: string[]; conditions: { ready?: boolean } } {
  const ready = check?.ready;
  return {
    addresses: [address],
    conditions: ready === null || ready === undefined ? {} : { ready },
  };
}

/** The slice annotation carrying the egress addresses (conditions have no room for them); no check time, as in proxies.json. */
export const CHECKS_ANNOTATION = "egress-proxies.dev/checks";

export function checksAnnotation(checks: readonly EndpointCheck[]): string {
  return JSON.stringify(checks.map(({ address, egressIp }) => ({ address, egressIp })));
}
