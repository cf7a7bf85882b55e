// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import { Deadline } from "../common/deadline";
import { buildNoCloudSeed } from "../nocloud";
import { ProxmoxClient, segment } from "./client";
import { waitForTask } from "./tasks";

/** One seed ISO per VM, named after it, on the dedicated ISO storage (rule 11). */
function seedFileName(vmName: string): string {
  return `${vmName}-seed.iso`;
}

export function seedVolumeId(seedStorage: string, vmName: string): string {
  return `${seedStorage}:iso/${seedFileName(vmName)}`;
}

export interface SeedSpec {
  node: string;
  seedStorage: string;
  vmName: string;
  userData?: string;
  vendorData?: string;
  installGuestAgent: boolean;
}

export interface UploadedSeed {
  volumeId: string;
  sha256: string;
}

/**
 * Always rebuilds and uploads the seed: a re-upload silently overwrites (F12,
 * rule 5), and a seed cut short by a crash is repaired by the next attempt.
 * The imgcopy task is waited for: the config write that attaches the ISO
 * needs the file to exist.
 */
export async function uploadSeed(
  client: ProxmoxClient,
  spec: SeedSpec,
  deadline: Deadline,
): Promise<UploadedSeed> {
  const seed = buildNoCloudSeed({
    vmName: spec.vmName,
    ...(spec.userData === undefined ? {} : { userData: spec.userData }),
    ...(spec.vendorData === undefined ? {} : { vendorData: spec.vendorData }),
    installGuestAgent: spec.installGuestAgent,
  });
  const upid = await client.upload<string>(
    `/nodes/${segment(spec.node)}/storage/${segment(spec.seedStorage)}/upload`,
    {
      fields: [["content", "iso"]],
      fileField: "filename",
      fileName: seedFileName(spec.vmName),
      content: seed.image.toBuffer(),
    },
    { timeoutMs: deadline.capped(120_000) },
  );
  await waitForTask(client, upid, { deadline });
  return { volumeId: seedVolumeId(spec.seedStorage, spec.vmName), sha256: seed.sha256 };
}

/** An imgdel task (F13); deleting a seed that is already gone still ends OK. */
export async function deleteSeed(
  client: ProxmoxClient,
  node: string,
  volumeId: string,
  deadline: Deadline,
): Promise<void> {
  const storage = volumeId.split(":")[0];
  const upid = await client.delete<string>(
    `/nodes/${segment(node)}/storage/${segment(storage)}/content/${segment(volumeId)}`,
    {},
    { timeoutMs: deadline.capped(30_000) },
  );
  await waitForTask(client, upid, { deadline });
}
