/**
 * What one create attempt made on the host before its domain existed, so a
 * failure can be undone exactly: this attempt's volumes, never a volume that
 * was there before it (an overlay an earlier attempt left is reused, and it
 * stays). Once the domain is defined nothing is undone here: the resource is
 * handed to Pulumi as a partial create instead (see provider.ts).
 */
import { allSettledOrFirstFailure } from "../common/settled";
import type { StoragePoolHandle } from "../libvirt-rpc-xdr";
import { outcomeUnknown } from "./classify";
import type { LibvirtHost } from "./host";

export type UndoOutcome = { undone: true; removed: string[] } | { undone: false; reason: string };

export class CreateAttempt {
  private readonly volumes: string[] = [];
  private defineSent = false;

  constructor(readonly pool: StoragePoolHandle) {}

  /**
   * Called just before the call that creates a volume this attempt established
   * was absent: a reply lost with the link may still have created it.
   */
  creating(volumeName: string): void {
    this.volumes.push(volumeName);
  }

  /** The create found a volume of that name already there (an earlier attempt's): it is not this attempt's. */
  foundExisting(volumeName: string): void {
    const index = this.volumes.lastIndexOf(volumeName);
    if (index >= 0) this.volumes.splice(index, 1);
  }

  /**
   * Runs steps that make things side by side. When one fails, the others
   * are waited for before the first failure is thrown, so an undo never runs
   * while a call that may still make something is in flight.
   */
  async together<T extends readonly unknown[]>(steps: {
    [K in keyof T]: Promise<T[K]>;
  }): Promise<T> {
    return allSettledOrFirstFailure<T>(steps);
  }

  /** Called just before the define call, for the same reason. */
  defining(): void {
    this.defineSent = true;
  }

  get madeSomething(): boolean {
    return this.volumes.length > 0 || this.defineSent;
  }

  /**
   * Removes this attempt's volumes after `failure`, on `host` (a budget of its
   * own: the create's deadline may be what ran out). A define whose answer was
   * lost may have happened: then the domain is looked up first, and if it
   * exists nothing is removed (a defined domain is recorded, not undone).
   * Throws when the host cannot be reached or a removal fails.
   */
  async undo(host: LibvirtHost, vmName: string, failure: unknown): Promise<UndoOutcome> {
    if (this.defineSent && outcomeUnknown(failure)) {
      if ((await host.findDomain(vmName)) !== undefined)
        return {
          undone: false,
          reason: `domain ${vmName} was defined although its answer was lost`,
        };
    }
    const removed: string[] = [];
    for (const name of this.volumes)
      if (await host.deleteVolumeNamed(this.pool, name)) removed.push(name);
    return { undone: true, removed };
  }
}
