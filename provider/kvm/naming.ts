/**
 * Every name KvmProxy puts on a host, decided in one place: per-VM volumes,
 * the content-addressed base image and its marker, the MAC address and the
 * Pulumi id.
 */
import { createHash } from "node:crypto";
import { base32 } from "../common/names";
import { PermanentError } from "../common/errors";
import { bracketedHost, hostAndPort } from "../ssh/address";

// FROZEN: volume names, the base-image prefix and the resource id form are in existing
// state and on existing hosts (delete and the reaper find volumes by these names).
export const overlayVolumeName = (vmName: string): string => `${vmName}.qcow2`;
export const seedVolumeName = (vmName: string): string => `${vmName}-seed.iso`;

/** Per-VM volume names back to the VM name (the reaper's orphan search). */
export function vmNameOfVolume(
  volumeName: string,
): { vmName: string; kind: "overlay" | "seed" } | undefined {
  if (volumeName.startsWith(BASE_IMAGE_PREFIX)) return undefined;
  const seed = /^([a-z0-9][a-z0-9-]{0,62})-seed\.iso$/.exec(volumeName);
  if (seed) return { vmName: seed[1], kind: "seed" };
  const overlay = /^([a-z0-9][a-z0-9-]{0,62})\.qcow2$/.exec(volumeName);
  if (overlay) return { vmName: overlay[1], kind: "overlay" };
  return undefined;
}

export const BASE_IMAGE_PREFIX = "egress-base-";

/**
 * The base image volume is named after what the image *is* (URL + expected
 * digest), never after a friendly name: two stacks naming different images
 * "debian" must not share a base, and a changed digest is a different image.
 */
export function baseImageVolumeName(image: {
  url: string;
  sha256?: string;
  format: "qcow2" | "raw";
}): string {
  const key = createHash("sha256")
    .update(`${image.url}\n${image.sha256 ?? ""}`)
    .digest();
  return `${BASE_IMAGE_PREFIX}${base32(key).slice(0, 20)}.${image.format}`;
}

/** Written after the upload is verified: "marker present" means "base complete". */
export const baseImageMarkerName = (baseVolumeName: string): string => `${baseVolumeName}.ready`;

/** A locally administered, deterministic MAC in QEMU's 52:54:00 range: a retried define gets the same NIC. */
export function macAddressFor(vmName: string): string {
  const digest = createHash("sha256").update(`mac:${vmName}`).digest();
  return ["52", "54", "00", ...[0, 1, 2].map((i) => digest[i].toString(16).padStart(2, "0"))].join(
    ":",
  );
}

/**
 * How the host appears in ids and outputs: `host` or `host:port`, an IPv6
 * literal in brackets (`[2001:db8::10]`, `[2001:db8::10]:2222`) so the port
 * cannot be read as part of it; `local` for the local socket.
 */
export function hostLabel(connection: { host: string; port: number } | undefined): string {
  if (connection === undefined) return "local";
  return connection.port === 22
    ? bracketedHost(connection.host)
    : hostAndPort(connection.host, connection.port);
}

/**
 * The label earlier releases wrote: the host exactly as configured, an
 * IPv6 literal bare (`2001:db8::10:2222` for port 2222). Ids in existing state
 * may carry it; read accepts it for the same host and keeps such an id as it is.
 */
export function legacyHostLabel(connection: { host: string; port: number } | undefined): string {
  if (connection === undefined) return "local";
  return connection.port === 22 ? connection.host : `${connection.host}:${connection.port}`;
}

export const kvmResourceId = (host: string, vmName: string): string =>
  `hosts/${host}/domains/${vmName}`;

export function parseKvmResourceId(id: string): { host: string; vmName: string } {
  const match = /^hosts\/([^/]+)\/domains\/([a-z0-9][a-z0-9-]{0,62})$/.exec(id);
  if (!match)
    throw new PermanentError(
      `id ${JSON.stringify(id)} is not a KvmProxy id; it looks like "hosts/<host>/domains/<vm name>"`,
    );
  return { host: match[1], vmName: match[2] };
}
