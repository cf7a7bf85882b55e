/**
 * The error shape Pulumi's dynamic-provider server turns into
 * "ErrorResourceInitFailed": the resource exists (it has an id and outputs) but
 * did not become healthy. Pulumi records it in state (marked failed) instead of
 * forgetting it, so a VM that booted but never became ready is not leaked.
 */
export class PartialCreateError extends Error {
  override readonly name = "PartialCreateError";
  readonly reasons: string[];

  constructor(
    readonly id: string,
    readonly properties: object,
    cause: Error,
  ) {
    super(cause.message, { cause });
    this.reasons = [cause.message];
  }
}
