/**
 * The domain XML of a proxy VM, and reading back what we need from a domain
 * the host describes. Pure: strings in, strings out.
 *
 * Shape decisions, each learned on real hosts (see docs/kvm.md):
 * - q35 with the seed cdrom on virtio-scsi: Debian's cloud kernel has no AHCI
 *   driver, so a SATA cdrom is invisible and cloud-init finds no datasource.
 * - UEFI with secure-boot and enrolled-keys off: otherwise libvirt picks the
 *   MS-enrolled Secure Boot firmware, which stock cloud images' GRUB may not pass.
 * - Disks as pool volumes (`type="volume"`), so the domain survives a pool
 *   moving to another path and the reaper can map disks back to volumes.
 * - The ownership mark in a namespaced `<metadata>` element: libvirt has no labels.
 */
import { XMLBuilder, XMLParser } from "fast-xml-parser";
import {
  MARK_XML_NAMESPACE,
  MARK_XML_PREFIX,
  markFromFields,
  markToFields,
  type MarkReading,
  type OwnershipMark,
} from "../common/mark";

export type CpuMode = "host-passthrough" | "host-model" | "maximum" | { model: string };

export interface DomainSpec {
  name: string;
  /** Keep the UUID when redefining an existing domain (libvirt refuses a new one for a known name). */
  uuid?: string;
  domainType: "kvm" | "qemu";
  vcpus: number;
  memoryMiB: number;
  firmware: "uefi" | "bios";
  cpuMode: CpuMode;
  pool: string;
  overlayVolume: string;
  seedVolume: string;
  network: { bridge: string } | { name: string };
  mac: string;
  mark: OwnershipMark;
}

const builder = new XMLBuilder({
  ignoreAttributes: false,
  attributeNamePrefix: "@_",
  format: true,
  suppressEmptyNode: true,
  // Otherwise managed="true" is written as a bare attribute, which is not XML.
  suppressBooleanAttributes: false,
});

const parser = new XMLParser({
  ignoreAttributes: false,
  attributeNamePrefix: "@_",
  parseAttributeValue: false,
  parseTagValue: false,
  // Attribute values must come back exactly; element text is trimmed where it is read.
  trimValues: false,
  isArray: (name) => ["disk", "interface", "controller"].includes(name),
});

/** FROZEN with MARK_XML_NAMESPACE: existing domains carry <egress:mark>; a rename orphans them. */
const MARK_ELEMENT = "mark";

/**
 * XML cannot carry control characters, and parsers (libxml2 among them) turn
 * tabs and newlines in attributes into spaces. Percent-encode those and '%'
 * itself, so any Pulumi resource name survives the host's round trip.
 */
/* eslint-disable no-control-regex -- control characters are exactly what this must match */
const XML_UNSAFE =
  /[%\u0000-\u001f\u007f\ufffe\uffff]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;
/* eslint-enable no-control-regex */
const encodeMarkValue = (value: string): string =>
  value.replace(XML_UNSAFE, (char) =>
    // A lone surrogate has no UTF-8 form: it becomes U+FFFD, as any encoder would make it.
    char.charCodeAt(0) >= 0xd800 && char.charCodeAt(0) <= 0xdfff
      ? "%EF%BF%BD"
      : encodeURIComponent(char),
  );
const decodeMarkValue = (value: string): string =>
  value.replace(/(%[0-9A-Fa-f]{2})+/g, (run) => {
    try {
      return decodeURIComponent(run);
    } catch {
      return run;
    }
  });

function markElement(mark: OwnershipMark): Record<string, unknown> {
  const attributes = Object.fromEntries(
    Object.entries(markToFields(mark)).map(([key, value]) => [`@_${key}`, encodeMarkValue(value)]),
  );
  return {
    [`${MARK_XML_PREFIX}:${MARK_ELEMENT}`]: {
      [`@_xmlns:${MARK_XML_PREFIX}`]: MARK_XML_NAMESPACE,
      ...attributes,
    },
  };
}

/** The mark alone, as DOMAIN_SET_METADATA takes it. */
export function markElementXml(mark: OwnershipMark): string {
  return builder.build(markElement(mark));
}

function cpuElement(mode: CpuMode): Record<string, unknown> {
  if (typeof mode === "object")
    return {
      "@_mode": "custom",
      "@_match": "exact",
      model: { "@_fallback": "allow", "#text": mode.model },
    };
  return { "@_mode": mode };
}

export function buildDomainXml(spec: DomainSpec): string {
  const efi = spec.firmware === "uefi";
  const domain = {
    domain: {
      "@_type": spec.domainType,
      name: spec.name,
      ...(spec.uuid ? { uuid: spec.uuid } : {}),
      memory: { "@_unit": "MiB", "#text": String(spec.memoryMiB) },
      vcpu: String(spec.vcpus),
      metadata: markElement(spec.mark),
      os: {
        ...(efi ? { "@_firmware": "efi" } : {}),
        ...(efi
          ? {
              firmware: {
                feature: [
                  { "@_enabled": "no", "@_name": "secure-boot" },
                  { "@_enabled": "no", "@_name": "enrolled-keys" },
                ],
              },
            }
          : {}),
        type: { "@_arch": "x86_64", "@_machine": "q35", "#text": "hvm" },
        boot: { "@_dev": "hd" },
      },
      features: { acpi: "", apic: "" },
      cpu: cpuElement(spec.cpuMode),
      clock: { "@_offset": "utc" },
      on_poweroff: "destroy",
      on_reboot: "restart",
      on_crash: "destroy",
      devices: {
        disk: [
          {
            "@_type": "volume",
            "@_device": "disk",
            driver: { "@_name": "qemu", "@_type": "qcow2", "@_discard": "unmap" },
            source: { "@_pool": spec.pool, "@_volume": spec.overlayVolume },
            target: { "@_dev": "vda", "@_bus": "virtio" },
          },
          {
            "@_type": "volume",
            "@_device": "cdrom",
            driver: { "@_name": "qemu", "@_type": "raw" },
            source: { "@_pool": spec.pool, "@_volume": spec.seedVolume },
            target: { "@_dev": "sda", "@_bus": "scsi" },
            readonly: "",
          },
        ],
        controller: [{ "@_type": "scsi", "@_index": "0", "@_model": "virtio-scsi" }],
        interface: [
          {
            "@_type": "bridge" in spec.network ? "bridge" : "network",
            mac: { "@_address": spec.mac },
            source:
              "bridge" in spec.network
                ? { "@_bridge": spec.network.bridge }
                : { "@_network": spec.network.name },
            model: { "@_type": "virtio" },
          },
        ],
        serial: { "@_type": "pty", target: { "@_port": "0" } },
        console: { "@_type": "pty", target: { "@_type": "serial", "@_port": "0" } },
        channel: {
          "@_type": "unix",
          target: { "@_type": "virtio", "@_name": "org.qemu.guest_agent.0" },
        },
        rng: { "@_model": "virtio", backend: { "@_model": "random", "#text": "/dev/urandom" } },
        memballoon: { "@_model": "virtio" },
      },
    },
  };
  return builder.build(domain);
}

export interface DomainDescription {
  name: string;
  uuid: string | undefined;
  domainType: string | undefined;
  firmware: "uefi" | "bios";
  /** vCPUs the domain boots with (`current`, else the maximum). */
  vcpus: number | undefined;
  /** `<memory>`, the size the domain is defined with, in MiB (fractions kept). */
  memoryMiB: number | undefined;
  cpuMode: CpuMode | undefined;
  /** The first NIC's attachment; another kind than bridge or network is reported by its type. */
  network: DomainNetwork | undefined;
  /** MAC of the first NIC: the address source matches guest interfaces against it. */
  mac: string | undefined;
  /** Volume-backed disks, for delete and the reaper. */
  volumes: Array<{ device: string; pool: string; volume: string }>;
  mark: MarkReading;
}

export type DomainNetwork =
  { bridge: string } | { name: string } | { type: string; source?: string };

type XmlNode = Record<string, unknown>;
const asNode = (value: unknown): XmlNode =>
  typeof value === "object" && value !== null ? (value as XmlNode) : {};
const attribute = (node: unknown, name: string): string | undefined => {
  const value = asNode(node)[`@_${name}`];
  return typeof value === "string" ? value : undefined;
};
const text = (node: unknown): string | undefined => {
  const value = typeof node === "string" ? node : asNode(node)["#text"];
  return typeof value === "string" ? value.trim() : undefined;
};

/** Reads the ownership mark from any element in our namespace, whatever prefix the host serialised it with. */
/**
 * Reads the ownership mark from any element in our namespace, whatever prefix
 * the host serialised it with. `namespaceKnown` is for DOMAIN_GET_METADATA's
 * answer: the query already named our namespace, and libvirt returns the
 * element without declaring it.
 */
function readMarkFromElement(container: unknown, namespaceKnown = false): MarkReading {
  for (const [key, value] of Object.entries(asNode(container))) {
    if (key.startsWith("@_") || key === "#text") continue;
    for (const element of Array.isArray(value) ? value : [value]) {
      const [prefix, local] = key.includes(":") ? key.split(":", 2) : [undefined, key];
      const namespace =
        prefix === undefined ? attribute(element, "xmlns") : attribute(element, `xmlns:${prefix}`);
      const ours = namespace === MARK_XML_NAMESPACE || (namespaceKnown && namespace === undefined);
      if (!ours || local !== MARK_ELEMENT) continue;
      const fields: Record<string, string> = {};
      for (const [name, fieldValue] of Object.entries(asNode(element)))
        if (name.startsWith("@_") && !name.startsWith("@_xmlns") && typeof fieldValue === "string")
          fields[name.slice(2)] = decodeMarkValue(fieldValue);
      const reading = markFromFields(fields);
      return reading.kind === "unmarked"
        ? { kind: "corrupt", reason: "the mark element has no managed attribute" }
        : reading;
    }
  }
  return { kind: "unmarked" };
}

/** Parses what DOMAIN_GET_METADATA returns for our namespace (one element, namespace implied). */
export function parseMarkElementXml(xml: string): MarkReading {
  try {
    return readMarkFromElement(parser.parse(xml), true);
  } catch (error) {
    return { kind: "corrupt", reason: `metadata is not XML: ${(error as Error).message}` };
  }
}

export function parseDomainXml(xml: string): DomainDescription {
  const domain = asNode(parser.parse(xml).domain);
  const devices = asNode(domain.devices);
  const disks = (devices.disk as unknown[] | undefined) ?? [];
  const interfaces = (devices.interface as unknown[] | undefined) ?? [];
  return {
    name: text(domain.name) ?? "",
    uuid: text(domain.uuid),
    domainType: attribute(domain, "type"),
    firmware:
      attribute(domain.os, "firmware") === "efi" || asNode(domain.os).loader !== undefined
        ? "uefi"
        : "bios",
    vcpus: vcpuCount(domain.vcpu),
    memoryMiB: memoryMiBOf(domain.memory),
    cpuMode: cpuModeOf(domain.cpu),
    network: networkOf(interfaces[0]),
    mac: attribute(asNode(interfaces[0]).mac, "address")?.toLowerCase(),
    volumes: disks.flatMap((disk) => {
      const pool = attribute(asNode(disk).source, "pool");
      const volume = attribute(asNode(disk).source, "volume");
      return pool && volume ? [{ device: attribute(disk, "device") ?? "disk", pool, volume }] : [];
    }),
    mark: readMarkFromElement(domain.metadata),
  };
}

function vcpuCount(node: unknown): number | undefined {
  const count = Number(attribute(node, "current") ?? text(node));
  return Number.isInteger(count) && count > 0 ? count : undefined;
}

/** libvirt's memory units (its own output uses KiB, the default). */
const MEMORY_UNIT_BYTES: Record<string, number> = {
  b: 1,
  bytes: 1,
  KB: 1e3,
  k: 1024,
  KiB: 1024,
  MB: 1e6,
  M: 1024 ** 2,
  MiB: 1024 ** 2,
  GB: 1e9,
  G: 1024 ** 3,
  GiB: 1024 ** 3,
  TB: 1e12,
  T: 1024 ** 4,
  TiB: 1024 ** 4,
};

function memoryMiBOf(node: unknown): number | undefined {
  const amount = Number(text(node));
  const unitBytes = MEMORY_UNIT_BYTES[attribute(node, "unit") ?? "KiB"];
  if (!Number.isFinite(amount) || amount <= 0 || unitBytes === undefined) return undefined;
  return (amount * unitBytes) / 1024 ** 2;
}

function cpuModeOf(node: unknown): CpuMode | undefined {
  const mode = attribute(node, "mode");
  if (mode === "host-passthrough" || mode === "host-model" || mode === "maximum") return mode;
  const model = text(asNode(node).model);
  if ((mode === "custom" || mode === undefined) && model) return { model };
  return undefined;
}

function networkOf(nic: unknown): DomainNetwork | undefined {
  const type = attribute(nic, "type");
  if (type === undefined) return undefined;
  const source = asNode(nic).source;
  const bridge = attribute(source, "bridge");
  const network = attribute(source, "network");
  if (type === "bridge" && bridge) return { bridge };
  if (type === "network" && network) return { name: network };
  const device = attribute(source, "dev") ?? bridge ?? network;
  return device === undefined ? { type } : { type, source: device };
}
