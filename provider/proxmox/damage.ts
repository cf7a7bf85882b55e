/**
 * What refresh finds broken beyond an in-place heal (see
 * common/replacement.ts): a VM without its boot disk, or whose seed ISO is
 * gone from its storage, cannot start again (PVE refuses a missing cdrom
 * volume); a VM deleted by hand leaves its seed ISO behind (`qm destroy`
 * removes the VM's disks, not an ISO on another storage), so the resource
 * stays in state, marked, and the replacement's delete removes the seed.
 */
import type { Deadline } from "../common/deadline";
import { type ProxmoxClient, segment } from "./client";
import { bootDisk } from "./vm-config";
import { sharedIsoContent } from "./node-listings";

const CALL_MS = 30_000;

/**
 * Whether the seed ISO is on its storage: one listing of the storage's ISO
 * content, shared by the Reads of the node's members (node-listings.ts).
 */
export async function seedIsPresent(
  client: ProxmoxClient,
  node: string,
  seedVolume: string,
  deadline: Deadline,
): Promise<boolean> {
  const storage = seedVolume.split(":")[0] ?? "";
  const volumes = await sharedIsoContent(client.listingScope, node, storage, async () => {
    const content = await client.get<Array<{ volid?: string }>>(
      `/nodes/${segment(node)}/storage/${segment(storage)}/content`,
      { content: "iso" },
      { timeoutMs: deadline.capped(CALL_MS) },
    );
    return new Set(content.flatMap((entry) => (entry.volid === undefined ? [] : [entry.volid])));
  });
  return volumes.has(seedVolume);
}

/** Why a VM found on the node must be replaced, or undefined when it can be healed in place. */
export function brokenVmReason(
  config: Record<string, string | undefined>,
  seedVolume: string,
  seedPresent: boolean,
): string | undefined {
  const missing = [
    ...(bootDisk(config) === undefined ? ["its boot disk"] : []),
    ...(seedPresent ? [] : [`its seed ${seedVolume}`]),
  ];
  return missing.length === 0
    ? undefined
    : `refresh found ${missing.join(" and ")} gone (deleted by hand?): the VM cannot start again`;
}

export const vmGoneReason = (vmid: number, seedVolume: string): string =>
  `refresh found VM ${vmid} gone (deleted by hand?) but its seed ${seedVolume} left behind`;
