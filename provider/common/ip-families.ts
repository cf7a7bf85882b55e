/**
 * Which address families a proxy VM takes, and how it gets its IPv6 address:
 * the inputs both VM resources share, the network-config they hand
 * cloud-init, and the pick of the VM's IPv6 address from what its guest
 * agent reports. Pure: no I/O.
 *
 * Left unset, a proxy is IPv4 only and nothing of this reaches the seed: a
 * stack written before dual stack existed sees no change.
 */
import { isIP } from "node:net";
import { z } from "zod";
import { ipv6Groups } from "./ipv6";

export type IpFamily = "ipv4" | "ipv6";

/** The two ways a VM gets its IPv6 address: router advertisements, or one written here. */
export type Ipv6Settings =
  | { mode: "slaac"; nameservers?: string[] }
  | { mode: "static"; address: string; gateway?: string; nameservers?: string[] };

const ipv6Literal = (field: string, example: string) =>
  z
    .string({ error: `${field} must be an IPv6 address, e.g. "${example}"` })
    .refine((text) => isIP(text) === 6, {
      error: `${field} must be an IPv6 address without brackets or prefix, e.g. "${example}"`,
    });

const nameserversSchema = z
  .array(ipv6Literal("ipv6.nameservers[]", "2001:4860:4860::8888"), {
    error: 'ipv6.nameservers must be a list of IPv6 addresses, e.g. ["2001:4860:4860::8888"]',
  })
  .min(1, { error: "ipv6.nameservers must list at least one address; leave it out for none" })
  .max(3, { error: "ipv6.nameservers takes at most 3 addresses (the resolver reads no more)" })
  .optional();

/** `address/prefix`, the prefix 1–128. */
function ipv6CidrProblem(text: string): string | undefined {
  const match = /^([^/]+)\/(\d{1,3})$/.exec(text);
  if (match === null || isIP(match[1]) !== 6)
    return 'ipv6.address must be an IPv6 address with its prefix length, e.g. "2001:db8:10::5/64"';
  const prefix = Number(match[2]);
  if (prefix < 1 || prefix > 128) return "ipv6.address has a prefix length outside 1-128";
  return undefined;
}

const ipv6Schema = z.discriminatedUnion(
  "mode",
  [
    z.strictObject({ mode: z.literal("slaac"), nameservers: nameserversSchema }),
    z.strictObject({
      mode: z.literal("static"),
      address: z
        .string({ error: 'ipv6.address must be text like "2001:db8:10::5/64"' })
        .superRefine((text, context) => {
          const problem = ipv6CidrProblem(text);
          if (problem !== undefined) context.addIssue({ code: "custom", message: problem });
        }),
      gateway: ipv6Literal("ipv6.gateway", "2001:db8:10::1").optional(),
      nameservers: nameserversSchema,
    }),
  ],
  {
    error:
      'ipv6 must be { mode: "slaac" } (router advertisements) or { mode: "static", address: "2001:db8:10::5/64", gateway: "2001:db8:10::1" }',
  },
);

/**
 * The inputs, spread into each VM resource's schema. No defaults: state
 * written before these inputs existed must compare equal to a program that
 * does not set them.
 */
export const ipFamiliesShape = {
  /** Default ["ipv4"]. ["ipv4", "ipv6"] is dual stack; ["ipv6"] takes no IPv4 address at all. */
  ipFamilies: z
    .array(
      z.enum(["ipv4", "ipv6"], {
        error: 'ipFamilies entries must be "ipv4" or "ipv6"',
      }),
      { error: 'ipFamilies must be a list: ["ipv4"], ["ipv4", "ipv6"] or ["ipv6"]' },
    )
    .min(1, {
      error: 'ipFamilies must name at least one family: ["ipv4"], ["ipv4", "ipv6"] or ["ipv6"]',
    })
    .refine((families) => new Set(families).size === families.length, {
      error: 'ipFamilies names a family twice; write ["ipv4", "ipv6"]',
    })
    // ["ipv4"] is the default written out: checked as unset, so writing it replaces no VM.
    .transform((families) =>
      families.length === 1 && families[0] === "ipv4" ? undefined : families,
    )
    .optional(),
  /** How the VM gets its IPv6 address; default SLAAC. Only with "ipv6" in ipFamilies. */
  ipv6: ipv6Schema.optional(),
};

interface FamilyInputs {
  ipFamilies?: IpFamily[];
  ipv6?: Ipv6Settings;
  networkConfig?: string;
}

/** Problems between the family inputs and the rest, as [field, message]; for a schema's superRefine. */
export function ipFamilyProblems(inputs: FamilyInputs): Array<[string, string]> {
  const problems: Array<[string, string]> = [];
  const families = inputs.ipFamilies ?? ["ipv4"];
  if (inputs.ipv6 !== undefined && !families.includes("ipv6"))
    problems.push([
      "ipv6",
      'ipv6 is set but ipFamilies does not include "ipv6"; write ipFamilies: ["ipv4", "ipv6"] (or ["ipv6"]), or leave ipv6 out',
    ]);
  if (inputs.networkConfig !== undefined && families.includes("ipv6"))
    problems.push([
      "networkConfig",
      'networkConfig is your own network-config, but ipFamilies asks the provider to write one for IPv6; leave networkConfig out, or leave "ipv6" out of ipFamilies and enable IPv6 in your networkConfig',
    ]);
  return problems;
}

/** The families a proxy takes, IPv4 first; unset means IPv4 only. */
export function familiesOf(inputs: { ipFamilies?: readonly IpFamily[] }): {
  ipv4: boolean;
  ipv6: boolean;
} {
  const families = inputs.ipFamilies ?? ["ipv4"];
  return { ipv4: families.includes("ipv4"), ipv6: families.includes("ipv6") };
}

/** The interface name the network-config gives the VM's NIC (cloud-init renames it by MAC). */
export const GUEST_NIC_NAME = "eth0";

/**
 * The NoCloud network-config (version 1) for a VM that takes IPv6, or
 * undefined for IPv4 only (cloud-init's DHCPv4 fallback then applies, as
 * before). Version 1 because it has a subnet type for SLAAC: on Debian 12's
 * ifupdown renderer `ipv6_slaac` becomes `iface eth0 inet6 auto`, which turns
 * router advertisements on for the interface; version 2 has no such type and
 * renders nothing for IPv6 there. The NIC is matched by MAC and named eth0,
 * because version 1 needs a name and the kernel's (ens3, enp1s0, ens18)
 * depends on the machine type.
 */
export function guestNetworkConfig(
  mac: string,
  inputs: { ipFamilies?: readonly IpFamily[]; ipv6?: Ipv6Settings },
): string | undefined {
  const families = familiesOf(inputs);
  if (!families.ipv6) return undefined;
  const ipv6 = inputs.ipv6 ?? { mode: "slaac" };
  const subnets: string[] = [];
  if (families.ipv4) subnets.push("      - type: dhcp4");
  if (ipv6.mode === "slaac") subnets.push("      - type: ipv6_slaac");
  else {
    subnets.push("      - type: static6", `        address: "${ipv6.address}"`);
    if (ipv6.gateway !== undefined) subnets.push(`        gateway: "${ipv6.gateway}"`);
  }
  if (ipv6.nameservers !== undefined)
    subnets.push(
      "        dns_nameservers:",
      ...ipv6.nameservers.map((server) => `          - "${server}"`),
    );
  return [
    "# egress-proxies: the proxy's network (ipFamilies)",
    "version: 1",
    "config:",
    "  - type: physical",
    `    name: ${GUEST_NIC_NAME}`,
    `    mac_address: "${mac.toLowerCase()}"`,
    "    subnets:",
    ...subnets,
    "",
  ].join("\n");
}

/** 16 bytes of an IPv6 address, or undefined when it is none. */
export function ipv6Bytes(address: string): Buffer | undefined {
  const groups = ipv6Groups(address);
  if (groups === undefined) return undefined;
  const bytes = Buffer.alloc(16);
  groups.forEach((group, index) => bytes.writeUInt16BE(group, index * 2));
  return bytes;
}

/**
 * A global unicast address (unique-local included: a lab or a private network
 * uses it): not loopback, unspecified, link-local, multicast, nor an IPv4
 * form (mapped), which never reach a proxy over IPv6.
 */
export function isRoutableIpv6(address: string): boolean {
  const bytes = ipv6Bytes(address);
  if (bytes === undefined) return false;
  if (bytes.every((byte, index) => byte === 0 || (index === 15 && byte === 1))) return false;
  if (bytes[0] === 0xff) return false;
  if (bytes[0] === 0xfe && (bytes[1] & 0xc0) === 0x80) return false;
  if (bytes.subarray(0, 10).every((byte) => byte === 0) && bytes[10] === 0xff && bytes[11] === 0xff)
    return false;
  return true;
}

/** The modified EUI-64 interface identifier SLAAC derives from a MAC (RFC 4291, appendix A). */
export function eui64InterfaceId(mac: string): Buffer {
  const octets = mac.split(":").map((part) => parseInt(part, 16));
  return Buffer.from([octets[0] ^ 0x02, octets[1], octets[2], 0xff, 0xfe, ...octets.slice(3, 6)]);
}

/**
 * The VM's IPv6 address among those on its NIC: the static one when it was
 * given, else the SLAAC address made from the MAC (stable across reboots;
 * privacy addresses beside it change), else the first routable one.
 */
export function pickIpv6(
  addresses: readonly string[],
  mac: string,
  ipv6?: Ipv6Settings,
): string | undefined {
  const routable = addresses.filter(isRoutableIpv6);
  if (ipv6?.mode === "static") {
    const wanted = ipv6Bytes(ipv6.address.split("/")[0]!);
    const configured = routable.find((address) => ipv6Bytes(address)!.equals(wanted!));
    if (configured !== undefined) return configured.toLowerCase();
  }
  const id = eui64InterfaceId(mac);
  const fromMac = routable.find((address) => ipv6Bytes(address)!.subarray(8).equals(id));
  return (fromMac ?? routable[0])?.toLowerCase();
}

/** `http://ip:port`, an IPv6 address in brackets. */
export function proxyEndpoint(ip: string, port: number): string {
  return `http://${ip.includes(":") ? `[${ip}]` : ip}:${port}`;
}
