/**
 * Storage volume XML for the three kinds of volume KvmProxy creates. Sizes
 * are always bytes: a "G" suffix once meant GiB on one host and GB on another.
 */
import { XMLBuilder } from "fast-xml-parser";

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
