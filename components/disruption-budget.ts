/**
 * The pool's `maxUnavailable` as the members' `disruptionBudget`
 * (provider/common/disruption-budget.ts): how many of its members one
 * deployment may restart, replace, rotate or delete at the same time. Pure.
 */

/** A count (2, "2") or a share of the members ("25%"). */
export type MaxUnavailable = number | string;

/** The default: a quarter of the members, at least one. */
export const DEFAULT_MAX_UNAVAILABLE = "25%";

const FORMAT_HELP = 'a whole number of members of at least 1 (e.g. 2) or a share of them (e.g. "25%")';

/** What is wrong with `value`, naming the field and the fix; undefined when it is fine. */
export function maxUnavailableProblem(value: unknown): string | undefined {
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
export function resolveMaxUnavailable(
  value: MaxUnavailable | undefined,
  members: number,
): number {
  const given = String(value ?? DEFAULT_MAX_UNAVAILABLE).trim();
  const count = given.endsWith("%")
    ? Math.floor((Number(given.slice(0, -1)) * members) / 100)
    : Number(given);
  return Math.max(1, count);
}
