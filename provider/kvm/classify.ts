/**
 * The one place that decides what a libvirt or SSH failure means for the
 * provider: NotFound (gone: treat as absent), Transient (retrying may help) or
 * Permanent (a person must change something). Anything not listed here is
 * Permanent on purpose: a silent "retry forever" on a config mistake is worse
 * than a failure a person reads.
 */
import { EgressProxyError, NotFoundError, PermanentError, TransientError } from "../common/errors";
import {
  ErrorCode,
  LibvirtAbortedError,
  LibvirtError,
  LibvirtStreamEndpointError,
  LibvirtTimeoutError,
  LibvirtTransportError,
} from "../libvirt-rpc-xdr";
import { SshAuthError, SshConfigError, SshConnectError, SshHostKeyError } from "../ssh/errors";

/** libvirt codes that mean "the object is gone". Only these: any other lookup failure is not "gone". */
const NOT_FOUND_CODES: ReadonlySet<number> = new Set([
  ErrorCode.NO_DOMAIN,
  ErrorCode.NO_STORAGE_VOL,
  ErrorCode.NO_DOMAIN_METADATA,
]);

/** libvirt codes a busy or briefly unready host produces. */
const TRANSIENT_CODES: ReadonlySet<number> = new Set([
  ErrorCode.OPERATION_TIMEOUT,
  ErrorCode.OPERATION_ABORTED,
  ErrorCode.AGENT_UNRESPONSIVE,
  ErrorCode.RESOURCE_BUSY,
  ErrorCode.AGENT_UNSYNCED,
  ErrorCode.AGENT_COMMAND_TIMEOUT,
]);

export interface ClassifyContext {
  operation?: string;
  resource?: string;
}

export function classifyLibvirtError(
  error: unknown,
  context: ClassifyContext = {},
): EgressProxyError {
  if (error instanceof EgressProxyError) return error;
  const detail = error instanceof Error ? error.message : String(error);
  const full = { ...context, cause: error };
  if (error instanceof LibvirtError) {
    if (NOT_FOUND_CODES.has(error.code)) return new NotFoundError(detail, full);
    if (TRANSIENT_CODES.has(error.code)) return new TransientError(detail, full);
    // libvirt refreshes a pool in the background after an upload; a refresh meanwhile fails like this.
    if (
      error.code === ErrorCode.INTERNAL_ERROR &&
      /asynchronous jobs running/.test(error.libvirtMessage)
    ) {
      return new TransientError(detail, full);
    }
    // A volume whose cancelled stream the daemon has not torn down yet: it will be free shortly.
    if (
      error.code === ErrorCode.OPERATION_INVALID &&
      /is still in use/.test(error.libvirtMessage)
    ) {
      return new TransientError(detail, full);
    }
    // The daemon's own RPC layer failing (e.g. a stream it could not keep up) is about the link.
    if (error.code === ErrorCode.RPC && !/authentication/i.test(error.libvirtMessage)) {
      return new TransientError(detail, full);
    }
    return new PermanentError(detail, full);
  }
  // The local socket refused this user (not in the libvirt group): no retry changes that.
  if (error instanceof LibvirtTransportError && isAccessDenied(error.cause))
    return new PermanentError(detail, full);
  if (
    error instanceof LibvirtTransportError ||
    error instanceof LibvirtTimeoutError ||
    error instanceof LibvirtAbortedError ||
    error instanceof SshConnectError
  ) {
    return new TransientError(detail, full);
  }
  if (error instanceof LibvirtStreamEndpointError) {
    // The source or sink is ours (an image download, a file): keep its class if it has one.
    const cause = error.cause;
    if (cause instanceof EgressProxyError)
      return cause.errorClass === "Permanent"
        ? new PermanentError(detail, full)
        : new TransientError(detail, full);
    return new TransientError(detail, full);
  }
  if (
    error instanceof SshHostKeyError ||
    error instanceof SshAuthError ||
    error instanceof SshConfigError
  ) {
    return new PermanentError(detail, full);
  }
  return new PermanentError(detail, full);
}

function isAccessDenied(cause: unknown): boolean {
  const code = (cause as NodeJS.ErrnoException | undefined)?.code;
  return code === "EACCES" || code === "EPERM";
}
