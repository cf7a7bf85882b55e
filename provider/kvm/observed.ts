/**
 * What refresh and `.get` report about a domain: its shape as the host
 * defines it, in the terms of KvmProxy's inputs. A VM resized by hand then
 * shows as drift, and the next `up` proposes what the change table says
 * (diff.ts). Pure: the host calls happen in provider.ts.
 */
import { sameValue } from "../common/diff";
import type { DomainDescription } from "./domain-xml";
import type { VmState } from "./host";
import { effectiveCpuMode, type KvmProxyInputs } from "./schema";

type Props = Record<string, unknown>;

const GIB = 1024 ** 3;

export interface ObservedDomain {
  description: DomainDescription;
  /** Capacity of the domain's disk volume (the overlay), when it could be read. */
  diskBytes: bigint | undefined;
  /** libvirt's autostart flag, when it could be read. */
  autostart?: boolean;
  /** The domain's state, when it was read. */
  state?: VmState;
}

/**
 * The `running` input a domain in `state` amounts to. Paused and suspended
 * count as running: they are reported, never treated as stopped (nothing
 * would start them, and a paused VM must not be killed). An unknown state
 * says nothing.
 */
export function runningOf(state: VmState | undefined): boolean | undefined {
  switch (state) {
    case "running":
    case "paused":
    case "suspended":
      return true;
    case "stopped":
    case "crashed":
    case "shutting-down":
      return false;
    default:
      return undefined;
  }
}

/**
 * The previous inputs with every field the host knows replaced by what the
 * host says. A field the host does not report (image, cloud-init, readiness)
 * keeps its previous value; so does one that could not be read.
 */
export function observedInputs(
  previous: Props,
  { description, diskBytes, autostart, state }: ObservedDomain,
): Props {
  const observed: Props = { ...previous, vmName: description.name, firmware: description.firmware };
  if (autostart !== undefined) observed.startOnBoot = autostart;
  const running = runningOf(state);
  if (running !== undefined) observed.running = running;
  if (description.vcpus !== undefined) observed.vcpus = description.vcpus;
  if (description.memoryMiB !== undefined) observed.memoryMiB = description.memoryMiB;
  if (diskBytes !== undefined) observed.diskGiB = gibOf(diskBytes);
  if (description.network !== undefined) observed.network = description.network;
  const disk = description.volumes.find((volume) => volume.device === "disk");
  if (disk !== undefined) observed.pool = disk.pool;
  const domainType = description.domainType;
  if (domainType === "kvm" || domainType === "qemu") observed.domainType = domainType;
  if (description.cpuMode !== undefined) {
    // cpuMode is usually left unset (a default that depends on domainType): report it
    // only when the domain runs something other than what the inputs amount to.
    const expected = effectiveCpuMode({
      cpuMode: previous.cpuMode as KvmProxyInputs["cpuMode"],
      domainType: (observed.domainType as KvmProxyInputs["domainType"] | undefined) ?? "kvm",
    });
    if (!sameValue(expected, description.cpuMode)) observed.cpuMode = description.cpuMode;
  }
  return observed;
}

/** Whole GiB as a whole number; a size resized to something else keeps its fraction (3 places). */
export function gibOf(bytes: bigint): number {
  const whole = bytes / BigInt(GIB);
  if (whole * BigInt(GIB) === bytes) return Number(whole);
  return Math.round((Number(bytes) / GIB) * 1000) / 1000;
}
