// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import { createHash } from "node:crypto";
import { Agent, fetch } from "undici";
import { Deadline } from "../common/deadline";
import { PermanentError, TransientError } from "../common/errors";
import { redactUrl, SecretValue } from "../common/redact";
import { Turns } from "../common/turns";
import { classifyApiFailure, classifyTransportFailure } from "./classify";
import { forgetNodeListings } from "./node-listings";

/** Where and how to reach one Proxmox VE API. */
export interface ProxmoxConnection {
  /** e.g. https://pve.example:8006 (a trailing /api2/json is accepted). */
  endpoint: string;
  /** `user@realm!tokenid=secret`; the `PVEAPIToken=` prefix is optional. */
  apiToken: SecretValue<string>;
  /** Where the token was set, for messages (e.g. "apiToken", "PROXMOX_VE_API_TOKEN"). Default "apiToken". */
  apiTokenSource?: string;
  /** PEM of the CA that signed the host's certificate (PVE's own CA by default). */
  caCertPem?: string;
  /** Skip TLS verification. Explicit opt-out, never a fallback. */
  insecure?: boolean;
}

export type QueryValue = string | number | boolean | undefined;
/** A list is sent as the key repeated, which PVE reads as an array parameter (agent/exec's `command`). */
export type FormFields = Record<string, string | number | boolean | readonly string[] | undefined>;

export interface RequestOptions {
  /** Per-request deadline in ms; every request has one. */
  timeoutMs?: number;
}

/** The fixed part of a multipart upload: ordinary fields first, then one file part. */
export interface UploadRequest {
  fields: Array<[string, string]>;
  fileField: string;
  fileName: string;
  content: Buffer;
}

const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;

/**
 * The Proxmox VE REST API over HTTP/1.1 (docs/proxmox.md section 9, fact F18) with token auth. Errors come out
 * classified (classify.ts) and free of the token. One undici pool per
 * endpoint+trust setting lives for the provider process; the token is per client.
 */
export class ProxmoxClient {
  readonly endpoint: string;
  /** How many HTTP requests this client sent: the benchmark reads it. */
  requestCount = 0;
  /**
   * Who asks, for listings shared between clients (node-listings.ts): the
   * endpoint and the token id (what PVE filters an index by), never the secret.
   */
  readonly listingScope: string;
  private readonly pool: EndpointPool;
  private readonly authorization: SecretValue<string>;
  /** The token's id and where it was set: a 401 names them (never the secret). */
  private readonly token: { id: string; source: string };

  constructor(
    connection: ProxmoxConnection,
    private readonly defaultTimeoutMs: number = DEFAULT_REQUEST_TIMEOUT_MS,
  ) {
    this.endpoint = normalizeEndpoint(connection.endpoint);
    const source = connection.apiTokenSource ?? "apiToken";
    const token = parseApiToken(connection.apiToken.reveal(), source);
    this.authorization = new SecretValue(token.header);
    this.token = { id: token.id, source };
    this.listingScope = `${this.endpoint}|${token.id}`;
    this.pool = poolFor(this.endpoint, connection.caCertPem, connection.insecure === true);
  }

  get<T>(
    path: string,
    query: Record<string, QueryValue> = {},
    options?: RequestOptions,
  ): Promise<T> {
    return this.request<T>("GET", withQuery(path, query), undefined, options);
  }

  post<T>(path: string, form: FormFields = {}, options?: RequestOptions): Promise<T> {
    return this.request<T>("POST", path, formBody(form), options);
  }

  put<T>(path: string, form: FormFields = {}, options?: RequestOptions): Promise<T> {
    return this.request<T>("PUT", path, formBody(form), options);
  }

  delete<T>(
    path: string,
    query: Record<string, QueryValue> = {},
    options?: RequestOptions,
  ): Promise<T> {
    return this.request<T>("DELETE", withQuery(path, query), undefined, options);
  }

  /**
   * Multipart upload with an exact Content-Length: pveproxy stages the body
   * to disk (F23) and refuses a chunked one. Field order matters (F12): the
   * `content` field must precede the file part.
   */
  upload<T>(path: string, upload: UploadRequest, options?: RequestOptions): Promise<T> {
    const boundary = `----egress-proxies-${createHash("sha256").update(upload.content).digest("hex").slice(0, 24)}`;
    const chunks: Buffer[] = [];
    for (const [name, value] of upload.fields) {
      chunks.push(
        Buffer.from(
          `--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`,
        ),
      );
    }
    chunks.push(
      Buffer.from(
        `--${boundary}\r\nContent-Disposition: form-data; name="${upload.fileField}"; filename="${upload.fileName}"\r\n` +
          `Content-Type: application/octet-stream\r\n\r\n`,
      ),
      upload.content,
      Buffer.from(`\r\n--${boundary}--\r\n`),
    );
    const body = Buffer.concat(chunks);
    return this.request<T>(
      "POST",
      path,
      { body, contentType: `multipart/form-data; boundary=${boundary}` },
      options,
    );
  }

  private async request<T>(
    method: string,
    path: string,
    payload: { body: Buffer; contentType: string } | undefined,
    options: RequestOptions = {},
  ): Promise<T> {
    const timeoutMs = options.timeoutMs ?? this.defaultTimeoutMs;
    const headers: Record<string, string> = {
      authorization: this.authorization.reveal(),
      accept: "application/json",
    };
    if (payload !== undefined) {
      headers["content-type"] = payload.contentType;
      headers["content-length"] = String(payload.body.length);
    }
    this.requestCount++;
    let status: number;
    let reasonPhrase: string;
    let text: string;
    // Any request but a read may change the node (even one that failed midway):
    // the listings asked of it before are not handed out after the answer.
    const changes = method !== "GET";
    // The request's own timeout starts once it has a connection: a queue of our own making (a
    // refresh's Reads all at once) must not spend it, or a guest agent's short attempt would time out
    // unsent and be taken for an agent that does not answer.
    const queuePatience = new Deadline(
      Math.max(timeoutMs, DEFAULT_REQUEST_TIMEOUT_MS) + timeoutMs,
      "the API's connections",
    );
    try {
      ({ status, reasonPhrase, text } = await this.pool.turns.run(
        this.endpoint,
        queuePatience,
        timeoutMs,
        `${method} ${path}`,
        async () => {
          const response = await fetch(`${this.endpoint}/api2/json${path}`, {
            method,
            headers,
            body: payload?.body,
            signal: AbortSignal.timeout(timeoutMs),
            dispatcher: this.pool.agent,
          });
          return {
            status: response.status,
            reasonPhrase: response.statusText,
            text: await response.text(),
          };
        },
      ));
    } catch (error) {
      if (error instanceof TransientError) throw error; // no turn came: nothing was sent
      throw classifyTransportFailure(method, path, error, timeoutMs);
    } finally {
      if (changes) forgetNodeListings(nodeOfPath(path));
    }
    const parsed = parseJson(text);
    if (status >= 200 && status < 300) return (parsed?.data ?? null) as T;
    throw classifyApiFailure({
      method,
      path,
      status,
      message: errorMessage(parsed, status, reasonPhrase),
      parameterErrors: parameterErrors(parsed),
      token: this.token,
    });
  }
}

/**
 * At most this many connections to one API endpoint (each a TLS handshake
 * the host pays for). HTTP/1.1 only (F18): one request per connection at a
 * time, so this is also how many requests run at once; the rest queue in the
 * pool, inside their deadlines. More would not be answered sooner: pveproxy
 * hands the calls that need root (`protected` in qemu-server, as the VM index
 * and status/current are) to pvedaemon, which runs 3 workers (`max_workers =>
 * 3` in pve-manager's PVE/Service/pvedaemon.pm). A refresh's Reads keep at most two requests in
 * flight each; a create keeps two (the seed upload beside the clone's task
 * polls). Before issue 32 the bound was 64 and a refresh of 1000 members
 * opened 5–6 connections per host at `--parallel` 8, 150 unbounded.
 * Requests take turns for them here, not in undici's queue, so a request's
 * timeout counts from when it is sent (a turn waits at most 30 s, or the
 * request's own timeout when that is longer).
 */
const CONNECTIONS_PER_ENDPOINT = 4;

interface EndpointPool {
  agent: Agent;
  turns: Turns;
}

/** Pools outlive a single create; keyed by what changes the TLS handshake, never by the token. */
const pools = new Map<string, EndpointPool>();

function poolFor(endpoint: string, caCertPem: string | undefined, insecure: boolean): EndpointPool {
  const key = `${endpoint}|${insecure}|${caCertPem === undefined ? "" : createHash("sha256").update(caCertPem).digest("hex")}`;
  let pool = pools.get(key);
  if (pool === undefined) {
    const agent = new Agent({
      connections: CONNECTIONS_PER_ENDPOINT,
      pipelining: 1,
      allowH2: false,
      connect: {
        timeout: 10_000,
        ...(insecure
          ? { rejectUnauthorized: false }
          : caCertPem === undefined
            ? {}
            : { ca: caCertPem }),
      },
    });
    pool = {
      agent,
      turns: new Turns({ total: CONNECTIONS_PER_ENDPOINT, perKey: CONNECTIONS_PER_ENDPOINT }),
    };
    pools.set(key, pool);
  }
  return pool;
}

/** Closes every pooled connection (tests, benchmarks, the end of a CLI run). */
export async function closeAllProxmoxPools(): Promise<void> {
  const all = [...pools.values()];
  pools.clear();
  await Promise.all(all.map((pool) => pool.agent.close().catch(() => undefined)));
}

function normalizeEndpoint(endpoint: string): string {
  let url: URL;
  try {
    url = new URL(endpoint);
  } catch {
    throw new PermanentError(
      `endpoint ${JSON.stringify(redactUrl(endpoint))} is not a URL; use https://<host>:8006`,
    );
  }
  if (url.username !== "" || url.password !== "")
    throw new PermanentError(
      `endpoint ${redactUrl(endpoint)} carries credentials; remove them and pass the API token as apiToken`,
    );
  if (url.protocol !== "https:")
    throw new PermanentError(
      `endpoint ${url.origin} must use https (Proxmox serves the API over TLS only)`,
    );
  return url.origin;
}

/** Token text → the Authorization header, and the token id (everything before the secret). */
function parseApiToken(token: string, source: string): { header: string; id: string } {
  const value = token.trim().replace(/^PVEAPIToken=/i, "");
  const match = /^([^@\s]+@[^!\s]+![^=\s]+)=\S+$/.exec(value);
  if (match === null)
    throw new PermanentError(
      `${source} must look like user@realm!tokenid=secret (the token id and its secret from Datacenter → Permissions → API Tokens)`,
    );
  return { header: `PVEAPIToken=${value}`, id: match[1]! };
}

function withQuery(path: string, query: Record<string, QueryValue>): string {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined)
      params.append(key, typeof value === "boolean" ? (value ? "1" : "0") : String(value));
  }
  const text = params.toString();
  return text === "" ? path : `${path}?${text}`;
}

function formBody(form: FormFields): { body: Buffer; contentType: string } {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(form)) {
    if (Array.isArray(value))
      for (const item of value as readonly string[]) params.append(key, item);
    else if (value !== undefined)
      params.append(key, typeof value === "boolean" ? (value ? "1" : "0") : String(value));
  }
  return { body: Buffer.from(params.toString()), contentType: "application/x-www-form-urlencoded" };
}

interface PveBody {
  data?: unknown;
  message?: unknown;
  errors?: unknown;
}

function parseJson(text: string): PveBody | undefined {
  if (text.trim() === "") return undefined;
  try {
    const value = JSON.parse(text) as unknown;
    return typeof value === "object" && value !== null ? (value as PveBody) : undefined;
  } catch {
    return undefined;
  }
}

/** F1: the trimmed body message, else the reason phrase (PVE puts the error text there too). */
function errorMessage(body: PveBody | undefined, status: number, reasonPhrase: string): string {
  if (typeof body?.message === "string" && body.message.trim() !== "") return body.message.trim();
  if (reasonPhrase.trim() !== "") return reasonPhrase.trim();
  return `HTTP ${status}`;
}

function parameterErrors(body: PveBody | undefined): Record<string, string> {
  const errors = body?.errors;
  if (typeof errors !== "object" || errors === null) return {};
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(errors)) out[key] = String(value);
  return out;
}

/** The node a request path addresses (`/nodes/{node}/…`), or undefined for a cluster-wide path. */
function nodeOfPath(path: string): string | undefined {
  const match = /^\/nodes\/([^/?]+)/.exec(path);
  return match === null ? undefined : decodeURIComponent(match[1]!);
}

/** Path segment encoding; UPIDs contain ':' and '@' and '!' and must be encoded (docs/proxmox.md, section 9). */
export const segment = (value: string | number): string => encodeURIComponent(String(value));
