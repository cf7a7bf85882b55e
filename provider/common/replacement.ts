/**
 * A VM that cannot be healed in place: refresh found its disk or seed gone,
 * or its domain gone while its volumes remain, or it did not become ready
 * within its budget after `up` started it again. Its outputs then say why
 * under `replaceBecause`, and diff proposes a replacement whatever the
 * program says, so the next `up` heals it with no hand edits.
 *
 * The replacement deletes first and keeps the VM's name: a broken VM serves
 * nothing (the pool already publishes it not ready), so nothing is lost while
 * it goes, and its name, volumes and VMID are free again before the new one
 * is made, so nothing can collide with or adopt what is left of the old one.
 *
 * It never loops: a replacement is a create, and a create that fails is
 * recorded as a partial create which the next `up` continues (waits for
 * again), never replaces. One broken VM costs at most one automatic
 * replacement; a fresh VM that does not become ready either points at the
 * image, cloud-init or the network, which another VM would not fix.
 */
import type { DiffDecision } from "./diff";

/** Output (and, after refresh, input) key naming why the VM must be replaced. FROZEN: state carries it. */
export const REPLACE_BECAUSE_KEY = "replaceBecause";

type Props = Record<string, unknown>;

/** Why these outputs must be replaced, or undefined when they need not be. */
export function replacementReason(outputs: Props): string | undefined {
  const reason = outputs[REPLACE_BECAUSE_KEY];
  return typeof reason === "string" && reason !== "" ? reason : undefined;
}

/** The table's decision, turned into a delete-first replacement when the old outputs say the VM is broken. */
export function withRepairReplacement(decision: DiffDecision, olds: Props): DiffDecision {
  if (replacementReason(olds) === undefined) return decision;
  return {
    changes: true,
    replaces: [...new Set([...decision.replaces, REPLACE_BECAUSE_KEY])],
    deleteBeforeReplace: true,
  };
}

/** Props with the reason set, or removed when there is none (a key Pulumi would store as null). */
export function withReplacementReason(props: Props, reason: string | undefined): Props {
  const { [REPLACE_BECAUSE_KEY]: _previous, ...rest } = props;
  return reason === undefined ? rest : { ...rest, [REPLACE_BECAUSE_KEY]: reason };
}

/** The serialized provider's key in a dynamic resource's inputs and outputs. */
const PROVIDER_KEY = "__provider";

/**
 * An update that started the VM again, which then did not become ready within
 * its budget. The dynamic-provider server turns an error with an id into
 * "ErrorResourceInitFailed", so Pulumi stores these outputs (the VM running,
 * marked for replacement) and the update is reported failed; the next `up`
 * replaces it.
 */
export class ReplaceOnNextUpError extends Error {
  override readonly name = "ReplaceOnNextUpError";
  readonly reasons: string[];
  readonly properties: Props;

  constructor(
    readonly id: string,
    outputs: Props,
    reason: string,
    cause: Error,
    /** The update request's news, for the serialized provider they carry. */
    request: Props,
  ) {
    super(`${cause.message}; ${reason}: the next \`pulumi up\` replaces it`, { cause });
    this.reasons = [this.message];
    const provider = request[PROVIDER_KEY];
    // Not ready: no address to publish, and no check that passed since it was started again.
    const notReady = { ip: null, endpoint: null, egressIp: null, checkedAt: null };
    this.properties = {
      ...withReplacementReason({ ...outputs, ...notReady }, reason),
      ...(typeof provider === "string" ? { [PROVIDER_KEY]: provider } : {}),
    };
  }
}
