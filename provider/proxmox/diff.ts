import { containsUnknown, ProxmoxProxyInputs } from "./schema";

export type ChangeKind = "replace" | "update";

/**
 * The decision table: which input changes replace the VM and which update in
 * place. Anything about the VM itself (where it lives, what it is cloned
 * from, its size, network and cloud-init) replaces; how we reach the API,
 * tags, readiness and timeouts update in place.
 */
export const CHANGE_KIND: Record<keyof ProxmoxProxyInputs, ChangeKind> = {
  apiEndpoint: "replace",
  node: "replace",
  templateVmid: "replace",
  diskStorage: "replace",
  seedStorage: "replace",
  vmidRange: "replace",
  vmName: "replace",
  cores: "replace",
  memoryMiB: "replace",
  diskGiB: "replace",
  bridge: "replace",
  vlanTag: "replace",
  userData: "replace",
  vendorData: "replace",
  installGuestAgent: "replace",
  apiToken: "update",
  caCertPem: "update",
  insecure: "update",
  tags: "update",
  readiness: "update",
  timeouts: "update",
  owner: "update",
  vmNameChosenBy: "update",
};

export interface DiffDecision {
  changes: boolean;
  replaces: string[];
  deleteBeforeReplace: boolean;
}

/**
 * Pure and offline. `olds` are the previous outputs (which carry the checked
 * inputs), `news` the checked new inputs, possibly with unknown values.
 */
export function decideDiff(
  olds: Record<string, unknown>,
  news: Record<string, unknown>,
): DiffDecision {
  const changed: string[] = [];
  for (const key of Object.keys(CHANGE_KIND) as Array<keyof ProxmoxProxyInputs>) {
    if (key === "vmNameChosenBy") continue;
    const before = olds[key];
    const after = news[key];
    if (containsUnknown(after) || !sameValue(before, after)) changed.push(key);
  }
  // New provider code must reach state even when no input changed.
  const providerChanged = olds.__provider !== undefined && news.__provider !== olds.__provider;
  const replaces = changed.filter(
    (key) => CHANGE_KIND[key as keyof ProxmoxProxyInputs] === "replace",
  );
  // A name the user fixed cannot exist twice: the old VM must go first.
  const deleteBeforeReplace =
    replaces.length > 0 && news.vmNameChosenBy === "user" && news.vmName === olds.vmName;
  return { changes: changed.length > 0 || providerChanged, replaces, deleteBeforeReplace };
}

/** Structural equality where undefined, null and a missing key are the same, and key order does not matter. */
export function sameValue(a: unknown, b: unknown): boolean {
  if (a === undefined || a === null) return b === undefined || b === null;
  if (b === undefined || b === null) return false;
  if (Array.isArray(a) || Array.isArray(b)) {
    if (!Array.isArray(a) || !Array.isArray(b) || a.length !== b.length) return false;
    return a.every((item, index) => sameValue(item, b[index]));
  }
  if (typeof a === "object" && typeof b === "object") {
    const keys = new Set([...Object.keys(a as object), ...Object.keys(b as object)]);
    for (const key of keys)
      if (!sameValue((a as Record<string, unknown>)[key], (b as Record<string, unknown>)[key]))
        return false;
    return true;
  }
  return a === b;
}
