/**
 * Gathers what preflight.ts decides on, in one pipelined round: every call
 * goes out before the first answer comes back (libvirt serves several calls
 * of one connection at once), so the whole preflight costs one round trip on
 * a host that is ready. Pools and networks are listed active only; the
 * inactive ones are asked for only when the wanted one is not active (the
 * finding then names them). For a bridge, create needs only that it exists
 * (one that is down is a warning, which does not stop a create), so one
 * listing of every interface does; only when the bridge is missing is the
 * active one asked, to name which are up. Only when the asked-for domain type
 * is missing does a call ask whether software emulation would do. The active
 * pools come back as handles, so create needs no look-up of its pool.
 *
 * Asked once per link, not per create: libvirt's version and the domain
 * capabilities of a ready host. One link is one daemon process, so its
 * version cannot change; KVM and the firmware could be removed, so what was
 * learnt is trusted for STABLE_FACTS_MAX_AGE_MS only, and a create that
 * fails after trusting it asks again (recheckAfterFailure): a host that
 * stopped being ready still fails with the preflight's own message. Pools,
 * networks and interfaces are asked every time: a stopped pool or network
 * must stop the create before it makes anything.
 */
import { errorClassOf, PermanentError } from "../common/errors";
import { PartialCreateError } from "../common/partial-create";
import { ErrorCode, LibvirtError, ListAllFlags, type StoragePoolHandle } from "../libvirt-rpc-xdr";
import type { LibvirtHost } from "./host";
import {
  decidePreflight,
  describeFailures,
  DOMAIN_ARCH,
  DOMAIN_MACHINE,
  failures,
  parseDomainCapabilities,
  type DomainCapsSummary,
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
  /** The version and domain capabilities were remembered from an earlier preflight on this link. */
  remembered: boolean;
}

/** How long a ready host's version and domain capabilities are trusted on the same link. */
export const STABLE_FACTS_MAX_AGE_MS = 120_000;

interface StableFacts {
  at: number;
  libVersion: number;
  /** By domain type. */
  domainCaps: Map<string, DomainCapsSummary>;
}

/** Per link (LibvirtHost.linkIdentity): a new link, e.g. after libvirtd restarted, starts empty. */
const stableFacts = new WeakMap<object, StableFacts>();

function rememberedFacts(link: object): StableFacts | undefined {
  const known = stableFacts.get(link);
  return known === undefined || Date.now() - known.at > STABLE_FACTS_MAX_AGE_MS ? undefined : known;
}

function remember(link: object, domainType: string, facts: HostFacts): void {
  if (!facts.libVersion.ok || !facts.domainCaps.ok) return;
  const known = rememberedFacts(link) ?? {
    at: Date.now(),
    libVersion: facts.libVersion.value,
    domainCaps: new Map<string, DomainCapsSummary>(),
  };
  known.domainCaps.set(domainType, facts.domainCaps.value);
  stableFacts.set(link, known);
}

/** Create's bridge check: does it exist at all (one listing); active ones asked only when it does not. */
async function bridgeListing(
  host: LibvirtHost,
  bridge: string,
): Promise<Listing<{ name: string }>> {
  const all = await host.hostInterfaces(ALL_INTERFACES);
  const names = all.map((object) => object.name);
  if (names.includes(bridge)) return { objects: { active: [], present: names }, active: [] };
  const active = (await host.hostInterfaces(ListAllFlags.ACTIVE)).map((object) => object.name);
  return {
    objects: { active, inactive: names.filter((name) => !active.includes(name)) },
    active: [],
  };
}

/** connectListAllInterfaces with neither ACTIVE nor INACTIVE: both. */
const ALL_INTERFACES = 0;

async function gatherHostFacts(
  host: LibvirtHost,
  wants: PreflightWants,
  options: GatherOptions & { fresh?: boolean } = {},
): Promise<GatheredFacts> {
  const autostart = options.autostart ?? false;
  const link = await host.linkIdentity();
  const known = autostart || options.fresh ? undefined : rememberedFacts(link);
  const knownCaps = known?.domainCaps.get(wants.domainType);
  const caps = (type: string) =>
    fact(async () =>
      parseDomainCapabilities(await host.domainCapabilities(type, DOMAIN_ARCH, DOMAIN_MACHINE)),
    );
  const [libVersion, pools, network, domainCaps] = await Promise.all([
    known ? { ok: true as const, value: known.libVersion } : fact(() => host.libVersion()),
    listedFact(() => listing((flags) => host.pools(flags), wants.pool, autostart)),
    "name" in wants.network
      ? listedFact(() => listing((flags) => host.networks(flags), wanted(wants), autostart))
      : autostart
        ? listedFact(() => listing((flags) => host.hostInterfaces(flags), wanted(wants), false))
        : listedFact(() => bridgeListing(host, wanted(wants))),
    knownCaps ? { ok: true as const, value: knownCaps } : caps(wants.domainType),
  ]);
  const emulationCaps =
    !domainCaps.ok && !domainCaps.unsupported && wants.domainType !== "qemu"
      ? await caps("qemu")
      : undefined;
  const facts: HostFacts = {
    libVersion,
    pools: pools.fact,
    ...("name" in wants.network ? { networks: network.fact } : { interfaces: network.fact }),
    domainCaps,
    ...(emulationCaps ? { emulationCaps } : {}),
  };
  if (!knownCaps && failures(decidePreflight(wants, facts)).length === 0)
    remember(link, wants.domainType, facts);
  return {
    facts,
    pool: pools.active.find((pool) => pool.name === wants.pool),
    remembered: knownCaps !== undefined,
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
 * the listing could not tell), and whether the version and capabilities were
 * remembered from an earlier create on this link (then a failure later in
 * the create goes through recheckAfterFailure).
 */
export async function assertHostReady(
  host: LibvirtHost,
  wants: PreflightWants,
): Promise<{ pool: StoragePoolHandle; remembered: boolean }> {
  const { facts, pool, remembered } = await gatherHostFacts(host, wants);
  const findings = decidePreflight(wants, facts);
  if (failures(findings).length > 0)
    throw new PermanentError(describeFailures(host.label, findings));
  return { pool: pool ?? (await host.pool(wants.pool)), remembered };
}

/**
 * A create that trusted remembered facts failed: forget them and ask the host
 * again. If it is no longer ready (KVM or the UEFI firmware went away since),
 * the error says so with the preflight's findings and fixes, in the same
 * class and shape (a recorded partial create stays one); otherwise the
 * original error is returned unchanged. Never throws: a re-check that cannot
 * be made leaves the original error as it was.
 */
export async function recheckAfterFailure(
  host: LibvirtHost,
  wants: PreflightWants,
  error: unknown,
): Promise<unknown> {
  try {
    stableFacts.delete(await host.linkIdentity());
    const { facts } = await gatherHostFacts(host, wants, { fresh: true });
    const findings = decidePreflight(wants, facts);
    if (failures(findings).length === 0) return error;
    const original = error instanceof Error ? error : new Error(String(error));
    const explained = new PermanentError(
      `${original.message}\n${describeFailures(host.label, findings, "is no longer ready for this VM")}`,
      { cause: original },
    );
    return original instanceof PartialCreateError
      ? new PartialCreateError(original.id, original.properties, explained)
      : explained;
  } catch {
    return error;
  }
}
