/** ProxmoxProxy delete: ownership checked, stop, destroy with disks, then the seed. Facts (Fn) and rules: docs/proxmox.md. */
import { Deadline } from "../common/deadline";
import { withContext } from "../common/errors";
import { deadlineFor, type DeleteOutcome } from "../common/lifecycle";
import { isGoneForGood, leaveBehind, withWayOut } from "../common/gone-hosts";
import { ProxmoxClient } from "./client";
import { ConnectionInputs } from "./connection";
import { deleteSeed } from "./seed";
import { destroyVm, getConfig, getStatus, stopVm, VmRef, waitUntilUnlocked } from "./vm";
import {
  Props,
  clientFor,
  ignoreNotFound,
  notFoundAsUndefined,
  parseResourceId,
  progress,
  settingsOf,
  stepsWithin,
} from "./steps";
import { endpointNamesOf, ourVmAt, seedVolumeOf } from "./read";

/**
 * Ownership checked; stop first ("VM is running - destroy failed" otherwise),
 * purge and destroy unreferenced disks, then the seed (an imgdel task, waited
 * for). Idempotent: a VM already gone still gets its seed removed.
 */
export async function remove(id: string, props: Props): Promise<DeleteOutcome> {
  const ref = parseResourceId(id);
  const vmName = String(props.vmName);
  const hostNames = endpointNamesOf(props);
  if (isGoneForGood(hostNames)) {
    leaveBehind(`ProxmoxProxy ${vmName}`, hostNames[1] ?? ref.node, [
      `VM ${ref.vmid} (${vmName}) on node ${ref.node} with its disks`,
      `seed ${seedVolumeOf(props)}`,
    ]);
    return "already gone";
  }
  const client = clientFor(props as ConnectionInputs);
  const deadline = deadlineFor(settingsOf(props).timeouts, "delete");
  try {
    const step = stepsWithin(deadline, vmName);
    let removed = false;
    await step("remove VM", async () => {
      removed = (await removeVm(client, ref, vmName, props, deadline)) || removed;
    });
    const seedVolume = seedVolumeOf(props);
    progress(vmName, `removing the seed ${seedVolume}`);
    await step("remove seed", () => deleteSeed(client, ref.node, seedVolume, deadline));
    return removed ? "removed" : "already gone";
  } catch (error) {
    throw withWayOut(
      withContext(error, {
        operation: "delete",
        resource: `VM ${vmName} (VMID ${ref.vmid}) on node ${ref.node}`,
      }),
      hostNames[1] ?? ref.node,
    );
  }
}

async function removeVm(
  client: ProxmoxClient,
  ref: VmRef,
  vmName: string,
  props: Props,
  deadline: Deadline,
): Promise<boolean> {
  let status = await getStatus(client, ref, deadline).catch(notFoundAsUndefined);
  if (status === undefined) return false;
  if (status.lock !== undefined && status.lock !== "") {
    status = await waitUntilUnlocked(client, ref, deadline).catch(notFoundAsUndefined);
    if (status === undefined) return false;
  }
  const config = await getConfig(client, ref, deadline).catch(notFoundAsUndefined);
  if (config === undefined) return false;
  // Ours is already gone when the VMID holds another VM; never touch theirs.
  if (ourVmAt(config, ref, { ...props, vmName }, false) === undefined) return false;
  if (status.status === "running") {
    progress(vmName, `stopping VMID ${ref.vmid}`);
    await stopVm(client, ref, deadline);
  }
  progress(vmName, `destroying VMID ${ref.vmid}`);
  await destroyVm(client, ref, deadline).catch(ignoreNotFound);
  return true;
}
