/**
 * Gathers what preflight.ts decides on, in one pipelined round: every call
 * goes out before the first answer comes back (libvirt serves several calls
 * of one connection at once), so the whole preflight costs one round trip on
 * a host that is ready. Pools, networks and interfaces are listed active
 * only; the inactive ones are asked for only when the wanted one is not
 * active (the finding then names them), and only when the asked-for domain
 * type is missing does a call ask whether software emulation would do. The
 * active pools come back as handles, so create needs no look-up of its pool.
 */
import { errorClassOf, PermanentError } from "../common/errors";
import { ErrorCode, LibvirtError, ListAllFlags, type StoragePoolHandle } from "../libvirt-rpc-xdr";
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

/** Active objects as the host lists them, plus the names preflight reads. */
interface Listing<T> {
  objects: NamedObjects;
  active: T[];
}

async function listing<T extends { name: string }>(
  list: (flags: number) => Promise<T[]>,
  wanted: string,
  autostart: boolean,
): Promise<Listing<T>> {
  const names = (objects: T[]) => objects.map((object) => object.name);
  if (autostart) {
    const [active, inactive, started] = await Promise.all([
      list(ListAllFlags.ACTIVE),
      list(ListAllFlags.INACTIVE),
      list(ListAllFlags.AUTOSTART),
    ]);
    return {
      objects: { active: names(active), inactive: names(inactive), autostart: names(started) },
      active,
    };
  }
  const active = await list(ListAllFlags.ACTIVE);
  if (active.some((object) => object.name === wanted))
    return { objects: { active: names(active) }, active };
  return {
    objects: { active: names(active), inactive: names(await list(ListAllFlags.INACTIVE)) },
    active,
  };
}

/** A fact from a listing, keeping the listing's handles beside it. */
async function listedFact<T extends { name: string }>(
  list: () => Promise<Listing<T>>,
): Promise<{ fact: Fact<NamedObjects>; active: T[] }> {
  let active: T[] = [];
  const result = await fact(async () => {
    const listed = await list();
    active = listed.active;
    return listed.objects;
  });
  return { fact: result, active };
}

interface GatheredFacts {
  facts: HostFacts;
  /** The wanted pool's handle when it is active. */
  pool: StoragePoolHandle | undefined;
}

async function gatherHostFacts(
  host: LibvirtHost,
  wants: PreflightWants,
  options: GatherOptions = {},
): Promise<GatheredFacts> {
  const autostart = options.autostart ?? false;
  const caps = (type: string) =>
    fact(async () =>
      parseDomainCapabilities(await host.domainCapabilities(type, DOMAIN_ARCH, DOMAIN_MACHINE)),
    );
  const [libVersion, pools, network, domainCaps] = await Promise.all([
    fact(() => host.libVersion()),
    listedFact(() => listing((flags) => host.pools(flags), wants.pool, autostart)),
    "name" in wants.network
      ? listedFact(() => listing((flags) => host.networks(flags), wanted(wants), autostart))
      : listedFact(() => listing((flags) => host.hostInterfaces(flags), wanted(wants), false)),
    caps(wants.domainType),
  ]);
  const emulationCaps =
    !domainCaps.ok && !domainCaps.unsupported && wants.domainType !== "qemu"
      ? await caps("qemu")
      : undefined;
  return {
    facts: {
      libVersion,
      pools: pools.fact,
      ...("name" in wants.network ? { networks: network.fact } : { interfaces: network.fact }),
      domainCaps,
      ...(emulationCaps ? { emulationCaps } : {}),
    },
    pool: pools.active.find((pool) => pool.name === wants.pool),
  };
}

const wanted = (wants: PreflightWants): string =>
  "name" in wants.network ? wants.network.name : wants.network.bridge;

export async function runPreflight(
  host: LibvirtHost,
  wants: PreflightWants,
  options: GatherOptions = {},
): Promise<Finding[]> {
  return decidePreflight(wants, (await gatherHostFacts(host, wants, options)).facts);
}

/**
 * Before create makes anything: a permanent error that names every unmet
 * need and its fix. Returns the pool create will use (looked up only when
 * the listing could not tell).
 */
export async function assertHostReady(
  host: LibvirtHost,
  wants: PreflightWants,
): Promise<{ pool: StoragePoolHandle }> {
  const { facts, pool } = await gatherHostFacts(host, wants);
  const findings = decidePreflight(wants, facts);
  if (failures(findings).length > 0)
    throw new PermanentError(describeFailures(host.label, findings));
  return { pool: pool ?? (await host.pool(wants.pool)) };
}
