/**
 * What refresh finds broken beyond an in-place heal (see
 * common/replacement.ts): a domain whose disk or seed volume is gone cannot
 * start again (qemu refuses a missing backing file), and a domain deleted by
 * hand that left its overlay and seed behind must not be dropped from state,
 * or those volumes would be leaked: state keeps naming them, and the
 * replacement's delete removes them.
 */
import type { DomainDescription } from "./domain-xml";
import type { LibvirtHost } from "./host";
import { overlayVolumeName, seedVolumeName } from "./naming";

/** The volumes the domain uses (disk and seed) that its pool no longer holds, as "pool/volume". */
export async function missingVolumes(
  host: LibvirtHost,
  description: DomainDescription,
): Promise<string[]> {
  const found = await Promise.all(
    description.volumes.map(async ({ pool: poolName, volume }) =>
      (await host.volumeListed(poolName, volume)) ? undefined : `${poolName}/${volume}`,
    ),
  );
  return found.filter((name): name is string => name !== undefined);
}

/** The per-VM volumes (overlay, seed) of `vmName` still in the pool, as "pool/volume". */
export async function perVmVolumesLeft(
  host: LibvirtHost,
  poolName: string,
  vmName: string,
): Promise<string[]> {
  const names = [overlayVolumeName(vmName), seedVolumeName(vmName)];
  const found = await Promise.all(names.map((name) => host.volumeListed(poolName, name)));
  return names.filter((_, index) => found[index]).map((name) => `${poolName}/${name}`);
}

export const missingVolumesReason = (missing: readonly string[]): string =>
  `refresh found ${missing.length === 1 ? "volume" : "volumes"} ${missing.join(", ")} gone (deleted by hand?): the VM cannot start again`;

export const domainGoneReason = (vmName: string, left: readonly string[]): string =>
  `refresh found domain ${vmName} gone (deleted by hand?) but ${left.join(", ")} left behind`;
