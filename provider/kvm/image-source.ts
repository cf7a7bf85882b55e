/**
 * Streams a cloud image from its URL: no HEAD (many image servers refuse
 * it), Content-Length used when present and not required, the sha256 and
 * byte count computed on the way, progress reported, image.maxMiB enforced
 * (on the announced length, and on the bytes as they come). Nothing is buffered
 * whole: a 500 MiB image passes through in chunks. Redirects are followed
 * here, hop by hop, under the policy in image-source-policy.ts; the
 * connections go only to addresses that policy checked (pinned-agent.ts).
 */
import { createHash } from "node:crypto";
import { Transform, type Readable, type TransformCallback } from "node:stream";
import { request, type Dispatcher } from "undici";
import { EgressProxyError, TransientError } from "../common/errors";
import { redactUrl, safeErrorMessage } from "../common/redact";
import { classifyImageFetchError, classifyImageHttpStatus } from "./classify";
import { announcedOverCap, imageMaxBytes, streamedOverCap } from "./image-limits";
import { redirectTarget, systemLookup, vetHost, type HostLookup } from "./image-source-policy";
import { createPinnedAgent, type PinnedAgent } from "./pinned-agent";

export interface ImageDownloadProgress {
  bytes: number;
  totalBytes: number | undefined;
  bytesPerSecond: number;
}

export interface ImageDownload {
  /** The body, hashed as it flows; read it exactly once. */
  body: Readable;
  /** From Content-Length, when the server sent one. */
  contentLength: number | undefined;
  /** Resolves once the body has been read to the end. */
  digest(): Promise<{ sha256: string; bytes: number }>;
  /** Stops the download and releases the connection. */
  abort(reason?: Error): void;
}

export interface ImageDownloadOptions {
  /**
   * Time to the final response headers (name lookups and every redirect
   * included), and the longest silence mid-body.
   */
  idleTimeoutMs: number;
  signal?: AbortSignal;
  onProgress?: (progress: ImageDownloadProgress) => void;
  /** Progress callbacks at most this often. */
  progressIntervalMs?: number;
  /** How host names become addresses; the system resolver unless a test injects one. */
  lookup?: HostLookup;
  /** image.maxMiB: the most this download may bring; default DEFAULT_IMAGE_MAX_MIB. */
  maxMiB?: number;
}

class HashingCounter extends Transform {
  readonly hash = createHash("sha256");
  bytes = 0;
  private readonly startedAt = Date.now();
  private lastReportAt = 0;

  constructor(
    private readonly totalBytes: number | undefined,
    private readonly onProgress: ImageDownloadOptions["onProgress"],
    private readonly intervalMs: number,
    private readonly maxBytes: number,
    private readonly overCap: () => Error,
  ) {
    super();
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    // Not one byte past the cap goes on to the volume.
    if (this.bytes + chunk.length > this.maxBytes) return callback(this.overCap());
    this.hash.update(chunk);
    this.bytes += chunk.length;
    this.report(false);
    callback(null, chunk);
  }

  override _flush(callback: TransformCallback): void {
    this.report(true);
    callback();
  }

  private report(final: boolean): void {
    const now = Date.now();
    if (!this.onProgress || (!final && now - this.lastReportAt < this.intervalMs)) return;
    this.lastReportAt = now;
    const seconds = Math.max((now - this.startedAt) / 1000, 0.001);
    this.onProgress({
      bytes: this.bytes,
      totalBytes: this.totalBytes,
      bytesPerSecond: this.bytes / seconds,
    });
  }
}

/** Redirect statuses that are followed (under the policy); any other 3xx is an answer. */
const REDIRECT_STATUSES: ReadonlySet<number> = new Set([301, 302, 303, 307, 308]);

export async function openImageDownload(
  url: string,
  options: ImageDownloadOptions,
): Promise<ImageDownload> {
  const controller = new AbortController();
  const onOuterAbort = () => controller.abort(options.signal?.reason);
  options.signal?.addEventListener("abort", onOuterAbort, { once: true });
  const agent = createPinnedAgent(options.idleTimeoutMs);
  const release = () => {
    options.signal?.removeEventListener("abort", onOuterAbort);
    agent.dispatcher.destroy().catch(() => undefined);
  };
  let response: Dispatcher.ResponseData;
  let finalUrl: URL;
  try {
    ({ response, url: finalUrl } = await fetchFollowingRedirects(url, options, agent, controller));
  } catch (error) {
    release();
    throw failureOf(error, url, options.signal);
  }
  if (response.statusCode < 200 || response.statusCode >= 300) {
    // The error page is not ours to show; closing this download's agent discards it.
    release();
    throw classifyImageHttpStatus(
      response.statusCode,
      url,
      finalUrl.href === new URL(url).href ? undefined : finalUrl,
    );
  }
  const lengthHeader = response.headers["content-length"];
  const contentLength =
    typeof lengthHeader === "string" && /^\d+$/.test(lengthHeader)
      ? Number(lengthHeader)
      : undefined;
  const tooLarge =
    contentLength === undefined ? undefined : announcedOverCap(url, contentLength, options.maxMiB);
  if (tooLarge !== undefined) {
    release();
    throw tooLarge;
  }
  const counter = new HashingCounter(
    contentLength,
    options.onProgress,
    options.progressIntervalMs ?? 2000,
    imageMaxBytes(options.maxMiB),
    () => streamedOverCap(url, options.maxMiB),
  );
  const finished = new Promise<{ sha256: string; bytes: number }>((resolve, reject) => {
    counter.on("end", () => {
      if (contentLength !== undefined && counter.bytes !== contentLength)
        reject(
          new TransientError(
            `image.url ${redactUrl(url)} ended after ${counter.bytes} of ${contentLength} bytes`,
          ),
        );
      else resolve({ sha256: counter.hash.digest("hex"), bytes: counter.bytes });
    });
    counter.on("error", reject);
  });
  // Nobody may be waiting on digest() when the stream fails; the consumer sees the error on the body.
  finished.catch(() => undefined);
  response.body.on("error", (error) => counter.destroy(failureOf(error, url, options.signal)));
  response.body.pipe(counter);
  counter.on("close", release);
  return {
    body: counter,
    contentLength,
    digest: () => finished,
    abort: (reason) => {
      controller.abort(reason);
      counter.destroy(reason);
    },
  };
}

/**
 * GETs `url`, following redirects one by one under the policy in
 * image-source-policy.ts. Every hop is checked (scheme, count, address)
 * before its connection exists. One budget covers the whole chain up to the
 * final response headers, DNS included: a server that redirects five times
 * gets no more time than one that answers at once.
 */
async function fetchFollowingRedirects(
  url: string,
  options: ImageDownloadOptions,
  agent: PinnedAgent,
  controller: AbortController,
): Promise<{ response: Dispatcher.ResponseData; url: URL }> {
  const original = new URL(url);
  const budgetMs = options.idleTimeoutMs;
  const endsAt = Date.now() + budgetMs;
  const timer = setTimeout(
    () =>
      controller.abort(
        new TransientError(
          `image.url ${redactUrl(url)} did not answer within ${budgetMs} ms (name lookups, redirects and response headers together)`,
        ),
      ),
    budgetMs,
  );
  const context = { original, lookup: options.lookup ?? systemLookup, signal: controller.signal };
  try {
    let current = original;
    // image.url is the user's choice: whatever kind of address it reaches, its redirects may reach too.
    const first = await vetHost(current, "any", context);
    const allowed = first.kinds;
    agent.pin(first);
    let redirects = 0;
    for (;;) {
      const response = await request(current, {
        method: "GET",
        dispatcher: agent.dispatcher,
        headersTimeout: Math.max(1, endsAt - Date.now()),
        bodyTimeout: options.idleTimeoutMs,
        signal: controller.signal,
        headers: { "user-agent": "egress-proxies image fetch", accept: "*/*" },
      });
      if (!REDIRECT_STATUSES.has(response.statusCode)) return { response, url: current };
      response.body.dump().catch(() => undefined);
      redirects += 1;
      const next = redirectTarget(original, current, response.headers.location, redirects);
      agent.pin(await vetHost(next, allowed, context));
      current = next;
    }
  } finally {
    clearTimeout(timer);
  }
}

/** A failure as the caller sees it: classified, and a cancel by the caller said as such. */
function failureOf(error: unknown, url: string, signal: AbortSignal | undefined): Error {
  if (signal?.aborted && !(error instanceof EgressProxyError))
    return new TransientError(
      `downloading image.url ${redactUrl(url)} was stopped: ${safeErrorMessage(signal.reason)}`,
      { cause: error },
    );
  return classifyImageFetchError(error, url);
}
