/**
 * Gathers what preflight.ts decides on, in one pipelined round: every call
 * goes out before the first answer comes back (libvirt serves several calls
 * of one connection at once), so the whole preflight costs one round trip on
 * a host that is ready. Only when the asked-for domain type is missing does a
 * second call ask whether software emulation would do.
 */
import { errorClassOf, PermanentError } from "../common/errors";
import { ErrorCode, LibvirtError, ListAllFlags } from "../libvirt-rpc-xdr";
import type { LibvirtHost } from "./host";
import {
  decidePreflight,
  describeFailures,
  DOMAIN_ARCH,
  DOMAIN_MACHINE,
  failures,
  parseDomainCapabilities,
  type Fact,
  type Finding,
  type HostFacts,
  type NamedObjects,
  type PreflightWants,
} from "./preflight";

export interface GatherOptions {
  /** Also learn which pools and networks start at boot (the doctor's warnings). */
  autostart?: boolean;
}

/** A failed look-up becomes a fact ("cannot tell"); a dead link or a timeout stays an error. */
async function fact<T>(lookup: () => Promise<T>): Promise<Fact<T>> {
  try {
    return { ok: true, value: await lookup() };
  } catch (error) {
    if (errorClassOf(error) === "Transient") throw error;
    const cause = (error as { cause?: unknown }).cause;
    const code = cause instanceof LibvirtError ? cause.code : undefined;
    return {
      ok: false,
      problem: cause instanceof LibvirtError ? cause.libvirtMessage : (error as Error).message,
      ...(code === ErrorCode.NO_SUPPORT ? { unsupported: true } : {}),
    };
  }
}

async function namedObjects(
  list: (flags: number) => Promise<string[]>,
  autostart: boolean,
): Promise<NamedObjects> {
  const [active, inactive, started] = await Promise.all([
    list(ListAllFlags.ACTIVE),
    list(ListAllFlags.INACTIVE),
    autostart ? list(ListAllFlags.AUTOSTART) : undefined,
  ]);
  return { active, inactive, ...(started ? { autostart: started } : {}) };
}

async function gatherHostFacts(
  host: LibvirtHost,
  wants: PreflightWants,
  options: GatherOptions = {},
): Promise<HostFacts> {
  const autostart = options.autostart ?? false;
  const caps = (type: string) =>
    fact(async () =>
      parseDomainCapabilities(await host.domainCapabilities(type, DOMAIN_ARCH, DOMAIN_MACHINE)),
    );
  const [libVersion, pools, network, domainCaps] = await Promise.all([
    fact(() => host.libVersion()),
    fact(() => namedObjects((flags) => host.poolNames(flags), autostart)),
    "name" in wants.network
      ? fact(() => namedObjects((flags) => host.networkNames(flags), autostart))
      : fact(() => namedObjects((flags) => host.interfaceNames(flags), false)),
    caps(wants.domainType),
  ]);
  const emulationCaps =
    !domainCaps.ok && !domainCaps.unsupported && wants.domainType !== "qemu"
      ? await caps("qemu")
      : undefined;
  return {
    libVersion,
    pools,
    ...("name" in wants.network ? { networks: network } : { interfaces: network }),
    domainCaps,
    ...(emulationCaps ? { emulationCaps } : {}),
  };
}

export async function runPreflight(
  host: LibvirtHost,
  wants: PreflightWants,
  options: GatherOptions = {},
): Promise<Finding[]> {
  return decidePreflight(wants, await gatherHostFacts(host, wants, options));
}

/** Before create makes anything: a permanent error that names every unmet need and its fix. */
export async function assertHostReady(host: LibvirtHost, wants: PreflightWants): Promise<void> {
  const findings = await runPreflight(host, wants);
  if (failures(findings).length > 0)
    throw new PermanentError(describeFailures(host.label, findings));
}
