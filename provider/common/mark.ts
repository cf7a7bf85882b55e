import { packageVersion } from "./version";

/**
 * The ownership mark: how a VM, volume or seed says "egress-proxies made me, for
 * this stack". libvirt carries it as a namespaced `<metadata>` element, Proxmox
 * as a tag plus a block in the VM description. Read, delete and the reaper
 * refuse anything without our mark or with another stack's.
 *
 * Ownership is decided by project + stack. The resource name is recorded for
 * people and the reaper's report, but a renamed (aliased) Pulumi resource keeps
 * its VM, so it does not take part in the decision.
 */
export interface OwnerIdentity {
  project: string;
  stack: string;
  resource: string;
}

export interface OwnershipMark {
  managed: true;
  owner: OwnerIdentity;
  /** ISO 8601, UTC, millisecond precision, as `Date#toISOString` writes it (MARK_TIME_EXAMPLE). */
  createdAt: string;
  packageVersion: string;
  /**
   * The creating arguments the host cannot report (a Proxmox VM does not say
   * which template it was cloned from), as flat strings, so `.get` can report
   * them and adoption compares equal (docs/proxmox.md 6a, docs/kvm.md
   * "Adopting a VM"). Written after the frozen fields; absent in marks written
   * before 0.x of issue 20, which still parse. Never a secret: it is
   * plaintext on the host.
   */
  creation?: Readonly<Record<string, string>>;
}

export type MarkReading =
  | { kind: "marked"; mark: OwnershipMark }
  | { kind: "unmarked" }
  | { kind: "corrupt"; reason: string };

export type Ownership = "ours" | "foreign" | "unmarked" | "corrupt";

/**
 * FROZEN, all four and FIELD_ORDER: the libvirt metadata element's namespace and
 * prefix, the Proxmox tag and the description block's header and field names
 * are written on every existing VM; changing one orphans them all (read,
 * delete and the reaper would no longer know them). Add fields, never rename.
 */
export const MARK_XML_NAMESPACE = "urn:egress-proxies:ownership:1";
export const MARK_XML_PREFIX = "egress";
export const MARK_TAG = "egress-proxies";
const TEXT_HEADER = "[egress-proxies]";

const FIELD_ORDER = ["managed", "project", "stack", "resource", "createdAt", "version"] as const;
type MarkField = (typeof FIELD_ORDER)[number];

/** A creation field's name: letters only (the text form's parser reads `[A-Za-z]+=`), never a frozen field's. */
const CREATION_FIELD = /^[A-Za-z]+$/;
const isCreationField = (key: string): boolean =>
  CREATION_FIELD.test(key) && !(FIELD_ORDER as readonly string[]).includes(key);

export function createMark(
  owner: OwnerIdentity,
  now: Date = new Date(),
  creation?: Readonly<Record<string, string>>,
): OwnershipMark {
  const mark: OwnershipMark = {
    managed: true,
    owner: { ...owner },
    createdAt: now.toISOString(),
    packageVersion,
  };
  if (creation === undefined) return mark;
  for (const key of Object.keys(creation))
    if (!isCreationField(key)) throw new Error(`mark creation field ${JSON.stringify(key)}`);
  return { ...mark, creation: { ...creation } };
}

/**
 * Flat string fields: XML attributes for libvirt, `key=value` lines for
 * Proxmox. The frozen fields first, in FIELD_ORDER, then the creation fields.
 */
export function markToFields(
  mark: OwnershipMark,
): Record<MarkField, string> & Record<string, string> {
  return {
    managed: "true",
    project: mark.owner.project,
    stack: mark.owner.stack,
    resource: mark.owner.resource,
    createdAt: mark.createdAt,
    version: mark.packageVersion,
    ...creationFields(mark),
  };
}

/** The creation fields a mark carries, frozen names left out (they cannot be overwritten). */
function creationFields(mark: OwnershipMark): Record<string, string> {
  return Object.fromEntries(
    Object.entries(mark.creation ?? {}).filter(([key]) => isCreationField(key)),
  );
}

export function markFromFields(fields: Partial<Record<string, string>>): MarkReading {
  if (fields.managed === undefined) return { kind: "unmarked" };
  if (fields.managed !== "true")
    return { kind: "corrupt", reason: `managed=${JSON.stringify(fields.managed)}` };
  for (const key of ["project", "stack", "resource", "createdAt"] as const) {
    if (!fields[key]) return { kind: "corrupt", reason: `${key} is missing` };
  }
  if (Number.isNaN(Date.parse(fields.createdAt!)))
    return {
      kind: "corrupt",
      reason: `createdAt ${JSON.stringify(fields.createdAt)} is not a date`,
    };
  const mark: OwnershipMark = {
    managed: true,
    owner: { project: fields.project!, stack: fields.stack!, resource: fields.resource! },
    createdAt: fields.createdAt!,
    packageVersion: fields.version ?? "unknown",
  };
  // Every other field is a creation field; a mark from before they existed has none.
  const creation = Object.entries(fields).filter(
    (entry): entry is [string, string] => isCreationField(entry[0]) && typeof entry[1] === "string",
  );
  return {
    kind: "marked",
    mark: creation.length === 0 ? mark : { ...mark, creation: Object.fromEntries(creation) },
  };
}

/**
 * A text block for free-form descriptions (Proxmox). Values are percent-encoded
 * so a resource name with newlines or '=' cannot forge or break a field.
 */
export function markToText(mark: OwnershipMark): string {
  return [
    TEXT_HEADER,
    ...Object.entries(markToFields(mark)).map(
      ([key, value]) => `${key}=${encodeURIComponent(value)}`,
    ),
  ].join("\n");
}

/** Finds our block inside a description that may hold other text around it. */
export function markFromText(text: string | undefined): MarkReading {
  if (!text) return { kind: "unmarked" };
  const lines = text.split(/\r?\n/);
  const start = lines.findIndex((line) => line.trim() === TEXT_HEADER);
  if (start < 0) return { kind: "unmarked" };
  const fields: Record<string, string> = {};
  for (const line of lines.slice(start + 1)) {
    const match = /^\s*([A-Za-z]+)=(.*)$/.exec(line);
    if (!match) break;
    try {
      fields[match[1]] = decodeURIComponent(match[2].trim());
    } catch {
      return { kind: "corrupt", reason: `field ${match[1]} is not valid percent-encoding` };
    }
  }
  const reading = markFromFields(fields);
  return reading.kind === "unmarked" ? { kind: "corrupt", reason: "managed is missing" } : reading;
}

export function ownershipOf(
  reading: MarkReading,
  expected: Pick<OwnerIdentity, "project" | "stack">,
): Ownership {
  if (reading.kind !== "marked") return reading.kind;
  const { owner } = reading.mark;
  return owner.project === expected.project && owner.stack === expected.stack ? "ours" : "foreign";
}

export function describeOwner(owner: OwnerIdentity): string {
  return `${owner.project}/${owner.stack} (resource ${owner.resource})`;
}

/** Frozen: the one form a creation time is written in, and the only one read back. */
export const MARK_TIME_EXAMPLE = "2026-01-31T12:00:00.000Z";
const MARK_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/;

/**
 * A creation time in the documented form, in epoch ms; undefined for anything
 * else. Strict on purpose: `Date.parse` reads "1" as the year 2001 and
 * "2026-02-30" as March 2nd, and an age made up that way could get a VM reaped.
 */
export function parseMarkTime(text: string | undefined): number | undefined {
  if (text === undefined || !MARK_TIME.test(text)) return undefined;
  const time = Date.parse(text);
  // The round trip refuses dates the calendar does not have (February 30th, hour 24).
  return !Number.isNaN(time) && new Date(time).toISOString() === text ? time : undefined;
}

/**
 * Age in milliseconds of a creation time, or undefined when it is not in the
 * documented form or lies in the future: such an item is never "old enough"
 * to reap.
 */
export function ageSinceMs(
  createdAt: string | undefined,
  now: Date = new Date(),
): number | undefined {
  const created = parseMarkTime(createdAt);
  if (created === undefined) return undefined;
  const age = now.getTime() - created;
  return age < 0 ? undefined : age;
}

export function markAgeMs(mark: OwnershipMark, now: Date = new Date()): number | undefined {
  return ageSinceMs(mark.createdAt, now);
}
