// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import { Deadline } from "../common/deadline";
import { buildNoCloudSeed } from "../nocloud";
import { ProxmoxClient, segment } from "./client";
import { StartedTask, waitForStarted, waitForTask } from "./tasks";

/** One seed ISO per VM, named after it, on the dedicated ISO storage (docs/proxmox.md section 9, rule 11). */
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
  /** With "ipv6" in ipFamilies: the network-config that turns IPv6 on (common/ip-families.ts). */
  networkConfig?: string;
}

export interface UploadedSeed {
  volumeId: string;
  sha256: string;
}

/**
 * The seed upload of one create. It needs no VM, so create starts it as soon
 * as Proxmox accepts the clone and lets it run beside the clone task; an
 * adopted VM gets it afterwards. Always rebuilt and uploaded: a re-upload
 * silently overwrites (F12, rule 5), and a seed cut short by a crash is
 * repaired by the next attempt. The imgcopy task is waited for: the config
 * write that attaches the ISO needs the file to exist.
 */
export class SeedUpload {
  /** The upload request sent early, until `result` takes it over. */
  private early: Promise<PostedSeed> | undefined;
  /** Every upload request of this create, each handled: an early one may fail before anyone asks. */
  private readonly posted: Array<Promise<PostedSeed | undefined>> = [];

  constructor(
    private readonly client: ProxmoxClient,
    private readonly spec: SeedSpec,
    private readonly deadline: Deadline,
    private readonly onStart: () => void = () => undefined,
  ) {}

  /** Sends the upload now (once); its task is not waited for until `result`. */
  startEarly(): void {
    if (this.posted.length === 0) this.early = this.post();
  }

  /**
   * The uploaded seed, its task waited for: the early upload the first time
   * (its task, older by then, is asked about at once); a retry uploads again.
   */
  async result(): Promise<UploadedSeed> {
    const early = this.early;
    this.early = undefined;
    const posted = await (early ?? this.post());
    await waitForStarted(this.client, posted.task, this.deadline);
    return {
      volumeId: seedVolumeId(this.spec.seedStorage, this.spec.vmName),
      sha256: posted.sha256,
    };
  }

  /**
   * The clone failed and left no VM: a seed uploaded beside it goes too, once
   * its copy has ended, best effort (deleting a missing volume ends OK, F13).
   */
  async discard(): Promise<void> {
    const accepted = (await Promise.all(this.posted)).filter((posted) => posted !== undefined);
    if (accepted.length === 0) return;
    const removal = new Deadline(30_000, "the 30 s removal of a failed clone's seed");
    for (const { task } of accepted)
      await waitForStarted(this.client, task, removal).catch(() => undefined);
    await deleteSeed(
      this.client,
      this.spec.node,
      seedVolumeId(this.spec.seedStorage, this.spec.vmName),
      removal,
    ).catch(() => undefined);
  }

  /** Resolves when no upload request of this create is in flight. */
  async settled(): Promise<void> {
    await Promise.all(this.posted);
  }

  private post(): Promise<PostedSeed> {
    this.onStart();
    const posted = (async () => {
      const seed = buildNoCloudSeed({
        vmName: this.spec.vmName,
        ...(this.spec.userData === undefined ? {} : { userData: this.spec.userData }),
        ...(this.spec.vendorData === undefined ? {} : { vendorData: this.spec.vendorData }),
        installGuestAgent: this.spec.installGuestAgent,
        ...(this.spec.networkConfig === undefined
          ? {}
          : { networkConfig: this.spec.networkConfig }),
      });
      const upid = await this.client.upload<string>(
        `/nodes/${segment(this.spec.node)}/storage/${segment(this.spec.seedStorage)}/upload`,
        {
          fields: [["content", "iso"]],
          fileField: "filename",
          fileName: seedFileName(this.spec.vmName),
          content: seed.image.toBuffer(),
        },
        { timeoutMs: this.deadline.capped(120_000) },
      );
      return { task: { upid, startedAt: Date.now() }, sha256: seed.sha256 };
    })();
    this.posted.push(posted.catch(() => undefined));
    return posted;
  }
}

interface PostedSeed {
  task: StartedTask;
  sha256: string;
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
