import { createHash } from "node:crypto";
import { markFromText, markToText, MarkReading, OwnershipMark } from "../common/mark";

/**
 * Pure readings and rewrites of Proxmox VM config values. No I/O here, so
 * every rule about config text in docs/proxmox.md, "Proxmox VE behaviours we rely on"
 * (Fn, rule n) is unit-tested.
 */

/** `virtio=BC:24:11:AA:BB:CC,bridge=vmbr0,firewall=1,tag=20` */
export interface NetDevice {
  model: string;
  mac: string;
  options: Array<[string, string]>;
}

const NIC_MODELS = [
  "virtio",
  "e1000",
  "e1000e",
  "rtl8139",
  "vmxnet3",
  "ne2k_pci",
  "pcnet",
  "i82551",
  "i82557b",
  "i82559er",
];

export function parseNetDevice(value: string): NetDevice | undefined {
  const parts = value.split(",").map((part) => part.split("=", 2) as [string, string | undefined]);
  let model: string | undefined;
  let mac: string | undefined;
  const options: Array<[string, string]> = [];
  for (const [key, raw] of parts) {
    const val = raw ?? "";
    if (NIC_MODELS.includes(key)) {
      model = key;
      mac = val;
    } else if (key === "model") model = val;
    else if (key === "macaddr") mac = val;
    else options.push([key, val]);
  }
  if (model === undefined || mac === undefined || !/^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$/.test(mac))
    return undefined;
  return { model, mac: mac.toUpperCase(), options };
}

/**
 * Rule 12 (docs/proxmox.md section 9, rules): bridge/VLAN rewrite net0, keeping the model and the MAC the clone
 * generated; unset leaves net0 as cloned (returns undefined: nothing to write).
 * `mac` replaces the clone's MAC: a VM that takes IPv6 gets one known before
 * the clone (proxmoxMacFor), because its seed's network-config, uploaded
 * beside the clone, names its NIC by MAC.
 */
export function rewriteNet0(
  net0: string,
  bridge: string | undefined,
  vlanTag: number | undefined,
  mac?: string,
): string | undefined {
  if (bridge === undefined && vlanTag === undefined && mac === undefined) return undefined;
  const device = parseNetDevice(net0);
  if (device === undefined) return undefined;
  const options = new Map(device.options);
  if (bridge !== undefined) options.set("bridge", bridge);
  if (vlanTag !== undefined) options.set("tag", String(vlanTag));
  return [
    `${device.model}=${(mac ?? device.mac).toUpperCase()}`,
    ...[...options].map(([key, value]) => `${key}=${value}`),
  ].join(",");
}

/** A MAC from the VM's name, under Proxmox's own prefix BC:24:11 (a locally administered range it draws from). */
export function proxmoxMacFor(vmName: string): string {
  const digest = createHash("sha256").update(`proxmox-mac:${vmName}`).digest();
  return ["bc", "24", "11", ...[0, 1, 2].map((i) => digest[i].toString(16).padStart(2, "0"))].join(
    ":",
  );
}

export function macOf(config: Record<string, string | undefined>): string | undefined {
  const net0 = config.net0;
  return net0 === undefined ? undefined : parseNetDevice(net0)?.mac.toLowerCase();
}

/**
 * Rule 8 / F19: the boot disk is the first entry of `boot: order=` that is a
 * disk; ide2 (our seed cdrom, which Proxmox appends to the order) and any
 * cdrom or NIC are skipped.
 */
export function bootDisk(config: Record<string, string | undefined>): string | undefined {
  const order = /^order=(.*)$/.exec(config.boot ?? "")?.[1];
  const candidates = order === undefined ? ["scsi0", "virtio0", "sata0", "ide0"] : order.split(";");
  for (const key of candidates) {
    if (key === "ide2" || !/^(scsi|virtio|sata|ide)\d+$/.test(key)) continue;
    const value = config[key];
    if (value === undefined || /media=cdrom/.test(value)) continue;
    return key;
  }
  return undefined;
}

const UNIT_BYTES: Record<string, number> = {
  "": 1,
  K: 1024,
  M: 1024 ** 2,
  G: 1024 ** 3,
  T: 1024 ** 4,
};

export function diskSizeBytes(diskValue: string | undefined): number | undefined {
  const match = /(?:^|,)size=(\d+(?:\.\d+)?)([KMGT])?(?:,|$)/.exec(diskValue ?? "");
  return match === null ? undefined : Math.round(Number(match[1]) * UNIT_BYTES[match[2] ?? ""]);
}

export const GIB = 1024 ** 3;

/** The description: a line for people, then our mark block (F10: verbatim, 8 KiB max; F11: our own creation time). */
export function vmDescription(vmName: string, mark: OwnershipMark): string {
  return [
    `Egress proxy ${vmName}, managed by egress-proxies (Pulumi stack ${mark.owner.project}/${mark.owner.stack}).`,
    "Do not edit the block below: it is how the provider and the reaper recognise this VM.",
    markToText(mark),
  ].join("\n");
}

export function markOfConfig(config: Record<string, string | undefined>): MarkReading {
  return markFromText(config.description);
}

/** `;`-separated, as the API writes them (F9). */
export function tagsValue(tags: readonly string[]): string {
  return [...new Set(tags.map((tag) => tag.toLowerCase()))].sort().join(";");
}

/**
 * F19: a template with a Proxmox cloud-init drive (or anything) on ide2 cannot
 * take our seed there. Returns the problem, or undefined.
 */
export function ide2Problem(
  config: Record<string, string | undefined>,
  ourSeedVolume: string,
): string | undefined {
  const ide2 = config.ide2;
  if (ide2 === undefined || ide2.startsWith(`${ourSeedVolume},`) || ide2 === ourSeedVolume)
    return undefined;
  // An empty CD-ROM drive is free to take our seed.
  if (/^none(,|$)/.test(ide2)) return undefined;
  return `ide2 is already in use (${ide2.split(",")[0]}); remove the template's cloud-init drive or CD-ROM from ide2`;
}
