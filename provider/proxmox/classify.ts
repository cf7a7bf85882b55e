import { EgressProxyError, NotFoundError, PermanentError, TransientError } from "../common/errors";
import { redactText } from "../common/redact";

/**
 * The one place a Proxmox failure gets its class. Everything the API, a task or
 * the network can say ends up here; the table is tested row by row
 * ("proxmox classify: the one table" in test/unit/proxmox-pure.test.ts). The
 * Fn labels are the Proxmox behaviours listed in docs/proxmox.md, "Proxmox VE behaviours we rely on".
 */

/** What PVE sent back for a failed request (docs/proxmox.md section 9, fact F1). */
export interface ApiFailure {
  method: string;
  /** Path below /api2/json, e.g. /nodes/pve/qemu/100/config. */
  path: string;
  status: number;
  /** The trimmed body `message`, else the HTTP reason phrase (F1). */
  message: string;
  /** Per-parameter messages of a 400 (F1). */
  parameterErrors: Record<string, string>;
  /** The token that was sent: its id (`user@realm!tokenid`, never the secret) and where it was set. */
  token?: { id: string; source: string };
}

const TRANSIENT_TEXT = [
  /got timeout/i, // flock / storage lock waits, agent commands (F5, locks)
  /got no worker upid/i, // pvedaemon overloaded
  /VM is locked \(/i, // F7: another task owns the VM right now
  /QEMU guest agent is not running/i, // F5: enabled, not (yet) answering
  /is not running/i, // F5: VM stopped (agent calls)
  /trying to acquire lock/i,
];

/** F2: the same 500 for GET config, GET status/current and DELETE. */
const MISSING_CONFIG = /Configuration file '[^']*' does not exist/i;

/** Turns a failed API response into NotFound / Transient / Permanent, with what to do. */
export function classifyApiFailure(failure: ApiFailure): EgressProxyError {
  const text = describeApiFailure(failure);
  const context = { operation: `${failure.method} ${failure.path}` };
  if (MISSING_CONFIG.test(failure.message)) return new NotFoundError(text, context);
  if (failure.status === 401)
    return new PermanentError(`${text}: ${rejectedTokenHint(failure)}`, context);
  if (failure.status === 403)
    return new PermanentError(`${text}: ${deniedPrivilegeHint(failure)}`, context);
  if (TRANSIENT_TEXT.some((pattern) => pattern.test(failure.message)))
    return new TransientError(text, context);
  if (/No QEMU guest agent configured/i.test(failure.message))
    return new PermanentError(
      `${text}: enable the guest agent option (agent: 1) on the template`,
      context,
    );
  // 5xx with a status above 500 comes from pveproxy itself or the way there
  // (595/596 no route/timeout to a node, 502/503/504 proxies): retry.
  if (failure.status >= 501 || failure.status === 429) return new TransientError(text, context);
  if (failure.status === 408) return new TransientError(text, context);
  return new PermanentError(text, context);
}

/**
 * F22: PVE answers the same 401 for an unknown token id, a wrong secret and an
 * expired token, so the message names the token id that was sent (the id is
 * no secret: it appears in every task's UPID) and where it was set.
 */
function rejectedTokenHint({ token }: ApiFailure): string {
  if (token === undefined)
    return "the API token was rejected; check apiToken (user@realm!tokenid=secret) or PROXMOX_VE_API_TOKEN";
  return (
    `Proxmox rejected API token ${token.id} (from ${token.source}): that token id does not exist there, ` +
    `has expired, or its secret is not this one; compare the id with Datacenter → Permissions → API Tokens ` +
    `and give ${token.source} the token as user@realm!tokenid=secret`
  );
}

/**
 * F17: a 403 names the path and the privilege when PVE says which ("Permission
 * check failed (<path>, <privilege>)"); other 403s ("Only root may use this
 * option.") say nothing more, and the hint points at the documented role.
 */
function deniedPrivilegeHint({ message, token }: ApiFailure): string {
  const who =
    token === undefined ? "the API token" : `API token ${token.id} (from ${token.source})`;
  const missing = /Permission check failed \(([^,]+), ([^)]+)\)/.exec(message);
  if (missing === null)
    return `Proxmox refused ${who}; grant its role the privileges listed in docs/proxmox.md (section 3, "Least-privilege token")`;
  return (
    `Proxmox refused ${who}: grant privilege ${missing[2]} on path ${missing[1]} to the token ` +
    `(and to its user: tokens with privilege separation get the intersection)`
  );
}

/**
 * A 401 or 403: the server said no to these credentials. Nothing after it can
 * succeed with the same token, so callers stop at once: no retry, no look
 * around for what a failed step may have left (a refused request made nothing).
 */
export function isCredentialRejected(error: unknown): boolean {
  return error instanceof PermanentError && /^40[13] /.test(error.detail);
}

function describeApiFailure(failure: ApiFailure): string {
  const params = Object.entries(failure.parameterErrors).map(
    ([name, message]) => `${name}: ${message.trim()}`,
  );
  const base = `${failure.status} ${failure.message}`;
  return redactText(params.length === 0 ? base : `${base} (${params.join("; ")})`);
}

/** A task that ended with an exitstatus other than OK (F16), with its log tail. */
export function classifyTaskFailure(
  upid: string,
  exitStatus: string,
  logTail: string[],
): EgressProxyError {
  const type = upid.split(":")[5] ?? "task";
  const tail =
    logTail.length === 0
      ? ""
      : `\n--- task log (last ${logTail.length} lines) ---\n${logTail.join("\n")}`;
  const text = redactText(`${type} task failed: ${exitStatus}${tail}`);
  const context = { operation: `task ${upid}` };
  if (/got timeout|got no worker upid/i.test(exitStatus)) return new TransientError(text, context);
  if (/shrinking disks is not supported/i.test(exitStatus))
    return new PermanentError(`${text}\nset diskGiB to at least the template's disk size`, context);
  if (MISSING_CONFIG.test(exitStatus)) return new NotFoundError(text, context);
  if (/VM is locked/i.test(exitStatus)) return new TransientError(text, context);
  return new PermanentError(text, context);
}

const TLS_TRUST_CODES = new Set([
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "CERT_HAS_EXPIRED",
  "ERR_TLS_CERT_ALTNAME_INVALID",
  "CERT_SIGNATURE_FAILURE",
]);

const NETWORK_TRANSIENT_CODES = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EPIPE",
  "EAI_AGAIN",
  "UND_ERR_CONNECT_TIMEOUT",
  "UND_ERR_HEADERS_TIMEOUT",
  "UND_ERR_BODY_TIMEOUT",
  "UND_ERR_SOCKET",
  "UND_ERR_CLOSED",
]);

/** A request that got no HTTP answer at all: TLS trust, network, or our own deadline. */
export function classifyTransportFailure(
  method: string,
  path: string,
  error: unknown,
  timeoutMs: number,
): EgressProxyError {
  const context = { operation: `${method} ${path}`, cause: error };
  const code = errorCode(error);
  const message = redactText(error instanceof Error ? error.message : String(error));
  if (code !== undefined && TLS_TRUST_CODES.has(code))
    return new PermanentError(
      `TLS: ${message} (${code}); give the host's CA certificate as caCertPem (or PROXMOX_VE_CA_CERT), or set insecure: true to skip verification`,
      context,
    );
  if (isAbort(error))
    return new TransientError(
      `no answer within ${timeoutMs} ms; the host may be down or overloaded`,
      context,
    );
  if (code !== undefined && NETWORK_TRANSIENT_CODES.has(code))
    return new TransientError(`${message} (${code})`, context);
  if (code === "ENOTFOUND")
    return new PermanentError(`${message}: check the endpoint host name`, context);
  return new TransientError(message, context);
}

function errorCode(error: unknown): string | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 4 && current !== undefined && current !== null; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") return code;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

function isAbort(error: unknown): boolean {
  const name = (error as { name?: unknown } | undefined)?.name;
  return name === "AbortError" || name === "TimeoutError";
}

/**
 * A task that ran and reported failure (as opposed to our losing sight of it):
 * Proxmox has already cleaned up after a failed clone.
 */
export function isTaskFailure(error: unknown): boolean {
  return error instanceof EgressProxyError && (error.operation ?? "").startsWith("task UPID:");
}

/** F4: the clone target VMID is taken (a crash mid-create, a parallel create, or someone else). */
export function isVmidTaken(error: unknown): boolean {
  return error instanceof EgressProxyError && /config file already exists/i.test(error.detail);
}
