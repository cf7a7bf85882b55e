/**
 * The error taxonomy every backend shares. A caller decides what to do from the
 * class alone: NotFound means "gone, treat as absent", Transient means "retrying
 * may help", Permanent means "a person must change something". Backends decide
 * the class in exactly one place (their `classify.ts`); everything else only
 * constructs or inspects these.
 */
export type ErrorClass = "NotFound" | "Transient" | "Permanent";

export interface ErrorContext {
  /** What we were doing, e.g. "create", "ensureBaseImage", "upload seed". */
  operation?: string;
  /** What we were doing it to, e.g. "domain proxy-abc on host-1". */
  resource?: string;
  /** The underlying error. Its message must already be free of secrets. */
  cause?: unknown;
}

export abstract class EgressProxyError extends Error {
  abstract readonly errorClass: ErrorClass;
  readonly operation?: string;
  readonly resource?: string;
  /** The message without the operation/resource prefix. */
  readonly detail: string;

  constructor(detail: string, context: ErrorContext = {}) {
    super(
      composeMessage(detail, context),
      context.cause === undefined ? undefined : { cause: context.cause },
    );
    this.detail = detail;
    this.operation = context.operation;
    this.resource = context.resource;
  }
}

export class NotFoundError extends EgressProxyError {
  readonly errorClass = "NotFound" as const;
  override readonly name = "NotFoundError";
}

export class TransientError extends EgressProxyError {
  readonly errorClass = "Transient" as const;
  override readonly name = "TransientError";
}

export class PermanentError extends EgressProxyError {
  readonly errorClass = "Permanent" as const;
  override readonly name = "PermanentError";
}

function composeMessage(detail: string, { operation, resource }: ErrorContext): string {
  const where = [operation, resource].filter((part) => part !== undefined && part !== "").join(" ");
  return where === "" ? detail : `${where}: ${detail}`;
}

/** The class of an error we made; `undefined` for anything nobody classified yet. */
export function errorClassOf(error: unknown): ErrorClass | undefined {
  return error instanceof EgressProxyError ? error.errorClass : undefined;
}

export const isNotFound = (error: unknown): error is NotFoundError =>
  errorClassOf(error) === "NotFound";
export const isTransient = (error: unknown): error is TransientError =>
  errorClassOf(error) === "Transient";
export const isPermanent = (error: unknown): error is PermanentError =>
  errorClassOf(error) === "Permanent";

/**
 * Re-raise an error with more context while keeping its class. An error nobody
 * classified becomes Permanent: a silent "retry forever" on a config mistake is
 * worse than a failure a person reads.
 */
export function withContext(
  error: unknown,
  context: Omit<ErrorContext, "cause">,
): EgressProxyError {
  const detail =
    error instanceof EgressProxyError
      ? error.detail
      : error instanceof Error
        ? error.message
        : String(error);
  const full = { ...context, cause: error };
  switch (errorClassOf(error)) {
    case "NotFound":
      return new NotFoundError(detail, full);
    case "Transient":
      return new TransientError(detail, full);
    default:
      return new PermanentError(detail, full);
  }
}
