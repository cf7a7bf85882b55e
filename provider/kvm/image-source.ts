/**
 * Streams a cloud image from its URL: no HEAD (many image servers refuse
 * it), Content-Length used when present and not required, the sha256 and
 * byte count computed on the way, progress reported. Nothing is buffered
 * whole: a 500 MiB image passes through in chunks.
 */
import { createHash } from "node:crypto";
import { Transform, type Readable, type TransformCallback } from "node:stream";
import { Agent, interceptors, request, type Dispatcher } from "undici";
import { NotFoundError, PermanentError, TransientError } from "../common/errors";
import { redactUrl } from "../common/redact";

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
  /** Time to the response headers, and the longest silence mid-body. */
  idleTimeoutMs: number;
  signal?: AbortSignal;
  onProgress?: (progress: ImageDownloadProgress) => void;
  /** Progress callbacks at most this often. */
  progressIntervalMs?: number;
}

let sharedDispatcher: Dispatcher | undefined;
function dispatcher(): Dispatcher {
  // Image mirrors redirect to CDNs; follow a few hops, never forever.
  sharedDispatcher ??= new Agent().compose(interceptors.redirect({ maxRedirections: 5 }));
  return sharedDispatcher;
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
  ) {
    super();
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
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

/** Classifies an HTTP status for an image URL: 404/410 mean the URL is wrong, 5xx/429 may pass. */
export function imageHttpError(status: number, url: string): Error {
  const where = `image.url ${redactUrl(url)} answered HTTP ${status}`;
  if (status === 404 || status === 410)
    return new NotFoundError(`${where}; check the URL (images move when a release is superseded)`);
  if (status === 429 || status >= 500)
    return new TransientError(`${where}; the server is busy or failing, try again`);
  return new PermanentError(`${where}; the image must be downloadable without credentials`);
}

export async function openImageDownload(
  url: string,
  options: ImageDownloadOptions,
): Promise<ImageDownload> {
  const controller = new AbortController();
  const onOuterAbort = () => controller.abort(options.signal?.reason);
  options.signal?.addEventListener("abort", onOuterAbort, { once: true });
  let response: Dispatcher.ResponseData;
  try {
    response = await request(url, {
      method: "GET",
      dispatcher: dispatcher(),
      headersTimeout: options.idleTimeoutMs,
      bodyTimeout: options.idleTimeoutMs,
      signal: controller.signal,
      headers: { "user-agent": "egress-proxies image fetch", accept: "*/*" },
    });
  } catch (error) {
    options.signal?.removeEventListener("abort", onOuterAbort);
    throw new TransientError(
      `downloading image.url ${redactUrl(url)} failed: ${(error as Error).message}`,
      {
        cause: error,
      },
    );
  }
  if (response.statusCode < 200 || response.statusCode >= 300) {
    // Discard the error page (bounded by the idle timeout); its content is not ours to show.
    response.body.dump().catch(() => undefined);
    options.signal?.removeEventListener("abort", onOuterAbort);
    throw imageHttpError(response.statusCode, url);
  }
  const lengthHeader = response.headers["content-length"];
  const contentLength =
    typeof lengthHeader === "string" && /^\d+$/.test(lengthHeader)
      ? Number(lengthHeader)
      : undefined;
  const counter = new HashingCounter(
    contentLength,
    options.onProgress,
    options.progressIntervalMs ?? 2000,
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
  response.body.on("error", (error) =>
    counter.destroy(
      new TransientError(`downloading image.url ${redactUrl(url)} failed: ${error.message}`, {
        cause: error,
      }),
    ),
  );
  response.body.pipe(counter);
  counter.on("close", () => options.signal?.removeEventListener("abort", onOuterAbort));
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
