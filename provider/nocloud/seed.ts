/**
 * The NoCloud seed: the files cloud-init reads from a volume labelled
 * "cidata". user-data and network-config travel byte for byte; meta-data names
 * the instance after the VM; vendor-data carries the guest-agent script and
 * any extra vendor-data the operator configured.
 */
import { createHash } from "node:crypto";
import { buildIsoImage, type IsoImage } from "../iso9660-writer";
import { assertVmName } from "../common/names";
import { GUEST_AGENT_SCRIPT, GUEST_AGENT_SCRIPT_NAME } from "./guest-agent-script";
import { buildMultipart } from "./mime";

export type Payload = Buffer | Uint8Array | string;

export interface NoCloudSeedInput {
  /** Becomes instance-id and local-hostname; must be a DNS label. */
  vmName: string;
  /** Any format cloud-init accepts (cloud-config, Jinja, MIME, gzip, script, #include, ...), kept byte for byte. */
  userData?: Payload;
  /** Extra vendor-data; any format, kept byte for byte inside the vendor-data document. */
  vendorData?: Payload;
  /** Default true: add the vendor script that installs and starts qemu-guest-agent. */
  installGuestAgent?: boolean;
  /** NoCloud network-config (v1 or v2), kept byte for byte. */
  networkConfig?: Payload;
}

export interface NoCloudSeed {
  /** The ISO, with its size known before the first byte (uploads need it). */
  image: IsoImage;
  /** sha256 of the image: equal inputs give equal seeds, so this shows when a seed must change. */
  sha256: string;
  /** What landed on the seed, by file name. */
  files: ReadonlyMap<string, Buffer>;
}

export const SEED_VOLUME_LABEL = "cidata";

const toBuffer = (payload: Payload): Buffer =>
  typeof payload === "string" ? Buffer.from(payload, "utf8") : Buffer.from(payload);

export function metaDataFor(vmName: string): Buffer {
  // vmName is a DNS label, so it needs no YAML quoting.
  return Buffer.from(`instance-id: ${vmName}\nlocal-hostname: ${vmName}\n`, "utf8");
}

/**
 * vendor-data is the agent script alone, the configured vendor-data alone, or
 * both as one MIME multipart (the only way cloud-init runs both).
 */
export function vendorDataFor(
  installGuestAgent: boolean,
  extra: Buffer | undefined,
): Buffer | undefined {
  const script = Buffer.from(GUEST_AGENT_SCRIPT, "utf8");
  if (!installGuestAgent) return extra;
  if (extra === undefined) return script;
  return buildMultipart([
    { payload: script, filename: GUEST_AGENT_SCRIPT_NAME },
    { payload: extra, filename: "vendor-data" },
  ]);
}

export function buildNoCloudSeed(input: NoCloudSeedInput): NoCloudSeed {
  const vmName = assertVmName(input.vmName, "vmName");
  const files = new Map<string, Buffer>();
  files.set("meta-data", metaDataFor(vmName));
  // NoCloud requires user-data to exist; an empty one means "nothing to do".
  files.set("user-data", input.userData === undefined ? Buffer.alloc(0) : toBuffer(input.userData));
  const vendorData = vendorDataFor(
    input.installGuestAgent ?? true,
    input.vendorData === undefined ? undefined : toBuffer(input.vendorData),
  );
  if (vendorData !== undefined) files.set("vendor-data", vendorData);
  if (input.networkConfig !== undefined) files.set("network-config", toBuffer(input.networkConfig));

  const image = buildIsoImage({
    volumeId: SEED_VOLUME_LABEL,
    files: [...files].map(([path, content]) => ({ path, content })),
  });
  // Hashed piece by piece: building the whole image in one buffer only to hash it would double the work.
  const hash = createHash("sha256");
  for (const chunk of image.chunks()) hash.update(chunk);
  return { image, sha256: hash.digest("hex"), files };
}
