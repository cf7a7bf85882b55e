/**
 * The error shape Pulumi's dynamic-provider server turns into
 * "ErrorResourceInitFailed": the resource exists (it has an id and outputs) but
 * did not become healthy. Pulumi records it in state (marked failed) instead of
 * forgetting it, so a VM that booted but never became ready is not leaked.
 *
 * What the engine does with the record next (docs/architecture.md, "Failed creates"):
 * - the next `up` runs diff, then `update` even when nothing changed (the
 *   resource has init errors); update sees `createIncomplete` and continues
 *   the create instead of only carrying outputs forward;
 * - `destroy` or a replacement runs `delete` with these properties as the
 *   outputs. The dynamic-provider server finds the provider code in the
 *   outputs' `__provider` key, and it does not add that key to a failed
 *   create's properties itself: so it is copied from the inputs here, or the
 *   record could never be deleted.
 */
import { inspect } from "node:util";

/** Output key of a recorded partial create: the next update continues the create. FROZEN: old state carries it. */
export const CREATE_INCOMPLETE_KEY = "createIncomplete";

/** The serialized provider's key in a dynamic resource's inputs and outputs. */
const PROVIDER_KEY = "__provider";

export class PartialCreateError extends Error {
  override readonly name = "PartialCreateError";
  readonly reasons: string[];
  /** What Pulumi stores as the resource's outputs. */
  readonly properties: Record<string, unknown>;

  constructor(
    readonly id: string,
    outputs: object,
    cause: Error,
    /** The create (or update) request's properties, for the serialized provider they carry. */
    request?: Record<string, unknown>,
  ) {
    super(cause.message, { cause });
    this.reasons = [cause.message];
    const provider = request?.[PROVIDER_KEY];
    this.properties = {
      ...outputs,
      [CREATE_INCOMPLETE_KEY]: true,
      ...(typeof provider === "string" ? { [PROVIDER_KEY]: provider } : {}),
    };
  }

  /**
   * How console.log and friends show it: the properties carry the request's connection (a private
   * key, an API token) for the engine to store encrypted, so a log shows their names, never values.
   */
  [inspect.custom](): string {
    const recorded = Object.keys(this.properties).sort().join(", ");
    return `${this.name}: ${this.message}\n  id: ${this.id}\n  properties recorded: ${recorded}`;
  }
}

/** Whether these outputs are a partial create's record (the create must be continued). */
export function isIncompleteCreate(outputs: Record<string, unknown>): boolean {
  return outputs[CREATE_INCOMPLETE_KEY] === true;
}
