/**
 * KvmProxy create: preflight, base image, overlay and seed, define, start,
 * wait; a failure is undone or recorded so the next up continues it.
 */
import { Deadline } from "../common/deadline";
import { plainJson as plain } from "../common/check";
import { errorClassOf, PermanentError, TransientError } from "../common/errors";
import { createMark } from "../common/mark";
import { deadlineFor, stepsWithin } from "../common/lifecycle";
import { PartialCreateError } from "../common/partial-create";
import { egressAtReadiness } from "../common/egress";
import { safeErrorMessage } from "../common/redact";
import { allSettledOrFirstFailure } from "../common/settled";
import type { DomainHandle, StoragePoolHandle, StorageVolHandle } from "../libvirt-rpc-xdr";
import { buildNoCloudSeed } from "../nocloud";
import { openHost, type HostSession } from "./connect";
import { CreateAttempt } from "./create-attempt";
import { creationMismatch, creationOf } from "./adoption";
import { buildDomainXml, parseDomainXml } from "./domain-xml";
import { assertHostReady, recheckAfterFailure } from "./host-facts";
import type { LibvirtHost, VmState } from "./host";
import { ensureBaseImage, type BaseImage } from "./image-cache";
import { kvmResourceId, macAddressFor, overlayVolumeName, seedVolumeName } from "./naming";
import { waitForReadiness } from "./ready";
import { effectiveCpuMode, type KvmProxyInputs } from "./schema";
import { overlayCapacity, overlayVolumeXml, rawVolumeXml } from "./volume-xml";
import {
  KvmProxyOutputs,
  Props,
  checkedInputs,
  endpointOf,
  progressLog,
  requireOurs,
  ipv6Output,
  seedInputOf,
  toError,
  uuidText,
} from "./steps";

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
    // Independent: both leave in one round trip. Both are waited for, so a start that fails does not
    // leave the autostart call in flight while the failure is recorded.
    await allSettledOrFirstFailure([
      session.host.setAutostart(domain.handle, inputs.startOnBoot),
      session.host.startDomain(domain.handle),
    ] as const);
    state = "running";
    const ready = await waitForReadiness(session.host, domain.handle, inputs, deadline);
    const ip = ready?.ip ?? null;
    const ipv6 = ipv6Output(inputs, ready);
    const egress = await egressAtReadiness(ip, inputs, deadline, ipv6?.ipv6Address);
    return {
      id,
      outs: plain({ ...outputsOf(session, inputs, domain, { ip, state }), ...ipv6, ...egress }),
    };
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
  const what = `domain ${inputs.vmName} on ${session.label}`;
  const mark = requireOurs(description.mark, inputs, what);
  const mismatch = creationMismatch(mark, inputs);
  if (mismatch !== undefined) throw new PermanentError(`${what}: ${mismatch}`);
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
    // The creating arguments libvirt cannot report, for `.get` (adoption.ts).
    const mark = createMark(inputs.owner, new Date(), creationOf(inputs));
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
