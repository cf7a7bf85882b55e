/**
 * Adoption by `ProxmoxProxy.get`: the creating arguments PVE cannot report,
 * kept in the VM's ownership mark (common/mark.ts, `creation`) so an adopted
 * VM reads back as the program that made it declares it (docs/proxmox.md,
 * 6a). Pure.
 *
 * FROZEN, the field names and value forms below: they are written into the
 * description of every VM created since; add fields, never rename.
 */
import type { OwnershipMark } from "../common/mark";
import type { ProxmoxProxyInputs } from "./schema";

type Props = Record<string, unknown>;

/**
 * The optional "as cloned" inputs: unset leaves the template's value, so the
 * host's value is reported only for those the creating program set.
 */
export const AS_CLONED_KEYS = ["bridge", "vlanTag", "diskGiB"] as const;

/** What create writes into the mark: nothing secret (userData and the token stay out). */
export function creationOf(spec: ProxmoxProxyInputs): Record<string, string> {
  const creation: Record<string, string> = {
    templateVmid: String(spec.templateVmid),
    diskStorage: spec.diskStorage,
    seedStorage: spec.seedStorage,
    vmidRange: `${spec.vmidRange.first}-${spec.vmidRange.last}`,
    installGuestAgent: String(spec.installGuestAgent),
  };
  if (spec.vmNameChosenBy !== undefined) creation.vmNameChosenBy = spec.vmNameChosenBy;
  // The value is the one asked for; read reports the host's (drift shows).
  for (const key of AS_CLONED_KEYS) if (spec[key] !== undefined) creation[key] = String(spec[key]);
  return creation;
}

export interface AdoptedCreation {
  /** The creating inputs the mark holds, in the inputs' own types. */
  inputs: Props;
  /** The "as cloned" inputs the creating program set: the host's value is reported for these. */
  asClonedSet: ReadonlySet<string>;
}

/**
 * What a mark says about the VM's creation, or undefined for a mark written
 * before creation fields existed: then these inputs stay out of the adopted
 * state, and diff leaves them out of the comparison (common/diff.ts).
 * A field that does not parse is left out the same way.
 */
export function adoptedCreation(mark: OwnershipMark): AdoptedCreation | undefined {
  const creation = mark.creation;
  if (creation?.templateVmid === undefined) return undefined;
  const inputs: Props = {};
  const whole = (text: string | undefined) =>
    text !== undefined && /^\d+$/.test(text) ? Number(text) : undefined;
  setIfDefined(inputs, "templateVmid", whole(creation.templateVmid));
  setIfDefined(inputs, "diskStorage", creation.diskStorage);
  setIfDefined(inputs, "seedStorage", creation.seedStorage);
  const range = /^(\d+)-(\d+)$/.exec(creation.vmidRange ?? "");
  if (range !== null) inputs.vmidRange = { first: Number(range[1]), last: Number(range[2]) };
  if (creation.installGuestAgent === "true" || creation.installGuestAgent === "false")
    inputs.installGuestAgent = creation.installGuestAgent === "true";
  if (creation.vmNameChosenBy === "user" || creation.vmNameChosenBy === "provider")
    inputs.vmNameChosenBy = creation.vmNameChosenBy;
  return {
    inputs,
    asClonedSet: new Set(AS_CLONED_KEYS.filter((key) => creation[key] !== undefined)),
  };
}

function setIfDefined(props: Props, key: string, value: unknown): void {
  if (value !== undefined) props[key] = value;
}

/**
 * Create adopting a VM it finds by name (a `.get` turned into `new`, a resumed
 * create): the VM must be the one the program describes. What its disk was
 * cloned from and onto cannot change in place, so a mark that says otherwise
 * is refused rather than recorded as the program's; undefined when it agrees
 * or does not say (an older mark).
 */
export function creationMismatch(
  mark: OwnershipMark,
  spec: ProxmoxProxyInputs,
): string | undefined {
  const creation = mark.creation ?? {};
  const differing = (["templateVmid", "diskStorage"] as const).filter(
    (key) => creation[key] !== undefined && creation[key] !== String(spec[key]),
  );
  if (differing.length === 0) return undefined;
  const said = differing.map((key) => `${key} ${creation[key]}`).join(", ");
  const asked = differing.map((key) => `${key} ${String(spec[key])}`).join(", ");
  return `its mark says it was made with ${said}, but the program asks for ${asked}; declare it with the values it was made with, or choose another vmName`;
}
