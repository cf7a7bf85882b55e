import { checkWithAutonaming } from "../common/check";
import { containsUnknown } from "../common/inputs";
import { rememberGoneHosts } from "../common/gone-hosts";
import { budgetedSteps } from "../common/disruption-rules";
import { changeTableWithGuestFiles } from "../common/guest-files";
import { deleteForServer } from "../common/lifecycle";
import { decideMemberDiff } from "../common/state-rules";
import { rememberProviderConfig } from "./connection";
import { DiffDecision, PROXMOX_CHANGE_TABLE } from "./diff";
import { CheckFailure, normalizeTags, validateInputs } from "./schema";
import { create as createVm } from "./create";
import { remove as removeVm } from "./delete";
import { read as readVm } from "./read";
import { update as updateVm } from "./update";
import type { Props } from "./steps";

/**
 * ProxmoxProxy's check/diff/create/read/update/delete: check and diff here,
 * the others each a short story in a module of its own (create.ts, read.ts,
 * update.ts, delete.ts) over the steps in vm.ts and seed.ts. The flow, the facts (Fn) and the rules are
 * those of docs/proxmox.md, "Proxmox VE behaviours we rely on".
 *
 * FROZEN: this module's path (dist/provider/proxmox/provider.js); the exports
 * configure, check, diff, create, read, update and delete, which the
 * dynamic-provider server calls on this module (it is the provider stored in
 * every state, resource.ts); and remove and deleteProxy, which closures
 * stored up to 0.1.0 call (docs/frozen-api.md).
 */

/** Each step within the disruption budget (common/disruption-rules.ts). */
export const { create, read, update, remove } = budgetedSteps({
  create: createVm,
  read: readVm,
  update: updateVm,
  remove: removeVm,
});
export { parseResourceId, PROXMOX_OUTPUT_KEYS, resourceId } from "./steps";

// ---------------------------------------------------------------- configure

export async function configure(request: {
  config?: { get(key: string): string | undefined };
}): Promise<void> {
  rememberProviderConfig(request.config);
  rememberGoneHosts(request.config);
}

// ---------------------------------------------------------------- check / diff: offline and pure

export async function check(
  olds: Props,
  news: Props,
): Promise<{ inputs: Props; failures: CheckFailure[] }> {
  const table = changeTableWithGuestFiles(PROXMOX_CHANGE_TABLE, olds, news);
  return checkWithAutonaming(table, olds, news, validateInputs, (inputs) => ({
    ...inputs,
    // At preview the list may be unknown, or hold an unknown tag: kept as given.
    tags: containsUnknown(inputs.tags) ? inputs.tags : normalizeTags(inputs.tags),
  }));
}

export async function diff(_id: string, olds: Props, news: Props): Promise<DiffDecision> {
  return decideMemberDiff(changeTableWithGuestFiles(PROXMOX_CHANGE_TABLE, olds, news), olds, news);
}

/**
 * FROZEN: `remove` under the name the provider code stored in state by
 * earlier releases calls (KvmProxy and StaticProxy always said `remove`).
 */
export const deleteProxy = remove;

/**
 * FROZEN: what the dynamic-provider server calls to delete, on the stored
 * provider that since this release is this module itself (resource.ts).
 */
const deleteProxyForServer = deleteForServer(remove);
export { deleteProxyForServer as delete };
