/**
 * How big an image download may be, and whether the pool can hold it. Both
 * are decided before the first byte of the body moves: a multi-GiB upload
 * that fails at 90 % (pool full, or a URL that serves something else than a
 * cloud image) costs the whole download and leaves a half-written volume to
 * clean. Pure: the sizes come in, an error (or nothing) goes out.
 */
import { PermanentError } from "../common/errors";
import { redactUrl } from "../common/redact";

const MIB = 1024 * 1024;

/**
 * image.maxMiB when unset: 8 GiB. Cloud images are far smaller (Debian's and
 * Ubuntu's qcow2 are under 1 GiB, their raw images 2-4 GiB), so the cap only
 * stops a URL that serves something else, or a server that never ends.
 */
export const DEFAULT_IMAGE_MAX_MIB = 8192;

export const imageMaxBytes = (maxMiB: number | undefined): number =>
  (maxMiB ?? DEFAULT_IMAGE_MAX_MIB) * MIB;

/** Sizes in the unit a person compares them in. */
export function describeBytes(bytes: number | bigint): string {
  const value = Number(bytes);
  if (value >= 1024 * MIB) return `${(value / 1024 / MIB).toFixed(1)} GiB`;
  if (value >= MIB) return `${(value / MIB).toFixed(1)} MiB`;
  return `${value} bytes`;
}

const capFix = (maxMiB: number | undefined): string =>
  `check image.url; if the image really is that large, raise image.maxMiB (now ${maxMiB ?? DEFAULT_IMAGE_MAX_MIB}${maxMiB === undefined ? ", the default" : ""})`;

/** The server announced a body larger than the cap: refused before it is read. */
export function announcedOverCap(
  url: string,
  contentLength: number,
  maxMiB: number | undefined,
): PermanentError | undefined {
  if (contentLength <= imageMaxBytes(maxMiB)) return undefined;
  return new PermanentError(
    `image.url ${redactUrl(url)} is ${describeBytes(contentLength)} (Content-Length), more than image.maxMiB allows (${describeBytes(imageMaxBytes(maxMiB))}); ${capFix(maxMiB)}`,
  );
}

/** The body went past the cap (a server that sent no Content-Length, or more than it announced). */
export function streamedOverCap(url: string, maxMiB: number | undefined): PermanentError {
  return new PermanentError(
    `image.url ${redactUrl(url)} sent more than image.maxMiB allows (${describeBytes(imageMaxBytes(maxMiB))}); the download was stopped and nothing was kept; ${capFix(maxMiB)}`,
  );
}

export interface PoolSpace {
  /** The pool's name and host, for the message. */
  pool: string;
  host: string;
  /** What libvirt says is free in the pool (storagePoolGetInfo's `available`). */
  availableBytes: bigint;
}

/**
 * The most the download can write: its Content-Length, else the cap (a
 * body of unknown length may be anything up to it). Refused when that does
 * not fit in the pool's free space.
 */
export function poolTooSmall(
  url: string,
  contentLength: number | undefined,
  maxMiB: number | undefined,
  space: PoolSpace,
): PermanentError | undefined {
  const needed = contentLength ?? imageMaxBytes(maxMiB);
  if (BigInt(needed) <= space.availableBytes) return undefined;
  const size =
    contentLength !== undefined
      ? `is ${describeBytes(contentLength)}`
      : `sends no Content-Length, so it may be up to image.maxMiB (${describeBytes(needed)})`;
  const fixes = [
    `free space in pool ${space.pool} (virsh pool-info ${space.pool} shows it)`,
    "or set pool to one with room",
    ...(contentLength === undefined
      ? ["or set image.maxMiB to the image's size (no more than the pool holds)"]
      : []),
  ];
  return new PermanentError(
    `image.url ${redactUrl(url)} ${size}, but pool ${space.pool} on ${space.host} has ${describeBytes(space.availableBytes)} free; nothing was uploaded. Fix: ${fixes.join("; ")}`,
  );
}
