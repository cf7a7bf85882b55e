/**
 * What a refresh re-checks about a proxy it finds running (the input
 * `egressRecheck: true`; the pool sets it), and the rule by which the next
 * `up` acts on it. The backends call these steps from read, diff and update;
 * the rule lives here so that every backend follows the same one
 * (docs/day2.md, "Egress re-checked on refresh"):
 *
 * - the proxy answers with the exit address recorded: only `checkedAt`
 *   moves (the time of the last check that answered: how fresh the finding
 *   is), so a resync of a healthy pool plans nothing (no input depends on
 *   it: the pool publishes no check time, components/published-checks.ts);
 * - it answers with another exit address: accepted (`egressIp` and
 *   `checkedAt` are new) and the pool republishes it;
 * - it does not answer (its port, or the egress URL through it, after
 *   RECHECK_ATTEMPTS tries each capped like create's): `egressProblem` is
 *   recorded, the pool publishes the member not ready, and the next `up`
 *   restarts the VM in place (the heal of a stopped VM) and waits for
 *   readiness and the egress check again;
 * - a refresh that finds it still not answering after such a restart reports
 *   a `rotation` the program does not hold, so the next `up` replaces it
 *   (created before the old one is deleted, under a new generated name);
 * - a VM older than `rotateAfterDays` is reported the same way;
 * - a dual-stack proxy is re-checked on each family at once (`ipv6Url`
 *   through its IPv6 address, else its port there), by these same rules: a
 *   family that fails is named in `egressProblem.families`, and the pool
 *   keeps publishing the member ready on the family that works.
 *
 * Read's step, and the question put to the guest before "no answer" is
 * acted on: recheck-on-read.ts.
 *
 * An exit address shared with another member is not a resource's finding:
 * only the pool sees every member (components/pool.ts decides that).
 */
import { isIP } from "node:net";
import type { Deadline } from "./deadline";
import { sleepWithin } from "./deadline";
import type { DiffDecision } from "./diff";
import { egressAddressIn } from "./egress";
import { PermanentError } from "./errors";
import { inIpv6Prefix } from "./egress-samples";
import type { IpFamily } from "./ip-families";
import { fetchThroughProxy, type ProxyCredentials } from "./proxy-probe";
import { tryTcpConnect } from "./readiness";
import { Turns } from "./turns";

type Props = Record<string, unknown>;

/** Tries before a proxy counts as not answering: one dropped connection must not restart a VM. */
export const RECHECK_ATTEMPTS = 3;
/** Each try is capped as one attempt of create's egress check is. */
const ATTEMPT_CAP_MS = 10_000;
const PAUSE_MS = 2_000;
/** What one re-check may take: queueing for a turn never cuts into it. */
const RECHECK_NEEDS_MS = RECHECK_ATTEMPTS * ATTEMPT_CAP_MS + (RECHECK_ATTEMPTS - 1) * PAUSE_MS;

/**
 * Re-checks in flight in the provider process: 64 in all (the runner's
 * sockets, and a thousand-member refresh at once still done in seconds with
 * probes of tens of milliseconds), 32 to any one echo service (every probe's
 * request lands there; a public one rate-limits). docs/scale.md has the measurement.
 */
export const RECHECK_TURNS = new Turns({ total: 64, perKey: 32 });

/** Output key: what the last re-check found wrong, null when it passed. FROZEN: state carries it. */
export const EGRESS_PROBLEM_KEY = "egressProblem";

export interface EgressProblem {
  /**
   * "unanswered": the proxy itself gave no answer (port refused, timeout,
   * connection dropped): restarted, then replaced. "egress": it answered, but
   * not with an address (squid's error page, refused credentials): reported
   * only, since the echo service being down would fail every proxy alike.
   * "path-unknown": no answer here, but the guest, asked through the
   * hypervisor, has the proxy's port listening: the path from this runner is
   * the likelier fault; reported, never restarted (common/guest-view.ts).
   */
  kind: "unanswered" | "egress" | "path-unknown";
  /** The proxy's last answer (or why there was none), without credentials. */
  reason: string;
  /** When a refresh first found it, ISO 8601 (kept while the problem lasts). */
  since: string;
  /** When an `up` restarted the VM for it (the heal tried); absent before. */
  restartedAt?: string;
  /**
   * A dual-stack proxy's: the families whose re-check failed with this kind
   * (the others still work, and the pool keeps publishing them). Absent: every
   * family (an IPv4-only proxy, state from before dual stack).
   */
  families?: IpFamily[];
}

export interface RecheckFinding {
  egressIp: string | null;
  checkedAt: string | null;
  egressProblem: EgressProblem | null;
  /** Only for a proxy that takes IPv6: what `ipv6Url` saw through its IPv6 address. */
  egressIpv6?: string | null;
}

/** The egress check as the re-check uses it: the URL, the field, the proxy's credentials. */
export interface RecheckCheck {
  url: string;
  /** Through the IPv6 address of a proxy that takes IPv6 (create's rule: common/egress.ts). */
  ipv6Url?: string;
  /** A proxy that spreads a prefix over its connections: any exit address inside it is the same finding. */
  ipv6Prefix?: { prefix: string };
  field?: string;
  proxyAuth?: ProxyCredentials;
}

/** The recorded problem in a resource's outputs, if any. */
export function egressProblemOf(props: Props): EgressProblem | undefined {
  const value = props[EGRESS_PROBLEM_KEY];
  if (value === null || typeof value !== "object") return undefined;
  const { kind, reason, since, restartedAt, families } = value as Record<string, unknown>;
  if (typeof reason !== "string" || typeof since !== "string") return undefined;
  const named = Array.isArray(families)
    ? families.filter((family): family is IpFamily => family === "ipv4" || family === "ipv6")
    : [];
  return {
    kind: kind === "egress" || kind === "path-unknown" ? kind : "unanswered",
    reason,
    since,
    ...(typeof restartedAt === "string" ? { restartedAt } : {}),
    ...(named.length > 0 ? { families: named } : {}),
  };
}

/** What one family's re-check found: the exit address (undefined: only the port was asked), or why not. */
type FamilyProbe =
  { ok: true; egressIp?: string } | { ok: false; kind: EgressProblem["kind"]; reason: string };

/**
 * One family's re-check: the egress URL through `proxy` when there is a
 * check, else its port; RECHECK_ATTEMPTS tries, each capped like create's.
 * `ipv6Only`: an answer that is no IPv6 address fails it (create's rule for
 * `ipv6Url`: something in between answered over IPv4).
 */
async function probeFamily(
  proxy: { host: string; port: number },
  check: RecheckCheck | undefined,
  deadline: Deadline,
  ipv6Only = false,
): Promise<FamilyProbe> {
  let last = "no attempt within the refresh's deadline";
  let kind: EgressProblem["kind"] = "unanswered";
  for (let attempt = 1; attempt <= RECHECK_ATTEMPTS && !deadline.expired(); attempt++) {
    kind = "unanswered";
    try {
      const capMs = deadline.capped(ATTEMPT_CAP_MS);
      if (check === undefined) {
        await tryTcpConnect(proxy.host, proxy.port, capMs);
        return { ok: true };
      }
      const answer = await fetchThroughProxy(proxy, check.url, capMs, check.proxyAuth);
      kind = "egress";
      const egressIp = egressAddressIn(answer, proxy, check, check.proxyAuth);
      if (ipv6Only && isIP(egressIp) !== 6)
        throw new PermanentError(
          `egressCheck ${check.url} through the proxy at [${proxy.host}]:${proxy.port}: the answer ${egressIp} is not an IPv6 address`,
        );
      return { ok: true, egressIp };
    } catch (error) {
      last = (error as Error).message;
      // Refused credentials, an answer that is no address: asking again cannot help.
      if (error instanceof PermanentError) break;
    }
    if (attempt < RECHECK_ATTEMPTS && deadline.remainingMs() > PAUSE_MS)
      await sleepWithin(PAUSE_MS, deadline);
  }
  return { ok: false, kind, reason: last };
}

/**
 * The IPv6 side of a dual-stack proxy: its IPv6 address (null: the guest
 * reports none, which counts as a proxy not answering there) and what is
 * asked through it (`ipv6Url`, else the port, as create's readiness did).
 */
export interface Ipv6Side {
  address: string | null;
}

const familyOf = (address: string): IpFamily => (isIP(address) === 6 ? "ipv6" : "ipv4");

/**
 * One re-check of a proxy found running: the egress URL through it when the
 * resource has an egress check, else its port; with `ipv6`, the IPv6 side
 * too (`ipv6Url` through the IPv6 address), concurrently, within the same
 * deadline. What it finds is the result; it throws only a TransientError
 * when the process's re-checks in flight (RECHECK_TURNS) left it no turn
 * while its deadline still had room for it. `previous` are the outputs state holds.
 */
export async function recheckEgress(
  proxy: { host: string; port: number },
  check: RecheckCheck | undefined,
  previous: Props,
  deadline: Deadline,
  ipv6?: Ipv6Side,
): Promise<RecheckFinding> {
  // A port-only re-check lands on the proxy itself: only the total binds it.
  const lands = check === undefined ? `[${proxy.host}]:${proxy.port}` : new URL(check.url).host;
  return RECHECK_TURNS.run(
    lands,
    deadline,
    RECHECK_NEEDS_MS,
    `the egress re-check through the proxy at [${proxy.host}]:${proxy.port}`,
    () => recheckNow(proxy, check, previous, deadline, ipv6),
  );
}

async function recheckNow(
  proxy: { host: string; port: number },
  check: RecheckCheck | undefined,
  previous: Props,
  deadline: Deadline,
  ipv6?: Ipv6Side,
): Promise<RecheckFinding> {
  const v6Check = check?.ipv6Url === undefined ? undefined : { ...check, url: check.ipv6Url };
  const [primary, second] = await Promise.all([
    probeFamily(proxy, check, deadline),
    ipv6 === undefined
      ? Promise.resolve(undefined)
      : ipv6.address === null
        ? Promise.resolve<FamilyProbe>({
            ok: false,
            kind: "unanswered",
            reason: "the guest reports no IPv6 address on the proxy's NIC",
          })
        : probeFamily({ host: ipv6.address, port: proxy.port }, v6Check, deadline, true),
  ]);
  const sides: Array<{ family: IpFamily; probe: FamilyProbe }> = [
    { family: familyOf(proxy.host), probe: primary },
    ...(second === undefined ? [] : [{ family: "ipv6" as const, probe: second }]),
  ];
  return findingOf(sides, previous, ipv6 !== undefined, check?.ipv6Prefix?.prefix);
}

/**
 * A proxy with ipv6Prefix leaves from a new address of its prefix on each
 * connection (workloads/prefix-egress.ts): a new exit address inside the
 * prefix is the finding state holds, so a confirming refresh changes no
 * output; one outside it (the dialer fell back to the VM's own address) is a
 * change, as any other.
 */
function sameSpread(now: string | null, was: string | null, prefix: string | undefined) {
  const inside = (address: string | null) =>
    prefix !== undefined && address !== null && inIpv6Prefix(address, prefix);
  return inside(now) && inside(was) ? was : now;
}

/**
 * The finding from each family's probe. An answered exit address is
 * accepted; `checkedAt` is the time of the last check that answered (a
 * failing one moves it only when another family brought a new address); a
 * family that failed keeps what was known. A dual-stack proxy's problem names the families that
 * failed (the pool keeps publishing it on the others); the worse kind
 * ("unanswered") decides, as for one family.
 */
function findingOf(
  sides: ReadonlyArray<{ family: IpFamily; probe: FamilyProbe }>,
  previous: Props,
  dual: boolean,
  spreadPrefix?: string,
): RecheckFinding {
  const known = (key: string) => (typeof previous[key] === "string" ? previous[key] : null);
  const knownAt = known("checkedAt");
  const problem = egressProblemOf(previous);
  const answered = (probe: FamilyProbe | undefined, was: string | null) =>
    probe?.ok === true && probe.egressIp !== undefined ? probe.egressIp : was;
  const egressIp = answered(sides[0]!.probe, known("egressIp"));
  const egressIpv6 = dual
    ? sameSpread(answered(sides[1]?.probe, known("egressIpv6")), known("egressIpv6"), spreadPrefix)
    : undefined;
  const changed = egressIp !== known("egressIp") || (dual && egressIpv6 !== known("egressIpv6"));
  const v6 = dual ? { egressIpv6 } : {};
  const failures = sides.flatMap(({ family, probe }) =>
    probe.ok ? [] : [{ family, kind: probe.kind, reason: probe.reason }],
  );
  if (failures.length === 0)
    // The time of the last check that answered, confirming or not: it says how fresh the finding is.
    return { egressIp, checkedAt: now(), egressProblem: null, ...v6 };
  const kind = failures.some((failure) => failure.kind === "unanswered") ? "unanswered" : "egress";
  const failing = failures.filter((failure) => failure.kind === kind);
  const label = (family: IpFamily) => (family === "ipv6" ? "IPv6" : "IPv4");
  return {
    egressIp,
    checkedAt: changed ? now() : knownAt,
    ...v6,
    egressProblem: {
      kind,
      reason: failures
        .map((failure) => (dual ? `${label(failure.family)}: ${failure.reason}` : failure.reason))
        .join("; "),
      // A problem of another kind starts its own time.
      since: problem?.kind === kind ? problem.since : now(),
      // The restart was for a proxy that did not answer: it counts while that lasts.
      ...(problem?.restartedAt === undefined || kind !== "unanswered"
        ? {}
        : { restartedAt: problem.restartedAt }),
      ...(dual ? { families: [...new Set(failing.map((failure) => failure.family))] } : {}),
    },
  };
}

export const now = (): string => new Date().toISOString();

/**
 * Whether the next `up` restarts the VM for its egress: the re-check is on,
 * the VM was found running and is meant to run, and the last refresh found
 * the proxy silent. Once: after a restart that did not help, the next refresh
 * reports the VM for replacement instead (an `up` without refresh in between
 * restarts nothing more).
 */
export function needsEgressRestart(olds: Props, news: Props): boolean {
  const problem = egressProblemOf(olds);
  return (
    news.egressRecheck === true &&
    news.running !== false &&
    olds.running !== false &&
    olds.state === "running" &&
    problem?.kind === "unanswered" &&
    problem.restartedAt === undefined
  );
}

/**
 * Whether the proxy failed its last re-check by not answering at all (the
 * pool publishes it not ready); with `family`, whether it failed on that
 * family (a dual-stack proxy silent on IPv6 only stays published on IPv4).
 */
export function isUnanswered(problem: unknown, family?: IpFamily): boolean {
  const found = egressProblemOf({ [EGRESS_PROBLEM_KEY]: problem });
  if (found?.kind !== "unanswered") return false;
  return family === undefined || found.families === undefined || found.families.includes(family);
}

/**
 * Whether the last re-check found the proxy silent from here while its guest
 * listens (not restarted); with `family`, whether that was on that family.
 */
export function isPathUnknown(problem: unknown, family?: IpFamily): boolean {
  const found = egressProblemOf({ [EGRESS_PROBLEM_KEY]: problem });
  if (found?.kind !== "path-unknown") return false;
  return family === undefined || found.families === undefined || found.families.includes(family);
}

/** Whether the last re-check got no answer from here at all, whatever the guest said. */
export function isSilentFromHere(problem: unknown): boolean {
  return isUnanswered(problem) || isPathUnknown(problem);
}

/** The table's decision, plus the in-place restart the rule asks for. */
export function withEgressHeal(decision: DiffDecision, olds: Props, news: Props): DiffDecision {
  if (decision.changes || !needsEgressRestart(olds, news)) return decision;
  return { ...decision, changes: true };
}

/**
 * The `rotation` a refresh reports when the VM is due for replacement (a new
 * value replaces it, see the change tables), or undefined to keep what the
 * inputs hold. Stable across refreshes (it quotes recorded times only), so
 * refreshing again changes nothing until the `up` replaces the VM.
 */
export function rotationDue(
  inputs: { rotateAfterDays?: number | undefined },
  createdAt: unknown,
  finding: RecheckFinding | undefined,
  now = Date.now(),
): string | undefined {
  const restartedAt = finding?.egressProblem?.restartedAt;
  if (restartedAt !== undefined && finding?.egressProblem?.kind === "unanswered")
    return `replace: no egress answer after the restart at ${restartedAt}`;
  const days = inputs.rotateAfterDays;
  if (days === undefined || typeof createdAt !== "string") return undefined;
  const born = Date.parse(createdAt);
  if (Number.isNaN(born) || now - born < days * 86_400_000) return undefined;
  return `replace: older than ${days} days (created ${createdAt})`;
}

/**
 * An `up` restarted the VM and it still did not answer. Shaped as Pulumi's
 * dynamic-provider server expects for "ErrorResourceInitFailed" (id,
 * properties, reasons): the engine keeps the VM in state with these outputs,
 * which record the restart, so the next refresh reports it for replacement.
 */
export class EgressHealFailedError extends Error {
  override readonly name = "EgressHealFailedError";
  readonly reasons: string[];
  readonly properties: Props;

  constructor(
    readonly id: string,
    outputs: Props,
    cause: Error,
    /** The update's new inputs, for the serialized provider they carry. */
    request: Props,
  ) {
    super(
      `${cause.message}; the VM was restarted because the last refresh found it not answering, and it still does not: the next \`pulumi up --refresh\` replaces it`,
      { cause },
    );
    this.reasons = [this.message];
    const problem = egressProblemOf(outputs);
    this.properties = {
      ...outputs,
      [EGRESS_PROBLEM_KEY]: {
        kind: "unanswered",
        reason: cause.message,
        since: problem?.since ?? new Date().toISOString(),
        restartedAt: new Date().toISOString(),
      },
      ...(typeof request.__provider === "string" ? { __provider: request.__provider } : {}),
    };
  }
}
