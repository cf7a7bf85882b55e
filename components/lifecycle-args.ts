/**
 * The pool's `maxUnavailable` and `drainSeconds` as the members'
 * `disruptionBudget` (provider/common/disruption-budget.ts): how many of its
 * members one deployment may restart, replace, rotate or delete at the same
 * time, and how long one stays up after it left the published set; and the
 * checks of the pool's other lifecycle arguments. Pure.
 */
import { MAX_DRAIN_SECONDS } from "../provider/common/disruption-budget";

/** The pool's arguments for its members' life after create (EgressProxyPoolArgs has them). */
export interface PoolLifecycleArgs {
  /**
   * Re-check every member on each refresh (default true): its port, then
   * `egressCheck` through it. A member that does not answer is published not
   * ready and the next `up` restarts it, then replaces it if it still does not
   * answer; a new exit address is accepted and republished. docs/day2.md.
   */
  recheckEgress?: boolean;
  /**
   * Rotate VM members older than this many days: a refresh reports them for
   * replacement, and the `up` creates each new VM (ready, checked) before the
   * old one is deleted. `pulumi up --refresh` (a resync) does both. docs/day2.md.
   */
  rotateAfterDays?: number;
  /**
   * How many members one `up` may take out of service at the same time:
   * restarted (a silent proxy), replaced (rotated, repaired, a new image),
   * or deleted (scale-down). A count (2) or a share of the members ("25%",
   * rounded down); never below 1. Default "25%". The other members wait: a
   * replacement or restart for the next `up` (a warning names them), a
   * delete for a free place. docs/day2.md, "A disruption budget".
   */
  maxUnavailable?: number | string;
  /**
   * Seconds a member stays up after it left the published set (Secret,
   * EndpointSlices) before its VM is deleted: in a rotation, a replacement
   * and a scale-down, for clients that still hold its URL (a mounted Secret
   * lags by a kubelet sync). 0: no drain. Default 30. Not in `pulumi
   * destroy`. docs/day2.md, "Drain".
   */
  drainSeconds?: number;
  /**
   * Two members found leaving from one exit address: "fail" (the default)
   * leaves it to you (a warning; with requireDistinctEgress, an error before
   * anything is published); "rotate" replaces the younger of them at the next
   * `pulumi up --refresh` (old VM first, within maxUnavailable), once: a new
   * VM that lands on the same address (one NAT for the network) is not
   * replaced again, and the pool says so. docs/day2.md, "Collisions".
   */
  onCollision?: "fail" | "rotate";
}

/** A count (2, "2") or a share of the members ("25%"). */
type MaxUnavailable = number | string;

/** The default: a quarter of the members, at least one. */
const DEFAULT_MAX_UNAVAILABLE = "25%";

const FORMAT_HELP =
  'a whole number of members of at least 1 (e.g. 2) or a share of them (e.g. "25%")';

/** What is wrong with `value`, naming the field and the fix; undefined when it is fine. */
function maxUnavailableProblem(value: unknown): string | undefined {
  if (value === undefined) return undefined;
  if (typeof value === "number")
    return Number.isInteger(value) && value >= 1
      ? undefined
      : `maxUnavailable must be ${FORMAT_HELP}, not ${value}`;
  if (typeof value !== "string") return `maxUnavailable must be ${FORMAT_HELP}`;
  const percent = /^(\d{1,3})%$/.exec(value.trim());
  if (percent !== null) {
    const share = Number(percent[1]);
    return share >= 1 && share <= 100
      ? undefined
      : `maxUnavailable must be a share from "1%" to "100%", not "${value}"`;
  }
  return /^\d+$/.test(value.trim()) && Number(value) >= 1
    ? undefined
    : `maxUnavailable must be ${FORMAT_HELP}, not "${value}"`;
}

/**
 * How many members may be out at once: a count as given, a share of
 * `members` rounded down, never below one (a budget of none would stop
 * every rotation and every heal for good).
 */
export function resolveMaxUnavailable(value: MaxUnavailable | undefined, members: number): number {
  const given = String(value ?? DEFAULT_MAX_UNAVAILABLE).trim();
  const count = given.endsWith("%")
    ? Math.floor((Number(given.slice(0, -1)) * members) / 100)
    : Number(given);
  return Math.max(1, count);
}

/** The default drain: a little longer than a mounted Secret's usual lag (kubelet's sync, about a minute at worst). */
export const DEFAULT_DRAIN_SECONDS = 30;

/** The members' drain: as given, else the default. */
export function resolveDrainSeconds(value: number | undefined): number {
  return value ?? DEFAULT_DRAIN_SECONDS;
}

function drainSecondsProblem(value: unknown): string | undefined {
  if (value === undefined) return undefined;
  return typeof value === "number" &&
    Number.isInteger(value) &&
    value >= 0 &&
    value <= MAX_DRAIN_SECONDS
    ? undefined
    : `drainSeconds must be a whole number of seconds from 0 (no drain) to ${MAX_DRAIN_SECONDS}, e.g. ${DEFAULT_DRAIN_SECONDS}, not ${JSON.stringify(value)}`;
}

/** The pool's lifecycle arguments (recheckEgress, rotateAfterDays, maxUnavailable, drainSeconds, onCollision), each problem naming its fix. */
export function lifecycleArgsProblems(args: {
  recheckEgress?: unknown;
  rotateAfterDays?: unknown;
  maxUnavailable?: unknown;
  drainSeconds?: unknown;
  onCollision?: unknown;
}): string[] {
  const problems: string[] = [];
  if (args.recheckEgress !== undefined && typeof args.recheckEgress !== "boolean")
    problems.push("recheckEgress must be true or false");
  const days = args.rotateAfterDays;
  if (days !== undefined && (typeof days !== "number" || !(days > 0) || days > 3650))
    problems.push(
      "rotateAfterDays must be a number of days above 0 and at most 3650, e.g. 30 (0.5 is twelve hours)",
    );
  const budgetProblem = maxUnavailableProblem(args.maxUnavailable);
  if (budgetProblem !== undefined) problems.push(budgetProblem);
  const drainProblem = drainSecondsProblem(args.drainSeconds);
  if (drainProblem !== undefined) problems.push(drainProblem);
  if (
    args.onCollision !== undefined &&
    args.onCollision !== "fail" &&
    args.onCollision !== "rotate"
  )
    problems.push(
      `onCollision must be "fail" (the default) or "rotate" (the younger of two members on one exit address is replaced), not ${JSON.stringify(args.onCollision)}`,
    );
  return problems;
}
