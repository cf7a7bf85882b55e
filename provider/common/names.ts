import { createHash, randomBytes } from "node:crypto";
import { PermanentError } from "./errors";

/**
 * VM names end up in libvirt domain names, volume file names, Proxmox VM names,
 * hostnames (cloud-init local-hostname) and DNS. One rule fits all of them: an
 * RFC 1123 DNS label, lower case, at most 63 characters.
 */
const MAX_VM_NAME_LENGTH = 63;
/** 10 base32 characters = 50 bits: a 1e-6 chance of collision needs ~35,000 VMs per prefix. */
const VM_NAME_SUFFIX_LENGTH = 10;

const DNS_LABEL = /^[a-z0-9]([a-z0-9-]*[a-z0-9])?$/;
const BASE32_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567";

/** RFC 4648 base32, lower case, no padding: DNS-safe and free of look-alike case pairs. */
export function base32(bytes: Uint8Array): string {
  let bits = 0;
  let value = 0;
  let out = "";
  for (const byte of bytes) {
    value = (value << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      out += BASE32_ALPHABET[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += BASE32_ALPHABET[(value << (5 - bits)) & 31];
  return out;
}

/**
 * Turns any resource name into a prefix that keeps a full name within 63
 * characters once `-<suffix>` is appended. Deterministic, so the same Pulumi
 * resource name always gives the same prefix.
 */
export function vmNamePrefix(resourceName: string): string {
  const cleaned = resourceName
    .toLowerCase()
    .replace(/[^a-z0-9-]+/g, "-")
    .replace(/-+/g, "-")
    .replace(/^-+|-+$/g, "");
  const room = MAX_VM_NAME_LENGTH - 1 - VM_NAME_SUFFIX_LENGTH;
  const trimmed = cleaned.slice(0, room).replace(/-+$/, "");
  return trimmed === "" ? "proxy" : trimmed;
}

/**
 * `<prefix>-<base32>`. The suffix is derived from `entropy`, so the same bytes
 * give the same name (tests, reproducible plans); pass fresh random bytes for a
 * new resource. Use {@link newVmName} for that.
 */
export function deriveVmName(resourceName: string, entropy: Uint8Array): string {
  const digest = createHash("sha256").update(entropy).digest();
  return `${vmNamePrefix(resourceName)}-${base32(digest).slice(0, VM_NAME_SUFFIX_LENGTH)}`;
}

export function newVmName(resourceName: string): string {
  return deriveVmName(resourceName, randomBytes(16));
}

/** Returns the problem with a user-chosen VM name, or undefined when it is fine. */
export function vmNameProblem(name: string): string | undefined {
  if (name.length === 0) return "must not be empty";
  if (name.length > MAX_VM_NAME_LENGTH)
    return `must be at most ${MAX_VM_NAME_LENGTH} characters (got ${name.length}); shorten it`;
  if (!DNS_LABEL.test(name))
    return "must be a DNS label: lower-case letters, digits and '-', starting and ending with a letter or digit";
  return undefined;
}

export function assertVmName(name: string, field = "vmName"): string {
  const problem = vmNameProblem(name);
  if (problem !== undefined)
    throw new PermanentError(`${field} ${JSON.stringify(name)} ${problem}`);
  return name;
}
