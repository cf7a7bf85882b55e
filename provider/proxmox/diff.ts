import { decideDiff, type ChangeTableOf, type DiffDecision } from "../common/diff";
import { ProxmoxProxyInputs } from "./schema";

export type { DiffDecision };

/**
 * The decision table: which input changes replace the VM and which update in
 * place. Anything about the VM itself (where it lives, what it is cloned
 * from, its size, network and cloud-init) replaces; how we reach the API,
 * tags, readiness and timeouts update in place.
 */
export const PROXMOX_CHANGE_TABLE: ChangeTableOf<ProxmoxProxyInputs, "guestFiles"> = {
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
  // The seed's network-config and net0's MAC follow them (common/ip-families.ts).
  ipFamilies: "replace",
  ipv6: "replace",
  userData: "replace",
  vendorData: "replace",
  installGuestAgent: "replace",
  // Delivered into the running guest (common/guest-files.ts, which also decides what userData does then).
  "guestFiles.files": "update",
  "guestFiles.commands": "update",
  "guestFiles.listensOn": "update",
  "guestFiles.userDataIdentity": "replace",
  apiToken: "update",
  caCertPem: "update",
  insecure: "update",
  tags: "update",
  rotation: "replace",
  startOnBoot: "update",
  running: "update",
  egressRecheck: "update",
  rotateAfterDays: "update",
  readiness: "update",
  egressCheck: "update",
  timeouts: "update",
  owner: "update",
  // Touches no VM; state must hold it, since a delete reads its drain from there.
  disruptionBudget: "update",
};

/**
 * Pure and offline. `olds` are the previous outputs (which carry the checked
 * inputs), `news` the checked new inputs, possibly with unknown values. A
 * state `ProxmoxProxy.get` adopted compares only what it holds (the adoption
 * rule in common/diff.ts; docs/proxmox.md 6a).
 */
export function decideProxmoxDiff(
  olds: Record<string, unknown>,
  news: Record<string, unknown>,
): DiffDecision {
  return decideDiff(PROXMOX_CHANGE_TABLE, olds, news);
}
