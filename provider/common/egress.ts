/**
 * The egress check: which address does a target see when a request leaves
 * through this proxy? A URL that answers with the caller's address (plain
 * text, or JSON with the address in a field) is fetched *through* the proxy,
 * with the proxy's basic auth. Shared by both resources' create paths (one
 * call after readiness) and by the `egress-proxies check` command.
 */
import { isIP } from "node:net";
import { z } from "zod";
import { Deadline, sleepWithin } from "./deadline";
import { PermanentError } from "./errors";
import { PROXIED_HTTP_URL } from "./inputs";
import { sampleIpv6Exits } from "./egress-samples";
import { fetchThroughProxy, type ProxyCredentials, type ProxyProbeResult } from "./proxy-probe";

/**
 * The problems of an egress check given by other names (a flag, a field of
 * another argument), each message naming `names.url` / `names.field`.
 */
export function egressCheckProblems(
  check: { url: unknown; field?: unknown },
  names: { url: string; field: string },
): string[] {
  const parsed = egressCheckSchema.safeParse(check);
  if (parsed.success) return [];
  return parsed.error.issues.map((issue) =>
    issue.message.replace("egressCheck.url", names.url).replace("egressCheck.field", names.field),
  );
}

const IPV6_LITERAL_HTTP_URL = /^http:\/\/\[[0-9A-Fa-f:.]+\](:\d{1,5})?(\/\S*)?$/;

/** JSON fields tried in order when `field` is not given (ipify, httpbin, ifconfig.co, ip-api). */
const DEFAULT_EGRESS_FIELDS = ["ip", "origin", "address", "query"] as const;

export const egressCheckSchema = z.strictObject({
  /** Fetched through the proxy; answers with the caller's address. */
  url: z
    .string({
      error: "egressCheck.url must be an http:// URL that answers with the caller's address",
    })
    .regex(PROXIED_HTTP_URL, {
      error:
        'egressCheck.url must be an http:// URL without credentials (the proxy fetches it), e.g. "http://echo.example.net/ip"',
    }),
  /** The JSON field holding the address (dots for nesting); default: plain text, or ip/origin/address/query. */
  field: z
    .string({ error: 'egressCheck.field must be a JSON field name, e.g. "ip" or "client.address"' })
    .regex(/^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$/, {
      error: 'egressCheck.field must be a JSON field name, e.g. "ip" or "client.address"',
    })
    .optional(),
  /**
   * With "ipv6" in the proxy's ipFamilies: the same echo service by an IPv6
   * literal (http://[2001:db8::7]/ip), fetched through the proxy's IPv6
   * address, so squid must leave over IPv6; its answer is `egressIpv6`.
   */
  ipv6Url: z
    .string({
      error:
        'egressCheck.ipv6Url must be an http:// URL whose host is an IPv6 literal, e.g. "http://[2001:db8::7]/ip"',
    })
    .regex(IPV6_LITERAL_HTTP_URL, {
      error:
        'egressCheck.ipv6Url must be an http:// URL whose host is an IPv6 literal in brackets (a name could resolve to IPv4), e.g. "http://[2001:db8::7]/ip"',
    })
    .optional(),
  /**
   * With a prefix spread over the proxy (the pool fills this in): how many
   * requests go through `ipv6Url` (default 20, all within the create budget)
   * and what the prefix and its mode are, to judge their exit addresses.
   */
  ipv6Samples: z
    .int({ error: "egressCheck.ipv6Samples must be a whole number from 2 to 1000, e.g. 20" })
    .min(2, { error: "egressCheck.ipv6Samples must be a whole number from 2 to 1000, e.g. 20" })
    .max(1000, { error: "egressCheck.ipv6Samples must be a whole number from 2 to 1000, e.g. 20" })
    .optional(),
  ipv6Prefix: z
    .strictObject(
      {
        prefix: z.string(),
        mode: z.enum(["random", "sticky", "pool"]),
        count: z.int().min(1).optional(),
      },
      {
        error:
          'egressCheck.ipv6Prefix must be { prefix: "2001:db8:1:2::/64", mode: "random" | "sticky" | "pool", count? }',
      },
    )
    .optional(),
  /** The proxy's own basic auth, when squid requires it (the pool fills this in). Secret. */
  proxyAuth: z
    .strictObject({
      user: z.string({ error: "egressCheck.proxyAuth.user must be a string" }).min(1),
      password: z.string({ error: "egressCheck.proxyAuth.password must be a string" }),
    })
    .optional(),
});
export type EgressCheck = z.output<typeof egressCheckSchema>;

export type EgressAnswer = { ok: true; address: string } | { ok: false; reason: string };

/**
 * The caller's address from an echo service's answer: a bare address (one
 * line), or JSON with it in `field` (or a conventional field). httpbin's
 * `origin` may list several addresses ("a, b") when proxies add
 * X-Forwarded-For: the first is the client as the service saw it.
 */
export function parseEgressAnswer(body: string, field?: string): EgressAnswer {
  const text = body.trim();
  if (text === "") return { ok: false, reason: "the answer was empty" };
  if (text.startsWith("{")) return fromJson(text, field);
  if (field !== undefined)
    return {
      ok: false,
      reason: `egressCheck.field is ${field} but the answer is not JSON: ${quote(text)}`,
    };
  return (
    asAddress(text) ?? { ok: false, reason: `the answer is not an IP address: ${quote(text)}` }
  );
}

function fromJson(text: string, field: string | undefined): EgressAnswer {
  let document: unknown;
  try {
    document = JSON.parse(text);
  } catch {
    return { ok: false, reason: `the answer looks like JSON but does not parse: ${quote(text)}` };
  }
  const paths =
    field === undefined ? DEFAULT_EGRESS_FIELDS.map((name) => [name]) : [field.split(".")];
  for (const path of paths) {
    const value = path.reduce<unknown>(
      (node, key) =>
        node !== null && typeof node === "object"
          ? (node as Record<string, unknown>)[key]
          : undefined,
      document,
    );
    if (typeof value === "string") {
      const address = asAddress(value.split(",")[0]!.trim());
      if (address !== undefined) return address;
      return { ok: false, reason: `field ${path.join(".")} is not an IP address: ${quote(value)}` };
    }
  }
  const wanted = field ?? DEFAULT_EGRESS_FIELDS.join(", ");
  return {
    ok: false,
    reason: `no address in the JSON answer (looked at ${wanted}): ${quote(text)}`,
  };
}

function asAddress(text: string): { ok: true; address: string } | undefined {
  // Brackets and a zone are not what an echo service sends; keep it strict.
  return isIP(text) === 0 ? undefined : { ok: true, address: text.toLowerCase() };
}

/**
 * A proxy's answer in one line for an error message: the status, squid's
 * error code when squid made the page, and the page's title (squid's pages
 * are long HTML whose first 200 characters are boilerplate) or the start
 * of the body.
 */
export function describeAnswer(answer: ProxyProbeResult): string {
  const squid = answer.squidError === undefined ? "" : ` (squid: ${answer.squidError})`;
  const title = /<title>([^<]*)<\/title>/i.exec(answer.body)?.[1];
  return `HTTP ${answer.status}${squid} ${quote(title ?? answer.body)}`;
}

/** At most 200 characters of an answer, on one line: enough to recognise a squid error page. */
function quote(text: string): string {
  const flat = text.replace(/\s+/g, " ").trim();
  return JSON.stringify(flat.length > 200 ? `${flat.slice(0, 200)}…` : flat);
}

export interface EgressFinding {
  /** The address the egress check saw, null without a check. */
  egressIp: string | null;
  /** When readiness (and the egress check) passed, ISO 8601; null when nothing was checked. */
  checkedAt: string | null;
  /** Only for a proxy with IPv6: what `ipv6Url` saw through its IPv6 address; null without one. */
  egressIpv6?: string | null;
  /** Only with `egressCheck.ipv6Prefix`: how many distinct exit addresses the IPv6 samples saw. */
  egressIpv6Distinct?: number | null;
}

/**
 * One fetch of the egress URL through the proxy. Resolves with the address,
 * or rejects: PermanentError when the proxy refused our credentials or the
 * service answered something that is no address (retrying cannot help),
 * a plain Error for what may pass (no answer yet, squid still starting: 5xx).
 */
export async function fetchEgressAddress(
  proxy: { host: string; port: number },
  check: { url: string; field?: string },
  timeoutMs: number,
  credentials?: ProxyCredentials,
): Promise<string> {
  const answer = await fetchThroughProxy(proxy, check.url, timeoutMs, credentials);
  return egressAddressIn(answer, proxy, check, credentials);
}

/**
 * The address in the proxy's answer to the egress URL, or the error
 * fetchEgressAddress describes: the proxy answered, but not with an address.
 */
export function egressAddressIn(
  answer: ProxyProbeResult,
  proxy: { host: string; port: number },
  check: { url: string; field?: string },
  credentials?: ProxyCredentials,
): string {
  const { status, body } = answer;
  const host = proxy.host.includes(":") ? `[${proxy.host}]` : proxy.host;
  const where = `egressCheck ${check.url} through the proxy at ${host}:${proxy.port}`;
  if (status === 407)
    throw new PermanentError(
      `${where}: the proxy asked for credentials (${describeAnswer(answer)})${credentials === undefined ? "; set egressCheck.proxyAuth" : "; check egressCheck.proxyAuth"}`,
    );
  if (status < 200 || status >= 300) throw new Error(`${where}: ${describeAnswer(answer)}`);
  const parsed = parseEgressAnswer(body, check.field);
  if (!parsed.ok) throw new PermanentError(`${where}: ${parsed.reason}`);
  return parsed.address;
}

/**
 * The step both create paths take once readiness passed: with an egress
 * check, fetch the address through the proxy until it answers (squid may
 * answer 503 for a few seconds after its port opens). Failing is a readiness
 * failure quoting the proxy's last answer.
 */
export async function egressAtReadiness(
  ip: string | null,
  inputs: { readiness: { mode: string; port: number }; egressCheck?: EgressCheck },
  deadline: Deadline,
  ipv6?: string | null,
): Promise<EgressFinding> {
  // Only a proxy with IPv6 carries the IPv6 finding: an IPv4-only one's outputs stay as they were.
  const v6 = (egressIpv6: string | null) => (ipv6 === undefined ? {} : { egressIpv6 });
  if (ip === null || inputs.readiness.mode === "none")
    return { egressIp: null, checkedAt: null, ...v6(null) };
  const check = inputs.egressCheck;
  if (check === undefined)
    return { egressIp: null, checkedAt: new Date().toISOString(), ...v6(null) };
  const egressIp = await egressUntilAnswered(
    { host: ip, port: inputs.readiness.port },
    check,
    deadline,
  );
  if (ipv6 === undefined || ipv6 === null || check.ipv6Url === undefined)
    return { egressIp, checkedAt: new Date().toISOString(), ...v6(null) };
  const egressIpv6 = await egressUntilAnswered(
    { host: ipv6, port: inputs.readiness.port },
    { ...check, url: check.ipv6Url },
    deadline,
  );
  if (isIP(egressIpv6) !== 6)
    throw new PermanentError(
      `egressCheck ${check.ipv6Url} through the proxy at [${ipv6}]:${inputs.readiness.port}: the answer ${egressIpv6} is not an IPv6 address; egressCheck.ipv6Url must reach the echo service over IPv6 only`,
    );
  // A prefix spread over the proxy: sample it, and fail when the dialer is not spreading.
  const distinct =
    check.ipv6Prefix === undefined
      ? {}
      : {
          egressIpv6Distinct: await sampleIpv6Exits(
            egressIpv6,
            (proxy) => egressUntilAnswered(proxy, { ...check, url: check.ipv6Url! }, deadline),
            { host: ipv6, port: inputs.readiness.port },
            check,
          ),
        };
  return { egressIp, checkedAt: new Date().toISOString(), egressIpv6, ...distinct };
}

/** The egress address through one of the proxy's addresses, retried until it answers or the deadline. */
async function egressUntilAnswered(
  proxy: { host: string; port: number },
  check: EgressCheck,
  deadline: Deadline,
): Promise<string> {
  let last = "no attempt";
  while (!deadline.expired()) {
    try {
      return await fetchEgressAddress(proxy, check, deadline.capped(10_000), check.proxyAuth);
    } catch (error) {
      if (error instanceof PermanentError) throw error;
      // An attempt that the overall deadline cut short says nothing about the proxy (on a busy
      // machine it may get a millisecond): the answer before it is the one worth quoting.
      if (!deadline.expired() || last === "no attempt") last = (error as Error).message;
    }
    await sleepWithin(2000, deadline);
  }
  throw deadline.timeoutError(`the egress check (last answer: ${last})`);
}
