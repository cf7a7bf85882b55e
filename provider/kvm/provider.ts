/**
 * KvmProxy's dynamic-provider methods. Each reads as a short story; the
 * details live in the modules it calls. check and diff are pure and offline,
 * so `pulumi preview` works in CI without any route to a hypervisor.
 *
 * FROZEN: this module's path (dist/provider/kvm/provider.js) and the exports
 * configure, check, diff, create, read, update and remove are required by the
 * provider code stored in every KvmProxy's state (see resource.ts).
 */
import type * as pulumi from "@pulumi/pulumi";
import type { z } from "zod";
import { Deadline } from "../common/deadline";
import { checkWithAutonaming, plainJson as plain } from "../common/check";
import { decideDiff } from "../common/diff";
import { EgressProxyError, errorClassOf, PermanentError, TransientError } from "../common/errors";
import type { CheckFailure } from "../common/inputs";
import { createMark, type MarkReading, type OwnershipMark } from "../common/mark";
import {
  carriedOutputs,
  checkedInputs as checkedInputsOf,
  continueCreate,
  deadlineFor,
  type DeleteOutcome,
  inputsOnly,
  outputsOnly,
  requireOurs as requireOursOf,
  stepsWithin,
} from "../common/lifecycle";
import { logToEngine } from "../common/engine-log";
import { isIncompleteCreate, PartialCreateError } from "../common/partial-create";
import { egressAtReadiness } from "../common/egress";
import { safeErrorMessage } from "../common/redact";
import type { DomainHandle, StoragePoolHandle, StorageVolHandle } from "../libvirt-rpc-xdr";
import { buildNoCloudSeed } from "../nocloud";
import { lookUpAddress } from "./addresses";
import { openHost, rememberKvmProviderConfig, type HostSession } from "./connect";
import { CreateAttempt } from "./create-attempt";
import { KVM_CHANGE_TABLE } from "./diff";
import { buildDomainXml, parseDomainXml, type DomainDescription } from "./domain-xml";
import { assertHostReady, recheckAfterFailure } from "./host-facts";
import type { LibvirtHost, VmState } from "./host";
import { ensureBaseImage, type BaseImage } from "./image-cache";
import {
  kvmResourceId,
  legacyHostLabel,
  macAddressFor,
  overlayVolumeName,
  parseKvmResourceId,
  seedVolumeName,
  vmNameOfVolume,
} from "./naming";
import { observedInputs } from "./observed";
import { anyInPlaceChange, inPlaceChanges, stopDomain, type InPlaceChanges } from "./power";
import { waitForReadiness } from "./ready";
import {
  effectiveCpuMode,
  kvmProxyInputsSchema,
  validateKvmInputs,
  type KvmProxyInputs,
} from "./schema";
import { overlayCapacity, overlayVolumeXml, rawVolumeXml } from "./volume-xml";

type Props = Record<string, unknown>;

/**
 * What create, read and update return: the checked inputs plus what only the host knows.
 * FROZEN key names (old state is read by new code): libvirtUuid, vmName, vmNameChosenBy, createIncomplete.
 */
export interface KvmProxyOutputs extends KvmProxyInputs {
  host: string;
  ip: string | null;
  mac: string;
  state: VmState;
  endpoint: string | null;
  imageVolume: string;
  seedSha256: string;
  createdAt: string;
  libvirtUuid: string;
  /** What the egress check saw at create (see common/egress.ts); absent in older state. */
  egressIp?: string | null;
  checkedAt?: string | null;
}

/** Progress lines for the user's `pulumi up` (the engine's log when running under Pulumi). */
export type ProgressLog = (message: string) => void;
let progressLog: ProgressLog = (message) => logToEngine(`KvmProxy: ${message}`);
export function setProgressLog(log: ProgressLog): void {
  progressLog = log;
}

// ---- configure -------------------------------------------------------------------------------------

export async function configure(request: {
  config?: { get(key: string): string | undefined };
}): Promise<void> {
  rememberKvmProviderConfig(request.config);
}

// ---- check / diff: pure -----------------------------------------------------------------------

export async function check(
  olds: Props,
  news: Props,
): Promise<{ inputs: Props; failures: CheckFailure[] }> {
  return checkWithAutonaming(KVM_CHANGE_TABLE, olds, news, validateKvmInputs);
}

export async function diff(
  _id: string,
  olds: Props,
  news: Props,
): Promise<pulumi.dynamic.DiffResult> {
  const decision = decideDiff(KVM_CHANGE_TABLE, olds, news);
  return {
    changes: decision.changes,
    replaces: decision.replaces,
    deleteBeforeReplace: decision.deleteBeforeReplace,
  };
}

// ---- create ----------------------------------------------------------------------------------------

/**
 * Never leaks, at any step. Before the domain is defined, a failure removes
 * the volumes this attempt made; once it is defined (or when that removal
 * cannot be done, e.g. the SSH link is gone for good) Pulumi gets the
 * resource as a partial create, so it is in state: the next `up` continues
 * it (update) and `destroy` removes it.
 */
export async function create(raw: Props): Promise<{ id: string; outs: Props }> {
  const inputs = checkedInputs(raw);
  const deadline = deadlineFor(inputs.timeouts, "create");
  const session = await stepsWithin(deadline, progressLog)("connect", () =>
    openHost(inputs, deadline),
  );
  const { pool, existing, remembered } = await surveyHost(session.host, inputs);
  try {
    return await createOnReadyHost(session, inputs, raw, deadline, pool, existing);
  } catch (error) {
    // The preflight trusted facts an earlier create learnt: a host that stopped being ready says so.
    if (!remembered) throw error;
    throw await recheckAfterFailure(session.within(recheckDeadline()), inputs, error);
  }
}

async function createOnReadyHost(
  session: HostSession,
  inputs: KvmProxyInputs,
  raw: Props,
  deadline: Deadline,
  pool: StoragePoolHandle,
  existing: DomainHandle | undefined,
): Promise<{ id: string; outs: Props }> {
  const id = kvmResourceId(session.label, inputs.vmName);
  const record = (parts: RecordedParts, state: VmState, error: unknown): PartialCreateError =>
    new PartialCreateError(
      id,
      plain(outputsOf(session, inputs, parts, { ip: null, state })),
      toError(error),
      raw,
    );
  const domain = existing
    ? await resumeExisting(session, inputs, existing)
    : await buildAndDefine(session, inputs, pool, deadline, record);
  let state: VmState = "stopped";
  try {
    if (!inputs.running) {
      // Defined and kept off, as asked: nothing to wait for.
      await session.host.setAutostart(domain.handle, inputs.startOnBoot);
      return { id, outs: plain({ ...outputsOf(session, inputs, domain, { ip: null, state }) }) };
    }
    // Independent: both leave in one round trip.
    await Promise.all([
      session.host.setAutostart(domain.handle, inputs.startOnBoot),
      session.host.startDomain(domain.handle),
    ]);
    state = "running";
    const ip = await waitForReadiness(session.host, domain.handle, inputs, deadline);
    const egress = await egressAtReadiness(ip, inputs, deadline);
    return { id, outs: plain({ ...outputsOf(session, inputs, domain, { ip, state }), ...egress }) };
  } catch (error) {
    // The domain exists: record it (marked failed) rather than leak it.
    throw record(domain, state, error);
  }
}

/** What a recorded (partial or complete) create names besides the inputs. */
interface RecordedParts {
  uuid: string;
  createdAt: string;
  imageVolume: string;
  seedSha256: string;
}

interface DefinedDomain extends RecordedParts {
  handle: DomainHandle;
}

type Recorder = (parts: RecordedParts, state: VmState, error: unknown) => PartialCreateError;

/**
 * Before create makes anything, in one round trip: the preflight (pool,
 * network, firmware, domain type: fail before making anything), the pool's
 * handle from its listing, and a domain an earlier attempt defined.
 */
async function surveyHost(
  host: LibvirtHost,
  inputs: KvmProxyInputs,
): Promise<{ pool: StoragePoolHandle; existing: DomainHandle | undefined; remembered: boolean }> {
  const existing = host.findDomain(inputs.vmName);
  // If the preflight fails, its error is the one to tell; this look-up's is dropped.
  existing.catch(() => undefined);
  const { pool, remembered } = await assertHostReady(host, inputs);
  return { pool, existing: await existing, remembered };
}

/** A retried create finds the domain it defined last time: adopt it only if the mark says it is ours. */
async function resumeExisting(
  session: HostSession,
  inputs: KvmProxyInputs,
  handle: DomainHandle,
): Promise<DefinedDomain> {
  const description = parseDomainXml(await session.host.domainXml(handle));
  const mark = requireOurs(description.mark, inputs, `domain ${inputs.vmName} on ${session.label}`);
  const seed = buildNoCloudSeed(seedInputOf(inputs));
  return {
    handle,
    uuid: uuidText(handle.uuid),
    createdAt: mark.createdAt,
    imageVolume:
      description.volumes.find((v) => v.device === "disk")?.volume ??
      overlayVolumeName(inputs.vmName),
    seedSha256: seed.sha256,
  };
}

/**
 * The idempotent sequence: base image, overlay (reused when a previous attempt
 * made it), seed (always rebuilt: a cancelled upload leaves a truncated one),
 * define. A failure on the way undoes what this attempt made (undoOrRecord).
 */
async function buildAndDefine(
  session: HostSession,
  inputs: KvmProxyInputs,
  pool: StoragePoolHandle,
  deadline: Deadline,
  record: Recorder,
): Promise<DefinedDomain> {
  const { host } = session;
  const base = await ensureBaseImage({
    host,
    cleanupHost: () => session.within(cleanupDeadline(inputs)),
    hostKey: session.hostKey,
    pool,
    image: inputs.image,
    deadline,
    log: progressLog,
  });
  const attempt = new CreateAttempt(pool);
  try {
    const seed = buildNoCloudSeed(seedInputOf(inputs));
    const [overlay, seedVolume] = await attempt.together([
      ensureOverlay(host, attempt, inputs, base),
      freshSeedVolume(host, attempt, inputs.vmName, seed.image.size),
    ] as const);
    await host.upload(seedVolume, seed.image.toStream(), seed.image.size);
    const mark = createMark(inputs.owner);
    const xml = buildDomainXml({
      name: inputs.vmName,
      domainType: inputs.domainType,
      vcpus: inputs.vcpus,
      memoryMiB: inputs.memoryMiB,
      firmware: inputs.firmware,
      cpuMode: effectiveCpuMode(inputs),
      pool: inputs.pool,
      overlayVolume: overlay,
      seedVolume: seedVolume.name,
      network: inputs.network,
      mac: macAddressFor(inputs.vmName),
      mark,
    });
    attempt.defining();
    const handle = await host.defineDomain(inputs.vmName, xml);
    return {
      handle,
      uuid: uuidText(handle.uuid),
      createdAt: mark.createdAt,
      imageVolume: base.name,
      seedSha256: seed.sha256,
    };
  } catch (error) {
    const parts = { uuid: "", createdAt: "", imageVolume: base.name, seedSha256: "" };
    throw await undoOrRecord(session, inputs, attempt, error, (state, why) =>
      record(parts, state, why),
    );
  }
}

/**
 * After a failure before the domain exists: remove this attempt's volumes
 * (over a fresh link if the old one died, within a budget of its own) and
 * return the original error; if that cannot be done, return the partial
 * create that puts them in state, so nothing is left that state does not name.
 */
async function undoOrRecord(
  session: HostSession,
  inputs: KvmProxyInputs,
  attempt: CreateAttempt,
  error: unknown,
  record: (state: VmState, error: unknown) => PartialCreateError,
): Promise<unknown> {
  if (!attempt.madeSomething) return error;
  try {
    const outcome = await attempt.undo(
      session.within(cleanupDeadline(inputs)),
      inputs.vmName,
      error,
    );
    if (outcome.undone) {
      progressLog(
        `create of ${inputs.vmName} failed; removed what it made (${outcome.removed.join(", ") || "nothing"})`,
      );
      return error;
    }
    return record("stopped", noted(error, `${outcome.reason}; it is recorded in state`));
  } catch (undoError) {
    const reason = undoError instanceof Error ? safeErrorMessage(undoError) : String(undoError);
    return record(
      "unknown",
      noted(
        error,
        `removing what this attempt made failed too (${reason}); it is recorded in state: the next up continues it, destroy removes it`,
      ),
    );
  }
}

/** Asking again why a create failed must not hold its error back long (a dead link is dialled again). */
const recheckDeadline = (): Deadline =>
  Deadline.afterSeconds(10, "re-checking the host after a failed create");

/** Undoing a failed create is a delete: it gets the delete budget (at most a minute), not what is left of create's. */
function cleanupDeadline(inputs: KvmProxyInputs): Deadline {
  return Deadline.afterSeconds(
    Math.min(inputs.timeouts.deleteSeconds, 60),
    "timeouts.deleteSeconds (removing what a failed create made)",
  );
}

/** The same error class, with what happened afterwards appended. */
function noted(error: unknown, note: string): Error {
  const original = toError(error);
  const Class = errorClassOf(original) === "Permanent" ? PermanentError : TransientError;
  return new Class(`${original.message}; ${note}`, { cause: original });
}

/** The VM's disk; one an earlier attempt made is reused (and stays if this attempt fails). */
async function ensureOverlay(
  host: LibvirtHost,
  attempt: CreateAttempt,
  inputs: KvmProxyInputs,
  base: BaseImage,
): Promise<string> {
  const name = overlayVolumeName(inputs.vmName);
  const capacity = overlayCapacity(inputs.diskGiB, base.virtualBytes);
  if ("problem" in capacity) {
    if (await host.findVolume(attempt.pool, name)) return name;
    throw new PermanentError(capacity.problem);
  }
  const xml = overlayVolumeXml(name, capacity.bytes, { path: base.path, format: base.format });
  attempt.creating(name);
  if ((await host.createVolumeIfAbsent(attempt.pool, name, xml)) === undefined)
    attempt.foundExisting(name);
  return name;
}

/** The seed volume, always new: one an earlier attempt left may hold a cancelled, truncated upload. */
async function freshSeedVolume(
  host: LibvirtHost,
  attempt: CreateAttempt,
  vmName: string,
  sizeBytes: number,
): Promise<StorageVolHandle> {
  const name = seedVolumeName(vmName);
  const xml = rawVolumeXml(name, sizeBytes);
  attempt.creating(name);
  const made = await host.createVolumeIfAbsent(attempt.pool, name, xml);
  if (made !== undefined) return made;
  await host.deleteVolumeNamed(attempt.pool, name);
  return host.createVolume(attempt.pool, name, xml);
}

// ---- read / update / delete -----------------------------------------------------------------------

/**
 * Refresh and `.get`. The domain is found by its identity (the libvirt UUID in
 * state, so a domain renamed by hand is still ours; the name only for `.get`
 * and for state from before the UUID was recorded), must carry this stack's
 * mark, and is reported as the host defines it: vCPUs, memory, disk size,
 * network, firmware, MAC, name. Those come back as `inputs` too, so refresh
 * shows the drift and the next `up` proposes what the change table says.
 */
export async function read(id: string, props: Props): Promise<pulumi.dynamic.ReadResult> {
  const target = hostTargetOf(props);
  parseKvmResourceId(id); // a malformed id is refused before any connection
  // `.get` passes the user's arguments only: no output of ours has been recorded yet.
  const adopting = props.createdAt === undefined;
  const deadline = deadlineFor(target.timeouts, "read");
  return stepsWithin(deadline)("read", () => readWithin(id, props, target, adopting, deadline));
}

async function readWithin(
  id: string,
  props: Props,
  target: HostTarget,
  adopting: boolean,
  deadline: Deadline,
): Promise<pulumi.dynamic.ReadResult> {
  const { host: idHost, vmName } = parseKvmResourceId(id);
  const session = await openHost(target, deadline);
  // An id from before IPv6 labels were bracketed names the same host: it stays as it is in state.
  const legacyId = idHost !== session.label && idHost === legacyHostLabel(target.connection);
  if (adopting && idHost !== session.label && !legacyId)
    throw new PermanentError(
      `id ${JSON.stringify(id)} names host ${idHost}, but the connection reaches ${session.label}; pass the connection of that host or use the id hosts/${session.label}/domains/${vmName}`,
    );
  const handle = await findDomainOf(session.host, props, vmName);
  if (handle === undefined)
    // Gone: Pulumi drops it from state. A partial create recorded before its domain existed stays
    // while its volumes do, so a refresh never turns them into leftovers that state does not name.
    return isIncompleteCreate(props) && (await perVmVolumesRemain(session, target.pool, vmName))
      ? { id, props }
      : {};
  const description = parseDomainXml(await session.host.definedXml(handle));
  const what = `domain ${description.name} on ${session.label}`;
  const mark = requireOurs(description.mark, target, what, adopting);
  // Independent questions: asked together, one round trip.
  const [diskBytes, { state }, autostart] = await Promise.all([
    diskCapacityOf(session.host, description),
    session.host.state(handle),
    session.host.autostart(handle),
  ]);
  const mac = description.mac ?? macAddressFor(description.name);
  const ip = await currentAddress(session.host, handle, state, mac, props.ip);
  const outputs: Props = {
    ...observedInputs(inputsOnly(props, OUTPUT_KEYS), {
      description,
      diskBytes,
      autostart,
      state,
    }),
    ...outputsOnly(props, OUTPUT_KEYS),
    host: session.label,
    state,
    mac,
    ip,
    endpoint: ip ? `http://${ip}:${target.readiness.port}` : null,
    createdAt: mark.createdAt,
    libvirtUuid: uuidText(handle.uuid),
  };
  return {
    id: kvmResourceId(legacyId ? idHost : session.label, description.name),
    props: plain(outputs),
    inputs: plain(inputsOnly(outputs, OUTPUT_KEYS)),
  };
}

/** One address source failing must not blank an address we knew; a stopped VM has none. */
async function currentAddress(
  host: LibvirtHost,
  handle: DomainHandle,
  state: VmState,
  mac: string,
  known: unknown,
): Promise<string | null> {
  const lookup =
    state === "running"
      ? await lookUpAddress(mac, (source) => host.interfaces(handle, source))
      : undefined;
  return lookup?.ip ?? (state === "stopped" || typeof known !== "string" ? null : known);
}

/** Identity: the UUID recorded at create; the name for `.get` and for state written before it. */
function findDomainOf(
  host: LibvirtHost,
  props: Props,
  vmName: string,
): Promise<DomainHandle | undefined> {
  return typeof props.libvirtUuid === "string" && props.libvirtUuid !== ""
    ? host.findDomainByUuid(props.libvirtUuid)
    : host.findDomain(vmName);
}

/** The capacity of the domain's disk volume (the overlay), or undefined when it cannot be found. */
async function diskCapacityOf(
  host: LibvirtHost,
  description: DomainDescription,
): Promise<bigint | undefined> {
  const disk = description.volumes.find((volume) => volume.device === "disk");
  if (disk === undefined) return undefined;
  const pool = await host.findPool(disk.pool);
  const volume = pool && (await host.findVolume(pool, disk.volume));
  return volume ? (await host.volumeInfo(volume)).capacity : undefined;
}

async function perVmVolumesRemain(
  session: HostSession,
  poolName: string,
  vmName: string,
): Promise<boolean> {
  const pool = await session.host.findPool(poolName);
  if (pool === undefined) return false;
  for (const name of [overlayVolumeName(vmName), seedVolumeName(vmName)])
    if (await session.host.findVolume(pool, name)) return true;
  return false;
}

/**
 * In-place changes only. Credentials, readiness and timeouts touch no VM;
 * startOnBoot sets libvirt's autostart, and running starts a VM a refresh
 * found stopped (or shuts it down) — see power.ts. A partial create in state
 * is the exception: the engine calls update on it at the next `up`, and update
 * continues the create (same host and name, so the same id).
 */
export async function update(id: string, olds: Props, news: Props): Promise<{ outs: Props }> {
  if (isIncompleteCreate(olds)) return continueCreate(id, news, create);
  const inputs = checkedInputs(news);
  const outs = carriedOutputs(olds, inputs, CARRIED_KEYS);
  const changes = inPlaceChanges(olds, inputs);
  if (!anyInPlaceChange(changes)) return { outs };
  const deadline = deadlineFor(inputs.timeouts, "create");
  const live = await stepsWithin(deadline, progressLog)("update", () =>
    applyOnHost(id, olds, inputs, changes, deadline),
  );
  return { outs: plain({ ...outs, ...live }) };
}

/**
 * The in-place changes on the domain found by its identity, after checking
 * the mark: autostart, and power. A VM started again is waited for like a new
 * one (readiness, then the egress check), so its outputs say what is true now.
 */
async function applyOnHost(
  id: string,
  olds: Props,
  inputs: KvmProxyInputs,
  changes: InPlaceChanges,
  deadline: Deadline,
): Promise<Props> {
  const session = await openHost(inputs, deadline);
  const { vmName } = parseKvmResourceId(id);
  const handle = await findDomainOf(session.host, olds, vmName);
  if (handle === undefined)
    throw new PermanentError(
      `domain ${vmName} on ${session.label} is gone; run \`pulumi up --refresh\` to create it again`,
    );
  const description = parseDomainXml(await session.host.definedXml(handle));
  requireOurs(description.mark, inputs, `domain ${description.name} on ${session.label}`);
  if (changes.startOnBoot) await session.host.setAutostart(handle, inputs.startOnBoot);
  if (!changes.running) return {};
  if (!inputs.running) {
    progressLog(`KvmProxy ${vmName}: shutting down (running: false)`);
    await stopDomain(session.host, handle, deadline);
    return { state: "stopped", ip: null, endpoint: null };
  }
  progressLog(`KvmProxy ${vmName}: starting it again (refresh found it not running)`);
  await session.host.startDomain(handle);
  const ip = await waitForReadiness(session.host, handle, inputs, deadline);
  const egress = await egressAtReadiness(ip, inputs, deadline);
  return { state: "running", ip, endpoint: ip ? endpointOf(ip, inputs) : null, ...egress };
}

/**
 * Deletes the domain found by its identity (a renamed one too) after checking
 * the mark, then its per-VM volumes: the ones it references and the ones its
 * name implies, so they go even when the domain was already gone (a create
 * that died before define). The shared base image is never among them.
 */
export async function remove(id: string, props: Props): Promise<DeleteOutcome> {
  const target = hostTargetOf(props);
  const { vmName } = parseKvmResourceId(id);
  const deadline = deadlineFor(target.timeouts, "delete");
  const progress = { removed: false };
  await stepsWithin(deadline, progressLog)(`delete ${vmName}`, () =>
    removeWithin(target, props, vmName, deadline, progress),
  );
  return progress.removed ? "removed" : "already gone";
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

// ---- helpers ------------------------------------------------------------------------------------------

function checkedInputs(raw: Props): KvmProxyInputs {
  const inputs = checkedInputsOf("KvmProxy", raw, validateKvmInputs, OUTPUT_KEYS);
  const vmName = typeof raw.vmName === "string" ? raw.vmName : undefined;
  if (vmName === undefined)
    throw new PermanentError(
      "vmName is missing; check fills it, so this state was not written by KvmProxy",
    );
  return { ...inputs, vmName };
}

/**
 * What read, delete and `.get` need from the props: where the host is, whose
 * VMs we may touch, and the settings with their defaults. Lenient on purpose:
 * refreshed state may hold what the host reported (a fractional size, a NIC
 * kind KvmProxy does not create), and `.get` passes only what the user gave.
 */
type HostTarget = ReturnType<typeof hostTargetOf>;

function hostTargetOf(props: Props) {
  const field = <K extends keyof typeof kvmProxyInputsSchema.shape>(key: K) => {
    const parsed = kvmProxyInputsSchema.shape[key].safeParse(props[key]);
    if (parsed.success) return parsed.data as z.output<(typeof kvmProxyInputsSchema.shape)[K]>;
    const reasons = parsed.error.issues.map((issue) => issue.message).join("; ");
    throw new PermanentError(`invalid KvmProxy ${String(key)}: ${reasons}`);
  };
  const owner = field("owner");
  const timeouts = field("timeouts");
  return {
    connection: field("connection"),
    socketPath: field("socketPath"),
    pool: field("pool"),
    owner,
    readiness: field("readiness"),
    timeouts,
  };
}

/** What only the host knows; update carries these unchanged (names frozen: they are state keys). */
const CARRIED_KEYS = [
  "host",
  "ip",
  "mac",
  "state",
  "endpoint",
  "imageVolume",
  "seedSha256",
  "createdAt",
  "libvirtUuid",
  "egressIp",
  "checkedAt",
] as const satisfies readonly (keyof KvmProxyOutputs)[];
const OUTPUT_KEYS: readonly string[] = CARRIED_KEYS;
/** The output keys the resource class declares. */
export const KVM_OUTPUT_KEYS = OUTPUT_KEYS;

/** Read, delete, `.get` and a resumed create act only on a domain that carries this stack's mark. */
function requireOurs(
  reading: MarkReading,
  inputs: Pick<KvmProxyInputs, "owner">,
  subject: string,
  adopting = false,
): OwnershipMark {
  return requireOursOf(reading, {
    resource: "KvmProxy",
    subject,
    owner: inputs.owner,
    adopting,
    markPlace: "metadata",
    fixForeign: "choose another vmName or remove it from that stack",
    fixUnmarked: "choose another vmName",
    inspect: "inspect it with virsh metadata before deleting by hand",
  });
}

function seedInputOf(inputs: KvmProxyInputs) {
  return {
    vmName: inputs.vmName,
    userData:
      inputs.userDataBase64 !== undefined
        ? Buffer.from(inputs.userDataBase64, "base64")
        : inputs.userData,
    vendorData: inputs.vendorData,
    installGuestAgent: inputs.installGuestAgent,
    networkConfig: inputs.networkConfig,
  };
}

function outputsOf(
  session: HostSession,
  inputs: KvmProxyInputs,
  parts: RecordedParts,
  live: { ip: string | null; state: VmState },
): KvmProxyOutputs {
  return {
    ...inputs,
    host: session.label,
    ip: live.ip,
    mac: macAddressFor(inputs.vmName),
    state: live.state,
    endpoint: live.ip ? endpointOf(live.ip, inputs) : null,
    imageVolume: parts.imageVolume,
    seedSha256: parts.seedSha256,
    createdAt: parts.createdAt,
    libvirtUuid: parts.uuid,
  };
}

const endpointOf = (ip: string, inputs: KvmProxyInputs): string =>
  `http://${ip}:${inputs.readiness.port}`;

function uuidText(uuid: Buffer): string {
  const hex = uuid.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function toError(error: unknown): Error {
  if (error instanceof EgressProxyError) return error;
  if (error instanceof Error) return new TransientError(safeErrorMessage(error), { cause: error });
  return new TransientError(String(error));
}
