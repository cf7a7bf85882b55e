import { createHash } from "node:crypto";

export interface VmidRange {
  first: number;
  last: number;
}

/**
 * The VMID a VM name prefers: a hash of the name mapped into the range. The
 * same name always prefers the same VMID, so a create resumed after a crash
 * looks in the same place first, and ten parallel creates with different
 * names spread over the range instead of racing for "the next free id".
 */
export function preferredVmid(vmName: string, range: VmidRange): number {
  const size = range.last - range.first + 1;
  const digest = createHash("sha256").update(vmName).digest();
  // 48 bits keep the modulo bias negligible for any range Proxmox allows.
  const value = digest.readUIntBE(0, 6);
  return range.first + (value % size);
}

/**
 * Every VMID of the range, starting at the preferred one and wrapping around:
 * the order in which create tries them when one is taken by someone else.
 */
export function* vmidCandidates(vmName: string, range: VmidRange): Generator<number> {
  const size = range.last - range.first + 1;
  const start = preferredVmid(vmName, range) - range.first;
  for (let offset = 0; offset < size; offset++) yield range.first + ((start + offset) % size);
}
