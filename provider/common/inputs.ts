/**
 * zod pieces both resources share, and the one way inputs are validated in
 * `check`: offline, pure, and tolerant of values Pulumi does not know yet.
 */
import { z } from "zod";
import { disruptionBudgetSchema } from "./disruption-budget";
import { rotateEgressSchema } from "./exit-address";
import { vmNameProblem } from "./names";

/** An http:// URL fetched through a proxy: no credentials (they would reach the target in clear). */
export const PROXIED_HTTP_URL = /^http:\/\/[^\s/@]+(\/\S*)?$/;
/** host:port, an IPv6 address in brackets. */
export const HOST_PORT = /^(\[[0-9a-fA-F:.]+\]|[^\s:/@[\]]+):\d{1,5}$/;

/** What Pulumi sends for a value not known yet (preview). */
export const UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9";

export const wholeNumber = (field: string, min: number, max: number, example: number) =>
  z
    .int({ error: `${field} must be a whole number, e.g. ${example}` })
    .min(min, { error: `${field} must be at least ${min}` })
    .max(max, { error: `${field} must be at most ${max}` });

export const vmNameSchema = z
  .string({ error: "vmName must be a string" })
  .superRefine((name, context) => {
    const problem = vmNameProblem(name);
    if (problem !== undefined)
      context.addIssue({ code: "custom", message: `vmName ${JSON.stringify(name)} ${problem}` });
  });

export const readinessSchema = z.strictObject({
  /**
   * "port": wait for the guest's address, then for `port` to accept TCP;
   * "address": wait for the address only; "none": done once the VM runs.
   */
  mode: z
    .enum(["port", "address", "none"], {
      error: 'readiness.mode must be "port", "address" or "none"',
    })
    .default("port"),
  port: wholeNumber("readiness.port", 1, 65535, 3128).default(3128),
  /**
   * With "port": also wait until a request without credentials is answered
   * 407, i.e. the proxy's own configuration serves, not a package's default
   * that listens on the same port first (common/readiness.ts).
   */
  authRequired: z.boolean({ error: "readiness.authRequired must be true or false" }).optional(),
});

export const timeoutsSchema = z.strictObject({
  createSeconds: wholeNumber("timeouts.createSeconds", 10, 86_400, 900).default(900),
  readySeconds: wholeNumber("timeouts.readySeconds", 1, 86_400, 600).default(600),
  deleteSeconds: wholeNumber("timeouts.deleteSeconds", 10, 86_400, 300).default(300),
});

export const ownerSchema = z.strictObject({
  project: z.string({ error: "owner.project must be the Pulumi project name" }).min(1),
  stack: z.string({ error: "owner.stack must be the Pulumi stack name" }).min(1),
  resource: z.string({ error: "owner.resource must be the Pulumi resource name" }).min(1),
});

export interface CheckFailure {
  property: string;
  reason: string;
}

export type ValidationResult<T> =
  | { ok: true; inputs: T }
  | {
      ok: false;
      failures: CheckFailure[];
      unknownOnly: boolean;
      /**
       * When the only problems are values Pulumi does not know yet (preview):
       * the inputs with every known field validated and defaulted, and every
       * unknown value kept as UNKNOWN where it was. `check` returns this, so
       * `diff` compares defaults with defaults and sees only what may change.
       */
      known?: Record<string, unknown>;
    };

/**
 * Validates inputs that may hold unknown values (preview): a problem at, or
 * under, an unknown value is not a problem yet. `typeName` and `docsPage` make
 * the message for an unexpected key say where the inputs are listed.
 */
export function validateWithUnknowns<S extends z.ZodType>(
  schema: S,
  raw: Record<string, unknown>,
  typeName: string,
  docsPage: string,
): ValidationResult<z.output<S>> {
  const { __provider: _ignored, ...rest } = raw;
  const unknownPaths: string[][] = [];
  const known = stripUnknowns(rest, [], unknownPaths) as Record<string, unknown>;
  const result = schema.safeParse(unknownPaths.length === 0 ? rest : known);
  if (result.success && unknownPaths.length === 0) return { ok: true, inputs: result.data };
  if (result.success)
    return { ok: false, failures: [], unknownOnly: true, known: fillKnown(schema, rest) as Props };
  const failures: CheckFailure[] = [];
  for (const issue of result.error.issues) {
    const path = issue.path.map(String);
    const keys =
      issue.code === "unrecognized_keys" ? issue.keys.map((key) => [...path, key]) : [path];
    for (const issuePath of keys) {
      if (
        unknownPaths.some(
          (unknown) => startsWith(issuePath, unknown) || startsWith(unknown, issuePath),
        )
      )
        continue;
      const property = issuePath.join(".");
      failures.push({
        property,
        reason:
          issue.code === "unrecognized_keys"
            ? `${property} is not an input of ${typeName}; remove it (see ${docsPage} for the inputs)`
            : issue.message.startsWith(property.split(".")[0]) || property === ""
              ? issue.message
              : `${property}: ${issue.message}`,
      });
    }
  }
  if (failures.length > 0) return { ok: false, failures, unknownOnly: false };
  return { ok: false, failures, unknownOnly: true, known: fillKnown(schema, rest) as Props };
}

type Props = Record<string, unknown>;

const isRecord = (value: unknown): value is Props =>
  typeof value === "object" && value !== null && !Array.isArray(value);

/**
 * `value` parsed by `schema` as far as it is known: defaults filled and
 * transforms applied to every known field, UNKNOWN kept wherever it was. The
 * schema is tried whole first (the known part alone may already satisfy it);
 * where a missing unknown value makes it fail, the object is walked field by
 * field. Unions and arrays with an unknown inside are kept as given: which
 * branch, or which element, is not decidable yet. Object-level refinements
 * cannot be judged with a value missing and are left to `up`, when check runs
 * again with everything known.
 */
export function fillKnown(schema: z.ZodType, value: unknown): unknown {
  if (value === UNKNOWN) return UNKNOWN;
  if (!containsUnknown(value)) {
    const parsed = schema.safeParse(value);
    return parsed.success ? parsed.data : value;
  }
  const parsed = schema.safeParse(stripUnknowns(value, [], []));
  if (parsed.success && !Array.isArray(value)) return withUnknownsOf(value, parsed.data);
  if (
    schema instanceof z.ZodOptional ||
    schema instanceof z.ZodDefault ||
    schema instanceof z.ZodNullable
  )
    return fillKnown(schema.unwrap() as z.ZodType, value);
  if (schema instanceof z.ZodObject && isRecord(value)) {
    const shape = schema.shape as Record<string, z.ZodType>;
    const filled: Props = {};
    for (const key of new Set([...Object.keys(shape), ...Object.keys(value)])) {
      const field = key in shape ? fillKnown(shape[key], value[key]) : value[key];
      if (field !== undefined) filled[key] = field;
    }
    return filled;
  }
  return value;
}

/** `parsed` with UNKNOWN put back at every place `raw` has one (objects only: arrays are never merged). */
function withUnknownsOf(raw: unknown, parsed: unknown): unknown {
  if (raw === UNKNOWN || (Array.isArray(raw) && containsUnknown(raw))) return raw;
  if (!isRecord(raw) || !isRecord(parsed) || !containsUnknown(raw)) return parsed;
  const merged: Props = { ...parsed };
  for (const [key, item] of Object.entries(raw))
    if (containsUnknown(item)) merged[key] = withUnknownsOf(item, parsed[key]);
  return merged;
}

function stripUnknowns(value: unknown, path: string[], unknownPaths: string[][]): unknown {
  if (value === UNKNOWN) {
    unknownPaths.push(path);
    return undefined;
  }
  if (Array.isArray(value))
    return value.map((item, index) => stripUnknowns(item, [...path, String(index)], unknownPaths));
  if (typeof value === "object" && value !== null) {
    const out: Record<string, unknown> = {};
    for (const [key, item] of Object.entries(value)) {
      const stripped = stripUnknowns(item, [...path, key], unknownPaths);
      if (stripped !== undefined) out[key] = stripped;
    }
    return out;
  }
  return value;
}

function startsWith(path: string[], prefix: string[]): boolean {
  return prefix.length <= path.length && prefix.every((part, index) => path[index] === part);
}

export function containsUnknown(value: unknown): boolean {
  if (value === UNKNOWN) return true;
  if (Array.isArray(value)) return value.some(containsUnknown);
  if (typeof value === "object" && value !== null)
    return Object.values(value).some(containsUnknown);
  return false;
}

/**
 * The VM lifecycle inputs both VM resources share: `rotation` (any text; a
 * new value replaces the VM, created before the old one goes; the pool's
 * `rotate` sets it), `startOnBoot` (libvirt autostart / PVE onboot) and
 * `running` (a refresh that finds the VM stopped makes the next `up` start it),
 * `egressRecheck` and `rotateAfterDays` (what refresh re-checks; docs/day2.md).
 */
/** Shared by the VM resources and StaticProxy. Optional, not defaulted: state written before it plans no change. */
export const egressRecheckSchema = z
  .boolean({ error: "egressRecheck must be true or false" })
  .optional();

export const vmLifecycleShape = {
  rotation: z
    .string({ error: "rotation must be a string (any text; a new value replaces the VM)" })
    .max(200, { error: "rotation must be at most 200 characters" })
    .optional(),
  /** Exit address -> text: the member leaving from one is replaced (common/egress-rotation.ts). */
  rotateEgress: rotateEgressSchema,
  /** How many members of the pool one deployment may disrupt at once (common/disruption-budget.ts). */
  disruptionBudget: disruptionBudgetSchema,
  startOnBoot: z.boolean({ error: "startOnBoot must be true or false" }).default(true),
  running: z.boolean({ error: "running must be true or false" }).default(true),
  /** Re-check the egress (port, then egressCheck) on every refresh; absent: off (see common/egress-recheck.ts). */
  egressRecheck: egressRecheckSchema,
  /** A refresh that finds the VM older than this reports it for replacement (common/egress-recheck.ts). */
  rotateAfterDays: z
    .number({ error: "rotateAfterDays must be a number of days, e.g. 30 (0.5 is twelve hours)" })
    .positive({ error: "rotateAfterDays must be more than 0" })
    .max(3650, { error: "rotateAfterDays must be at most 3650 (ten years)" })
    .optional(),
};
