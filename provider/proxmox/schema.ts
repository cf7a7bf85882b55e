// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import { guestFilesSchema } from "../common/guest-files";
import { z } from "zod";
import { egressCheckSchema } from "../common/egress";
import { ipFamiliesShape, ipFamilyProblems } from "../common/ip-families";
import type { EgressProblem } from "../common/egress-recheck";
import {
  CheckFailure,
  ownerSchema,
  readinessSchema,
  timeoutsSchema,
  vmLifecycleShape,
  UNKNOWN,
  validateWithUnknowns,
  ValidationResult,
  vmNameSchema,
  wholeNumber,
} from "../common/inputs";

export { UNKNOWN };
export type { CheckFailure };

/**
 * ProxmoxProxy inputs. Every message names the field and says what to write
 * instead; `check` reports them as Pulumi check failures.
 */

/** F9 / rule 7 (docs/proxmox.md section 9): the tag pattern Proxmox accepts once folded to lower case. */
const TAG_PATTERN = /^[a-z0-9_][a-z0-9_\-+.]*$/;
const STORAGE_ID = /^[a-z][a-z0-9\-_.]*$/i;
const NODE_NAME = /^[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?$/;
const BRIDGE_NAME = /^[a-zA-Z][a-zA-Z0-9_.-]{0,14}$/;

const storageId = (field: string, example: string) =>
  z
    .string({ error: `${field} must be a Proxmox storage id, e.g. "${example}"` })
    .regex(STORAGE_ID, {
      error: `${field} must be a Proxmox storage id (letters, digits, '-', '_', '.'), e.g. "${example}"`,
    });

const vmidRangeSchema = z
  .strictObject({
    first: wholeNumber("vmidRange.first", 100, 999_999_999, 20000),
    last: wholeNumber("vmidRange.last", 100, 999_999_999, 29999),
  })
  .refine((range) => range.last >= range.first, {
    error: "vmidRange.last must not be below vmidRange.first; swap them",
  });

const proxmoxProxyInputsObject = z.strictObject({
  // Where (credentials may also come from provider config or the environment).
  apiEndpoint: z
    .string({ error: 'apiEndpoint must be the API URL, e.g. "https://pve.example:8006"' })
    .regex(/^https:\/\/[^/@\s]+(:\d+)?(\/api2\/json)?\/?$/i, {
      error:
        'apiEndpoint must be an https URL without credentials or path, e.g. "https://pve.example:8006" (the token goes in apiToken)',
    })
    .optional(),
  apiToken: z
    .string({ error: "apiToken must be a string user@realm!tokenid=secret" })
    .regex(/^(PVEAPIToken=)?[^@\s]+@[^!\s]+![^=\s]+=\S+$/, {
      error:
        "apiToken must look like user@realm!tokenid=secret (Datacenter → Permissions → API Tokens)",
    })
    .optional(),
  caCertPem: z
    .string({ error: "caCertPem must be PEM text (-----BEGIN CERTIFICATE-----…)" })
    .includes("-----BEGIN CERTIFICATE-----", {
      error:
        "caCertPem must be PEM text starting with -----BEGIN CERTIFICATE-----; for a file path use PROXMOX_VE_CA_CERT",
    })
    .optional(),
  insecure: z.boolean({ error: "insecure must be true or false" }).optional(),
  node: z.string({ error: 'node must be the Proxmox node name, e.g. "pve"' }).regex(NODE_NAME, {
    error: 'node must be a Proxmox node name (letters, digits, "-"), e.g. "pve"',
  }),
  templateVmid: wholeNumber("templateVmid", 100, 999_999_999, 9000),
  diskStorage: storageId("diskStorage", "local-lvm"),
  seedStorage: storageId("seedStorage", "seeds"),
  vmidRange: vmidRangeSchema.default({ first: 20000, last: 29999 }),
  vmName: vmNameSchema.optional(),
  /** "user" when the name was given, "provider" when check generated it (diff decides deleteBeforeReplace). FROZEN key and values: old state. */
  vmNameChosenBy: z.enum(["user", "provider"]).optional(),
  // Machine.
  cores: wholeNumber("cores", 1, 128, 2).default(1),
  memoryMiB: wholeNumber("memoryMiB", 256, 1_048_576, 1024).default(1024),
  diskGiB: wholeNumber("diskGiB", 1, 65_536, 10).optional(),
  bridge: z
    .string({ error: 'bridge must be a Linux bridge name, e.g. "vmbr1"' })
    .regex(BRIDGE_NAME, {
      error: 'bridge must be a Linux bridge name (at most 15 characters), e.g. "vmbr1"',
    })
    .optional(),
  vlanTag: wholeNumber("vlanTag", 1, 4094, 20).optional(),
  ...ipFamiliesShape,
  tags: z
    .array(
      z.string().transform((tag, context) => {
        const folded = tag.toLowerCase();
        if (!TAG_PATTERN.test(folded))
          context.addIssue({
            code: "custom",
            message: `tags entry ${JSON.stringify(tag)} has characters Proxmox rejects; use letters, digits and _ - + . (no spaces, no '!')`,
          });
        return folded;
      }),
      { error: "tags must be a list of strings" },
    )
    .default([]),
  // cloud-init.
  userData: z
    .string({ error: "userData must be a string (any format cloud-init accepts)" })
    .optional(),
  vendorData: z.string({ error: "vendorData must be a string" }).optional(),
  installGuestAgent: z.boolean({ error: "installGuestAgent must be true or false" }).default(true),
  /** Files the user-data writes, delivered in place when they change (common/guest-files.ts). */
  guestFiles: guestFilesSchema,
  // Behaviour.
  ...vmLifecycleShape,
  readiness: readinessSchema.default({ mode: "port", port: 3128 }),
  egressCheck: egressCheckSchema.optional(),
  timeouts: timeoutsSchema.default({ createSeconds: 900, readySeconds: 600, deleteSeconds: 300 }),
  owner: ownerSchema,
});

export const proxmoxProxyInputsSchema = proxmoxProxyInputsObject.superRefine((inputs, context) => {
  for (const [field, message] of ipFamilyProblems(inputs))
    context.addIssue({ code: "custom", message, path: [field] });
});

/** Checked inputs, defaults applied. */
export type ProxmoxProxyInputs = z.output<typeof proxmoxProxyInputsSchema> & { vmName: string };

/** What create/read/update return: the inputs plus what only the host knows. FROZEN key names: vmid, vmName, vmNameChosenBy (old state). */
export interface ProxmoxProxyOutputs extends ProxmoxProxyInputs {
  vmid: number;
  /** The node, under the name KvmProxy uses for its host. */
  host: string;
  ip: string | null;
  mac: string | null;
  /** running | paused | stopped | locked (<lock>) */
  state: string;
  /** http://ip:port once the address is known. */
  endpoint: string | null;
  seedVolume: string;
  seedSha256: string;
  createdAt: string;
  /** What the egress check saw at create (see common/egress.ts); absent in older state. */
  egressIp?: string | null;
  checkedAt?: string | null;
  /** With "ipv6" in ipFamilies: the VM's IPv6 address, and what the egress check saw over IPv6. */
  ipv6Address?: string | null;
  egressIpv6?: string | null;
  /** With egressCheck.ipv6Prefix: how many distinct exit addresses the IPv6 samples saw at create. */
  egressIpv6Distinct?: number | null;
  /** What the last egress re-check found wrong (common/egress-recheck.ts); null or absent when none. */
  egressProblem?: EgressProblem | null;
}

/**
 * Validates inputs that may hold unknown values (preview): a problem at, or
 * under, an unknown value is not a problem yet.
 */
export function validateInputs(raw: Record<string, unknown>): ValidationResult<ProxmoxProxyInputs> {
  return validateWithUnknowns(
    proxmoxProxyInputsSchema,
    raw,
    "ProxmoxProxy",
    "docs/proxmox.md",
  ) as ValidationResult<ProxmoxProxyInputs>;
}

/** Tags as Proxmox stores them (F9: folded, `;`-separated), our mark tag first, compared as sets (rule 7). */
export function normalizeTags(tags: readonly string[]): string[] {
  return [...new Set(tags.map((tag) => tag.toLowerCase()))].sort();
}
