/**
 * What can go wrong talking to libvirtd, as types a caller can tell apart:
 * - `LibvirtError`: the daemon answered with an error (the link is fine).
 * - `LibvirtTransportError`: the link is gone or spoke nonsense; every call
 *   in flight on it fails with this, and the connection cannot be used again.
 * - `LibvirtTimeoutError` / `LibvirtAbortedError`: one call ran out of time or
 *   its caller gave up; the connection stays usable for everybody else.
 * - `LibvirtStreamEndpointError`: the local side of a stream (the upload's
 *   source or the download's sink) failed.
 * This library only types errors; mapping them to retry decisions is the
 * caller's job (the project does it in one place, `classifyLibvirtError`).
 */

/** virErrorNumber values this project meets (include/libvirt/virterror.h). */
export const ErrorCode = {
  INTERNAL_ERROR: 1,
  NO_SUPPORT: 3,
  INVALID_ARG: 8,
  OPERATION_FAILED: 9,
  XML_ERROR: 27,
  DOM_EXIST: 28,
  OPERATION_DENIED: 29,
  RPC: 39,
  NO_DOMAIN: 42,
  NO_NETWORK: 43,
  AUTH_FAILED: 45,
  NO_STORAGE_POOL: 49,
  NO_STORAGE_VOL: 50,
  OPERATION_INVALID: 55,
  CONFIG_UNSUPPORTED: 67,
  OPERATION_TIMEOUT: 68,
  INVALID_STREAM: 73,
  ARGUMENT_UNSUPPORTED: 74,
  OPERATION_ABORTED: 78,
  NO_DOMAIN_METADATA: 80,
  OPERATION_UNSUPPORTED: 84,
  AGENT_UNRESPONSIVE: 86,
  RESOURCE_BUSY: 87,
  ACCESS_DENIED: 88,
  STORAGE_VOL_EXIST: 90,
  XML_INVALID_SCHEMA: 92,
  AUTH_UNAVAILABLE: 94,
  AGENT_UNSYNCED: 97,
  NO_HOSTNAME: 108,
  AGENT_COMMAND_TIMEOUT: 112,
  AGENT_COMMAND_FAILED: 113,
} as const;

/** virErrorDomain values this project meets. */
export const ErrorDomain = {
  RPC: 7,
  QEMU: 10,
  REMOTE: 13,
  STORAGE: 18,
  DOMAIN: 20,
  STREAMS: 38,
} as const;

/** The decoded `remote_error` struct, all 11 fields. */
export interface RemoteErrorFields {
  code: number;
  domain: number;
  message: string | null;
  level: number;
  dom: { name: string; uuid: Buffer; id: number } | null;
  str1: string | null;
  str2: string | null;
  str3: string | null;
  int1: number;
  int2: number;
  net: { name: string; uuid: Buffer } | null;
}

/** An error the daemon reported for one call. The connection is still healthy. */
export class LibvirtError extends Error {
  override readonly name = "LibvirtError";
  /** virErrorNumber; "unknown procedure" is normalised to NO_SUPPORT. */
  readonly code: number;
  /** virErrorDomain: which part of libvirt raised it. */
  readonly domain: number;
  /** The daemon's own message, unchanged. */
  readonly libvirtMessage: string;
  readonly procedure: string;
  readonly remote: RemoteErrorFields;

  constructor(procedure: string, remote: RemoteErrorFields) {
    const libvirtMessage = remote.message ?? "(no message)";
    super(
      `libvirt ${procedure} failed: ${libvirtMessage} (code ${remote.code}, domain ${remote.domain})`,
    );
    this.procedure = procedure;
    this.remote = remote;
    this.libvirtMessage = libvirtMessage;
    this.domain = remote.domain;
    // Old daemons answer procedures they do not know with a generic RPC error whose
    // message starts "unknown procedure"; callers want to see "not supported".
    this.code = libvirtMessage.startsWith("unknown procedure") ? ErrorCode.NO_SUPPORT : remote.code;
  }
}

export type TransportFailure =
  /** The peer closed the link, or we did. */
  | "closed"
  /** The socket or SSH channel reported an error. */
  | "io"
  /** The peer sent something that is not the libvirt protocol (bad length, wrong program, bad XDR). */
  | "protocol"
  /** Neither data nor keepalive answers arrived in time: the peer or the path is dead. */
  | "keepalive"
  /** The handshake (auth list, open) did not complete in time. */
  | "handshake";

/** The connection is unusable. Every call in flight on it gets this. */
export class LibvirtTransportError extends Error {
  override readonly name = "LibvirtTransportError";
  constructor(
    readonly failure: TransportFailure,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** One call passed its deadline. Other calls on the connection are unaffected. */
export class LibvirtTimeoutError extends Error {
  override readonly name = "LibvirtTimeoutError";
  constructor(
    readonly procedure: string,
    readonly timeoutMs: number,
  ) {
    super(`libvirt ${procedure} did not finish within its deadline of ${timeoutMs} ms`);
  }
}

/** The caller aborted one call through its AbortSignal. */
export class LibvirtAbortedError extends Error {
  override readonly name = "LibvirtAbortedError";
  constructor(
    readonly procedure: string,
    options?: { cause?: unknown },
  ) {
    super(`libvirt ${procedure} was aborted by its caller`, options);
  }
}

/** The local end of a stream failed: the upload's source or the download's sink. */
export class LibvirtStreamEndpointError extends Error {
  override readonly name = "LibvirtStreamEndpointError";
  constructor(
    readonly procedure: string,
    readonly endpoint: "source" | "sink",
    options: { cause: unknown },
  ) {
    const reason = options.cause instanceof Error ? options.cause.message : String(options.cause);
    super(`libvirt ${procedure}: the stream's ${endpoint} failed: ${reason}`, options);
  }
}
