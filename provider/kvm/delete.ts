/** KvmProxy delete: the domain found by its identity and mark, then its per-VM volumes; a host gone for good is given up. */
import { Deadline } from "../common/deadline";
import { PermanentError } from "../common/errors";
import { type OwnershipMark } from "../common/mark";
import { deadlineFor, type DeleteOutcome, stepsWithin } from "../common/lifecycle";
import { isGoneForGood, leaveBehind, withWayOut } from "../common/gone-hosts";
import { openHost } from "./connect";
import { parseDomainXml } from "./domain-xml";
import { overlayVolumeName, parseKvmResourceId, seedVolumeName, vmNameOfVolume } from "./naming";
import { HostTarget, Props, hostNamesOf, hostTargetOf, progressLog, requireOurs } from "./steps";
import { findDomainOf } from "./read";

/**
 * Deletes the domain found by its identity (a renamed one too) after checking
 * the mark, then its per-VM volumes: the ones it references and the ones its
 * name implies, so they go even when the domain was already gone (a create
 * that died before define). The shared base image is never among them.
 */
export async function remove(id: string, props: Props): Promise<DeleteOutcome> {
  const target = hostTargetOf(props);
  const { host, vmName } = parseKvmResourceId(id);
  if (isGoneForGood(hostNamesOf(host, target))) {
    leaveBehind(`KvmProxy ${vmName}`, host, leftBehindOn(target, props, vmName));
    return "already gone";
  }
  const deadline = deadlineFor(target.timeouts, "delete");
  const progress = { removed: false };
  await stepsWithin(deadline, progressLog)(`delete ${vmName}`, () =>
    removeWithin(target, props, vmName, deadline, progress),
  ).catch((error: unknown) => Promise.reject(withWayOut(error, host)));
  return progress.removed ? "removed" : "already gone";
}

/** What delete would have removed, as state records it. */
function leftBehindOn(target: HostTarget, props: Props, vmName: string): string[] {
  const uuid = typeof props.libvirtUuid === "string" ? ` (libvirt UUID ${props.libvirtUuid})` : "";
  return [
    `domain ${vmName}${uuid}`,
    `volume ${target.pool}/${overlayVolumeName(vmName)}`,
    `volume ${target.pool}/${seedVolumeName(vmName)}`,
  ];
}

/** Delete's one step, safe to repeat: everything it removes may already be gone. */
async function removeWithin(
  target: HostTarget,
  props: Props,
  vmName: string,
  deadline: Deadline,
  progress: { removed: boolean },
): Promise<void> {
  const session = await openHost(target, deadline);
  const { host } = session;
  const volumes = [
    { pool: target.pool, volume: overlayVolumeName(vmName) },
    { pool: target.pool, volume: seedVolumeName(vmName) },
  ];
  const handle = await findDomainOf(host, props, vmName);
  if (handle !== undefined) {
    const description = parseDomainXml(await host.definedXml(handle));
    const what = `domain ${description.name} on ${session.label}`;
    requireSameVm(requireOurs(description.mark, target, what), props, what);
    volumes.push(...description.volumes.filter((v) => vmNameOfVolume(v.volume) !== undefined));
    await host.destroyDomain(handle);
    await host.undefineDomain(handle);
    progress.removed = true;
  }
  const done = new Set<string>();
  for (const { pool: poolName, volume } of volumes) {
    if (done.has(`${poolName}/${volume}`)) continue;
    done.add(`${poolName}/${volume}`);
    const pool = await host.findPool(poolName);
    // No pool: nothing is left there.
    if (pool !== undefined && (await host.deleteVolumeNamed(pool, volume))) progress.removed = true;
  }
}

/**
 * A recorded creation time must match the mark: a domain of this stack made
 * since (same name, found by name) is another VM, and so are its volumes.
 * The reaper relies on this to delete only the domain it listed.
 */
function requireSameVm(mark: OwnershipMark, props: Props, what: string): void {
  const recorded = props.createdAt;
  if (typeof recorded === "string" && recorded !== "" && recorded !== mark.createdAt)
    throw new PermanentError(
      `${what} was made at ${mark.createdAt}, but this record is of one made at ${recorded}: it is another VM of this stack; left alone (run pulumi refresh)`,
    );
}
