/**
 * Storage volume XML for the three kinds of volume KvmProxy creates. Sizes
 * are always bytes: a "G" suffix once meant GiB on one host and GB on another.
 */
import { XMLBuilder, XMLParser } from "fast-xml-parser";

const builder = new XMLBuilder({
  ignoreAttributes: false,
  attributeNamePrefix: "@_",
  format: true,
  suppressEmptyNode: true,
});

const bytes = (count: number | bigint) => ({ "@_unit": "bytes", "#text": String(count) });

/**
 * The base image, created at the downloaded size (or 0 when unknown); libvirt
 * reads the real virtual size on the pool refresh after the upload.
 */
export function baseImageVolumeXml(
  name: string,
  format: "qcow2" | "raw",
  sizeBytes: number,
): string {
  return builder.build({
    volume: { name, capacity: bytes(sizeBytes), target: { format: { "@_type": format } } },
  });
}

/** A raw volume for a file we upload whole: the seed ISO and the base marker. */
export function rawVolumeXml(name: string, sizeBytes: number): string {
  return builder.build({
    volume: { name, capacity: bytes(sizeBytes), target: { format: { "@_type": "raw" } } },
  });
}

/** The VM's disk: a qcow2 overlay on the shared base, so each VM stores only its own changes. */
export function overlayVolumeXml(
  name: string,
  capacityBytes: bigint,
  backing: { path: string; format: "qcow2" | "raw" },
): string {
  return builder.build({
    volume: {
      name,
      capacity: bytes(capacityBytes),
      target: { format: { "@_type": "qcow2" } },
      backingStore: { path: backing.path, format: { "@_type": backing.format } },
    },
  });
}

const parser = new XMLParser({
  ignoreAttributes: false,
  attributeNamePrefix: "@_",
  // Sizes stay text until they become BigInt: a float loses bytes past 2^53.
  parseTagValue: false,
  parseAttributeValue: false,
});

/** What create needs of an existing volume: its size and where it lives on the host. */
export interface VolumeDescription {
  capacityBytes: bigint;
  path: string;
  /** libvirt's key for the volume (for a directory pool, its path). */
  key: string;
}

/**
 * Reads `storageVolGetXmlDesc`: one call instead of GET_INFO plus GET_PATH.
 * libvirt writes sizes in bytes; a unit is honoured in case another writer
 * did not.
 */
export function parseVolumeXml(xml: string): VolumeDescription {
  const volume = (parser.parse(xml) as { volume?: Record<string, unknown> }).volume ?? {};
  const capacity = volume.capacity as { "#text"?: string; "@_unit"?: string } | string | undefined;
  const amount = typeof capacity === "string" ? capacity : capacity?.["#text"];
  const unit = typeof capacity === "object" ? (capacity["@_unit"] ?? "bytes") : "bytes";
  const path = (volume.target as { path?: unknown } | undefined)?.path;
  const unitBytes = VOLUME_UNIT_BYTES[unit];
  if (amount === undefined || !/^\d+$/.test(amount.trim()) || unitBytes === undefined)
    throw new Error(`volume XML has no capacity in a known unit: ${JSON.stringify(capacity)}`);
  if (typeof path !== "string" || path.trim() === "")
    throw new Error("volume XML has no target path");
  const key = typeof volume.key === "string" && volume.key.trim() !== "" ? volume.key.trim() : path;
  return { capacityBytes: BigInt(amount.trim()) * unitBytes, path: path.trim(), key: key.trim() };
}

const VOLUME_UNIT_BYTES: Record<string, bigint> = {
  b: 1n,
  bytes: 1n,
  KiB: 1024n,
  MiB: 1024n ** 2n,
  GiB: 1024n ** 3n,
  TiB: 1024n ** 4n,
};

export const GIB = 1024n ** 3n;

/**
 * The overlay's capacity: the requested size, which must hold the image's
 * virtual size. Returns the problem as text so the caller classifies it.
 */
export function overlayCapacity(
  diskGiB: number,
  imageVirtualBytes: bigint,
): { bytes: bigint } | { problem: string } {
  const requested = BigInt(diskGiB) * GIB;
  if (requested >= imageVirtualBytes) return { bytes: requested };
  const neededGiB = (imageVirtualBytes + GIB - 1n) / GIB;
  return {
    problem: `diskGiB ${diskGiB} is smaller than the image's virtual size (${imageVirtualBytes} bytes); set diskGiB to at least ${neededGiB}`,
  };
}
