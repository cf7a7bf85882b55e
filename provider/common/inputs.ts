/**
 * zod pieces both resources share, and the one way inputs are validated in
 * `check`: offline, pure, and tolerant of values Pulumi does not know yet.
 */
import { z } from "zod";
import { vmNameProblem } from "./names";

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
  { ok: true; inputs: T } | { ok: false; failures: CheckFailure[]; unknownOnly: boolean };

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
  if (result.success) {
    if (unknownPaths.length > 0) return { ok: false, failures: [], unknownOnly: true };
    return { ok: true, inputs: result.data };
  }
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
  return { ok: false, failures, unknownOnly: failures.length === 0 };
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
