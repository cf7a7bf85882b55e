/**
 * The base image cache on each host: one volume per image (named by URL +
 * digest), filled by streaming the download straight into a libvirt upload,
 * and a small marker volume written last, so "marker present" means "base
 * complete and verified".
 *
 * Rules learned on real hosts (by the Go operator this package replaces):
 * - ten proxies starting at once on one host download once (single flight
 *   per host, pool and image in this provider process);
 * - a base that has a marker is never replaced: live overlays back onto it;
 * - a base without a marker is an upload in progress (another process) while
 *   its allocation grows, and a leftover of a dead upload once it stops
 *   growing: only then is it removed and fetched again;
 * - a download that cannot fit in the pool (its Content-Length, or
 *   image.maxMiB when it has none) is refused before its volume exists.
 */
import type { Deadline } from "../common/deadline";
import { PermanentError, TransientError } from "../common/errors";
import { redactUrl } from "../common/redact";
import type { StoragePoolHandle, StorageVolHandle } from "../libvirt-rpc-xdr";
import { outcomeUnknown } from "./classify";
import type { LibvirtHost } from "./host";
import { poolTooSmall } from "./image-limits";
import { openImageDownload, type ImageDownload, type ImageDownloadProgress } from "./image-source";
import { baseImageMarkerName, baseImageVolumeName } from "./naming";
import { baseImageVolumeXml, rawVolumeXml, type VolumeDescription } from "./volume-xml";
import { Readable } from "node:stream";

export interface ImageSpec {
  url: string;
  sha256?: string;
  format: "qcow2" | "raw";
  /** The most a download may bring; DEFAULT_IMAGE_MAX_MIB when unset. */
  maxMiB?: number;
}

export interface BaseImage {
  volume: StorageVolHandle;
  name: string;
  path: string;
  format: "qcow2" | "raw";
  /** The image's virtual size as libvirt read it after the upload. */
  virtualBytes: bigint;
  /** True when this call downloaded it; false when the cache already had it. */
  downloaded: boolean;
}

export interface EnsureBaseImageOptions {
  host: LibvirtHost;
  /** Identifies the host for single flight, e.g. "kvm1.lan:22". */
  hostKey: string;
  /**
   * The host with a budget of its own for removing a half-filled base after a
   * failure (the operation's deadline may be what ran out, the link may have
   * died). Defaults to `host`.
   */
  cleanupHost?: () => LibvirtHost;
  pool: StoragePoolHandle;
  image: ImageSpec;
  deadline: Deadline;
  log: (message: string) => void;
  /** How long an unmarked base must stop growing before it counts as a dead upload. */
  staleAfterMs?: number;
  downloadIdleTimeoutMs?: number;
}

const inFlight = new Map<string, Promise<BaseImage>>();

export async function ensureBaseImage(options: EnsureBaseImageOptions): Promise<BaseImage> {
  const name = baseImageVolumeName(options.image);
  const key = `${options.hostKey}|${options.pool.name}|${name}`;
  let pending = inFlight.get(key);
  if (pending === undefined) {
    pending = fillCache(options, name).finally(() => inFlight.delete(key));
    inFlight.set(key, pending);
    return pending;
  }
  // Another create on this host is fetching the same image: wait for it, then report it as cached.
  return { ...(await pending), downloaded: false };
}

async function fillCache(options: EnsureBaseImageOptions, name: string): Promise<BaseImage> {
  const { host, pool } = options;
  const marker = baseImageMarkerName(name);
  for (;;) {
    options.deadline.check(`preparing base image ${name} on ${host.label}`);
    const [markerVolume, base] = await Promise.all([
      host.findVolume(pool, marker),
      host.describeVolumeNamed(pool, name),
    ]);
    if (markerVolume && base) return describeBase(options, base, name, false);
    if (base === undefined) break;
    const baseVolume = base.volume;
    // A base without its marker: someone is uploading, or an upload died.
    if (await stillGrowing(options, baseVolume)) {
      options.log(`base image ${name} is being uploaded by another process; waiting`);
      continue;
    }
    options.log(`removing incomplete base image ${name} left by an interrupted upload`);
    await host.deleteVolume(baseVolume);
    if (markerVolume) await host.deleteVolume(markerVolume);
    break;
  }
  const volume = await downloadInto(options, name);
  let digest: string;
  try {
    await host.refreshPool(pool);
    digest = await writeMarker(options, marker, volume.sha256);
  } catch (error) {
    // Without its marker the base counts as an interrupted upload (the pool may have filled just
    // after the image's last byte): removed now, not left for the next create to find stale.
    const cleanup = options.cleanupHost?.() ?? host;
    await cleanup.deleteVolume(volume.handle).catch(() => undefined);
    await cleanup.deleteVolumeNamed(pool, marker).catch(() => undefined);
    throw error;
  }
  options.log(`base image ${name} cached (sha256 ${digest})`);
  const description = await host.volumeDescription(volume.handle);
  return describeBase(options, { volume: volume.handle, description }, name, true);
}

async function stillGrowing(
  options: EnsureBaseImageOptions,
  volume: StorageVolHandle,
): Promise<boolean> {
  const before = await options.host.volumeInfo(volume);
  await new Promise((resolve) =>
    setTimeout(resolve, Math.min(options.staleAfterMs ?? 10_000, options.deadline.remainingMs())),
  );
  const markerNow = await options.host.findVolume(options.pool, baseImageMarkerName(volume.name));
  if (markerNow) return true; // finished meanwhile: the loop will find both
  const after = await options.host
    .findVolume(options.pool, volume.name)
    .then((v) => (v ? options.host.volumeInfo(v) : undefined));
  return after !== undefined && after.allocation !== before.allocation;
}

async function downloadInto(
  options: EnsureBaseImageOptions,
  name: string,
): Promise<{ handle: StorageVolHandle; sha256: string }> {
  const { host, pool, image } = options;
  const shownUrl = redactUrl(image.url);
  options.log(`downloading ${shownUrl} into ${pool.name}/${name} on ${host.label}`);
  let lastLogged = 0;
  // Opened before any volume exists: a refused redirect or an error answer leaves nothing to clean.
  const download = await openImageDownload(image.url, {
    idleTimeoutMs: options.downloadIdleTimeoutMs ?? 60_000,
    maxMiB: image.maxMiB,
    onProgress: (progress) => {
      if (Date.now() - lastLogged < 5000 && progress.bytes !== progress.totalBytes) return;
      lastLogged = Date.now();
      options.log(describeProgress(name, progress));
    },
  });
  try {
    await requireRoomFor(options, download);
  } catch (error) {
    download.abort(error instanceof Error ? error : new Error(String(error)));
    throw error;
  }
  let handle: StorageVolHandle | undefined;
  try {
    handle = await host.createVolume(
      pool,
      name,
      baseImageVolumeXml(name, image.format, download.contentLength ?? 0),
    );
    await host.upload(handle, download.body);
    const { sha256, bytes } = await download.digest();
    if (image.sha256 !== undefined && sha256 !== image.sha256)
      throw new PermanentError(
        `image.sha256 does not match what ${shownUrl} served (${bytes} bytes, sha256 ${sha256}); check the digest or the URL`,
      );
    return { handle, sha256 };
  } catch (error) {
    download.abort(error instanceof Error ? error : new Error(String(error)));
    // Never leave a half-filled base behind: the next attempt would have to wait for it to go stale.
    // A create whose answer was lost may have made the volume too; a create the daemon refused
    // (another process made it first) must not remove theirs.
    const cleanup = options.cleanupHost?.() ?? host;
    if (handle !== undefined) await cleanup.deleteVolume(handle).catch(() => undefined);
    else if (outcomeUnknown(error))
      await cleanup.deleteVolumeNamed(pool, name).catch(() => undefined);
    throw error;
  }
}

/**
 * Refuses a download the pool cannot hold, while only its headers have
 * arrived. libvirt's figure is from its last look at the pool; when it says
 * "too small", the pool is looked at again before refusing, so space freed
 * since (outside libvirt) is not held against the download. A figure that is
 * too generous is caught by the upload itself (the pool fills: nothing kept).
 */
async function requireRoomFor(
  options: EnsureBaseImageOptions,
  download: ImageDownload,
): Promise<void> {
  const { host, pool, image } = options;
  const refusal = async () => {
    const space = await host.poolSpace(pool);
    // A pool type that reports no size at all (capacity 0) cannot be judged: the upload will tell.
    if (space.capacity === 0n) return undefined;
    return poolTooSmall(image.url, download.contentLength, image.maxMiB, {
      pool: pool.name,
      host: host.label,
      availableBytes: space.available,
    });
  };
  if ((await refusal()) === undefined) return;
  // One try: a pool busy with another upload is not worth waiting for to say no.
  await host.refreshPool(pool, { once: true }).catch(() => undefined);
  const error = await refusal();
  if (error !== undefined) throw error;
}

async function writeMarker(
  options: EnsureBaseImageOptions,
  marker: string,
  sha256: string,
): Promise<string> {
  const content = Buffer.from(`sha256=${sha256}\nurl=${redactUrl(options.image.url)}\n`, "utf8");
  const existing = await options.host.findVolume(options.pool, marker);
  if (existing) await options.host.deleteVolume(existing);
  const handle = await options.host.createVolume(
    options.pool,
    marker,
    rawVolumeXml(marker, content.length),
  );
  await options.host.upload(handle, Readable.from([content]), content.length);
  return sha256;
}

function describeBase(
  options: EnsureBaseImageOptions,
  { volume, description }: { volume: StorageVolHandle; description: VolumeDescription },
  name: string,
  downloaded: boolean,
): BaseImage {
  if (description.capacityBytes === 0n)
    throw new TransientError(
      `base image ${name} on ${options.host.label} reports no size yet; the pool refresh has not finished`,
    );
  return {
    volume,
    name,
    path: description.path,
    format: options.image.format,
    virtualBytes: description.capacityBytes,
    downloaded,
  };
}

function describeProgress(name: string, progress: ImageDownloadProgress): string {
  const mib = (bytes: number) => (bytes / 1024 / 1024).toFixed(1);
  const total = progress.totalBytes !== undefined ? ` of ${mib(progress.totalBytes)} MiB` : "";
  return `${name}: ${mib(progress.bytes)} MiB${total} at ${mib(progress.bytesPerSecond)} MiB/s`;
}
