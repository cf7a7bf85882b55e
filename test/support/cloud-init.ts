/** Runs cloud-init's own NoCloud and user-data code (Debian's cloud-init package) over a seed. */
import { join } from "node:path";
import { buildNoCloudSeed, type NoCloudSeedInput } from "../../provider/nocloud";
import { extractWith, run, scratchDir, writeImage } from "./iso-tools";

export interface CloudInitPart {
  type: string;
  filename: string | null;
  payload: Buffer;
  /** The payload as cloud-init's part handlers are given it (scripts are written from this). */
  handed: Buffer;
  sniffed: string | null;
}

export interface CloudInitView {
  files: Map<string, Buffer>;
  metaData: Record<string, unknown>;
  userDataParts: CloudInitPart[] | { error: string };
  vendorDataParts: CloudInitPart[] | { error: string } | null;
}

// Debian installs cloud-init for /usr/bin/python3; another python3 may come first on PATH.
const DEBIAN_PYTHON = "/usr/bin/python3";
const PROBE = join(__dirname, "../../../test/support/cloudinit_probe.py");

interface RawPart {
  type: string;
  filename: string | null;
  payload: string | null;
  handed: string | null;
  sniffed: string | null;
  error?: string;
}

function decodeParts(raw: RawPart[] | null): CloudInitPart[] | { error: string } | null {
  if (raw === null) return null;
  if (raw.length === 1 && raw[0].error !== undefined) return { error: raw[0].error };
  return raw.map((part) => ({
    type: part.type,
    filename: part.filename,
    payload: Buffer.from(part.payload ?? "", "base64"),
    handed: Buffer.from(part.handed ?? "", "base64"),
    sniffed: part.sniffed,
  }));
}

/** Builds the seed, extracts it with a Rock-Ridge-first reader (as Linux mounts it) and lets cloud-init read it. */
export function readSeedWithCloudInit(input: NoCloudSeedInput): CloudInitView {
  const scratch = scratchDir("seed");
  try {
    const iso = writeImage(scratch.dir, buildNoCloudSeed(input).image.toBuffer());
    const dir = join(scratch.dir, "mnt");
    run("mkdir", [dir]);
    extractWith("xorriso", iso, dir);
    const out = JSON.parse(run(DEBIAN_PYTHON, [PROBE, dir]).toString("utf8"));
    return {
      files: new Map(
        Object.entries(out.files as Record<string, string>).map(([k, v]) => [
          k,
          Buffer.from(v, "base64"),
        ]),
      ),
      metaData: out.metaData,
      userDataParts: decodeParts(out.userDataParts)!,
      vendorDataParts: decodeParts(out.vendorDataParts),
    };
  } finally {
    scratch.remove();
  }
}

const NETWORK_RENDERER = join(__dirname, "../../../test/support/cloudinit_network.py");

export interface RenderedNetwork {
  /** /etc/network/interfaces.d/50-cloud-init as cloud-init's ENI renderer (Debian 12's) writes it. */
  interfaces: string;
  /** The udev rule that names the NIC by MAC, or null. */
  udevRules: string | null;
  state: Array<{ name: string; mac_address: string | null; subnets: Record<string, unknown>[] }>;
}

/** Parses a network-config with cloud-init's network_state and renders it with its ENI renderer. */
export function renderNetworkWithCloudInit(networkConfig: string): RenderedNetwork {
  const scratch = scratchDir("network");
  try {
    const source = join(scratch.dir, "network-config");
    run("sh", ["-c", 'cat > "$1"', "sh", source], { input: Buffer.from(networkConfig, "utf8") });
    const out = join(scratch.dir, "root");
    run("mkdir", [out]);
    return JSON.parse(
      run(DEBIAN_PYTHON, [NETWORK_RENDERER, source, out]).toString("utf8"),
    ) as RenderedNetwork;
  } finally {
    scratch.remove();
  }
}
