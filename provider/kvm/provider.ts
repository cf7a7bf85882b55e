/**
 * KvmProxy's dynamic-provider methods: check and diff here, create, read,
 * update and delete each a short story in a module of its own (create.ts,
 * read.ts, update.ts, delete.ts) over the modules they call. check and diff are pure and offline,
 * so `pulumi preview` works in CI without any route to a hypervisor.
 *
 * FROZEN: this module's path (dist/provider/kvm/provider.js); the exports
 * configure, check, diff, create, read, update and delete, which the
 * dynamic-provider server calls on this module (it is the provider stored in
 * every state, resource.ts); and remove, which the closures stored up
 * to 0.1.0 call (docs/frozen-api.md).
 */
import type * as pulumi from "@pulumi/pulumi";
import { checkWithAutonaming } from "../common/check";
import { budgetedSteps } from "../common/disruption-rules";
import { rememberGoneHosts } from "../common/gone-hosts";
import type { CheckFailure } from "../common/inputs";
import { changeTableWithGuestFiles } from "../common/guest-files";
import { deleteForServer } from "../common/lifecycle";
import { decideMemberDiff } from "../common/state-rules";
import { rememberKvmProviderConfig } from "./connect";
import { KVM_CHANGE_TABLE } from "./diff";
import { validateKvmInputs } from "./schema";
import type { Props } from "./steps";

import { create as createVm } from "./create";
import { remove as removeVm } from "./delete";
import { read as readVm } from "./read";
import { update as updateVm } from "./update";

/** Each step within the disruption budget (common/disruption-rules.ts). */
export const { create, read, update, remove } = budgetedSteps({
  create: createVm,
  read: readVm,
  update: updateVm,
  remove: removeVm,
});
export { KVM_OUTPUT_KEYS, setProgressLog, type KvmProxyOutputs, type ProgressLog } from "./steps";

// ---- configure -------------------------------------------------------------------------------------

export async function configure(request: {
  config?: { get(key: string): string | undefined };
}): Promise<void> {
  rememberKvmProviderConfig(request.config);
  rememberGoneHosts(request.config);
}

// ---- check / diff: pure -----------------------------------------------------------------------

export async function check(
  olds: Props,
  news: Props,
): Promise<{ inputs: Props; failures: CheckFailure[] }> {
  return checkWithAutonaming(
    changeTableWithGuestFiles(KVM_CHANGE_TABLE, olds, news),
    olds,
    news,
    validateKvmInputs,
  );
}

export async function diff(
  _id: string,
  olds: Props,
  news: Props,
): Promise<pulumi.dynamic.DiffResult> {
  const decision = decideMemberDiff(
    changeTableWithGuestFiles(KVM_CHANGE_TABLE, olds, news),
    olds,
    news,
  );
  return {
    changes: decision.changes,
    replaces: decision.replaces,
    deleteBeforeReplace: decision.deleteBeforeReplace,
  };
}

/**
 * FROZEN: what the dynamic-provider server calls to delete, on the stored
 * provider that since this release is this module itself (resource.ts).
 */
const deleteProxyForServer = deleteForServer(remove);
export { deleteProxyForServer as delete };
