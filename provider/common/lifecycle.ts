/**
 * The lifecycle every backend runs, in one place: checking inputs out of
 * props that also hold outputs, the ownership check, deadlines from
 * `timeouts`, a step runner that retries transient failures within the
 * deadline, the partial-create record, and the outputs update carries.
 * A backend's provider.ts keeps only its own steps (building from volumes,
 * cloning a template, probing a URL) and calls these for the rest.
 */
import { Deadline, retryWithBackoff } from "./deadline";
import { isTransient, PermanentError } from "./errors";
import type { ValidationResult } from "./inputs";
import { describeOwner, ownershipOf, type MarkReading, type OwnershipMark } from "./mark";
import { CREATE_INCOMPLETE_KEY, PartialCreateError } from "./partial-create";
import { plainJson } from "./check";

export type Props = Record<string, unknown>;

/** The serialized provider's key: neither an input nor an output of ours. */
const PROVIDER_KEY = "__provider";

// ---- input checking ----------------------------------------------------------------------------

/**
 * The inputs out of props that may also hold outputs (state given to create
 * by update, to read and delete by the engine): outputs and the serialized
 * provider are dropped, the rest validated with the backend's schema.
 */
export function checkedInputs<T>(
  resource: string,
  raw: Props,
  validate: (inputs: Props) => ValidationResult<T>,
  outputKeys: readonly string[],
): T {
  const result = validate(inputsOnly(raw, outputKeys));
  if (result.ok) return result.inputs;
  const reasons = result.failures.map((failure) => failure.reason).join("; ");
  throw new PermanentError(
    `invalid ${resource} inputs: ${reasons || "unknown values where known ones are needed"}`,
  );
}

/** Props without outputs (and a partial create's flag) and without the serialized provider. */
export function inputsOnly(props: Props, outputKeys: readonly string[]): Props {
  const drop = new Set([...outputKeys, CREATE_INCOMPLETE_KEY, PROVIDER_KEY]);
  return Object.fromEntries(Object.entries(props).filter(([key]) => !drop.has(key)));
}

/** Only the outputs (and a partial create's flag) of props. */
export function outputsOnly(props: Props, outputKeys: readonly string[]): Props {
  const keep = new Set([...outputKeys, CREATE_INCOMPLETE_KEY]);
  return Object.fromEntries(Object.entries(props).filter(([key]) => keep.has(key)));
}

// ---- ownership ---------------------------------------------------------------------------------

export interface OwnershipQuestion {
  /** The resource class, named in the fix for `.get`: "KvmProxy". */
  resource: string;
  /** What was found, e.g. `domain web-1 on kvm1:22`. */
  subject: string;
  owner: { project: string; stack: string };
  /** `.get`: the messages word the fix for adoption. */
  adopting?: boolean;
  /** Where the mark lives, e.g. "metadata" (libvirt) or "description" (Proxmox). */
  markPlace: string;
  /** The fix when the name is taken by another stack's VM. */
  fixForeign: string;
  /** The fix when the name is taken by a VM this package did not make. */
  fixUnmarked: string;
  /** Where to look at a mark nobody can read (virsh metadata, the VM's description). */
  inspect: string;
}

/**
 * Read, delete, `.get` and a resumed create act only on a VM that carries
 * this stack's mark: anything else is a Permanent error that says whose it is
 * and what to change.
 */
export function requireOurs(reading: MarkReading, question: OwnershipQuestion): OwnershipMark {
  const { resource, subject, owner, adopting = false } = question;
  switch (ownershipOf(reading, owner)) {
    case "ours":
      return (reading as { mark: OwnershipMark }).mark;
    case "foreign":
      throw new PermanentError(
        `${subject} belongs to ${describeOwner((reading as { mark: OwnershipMark }).mark.owner)}, not to ${owner.project}/${owner.stack}; ${adopting ? `only the stack that owns it can adopt it with ${resource}.get` : question.fixForeign}`,
      );
    case "unmarked":
      throw new PermanentError(
        `${subject} has no egress-proxies mark in its ${question.markPlace} (no ownership mark): it was not made by this package${adopting ? `, so ${resource}.get cannot adopt it; create a ${resource} instead` : `; ${question.fixUnmarked}`}`,
      );
    default:
      throw new PermanentError(
        `${subject} carries an unreadable ownership mark (${(reading as { reason: string }).reason}); ${question.inspect}`,
      );
  }
}

// ---- deadlines ---------------------------------------------------------------------------------

export interface Timeouts {
  createSeconds: number;
  readySeconds: number;
  deleteSeconds: number;
}

/** Refresh must not hang a `pulumi refresh`: readySeconds, at most two minutes. */
export const READ_CAP_SECONDS = 120;

/** The deadline of one operation, from the resource's `timeouts` (named in the timeout error). */
export function deadlineFor(
  timeouts: Timeouts,
  operation: "create" | "ready" | "read" | "delete",
): Deadline {
  switch (operation) {
    case "create":
      return Deadline.afterSeconds(timeouts.createSeconds, "timeouts.createSeconds");
    case "ready":
      return Deadline.afterSeconds(timeouts.readySeconds, "timeouts.readySeconds");
    case "read":
      return Deadline.afterSeconds(
        Math.min(timeouts.readySeconds, READ_CAP_SECONDS),
        "timeouts.readySeconds",
      );
    case "delete":
      return Deadline.afterSeconds(timeouts.deleteSeconds, "timeouts.deleteSeconds");
  }
}

/** Whichever deadline comes first. */
export function earlier(a: Deadline, b: Deadline): Deadline {
  return a.at <= b.at ? a : b;
}

// ---- steps -------------------------------------------------------------------------------------

export type StepRunner = <T>(what: string, attempt: () => Promise<T>) => Promise<T>;

/**
 * Runs the steps of one story: each retries Transient failures (a dropped
 * link, a 5xx, a busy daemon) with backoff until the shared deadline, and says
 * so through `log` when given. Permanent and NotFound failures end the step at
 * once. A step must be safe to repeat (every backend step is idempotent).
 */
export function stepsWithin(deadline: Deadline, log?: (message: string) => void): StepRunner {
  return <T>(what: string, attempt: () => Promise<T>): Promise<T> =>
    retryWithBackoff(
      what,
      deadline,
      {
        initialDelayMs: 200,
        maxDelayMs: 5000,
        retryable: isTransient,
        onRetry: (error) => {
          const detail = error instanceof Error ? error.message : String(error);
          log?.(`${what}: ${detail}; retrying`);
        },
      },
      attempt,
    );
}

// ---- partial create ----------------------------------------------------------------------------

/**
 * Runs a create (or update continuing one) so that its partial-create record
 * carries the request's serialized provider: without it Pulumi could never
 * delete the record.
 */
export async function recordingPartialCreate<T>(
  request: Props,
  run: () => Promise<T>,
  id?: string,
): Promise<T> {
  try {
    return await run();
  } catch (error) {
    if (!(error instanceof PartialCreateError)) throw error;
    throw new PartialCreateError(id ?? error.id, error.properties, error.cause as Error, request);
  }
}

/**
 * Update on a partial create continues it: the same id must come out (same
 * host and name, or the VMID state records), or state and the world disagree.
 */
export async function continueCreate(
  id: string,
  news: Props,
  create: (news: Props) => Promise<{ id: string; outs: object }>,
): Promise<{ outs: Props }> {
  const created = await recordingPartialCreate(news, () => create(news), id);
  if (created.id !== id)
    throw new PermanentError(
      `continuing the create of ${id} reached ${created.id}; run pulumi refresh, then up again`,
    );
  return { outs: plainJson(created.outs as Props) };
}

// ---- delete ------------------------------------------------------------------------------------

/** What a delete did: the reaper reports it; Pulumi ignores it. */
export type DeleteOutcome = "removed" | "already gone";

/**
 * The delete the dynamic-provider server calls on a stored provider that is
 * the provider module itself (resource.ts): the server ignores the outcome,
 * and Pulumi's type says void.
 */
export function deleteForServer(
  remove: (id: string, props: Props) => Promise<DeleteOutcome>,
): (id: string, props: Props) => Promise<void> {
  return async (id, props) => {
    await remove(id, props);
  };
}

// ---- update ------------------------------------------------------------------------------------

/**
 * An in-place update's outputs: the new inputs, with what only the backend
 * knows carried from the old outputs. `endpoint` follows a changed readiness
 * port; outputs absent in older state become null (a Struct cannot hold undefined).
 */
export function carriedOutputs<I extends { readiness: { port: number } }>(
  olds: Props,
  inputs: I,
  outputKeys: readonly string[],
): Props {
  const carried: Props = {};
  for (const key of outputKeys) carried[key] = olds[key] ?? null;
  const address = olds.ip;
  if (typeof address === "string" && address !== "")
    carried.endpoint = `http://${address}:${inputs.readiness.port}`;
  return plainJson({ ...inputs, ...carried });
}
