/**
 * Unknown keys in stack config: which keys a zod schema knows at a path, and
 * which of them the user most likely meant, and zod's issues told so. Pure;
 * used by stack-config.ts so that `kvm: { netwrok: ... }` is answered with
 * "did you mean network?" instead of a later failure naming a property the
 * user never wrote.
 */
import type { z } from "zod";

/** The parts of zod 4's schema definitions the walk reads (`schema.def`). */
interface SchemaDef {
  type: string;
  shape?: Record<string, z.ZodType>;
  innerType?: z.ZodType;
  in?: z.ZodType;
  out?: z.ZodType;
  options?: readonly z.ZodType[];
  element?: z.ZodType;
  left?: z.ZodType;
  right?: z.ZodType;
}

const WRAPPERS = new Set([
  "optional",
  "default",
  "prefault",
  "nullable",
  "nonoptional",
  "readonly",
  "catch",
]);

/** The keys an object schema accepts at `path` (through optional, default, pipe, union, array). */
export function knownKeysAt(schema: z.ZodType, path: readonly PropertyKey[]): string[] {
  const def = (schema as unknown as { def: SchemaDef }).def;
  const inner = (next: z.ZodType | undefined, rest = path) =>
    next === undefined ? [] : knownKeysAt(next, rest);
  if (WRAPPERS.has(def.type)) return inner(def.innerType);
  switch (def.type) {
    case "object": {
      if (path.length === 0) return Object.keys(def.shape ?? {});
      const [head, ...rest] = path;
      return inner(def.shape?.[String(head)], rest);
    }
    case "pipe":
      return unique([...inner(def.in), ...inner(def.out)]);
    case "union":
      return unique((def.options ?? []).flatMap((option) => knownKeysAt(option, path)));
    case "intersection":
      return unique([...inner(def.left), ...inner(def.right)]);
    case "array":
      return typeof path[0] === "number" ? inner(def.element, path.slice(1)) : [];
    default:
      return [];
  }
}

const unique = (names: string[]): string[] => [...new Set(names)];

/**
 * The known name closest to `typed` (case ignored; a swap of two neighbouring
 * letters counts as one edit), if it is close enough to be a typo: at most one
 * edit for short names, one per three letters for longer ones.
 */
export function closestName(typed: string, known: readonly string[]): string | undefined {
  const limit = Math.max(1, Math.floor(typed.length / 3));
  let best: { name: string; distance: number } | undefined;
  for (const name of known) {
    const distance = editDistance(typed.toLowerCase(), name.toLowerCase());
    if (distance <= limit && (best === undefined || distance < best.distance))
      best = { name, distance };
  }
  return best?.name;
}

/** Optimal string alignment distance: insertions, deletions, substitutions and adjacent swaps. */
function editDistance(a: string, b: string): number {
  const rows = Array.from({ length: a.length + 1 }, (_, i) =>
    Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)),
  );
  for (let i = 1; i <= a.length; i++)
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let distance = Math.min(
        rows[i - 1]![j]! + 1,
        rows[i]![j - 1]! + 1,
        rows[i - 1]![j - 1]! + cost,
      );
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1])
        distance = Math.min(distance, rows[i - 2]![j - 2]! + 1);
      rows[i]![j] = distance;
    }
  return rows[a.length]![b.length]!;
}

/**
 * A problem whose message continues the config key ("<key> is not a known
 * setting; ..."), as opposed to one printed as "<key>: <message>".
 */
const CONTINUES_KEY = { continuesKey: true };

/**
 * zod's issues for one schema, unknown keys spelled out one by one with the
 * closest known key (or, for an input the pool decides, where it is set).
 */
export function describeIssues(
  issues: readonly z.core.$ZodIssue[],
  schema: z.ZodType,
  decidedAt?: {
    path: readonly PropertyKey[];
    keys: readonly string[];
    /** What to do instead, by key; "remove it" when a key has none. */
    advice: Readonly<Record<string, string>>;
  },
): z.core.$ZodRawIssue[] {
  return issues.flatMap((issue): z.core.$ZodRawIssue[] => {
    if (issue.code !== "unrecognized_keys")
      return [
        {
          code: "custom",
          message: issue.message,
          path: [...issue.path],
          input: undefined,
          ...(issue.code === "custom" && issue.params !== undefined
            ? { params: issue.params }
            : {}),
        },
      ];
    const known = knownKeysAt(schema, issue.path);
    const decided =
      decidedAt !== undefined && samePath(issue.path, decidedAt.path) ? decidedAt.keys : [];
    return issue.keys.map((key) => ({
      code: "custom",
      path: [...issue.path, key],
      input: undefined,
      params: CONTINUES_KEY,
      message: decided.includes(key)
        ? `is set by the pool for every proxy; ${decidedAt!.advice[key] ?? "remove it"}`
        : unknownKeyAdvice(key, known),
    }));
  });
}

function unknownKeyAdvice(key: string, known: readonly string[]): string {
  const guess = closestName(key, known);
  if (guess !== undefined) return `is not a known setting; did you mean ${guess}?`;
  return known.length === 0
    ? "is not a known setting; remove it"
    : `is not a known setting; remove it (the settings here are ${known.join(", ")})`;
}

const samePath = (a: readonly PropertyKey[], b: readonly PropertyKey[]) =>
  a.length === b.length && a.every((part, index) => part === b[index]);
