/**
 * Preflight: is this host ready for the VM we are about to make? Pure — facts
 * about the host in (gathered by host-facts.ts in one pipelined round), a list
 * of findings out. Each finding names the input it is about, what the host
 * has, and the exact commands that fix it, so the first error a user on a
 * freshly installed host sees is the whole story instead of the first of
 * several ("pool does not exist", then "pool is not active", then "network
 * is not active" at domain start).
 *
 * What stock packages leave behind (see docs/kvm.md, "A stock host"):
 * Debian 12 defines the network `default` but does not start it; neither
 * Debian nor Ubuntu defines a storage pool `default`; UEFI needs `ovmf`,
 * which qemu-system-x86 only recommends; the firmware-feature XML we send
 * for UEFI needs libvirt 7.2 (Ubuntu 20.04 ships 6.0).
 */
import { XMLParser } from "fast-xml-parser";

/** What the VM will ask of the host (KvmProxy inputs of the same names). */
export interface PreflightWants {
  pool: string;
  network: { bridge: string } | { name: string };
  firmware: "uefi" | "bios";
  domainType: "kvm" | "qemu";
}

/** One fact about the host, or why it could not be learnt. */
export type Fact<T> =
  | { ok: true; value: T }
  /** `unsupported`: the host's libvirt has no such call or driver (too old, or not built in). */
  | { ok: false; problem: string; unsupported?: boolean };

export interface NamedObjects {
  active: string[];
  /** Asked for only when the wanted one is not active (or for the doctor): it names them then. */
  inactive?: string[];
  /** Known only when gathered for the doctor (create does not need it). */
  autostart?: string[];
  /**
   * Listed without telling active from inactive: create's bridge check, which
   * needs only that the bridge exists (one that is down is only a warning).
   */
  present?: string[];
}

export interface DomainCapsSummary {
  domainType: string;
  machine: string;
  /** The host has UEFI firmware for this machine type. */
  efi: boolean;
  /** ... and firmware that runs with Secure Boot off (we switch it off). */
  efiWithoutSecureBoot: boolean;
}

export interface HostFacts {
  /** libvirt's version as major·10⁶ + minor·10³ + micro. */
  libVersion: Fact<number>;
  pools: Fact<NamedObjects>;
  /** Gathered when the network is a libvirt network. */
  networks?: Fact<NamedObjects>;
  /** Gathered when the network is a bridge: the host's interfaces as libvirt's interface driver sees them. */
  interfaces?: Fact<NamedObjects>;
  /** Domain capabilities for the domain type asked for (q35, x86_64). */
  domainCaps: Fact<DomainCapsSummary>;
  /** Only when the asked-for type is unavailable: the capabilities for `qemu` (emulation). */
  emulationCaps?: Fact<DomainCapsSummary>;
}

export type CheckName = "libvirt-version" | "domain-type" | "firmware" | "pool" | "network";
/** fail: create would fail; warn: works now, may not later; unknown: this host cannot tell us. */
export type CheckStatus = "ok" | "warn" | "fail" | "unknown";

/** A fix `egress-proxies doctor --fix` may apply: only the distribution's usual, reversible set-up. */
export type SafeFix =
  | { kind: "create-default-pool"; path: typeof DEFAULT_POOL_PATH }
  | { kind: "start-pool"; pool: "default" }
  | { kind: "autostart-pool"; pool: "default" }
  | { kind: "start-network"; network: "default" }
  | { kind: "autostart-network"; network: "default" };

export interface Finding {
  check: CheckName;
  status: CheckStatus;
  /** The input this is about, as KvmProxy names it ("pool", "network.name", ...). */
  input: string;
  /** The value asked for. */
  wanted: string;
  /** What the host has, in words. */
  hostHas: string;
  /** Exact commands (or input changes) that fix it; empty when nothing needs fixing. */
  fix: string[];
  safeFix?: SafeFix;
}

/** Where Debian, Ubuntu and Fedora keep libvirt images; virt-install's pool `default` points here. */
const DEFAULT_POOL_PATH = "/var/lib/libvirt/images";
/** `<os firmware="efi">` with `<firmware><feature .../>` (secure-boot off) needs libvirt 7.2. */
const MIN_LIBVIRT_FOR_UEFI = 7_002_000;
/** The machine and architecture every proxy VM uses (domain-xml.ts). */
export const DOMAIN_MACHINE = "q35";
export const DOMAIN_ARCH = "x86_64";

function formatLibvirtVersion(version: number): string {
  return `${Math.floor(version / 1_000_000)}.${Math.floor(version / 1000) % 1000}.${version % 1000}`;
}

/** Every check, in the order a person should fix them. */
export function decidePreflight(wants: PreflightWants, facts: HostFacts): Finding[] {
  return [
    checkLibvirtVersion(wants, facts),
    checkDomainType(wants, facts),
    checkFirmware(wants, facts),
    checkPool(wants, facts),
    "name" in wants.network
      ? checkNetwork(wants.network.name, facts.networks)
      : checkBridge(wants.network.bridge, facts.interfaces),
  ];
}

export const failures = (findings: readonly Finding[]): Finding[] =>
  findings.filter((finding) => finding.status === "fail");

/** One line per failed check: input, what the host has, and the fix. */
export function describeFailures(
  host: string,
  findings: readonly Finding[],
  state = "is not ready for this VM (nothing was created)",
): string {
  const lines = failures(findings).map(
    (f) =>
      `- ${f.input} ${JSON.stringify(f.wanted)}: ${f.hostHas}. Fix: ${f.fix.join("; ")}` +
      (f.safeFix ? " (or run `egress-proxies doctor --fix`, which does exactly this)" : ""),
  );
  return `host ${host} ${state}:\n${lines.join("\n")}`;
}

// ---- the checks ---------------------------------------------------------------------------------

function unknown(check: CheckName, input: string, wanted: string, problem: string): Finding {
  return { check, status: "unknown", input, wanted, hostHas: `cannot tell (${problem})`, fix: [] };
}

function checkLibvirtVersion(wants: PreflightWants, facts: HostFacts): Finding {
  const input = "firmware";
  const wanted = wants.firmware;
  if (!facts.libVersion.ok)
    return unknown("libvirt-version", input, wanted, facts.libVersion.problem);
  const has = `libvirt ${formatLibvirtVersion(facts.libVersion.value)}`;
  if (wants.firmware === "bios" || facts.libVersion.value >= MIN_LIBVIRT_FOR_UEFI)
    return { check: "libvirt-version", status: "ok", input, wanted, hostHas: has, fix: [] };
  return {
    check: "libvirt-version",
    status: "fail",
    input,
    wanted,
    hostHas: `${has}; UEFI with Secure Boot switched off needs libvirt ${formatLibvirtVersion(MIN_LIBVIRT_FOR_UEFI)} or newer`,
    fix: [
      "set firmware: \"bios\" (the image must boot with BIOS; Debian's and Ubuntu's cloud images do)",
      "or upgrade libvirt on the host (Ubuntu 22.04 ships 8.0, Debian 12 ships 9.0)",
    ],
  };
}

const QEMU_MISSING_FIX = [
  "apt install qemu-system-x86 (Debian/Ubuntu; dnf install qemu-kvm on Fedora/RHEL)",
];

function checkDomainType(wants: PreflightWants, facts: HostFacts): Finding {
  const input = "domainType";
  const wanted = wants.domainType;
  const caps = facts.domainCaps;
  if (caps.ok)
    return {
      check: "domain-type",
      status: "ok",
      input,
      wanted,
      hostHas: `${caps.value.domainType} guests (${caps.value.machine})`,
      fix: [],
    };
  if (caps.unsupported) return unknown("domain-type", input, wanted, caps.problem);
  if (wants.domainType === "kvm" && facts.emulationCaps?.ok)
    return {
      check: "domain-type",
      status: "fail",
      input,
      wanted,
      hostHas: `no KVM (${caps.problem}); only software emulation (domainType "qemu") is available`,
      fix: [
        'set domainType: "qemu" (software emulation: works, but boots and runs several times slower)',
        "or make KVM usable: enable VT-x/AMD-V in the firmware setup, `modprobe kvm_intel` (or kvm_amd), and check that /dev/kvm exists",
      ],
    };
  return {
    check: "domain-type",
    status: "fail",
    input,
    wanted,
    hostHas: `no QEMU that runs ${DOMAIN_ARCH} ${DOMAIN_MACHINE} guests (${caps.problem})`,
    fix: QEMU_MISSING_FIX,
  };
}

function checkFirmware(wants: PreflightWants, facts: HostFacts): Finding {
  const input = "firmware";
  const wanted = wants.firmware;
  const caps = facts.domainCaps;
  if (wants.firmware === "bios")
    return {
      check: "firmware",
      status: "ok",
      input,
      wanted,
      hostHas: "BIOS (SeaBIOS, always there)",
      fix: [],
    };
  // Without KVM the answer is the emulation's: the same OVMF serves both domain types, and the fix
  // for the domain type (domainType: "qemu") keeps the firmware asked for.
  const answered = caps.ok ? caps : facts.emulationCaps;
  if (answered === undefined || !answered.ok)
    return unknown("firmware", input, wanted, "no domain capabilities");
  const from = caps.ok
    ? ""
    : `; answered for software emulation (domainType "qemu"): this host has no KVM`;
  const ovmfFix = [
    "apt install ovmf (Debian/Ubuntu; dnf install edk2-ovmf on Fedora/RHEL), then restart libvirtd",
    'or set firmware: "bios"',
  ];
  if (!answered.value.efi)
    return {
      check: "firmware",
      status: "fail",
      input,
      wanted,
      hostHas: `no UEFI firmware (OVMF) for QEMU${from}`,
      fix: ovmfFix,
    };
  if (!answered.value.efiWithoutSecureBoot)
    return {
      check: "firmware",
      status: "fail",
      input,
      wanted,
      hostHas: `only Secure Boot UEFI firmware, and stock cloud images are booted with it off${from}`,
      fix: ovmfFix,
    };
  return {
    check: "firmware",
    status: "ok",
    input,
    wanted,
    hostHas: `UEFI firmware (OVMF)${from}`,
    fix: [],
  };
}

function listing(kind: string, objects: NamedObjects): string {
  const all = [
    ...objects.active.map((name) => `${name} (active)`),
    ...(objects.inactive ?? []).map((name) => `${name} (inactive)`),
  ];
  return all.length === 0 ? `no ${kind} at all` : `${kind}: ${all.join(", ")}`;
}

function checkPool(wants: PreflightWants, facts: HostFacts): Finding {
  const input = "pool";
  const name = wants.pool;
  if (!facts.pools.ok) return unknown("pool", input, name, facts.pools.problem);
  const pools = facts.pools.value;
  const isDefault = name === "default";
  const base = { check: "pool" as const, input, wanted: name };
  if (pools.active.includes(name)) {
    if (pools.autostart === undefined || pools.autostart.includes(name))
      return { ...base, status: "ok", hostHas: "active", fix: [] };
    return {
      ...base,
      status: "warn",
      hostHas: "active, but not started at boot: after a reboot creates fail until it is started",
      fix: [`virsh pool-autostart ${name}`],
      ...(isDefault ? { safeFix: { kind: "autostart-pool", pool: "default" } as const } : {}),
    };
  }
  if (pools.inactive?.includes(name))
    return {
      ...base,
      status: "fail",
      hostHas: "defined but not active",
      fix: [`virsh pool-start ${name}`, `virsh pool-autostart ${name}`],
      ...(isDefault ? { safeFix: { kind: "start-pool", pool: "default" } as const } : {}),
    };
  const path = isDefault ? DEFAULT_POOL_PATH : `${DEFAULT_POOL_PATH}/${name}`;
  return {
    ...base,
    status: "fail",
    hostHas: `no such pool (${listing("pools", pools)}); Debian and Ubuntu define none until virt-install or virt-manager first runs`,
    fix: [
      `virsh pool-define-as ${name} dir --target ${path}`,
      `virsh pool-build ${name}`,
      `virsh pool-start ${name}`,
      `virsh pool-autostart ${name}`,
      ...(pools.active.length > 0
        ? [`or set pool to one the host has (${pools.active.join(", ")})`]
        : []),
    ],
    ...(isDefault
      ? { safeFix: { kind: "create-default-pool", path: DEFAULT_POOL_PATH } as const }
      : {}),
  };
}

function checkNetwork(name: string, networks: Fact<NamedObjects> | undefined): Finding {
  const input = "network.name";
  if (networks === undefined || !networks.ok)
    return unknown("network", input, name, networks?.problem ?? "not gathered");
  const isDefault = name === "default";
  const base = { check: "network" as const, input, wanted: name };
  if (networks.value.active.includes(name)) {
    if (networks.value.autostart === undefined || networks.value.autostart.includes(name))
      return { ...base, status: "ok", hostHas: "active", fix: [] };
    return {
      ...base,
      status: "warn",
      hostHas:
        "active, but not started at boot: after a reboot VMs fail to start until it is started",
      fix: [`virsh net-autostart ${name}`],
      ...(isDefault ? { safeFix: { kind: "autostart-network", network: "default" } as const } : {}),
    };
  }
  // The NAT network's DHCP is dnsmasq, only a Recommends of the libvirt daemon packages.
  const dnsmasq = isDefault ? ["apt install dnsmasq-base (its DHCP server; Debian/Ubuntu)"] : [];
  if (networks.value.inactive?.includes(name))
    return {
      ...base,
      status: "fail",
      hostHas: "defined but not active (Debian's package defines it and starts nothing)",
      fix: [...dnsmasq, `virsh net-start ${name}`, `virsh net-autostart ${name}`],
      ...(isDefault ? { safeFix: { kind: "start-network", network: "default" } as const } : {}),
    };
  return {
    ...base,
    status: "fail",
    hostHas: `no such network (${listing("networks", networks.value)})`,
    fix: isDefault
      ? [
          "apt install libvirt-daemon-config-network dnsmasq-base (or: virsh net-define /usr/share/libvirt/networks/default.xml)",
          "virsh net-start default",
          "virsh net-autostart default",
          'or set network to a host bridge, e.g. { bridge: "br0" }',
        ]
      : [
          ...(networks.value.active.length > 0
            ? [`set network.name to one the host has (${networks.value.active.join(", ")})`]
            : []),
          `or define it: virsh net-define <file.xml> && virsh net-start ${name} && virsh net-autostart ${name}`,
        ],
  };
}

function checkBridge(name: string, interfaces: Fact<NamedObjects> | undefined): Finding {
  const input = "network.bridge";
  if (interfaces === undefined || !interfaces.ok)
    return unknown("network", input, name, interfaces?.problem ?? "not gathered");
  const base = { check: "network" as const, input, wanted: name };
  if (interfaces.value.active.includes(name))
    return { ...base, status: "ok", hostHas: "up", fix: [] };
  if (interfaces.value.present?.includes(name))
    return { ...base, status: "ok", hostHas: "exists (whether it is up was not asked)", fix: [] };
  if (interfaces.value.inactive?.includes(name))
    return {
      ...base,
      status: "warn",
      hostHas: "exists but is down: VMs start, but reach nothing",
      fix: [`ip link set ${name} up (and bring it up at boot in the host's network configuration)`],
    };
  return {
    ...base,
    status: "fail",
    hostHas: `no such interface (${listing("interfaces", interfaces.value)})`,
    fix: [
      `create the bridge ${name} with the LAN NIC in it (ifupdown: "iface ${name} inet dhcp" + "bridge_ports eth0" in /etc/network/interfaces; netplan: bridges: { ${name}: { interfaces: [eth0] } })`,
      'or set network to { name: "default" } (libvirt\'s NAT network)',
    ],
  };
}

// ---- domain capabilities ----------------------------------------------------------------------

const capsParser = new XMLParser({
  ignoreAttributes: false,
  attributeNamePrefix: "@_",
  parseTagValue: false,
  parseAttributeValue: false,
  isArray: (name) => ["enum", "value"].includes(name),
});

interface CapsEnum {
  "@_name"?: string;
  value?: unknown[];
}

const enumValues = (enums: CapsEnum[] | undefined, name: string): string[] | undefined => {
  const found = enums?.find((e) => e["@_name"] === name);
  return found === undefined ? undefined : (found.value ?? []).map((v) => String(v).trim());
};

/** The parts of `virsh domcapabilities` preflight needs. */
export function parseDomainCapabilities(xml: string): DomainCapsSummary {
  const doc = capsParser.parse(xml) as {
    domainCapabilities?: {
      domain?: unknown;
      machine?: unknown;
      os?: {
        "@_supported"?: string;
        enum?: CapsEnum[];
        loader?: { "@_supported"?: string; value?: unknown[]; enum?: CapsEnum[] };
      };
    };
  };
  const caps = doc.domainCapabilities ?? {};
  const os = caps.os;
  const loader = os?.loader;
  const loaders = (loader?.value ?? []).map((v) => String(v).trim()).filter((v) => v !== "");
  // libvirt ≥ 5.2 lists firmware kinds; older hosts only list loader paths.
  const firmware = enumValues(os?.enum, "firmware");
  const efi =
    os?.["@_supported"] !== "no" &&
    (firmware !== undefined
      ? firmware.includes("efi")
      : loader?.["@_supported"] === "yes" && loaders.length > 0);
  const secure = enumValues(loader?.enum, "secure");
  return {
    domainType: String(caps.domain ?? "").trim(),
    machine: String(caps.machine ?? "").trim(),
    efi,
    efiWithoutSecureBoot: efi && (secure === undefined || secure.includes("no")),
  };
}
