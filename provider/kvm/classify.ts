/**
 * The one place that decides what a libvirt, SSH or image download failure means for the
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
import { redactText, redactUrl } from "../common/redact";
import { SshAuthError, SshConfigError, SshConnectError, SshHostKeyError } from "../ssh/errors";
import { describeImageUrl, ImageSourceRefusedError } from "./image-source-policy";

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

// ---- image downloads ---------------------------------------------------------------------------

/** Classifies an HTTP status for an image URL: 404/410 mean the URL is wrong, 5xx/429 may pass. */
export function classifyImageHttpStatus(
  status: number,
  url: string,
  finalUrl?: URL,
): EgressProxyError {
  const redirected = finalUrl === undefined ? "" : ` (redirected to ${describeImageUrl(finalUrl)})`;
  const where = `image.url ${redactUrl(url)}${redirected} answered HTTP ${status}`;
  if (status === 404 || status === 410)
    return new NotFoundError(`${where}; check the URL (images move when a release is superseded)`);
  if (status === 429 || status >= 500)
    return new TransientError(`${where}; the server is busy or failing, try again`);
  return new PermanentError(`${where}; the image must be downloadable without credentials`);
}

/** What the network, a busy server or a flaky resolver cause: another attempt may pass. */
const TRANSIENT_FETCH_CODES: ReadonlySet<string> = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ECONNABORTED",
  "ETIMEDOUT",
  "EPIPE",
  "EHOSTUNREACH",
  "EHOSTDOWN",
  "ENETUNREACH",
  "ENETDOWN",
  // A name that does not resolve may be a typo, but just as often a resolver or VPN that is down.
  "ENOTFOUND",
  "EAI_AGAIN",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_HEADERS_TIMEOUT",
  "UND_ERR_BODY_TIMEOUT",
  "UND_ERR_SOCKET",
  "UND_ERR_ABORTED",
  "UND_ERR_CLOSED",
  "UND_ERR_DESTROYED",
  "UND_ERR_INFO",
  "UND_ERR_RES_CONTENT_LENGTH_MISMATCH",
]);

/** A certificate or TLS handshake that is refused today is refused on every retry: a person must act. */
const PERMANENT_TLS_CODES: ReadonlySet<string> = new Set([
  "CERT_HAS_EXPIRED",
  "CERT_NOT_YET_VALID",
  "CERT_REVOKED",
  "CERT_UNTRUSTED",
  "CERT_REJECTED",
  "CERT_SIGNATURE_FAILURE",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "ERR_TLS_CERT_ALTNAME_INVALID",
]);

/**
 * What a failed image download means. A refused redirect or address is
 * Permanent (the image server decided it; retrying asks the same server),
 * so is a certificate nobody trusts; network trouble is Transient; an HTTP
 * parser error (HPE_*) from a response cut mid-way is Transient too.
 * Anything else is Permanent, as everywhere in this file.
 */
export function classifyImageFetchError(error: unknown, url: string): EgressProxyError {
  if (error instanceof EgressProxyError) return error;
  const detail = redactText(error instanceof Error ? error.message : String(error));
  const full = { cause: error };
  if (error instanceof ImageSourceRefusedError) return new PermanentError(detail, full);
  const code = (error as { code?: unknown } | undefined)?.code;
  const failed = `downloading image.url ${redactUrl(url)} failed: ${detail}`;
  if (code === "ERR_SSL_WRONG_VERSION_NUMBER")
    return new PermanentError(
      `${failed}; the server does not speak TLS on that port: check image.url's scheme and port`,
      full,
    );
  if (typeof code === "string" && PERMANENT_TLS_CODES.has(code))
    return new PermanentError(
      `${failed}; the server's TLS certificate is not accepted here: use an image.url whose certificate the system trusts`,
      full,
    );
  if (typeof code === "string" && (TRANSIENT_FETCH_CODES.has(code) || code.startsWith("HPE_")))
    return new TransientError(failed, full);
  return new PermanentError(failed, full);
}

function isAccessDenied(cause: unknown): boolean {
  const code = (cause as NodeJS.ErrnoException | undefined)?.code;
  return code === "EACCES" || code === "EPERM";
}
