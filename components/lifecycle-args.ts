/**
 * The pool's `maxUnavailable` as the members' `disruptionBudget`
 * (provider/common/disruption-budget.ts): how many of its members one
 * deployment may restart, replace, rotate or delete at the same time, and
 * the checks of the pool's other lifecycle arguments. Pure.
 */

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

/** The pool's lifecycle arguments (recheckEgress, rotateAfterDays, maxUnavailable), each problem naming its fix. */
export function lifecycleArgsProblems(args: {
  recheckEgress?: unknown;
  rotateAfterDays?: unknown;
  maxUnavailable?: unknown;
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
  return problems;
}
