/** ProxmoxProxy update: what changes in place (config, power, autostart, guest files), and the egress heal. Facts (Fn) and rules: docs/proxmox.md. */
import { plainJson as plain } from "../common/check";
import { sameValue } from "../common/diff";
import { isPermanent, withContext } from "../common/errors";
import { MARK_TAG } from "../common/mark";
import {
  carriedOutputs,
  continueCreate as continueCreateOf,
  deadlineFor,
} from "../common/lifecycle";
import { isIncompleteCreate, PartialCreateError } from "../common/partial-create";
import { restartAdmitted } from "../common/disruption-rules";
import { EgressHealFailedError, needsEgressRestart } from "../common/egress-recheck";
import { egressAtReadiness } from "../common/egress";
import { ReplaceOnNextUpError } from "../common/replacement";
import { deliverGuestFiles, documentKept, guestFilesToDeliver } from "../common/guest-files";
import { guestChannelOfVm } from "./guest-files";
import { FormFields } from "./client";
import { ProxmoxProxyOutputs } from "./schema";
import { tagsValue } from "./vm-config";
import { powerOffVm, startVm, writeConfig } from "./vm";
import {
  CARRIED_KEYS,
  Props,
  checkedInputs,
  clientFor,
  parseResourceId,
  progress,
  stepsWithin,
} from "./steps";
import { becomeReady, createSteps } from "./create";

/**
 * In place: the tags and onboot (metadata, one config write), and the VM's
 * power: started again when a refresh found it stopped (then readiness and
 * the egress check, as at create), or stopped on request. A partial create in
 * state is the exception: the engine calls update on it at the next `up`, and
 * update continues the create on the VMID state records.
 */
export async function update(id: string, olds: Props, news: Props): Promise<{ outs: Props }> {
  if (isIncompleteCreate(olds))
    return continueCreateOf(id, news, (inputs) => createSteps(inputs, parseResourceId(id)));
  const spec = checkedInputs(news);
  const ref = parseResourceId(id);
  const deadline = deadlineFor(spec.timeouts, "create");
  const step = stepsWithin(deadline, spec.vmName);
  const context = { operation: "update", resource: `VM ${ref.vmid} on node ${ref.node}` };
  const client = clientFor(spec);
  const changes: FormFields = {};
  if (!sameValue(olds.tags, spec.tags)) changes.tags = tagsValue([MARK_TAG, ...spec.tags]);
  // Absent in state written before it existed: PVE's value is unknown, so it is written.
  if (olds.startOnBoot !== spec.startOnBoot) changes.onboot = spec.startOnBoot ? 1 : 0;
  const carried = carriedOutputs(olds, spec, CARRIED_KEYS) as unknown as ProxmoxProxyOutputs;
  const restart = needsEgressRestart(olds, spec) && restartAdmitted(news);
  const files = guestFilesToDeliver(olds, spec);
  // A VM left stopped gets its files when it runs again: state keeps what it has until then.
  if (files !== undefined && !spec.running) Object.assign(carried, documentKept(olds));
  const deliver = async () => {
    if (files === undefined || !spec.running) return;
    progress(spec.vmName, `delivering ${files.files.length} guest file(s) into VMID ${ref.vmid}`);
    await step("deliver guest files", () =>
      deliverGuestFiles(guestChannelOfVm(client, ref, deadline), files, context.resource),
    );
  };
  try {
    if (Object.keys(changes).length > 0)
      await step("write config", () => writeConfig(client, ref, changes, deadline));
    if (olds.running === spec.running && !restart) {
      await deliver();
      return { outs: plain({ ...carried }) };
    }
    if (!spec.running) {
      progress(spec.vmName, `shutting down VMID ${ref.vmid} (running: false)`);
      const how = await step("shut down", () => powerOffVm(client, ref, deadline));
      if (how === "stopped")
        progress(spec.vmName, `VMID ${ref.vmid} did not shut down in its grace period: stopped`);
      return { outs: plain({ ...carried, state: "stopped", ip: null, endpoint: null }) };
    }
    if (restart) {
      // squid does not answer on a running VM: shut down (a hung guest is stopped after the grace), then start.
      progress(spec.vmName, `restarting VMID ${ref.vmid} (refresh found its proxy not answering)`);
      await step("shut down", () => powerOffVm(client, ref, deadline));
    } else progress(spec.vmName, `starting VMID ${ref.vmid} again (refresh found it not running)`);
    await step("start", () => startVm(client, ref, deadline));
    const startedAt = Date.now();
    const running = { ...carried, state: "running" };
    const ready = await becomeReady(client, spec, ref, running).catch((error: unknown) => {
      // At create this records a partial VM; here the VM is in state already: the cause is the error.
      const cause = error instanceof PartialCreateError ? (error.cause ?? error) : error;
      // Its readiness budget spent: starting it again did not heal it; stored marked, the next up replaces it.
      const spent = Math.round((Date.now() - startedAt) / 1000);
      if (isPermanent(cause) || spent < spec.timeouts.readySeconds - 2) throw cause;
      throw new ReplaceOnNextUpError(
        id,
        plain(running),
        `it was not ready ${spent} s after \`up\` started it again`,
        cause as Error,
        news,
      );
    });
    const egress = await egressAtReadiness(ready.ip, spec, deadline, ready.ipv6Address);
    await deliver();
    return { outs: plain({ ...ready, ...egress, egressProblem: null }) };
  } catch (error) {
    if (restart) {
      // The re-check's restart did not heal it, ready or not: its rule replaces the VM new-VM-first
      // at the next refresh + up (egress-recheck.ts), gentler than the delete-first repair.
      const cause = error instanceof ReplaceOnNextUpError ? (error.cause ?? error) : error;
      throw new EgressHealFailedError(id, { ...carried }, withContext(cause, context), news);
    }
    throw error instanceof ReplaceOnNextUpError ? error : withContext(error, context);
  }
}
