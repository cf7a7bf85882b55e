/**
 * Changes `update` makes on the host in place: libvirt's autostart flag, and
 * the VM's power (started again after a refresh found it stopped, or shut
 * down on request). Everything else about a KvmProxy replaces it.
 */
import { type Deadline, shutdownGraceMs, sleepWithin } from "../common/deadline";
import type { DomainHandle } from "../libvirt-rpc-xdr";
import type { LibvirtHost } from "./host";
import type { KvmProxyInputs } from "./schema";

type Props = Record<string, unknown>;

export interface InPlaceChanges {
  startOnBoot: boolean;
  running: boolean;
}

/**
 * What differs between the stored outputs and the new inputs among the
 * in-place settings. A key absent from state written before it existed
 * counts as changed: the host's value is unknown, so it is set.
 */
export function inPlaceChanges(olds: Props, inputs: KvmProxyInputs): InPlaceChanges {
  return {
    startOnBoot: olds.startOnBoot !== inputs.startOnBoot,
    running: olds.running !== inputs.running,
  };
}

export const anyInPlaceChange = (changes: InPlaceChanges): boolean =>
  changes.startOnBoot || changes.running;

/**
 * Powers the domain off: ACPI first (squid closes its connections, the disk
 * is clean), hard after the grace period or when the deadline is near. A
 * guest without ACPI handling (or a hung one) is still stopped.
 */
export async function stopDomain(
  host: LibvirtHost,
  dom: DomainHandle,
  deadline: Deadline,
): Promise<void> {
  await host.shutdownDomain(dom);
  const graceEnds = Date.now() + shutdownGraceMs(deadline);
  while (Date.now() < graceEnds) {
    if ((await host.state(dom)).state === "stopped") return;
    await sleepWithin(1000, deadline);
  }
  await host.destroyDomain(dom);
}
