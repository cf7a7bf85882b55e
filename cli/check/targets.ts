/**
 * Which proxies `check` probes, from the documents users already have:
 * `pulumi stack output --json` of a stack built with EgressProxyPool (the
 * root program's or their own, exporting `endpointsWithCredentials` or
 * `endpoints`, and `proxies` for names), the `proxies.json` the Kubernetes
 * publishing writes (an array of `{ url, ... }`, or of URLs in older
 * deployments), or plain proxy URLs.
 */
import { isIP } from "node:net";
import type { ProxyCredentials } from "../../provider/common/proxy-probe";

export interface ProxyTarget {
  /** The pool's key for it (`<backend>-<index>`) when the input names it, else host:port. */
  name: string;
  host: string;
  port: number;
  /** host:port (IPv6 in brackets), never with credentials. */
  endpoint: string;
  credentials?: ProxyCredentials;
  /**
   * The address family it is reached over: "ipv6" for an IPv6 literal (a
   * dual-stack member's second URL), else "ipv4". A metric label, and which
   * egress URL applies (--egress-url-ipv6).
   */
  family: "ipv4" | "ipv6";
  /** From the pool's `proxies[].rotateAfter`: when the member is due for rotation by age. */
  rotateAfter?: string;
  /** From the pool's `proxies[]`: what the last refresh's re-check found wrong, if anything. */
  recordedProblem?: RecordedProblem;
}

/** A member's `egressProblemKind` and `egressProblem` in the pool's `proxies` output. */
export interface RecordedProblem {
  kind: "unanswered" | "egress" | "path-unknown";
  reason: string;
}

export class InputError extends Error {}

/** What `pulumi stack output --json` prints for a secret without --show-secrets. */
const HIDDEN_SECRET = "[secret]";

/**
 * The proxies in one input document. `fallback` supplies credentials for
 * URLs that carry none (from --user and $EGRESS_PROXY_PASSWORD).
 */
export function targetsFromDocument(
  document: unknown,
  source: string,
  fallback?: ProxyCredentials,
): ProxyTarget[] {
  const { urls, names } = urlsOf(document, source);
  if (urls.length === 0) throw new InputError(`${source} lists no proxies`);
  const targets = urls.map((url, index) => targetFromUrl(url, `${source}[${index}]`, fallback));
  for (const target of targets) {
    const member = names.get(target.endpoint);
    target.name = member?.name ?? target.name;
    if (member?.rotateAfter !== undefined) target.rotateAfter = member.rotateAfter;
    if (member?.recordedProblem !== undefined) target.recordedProblem = member.recordedProblem;
  }
  return dedupe(targets);
}

interface MemberNote {
  name: string;
  rotateAfter?: string;
  recordedProblem?: RecordedProblem;
}

const PROBLEM_KINDS = new Set(["unanswered", "egress", "path-unknown"]);

function urlsOf(
  document: unknown,
  source: string,
): { urls: string[]; names: Map<string, MemberNote> } {
  if (Array.isArray(document))
    return { urls: document.map((entry) => urlOfEntry(entry, source)), names: new Map() };
  if (document === null || typeof document !== "object")
    throw new InputError(
      `${source} is neither stack outputs (an object) nor proxies.json (an array)`,
    );
  const outputs = document as Record<string, unknown>;
  const names = namesOf(outputs.proxies);
  const withCredentials = outputs.endpointsWithCredentials;
  if (Array.isArray(withCredentials))
    return { urls: withCredentials.map((entry) => urlOfEntry(entry, source)), names };
  if (Array.isArray(outputs.endpoints)) {
    return { urls: outputs.endpoints.map((entry) => urlOfEntry(entry, source)), names };
  }
  const hint =
    withCredentials === HIDDEN_SECRET
      ? " (endpointsWithCredentials is hidden: add --show-secrets, or give --user and $EGRESS_PROXY_PASSWORD with endpoints)"
      : "";
  throw new InputError(
    `${source} has no endpointsWithCredentials or endpoints list; is it the output of \`pulumi stack output --json\` for a stack with an EgressProxyPool?${hint}`,
  );
}

function urlOfEntry(entry: unknown, source: string): string {
  if (typeof entry === "string") return entry;
  if (
    entry !== null &&
    typeof entry === "object" &&
    typeof (entry as { url?: unknown }).url === "string"
  )
    return (entry as { url: string }).url;
  throw new InputError(`${source}: every entry must be a proxy URL or an object with a url`);
}

/** The pool's `proxies` output: endpoint (no credentials) → pool key (and when it is due for rotation). */
function namesOf(proxies: unknown): Map<string, MemberNote> {
  const names = new Map<string, MemberNote>();
  if (!Array.isArray(proxies)) return names;
  for (const proxy of proxies as Array<{
    name?: unknown;
    endpoint?: unknown;
    endpointIpv6?: unknown;
    rotateAfter?: unknown;
    egressProblem?: unknown;
    egressProblemKind?: unknown;
  }>) {
    if (typeof proxy?.name !== "string") continue;
    const kind = proxy.egressProblemKind;
    const note: MemberNote = {
      name: proxy.name,
      ...(typeof proxy.rotateAfter === "string" ? { rotateAfter: proxy.rotateAfter } : {}),
      ...(typeof kind === "string" &&
      PROBLEM_KINDS.has(kind) &&
      typeof proxy.egressProblem === "string"
        ? {
            recordedProblem: {
              kind: kind as RecordedProblem["kind"],
              reason: proxy.egressProblem,
            },
          }
        : {}),
    };
    // A dual-stack member's both URLs carry its name (each is probed, labelled by family).
    for (const endpoint of [proxy.endpoint, proxy.endpointIpv6]) {
      if (typeof endpoint !== "string") continue;
      try {
        names.set(new URL(endpoint).host, note);
      } catch {
        // A malformed entry only costs the friendly name.
      }
    }
  }
  return names;
}

export function targetFromUrl(
  text: string,
  where: string,
  fallback?: ProxyCredentials,
): ProxyTarget {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new InputError(`${where} is not a URL (expected http://[user:password@]host:port)`);
  }
  if (url.protocol !== "http:")
    throw new InputError(`${where}: only http:// proxies can be checked, not ${url.protocol}`);
  const port = url.port === "" ? 80 : Number(url.port);
  const host = url.hostname.replace(/^\[(.*)\]$/, "$1");
  const credentials =
    url.username !== ""
      ? { user: decodeURIComponent(url.username), password: decodeURIComponent(url.password) }
      : fallback;
  const family = isIP(host) === 6 ? "ipv6" : "ipv4";
  return { name: url.host, host, port, endpoint: url.host, credentials, family };
}

function dedupe(targets: ProxyTarget[]): ProxyTarget[] {
  const seen = new Set<string>();
  return targets.filter((target) => !seen.has(target.endpoint) && seen.add(target.endpoint));
}
