/**
 * KvmProxy's dynamic-provider methods. Each reads as a short story; the
 * details live in the modules it calls. check and diff are pure and offline,
 * so `pulumi preview` works in CI without any route to a hypervisor.
 */
import type * as pulumi from "@pulumi/pulumi";
import { Deadline, sleepWithin } from "../common/deadline";
import { checkWithAutonaming, plainJson as plain } from "../common/check";
import { decideDiff } from "../common/diff";
import { EgressProxyError, PermanentError, TransientError } from "../common/errors";
import type { CheckFailure } from "../common/inputs";
import {
  createMark,
  describeOwner,
  ownershipOf,
  type MarkReading,
  type OwnershipMark,
} from "../common/mark";
import { logToEngine } from "../common/engine-log";
import { PartialCreateError } from "../common/partial-create";
import { egressAtReadiness } from "../common/egress";
import { fetchThroughProxy } from "../common/proxy-probe";
import { waitForTcpPort } from "../common/readiness";
import { safeErrorMessage } from "../common/redact";
import type { DomainHandle } from "../libvirt-rpc-xdr";
import { buildNoCloudSeed } from "../nocloud";
import { lookUpAddress } from "./addresses";
import { openHost, rememberKvmProviderConfig, type HostSession } from "./connect";
import { KVM_CHANGE_TABLE } from "./diff";
import { assertHostReady } from "./host-facts";
import { buildDomainXml, parseDomainXml } from "./domain-xml";
import type { LibvirtHost, VmState } from "./host";
import { ensureBaseImage, type BaseImage } from "./image-cache";
import {
  kvmResourceId,
  macAddressFor,
  overlayVolumeName,
  parseKvmResourceId,
  seedVolumeName,
} from "./naming";
import { effectiveCpuMode, validateKvmInputs, type KvmProxyInputs } from "./schema";
import { overlayCapacity, overlayVolumeXml, rawVolumeXml } from "./volume-xml";

type Props = Record<string, unknown>;

/** What create, read and update return: the checked inputs plus what only the host knows. */
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

export async function create(raw: Props): Promise<{ id: string; outs: Props }> {
  const inputs = checkedInputs(raw);
  const deadline = Deadline.afterSeconds(inputs.timeouts.createSeconds, "timeouts.createSeconds");
  const session = await openHost(inputs, deadline);
  await assertHostReady(session.host, inputs); // pool, network, firmware, domain type: fail before making anything
  const id = kvmResourceId(session.label, inputs.vmName);
  const existing = await session.host.findDomain(inputs.vmName);
  const domain = existing
    ? await resumeExisting(session, inputs, existing)
    : await buildAndDefine(session, inputs, deadline);
  await session.host.startDomain(domain.handle);
  const outputs = outputsOf(session, inputs, domain, { ip: null, state: "running" });
  try {
    const ip = await waitForReadiness(session.host, domain.handle, inputs, deadline);
    const egress = await egressAtReadiness(ip, inputs, deadline);
    return {
      id,
      outs: plain({ ...outputs, ip, endpoint: ip ? endpointOf(ip, inputs) : null, ...egress }),
    };
  } catch (error) {
    // The VM exists: record it (marked failed) rather than leak it.
    throw new PartialCreateError(id, plain(outputs), toError(error));
  }
}

interface DefinedDomain {
  handle: DomainHandle;
  uuid: string;
  mark: OwnershipMark;
  imageVolume: string;
  seedSha256: string;
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
    mark,
    imageVolume:
      description.volumes.find((v) => v.device === "disk")?.volume ??
      overlayVolumeName(inputs.vmName),
    seedSha256: seed.sha256,
  };
}

/**
 * The idempotent sequence: base image, overlay (reused when a previous attempt
 * made it), seed (always rebuilt: a cancelled upload leaves a truncated one),
 * define. Volumes this attempt created are removed if define never happens.
 */
async function buildAndDefine(
  session: HostSession,
  inputs: KvmProxyInputs,
  deadline: Deadline,
): Promise<DefinedDomain> {
  const { host } = session;
  const pool = await host.pool(inputs.pool);
  const base = await ensureBaseImage({
    host,
    hostKey: session.hostKey,
    pool,
    image: inputs.image,
    deadline,
    log: progressLog,
  });
  const created: string[] = [];
  try {
    const overlay = await ensureOverlay(host, pool, inputs, base, created);
    const seed = buildNoCloudSeed(seedInputOf(inputs));
    const seedName = seedVolumeName(inputs.vmName);
    await host.deleteVolumeNamed(pool, seedName);
    const seedVolume = await host.createVolume(
      pool,
      seedName,
      rawVolumeXml(seedName, seed.image.size),
    );
    created.push(seedName);
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
      seedVolume: seedName,
      network: inputs.network,
      mac: macAddressFor(inputs.vmName),
      mark,
    });
    const handle = await host.defineDomain(inputs.vmName, xml);
    return {
      handle,
      uuid: uuidText(handle.uuid),
      mark,
      imageVolume: base.name,
      seedSha256: seed.sha256,
    };
  } catch (error) {
    for (const name of created) await host.deleteVolumeNamed(pool, name).catch(() => undefined);
    throw error;
  }
}

async function ensureOverlay(
  host: LibvirtHost,
  pool: Awaited<ReturnType<LibvirtHost["pool"]>>,
  inputs: KvmProxyInputs,
  base: BaseImage,
  created: string[],
): Promise<string> {
  const name = overlayVolumeName(inputs.vmName);
  if (await host.findVolume(pool, name)) return name;
  const capacity = overlayCapacity(inputs.diskGiB, base.virtualBytes);
  if ("problem" in capacity) throw new PermanentError(capacity.problem);
  await host.createVolume(
    pool,
    name,
    overlayVolumeXml(name, capacity.bytes, { path: base.path, format: base.format }),
  );
  created.push(name);
  return name;
}

/** Waits for the address from the VM's own NIC, then (by readiness.mode) for the proxy port. */
async function waitForReadiness(
  host: LibvirtHost,
  dom: DomainHandle,
  inputs: KvmProxyInputs,
  createDeadline: Deadline,
): Promise<string | null> {
  if (inputs.readiness.mode === "none") return null;
  const deadline = earlier(
    createDeadline,
    Deadline.afterSeconds(inputs.timeouts.readySeconds, "timeouts.readySeconds"),
  );
  const mac = macAddressFor(inputs.vmName);
  let ip: string | undefined;
  while (ip === undefined) {
    // "Agent not connected yet" is the normal state of a booting VM, not an error.
    ({ ip } = await lookUpAddress(mac, (source) => host.interfaces(dom, source)));
    if (ip === undefined) {
      if (deadline.remainingMs() < 2000)
        throw deadline.timeoutError(`the guest agent reporting ${inputs.vmName}'s address`);
      await sleepWithin(2000, deadline);
    }
  }
  if (inputs.readiness.mode === "port") {
    await waitForTcpPort(ip, inputs.readiness.port, deadline);
    if (inputs.readiness.probeUrl !== undefined)
      await waitForProxyProbe(ip, inputs.readiness.port, inputs.readiness.probeUrl, deadline);
  }
  return ip;
}

/** The proxy is ready when a request through it succeeds; squid may answer 503 while it finishes starting. */
async function waitForProxyProbe(
  ip: string,
  port: number,
  url: string,
  deadline: Deadline,
): Promise<void> {
  let last = "no attempt";
  while (deadline.remainingMs() > 0) {
    try {
      const { status } = await fetchThroughProxy({ host: ip, port }, url, deadline.capped(10_000));
      if (status >= 200 && status < 400) return;
      last = `HTTP ${status}`;
    } catch (error) {
      last = (error as Error).message;
    }
    await sleepWithin(2000, deadline);
  }
  throw deadline.timeoutError(
    `a request to readiness.probeUrl through the proxy at ${ip}:${port} (last: ${last})`,
  );
}

// ---- read / update / delete -----------------------------------------------------------------------

export async function read(id: string, props: Props): Promise<pulumi.dynamic.ReadResult> {
  const previous = props as unknown as KvmProxyOutputs;
  const inputs = checkedInputs(props);
  const { vmName } = parseKvmResourceId(id);
  const deadline = Deadline.afterSeconds(
    Math.min(inputs.timeouts.readySeconds, 120),
    "timeouts.readySeconds",
  );
  const session = await openHost(inputs, deadline);
  const handle = await session.host.findDomain(vmName);
  if (handle === undefined) return {}; // gone: Pulumi drops it from state
  const description = parseDomainXml(await session.host.domainXml(handle));
  requireOurs(description.mark, inputs, `domain ${vmName} on ${session.label}`);
  const { state } = await session.host.state(handle);
  const mac = description.mac ?? macAddressFor(vmName);
  // One address source failing must not blank an address we knew.
  const lookup =
    state === "running"
      ? await lookUpAddress(mac, (source) => session.host.interfaces(handle, source))
      : undefined;
  const ip = lookup?.ip ?? (state === "stopped" ? null : (previous.ip ?? null));
  return {
    id,
    props: plain({
      ...previous,
      state,
      mac,
      ip,
      endpoint: ip ? endpointOf(ip, inputs) : null,
      libvirtUuid: uuidText(handle.uuid),
    }),
  };
}

/** In-place changes only (credentials, readiness, timeouts): no VM is touched. */
export async function update(_id: string, olds: Props, news: Props): Promise<{ outs: Props }> {
  const inputs = checkedInputs(news);
  const previous = olds as unknown as KvmProxyOutputs;
  return {
    outs: plain({
      ...inputs,
      host: previous.host,
      ip: previous.ip,
      mac: previous.mac,
      state: previous.state,
      endpoint: previous.ip ? endpointOf(previous.ip, inputs) : null,
      imageVolume: previous.imageVolume,
      seedSha256: previous.seedSha256,
      createdAt: previous.createdAt,
      libvirtUuid: previous.libvirtUuid,
      egressIp: previous.egressIp ?? null,
      checkedAt: previous.checkedAt ?? null,
    }),
  };
}

export async function remove(id: string, props: Props): Promise<void> {
  const inputs = checkedInputs(props);
  const { vmName } = parseKvmResourceId(id);
  const deadline = Deadline.afterSeconds(inputs.timeouts.deleteSeconds, "timeouts.deleteSeconds");
  const session = await openHost(inputs, deadline);
  const { host } = session;
  const handle = await host.findDomain(vmName);
  if (handle !== undefined) {
    requireOurs(
      parseDomainXml(await host.domainXml(handle)).mark,
      inputs,
      `domain ${vmName} on ${session.label}`,
    );
    await host.destroyDomain(handle);
    await host.undefineDomain(handle);
  }
  // The volumes go even when the domain was already gone (a create that died before define).
  const pool = await host.findPool(inputs.pool);
  if (pool === undefined) return; // no pool: nothing of ours can be left
  await host.deleteVolumeNamed(pool, overlayVolumeName(vmName));
  await host.deleteVolumeNamed(pool, seedVolumeName(vmName));
}

// ---- helpers ------------------------------------------------------------------------------------------

function checkedInputs(raw: Props): KvmProxyInputs {
  const result = validateKvmInputs(stripOutputs(raw));
  if (!result.ok) {
    const reasons = result.failures.map((failure) => failure.reason).join("; ");
    throw new PermanentError(
      `invalid KvmProxy inputs: ${reasons || "unknown values where known ones are needed"}`,
    );
  }
  const vmName = typeof raw.vmName === "string" ? raw.vmName : undefined;
  if (vmName === undefined)
    throw new PermanentError(
      "vmName is missing; check fills it, so this state was not written by KvmProxy",
    );
  return { ...result.inputs, vmName };
}

const OUTPUT_KEYS = [
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
];
function stripOutputs(raw: Props): Props {
  const inputs: Props = {};
  for (const [key, value] of Object.entries(raw))
    if (!OUTPUT_KEYS.includes(key) && key !== "__provider") inputs[key] = value;
  return inputs;
}

/** Read, delete and a resumed create act only on a domain that carries this stack's mark. */
function requireOurs(reading: MarkReading, inputs: KvmProxyInputs, what: string): OwnershipMark {
  switch (ownershipOf(reading, inputs.owner)) {
    case "ours":
      return (reading as { mark: OwnershipMark }).mark;
    case "foreign":
      throw new PermanentError(
        `${what} belongs to ${describeOwner((reading as { mark: OwnershipMark }).mark.owner)}, not to ${inputs.owner.project}/${inputs.owner.stack}; choose another vmName or remove it from that stack`,
      );
    case "unmarked":
      throw new PermanentError(
        `${what} exists but was not made by egress-proxies (no ownership mark); choose another vmName`,
      );
    default:
      throw new PermanentError(
        `${what} carries an unreadable ownership mark (${(reading as { reason: string }).reason}); inspect it with virsh metadata before deleting by hand`,
      );
  }
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
  domain: DefinedDomain,
  live: { ip: string | null; state: VmState },
): KvmProxyOutputs {
  return {
    ...inputs,
    host: session.label,
    ip: live.ip,
    mac: macAddressFor(inputs.vmName),
    state: live.state,
    endpoint: live.ip ? endpointOf(live.ip, inputs) : null,
    imageVolume: domain.imageVolume,
    seedSha256: domain.seedSha256,
    createdAt: domain.mark.createdAt,
    libvirtUuid: domain.uuid,
  };
}

const endpointOf = (ip: string, inputs: KvmProxyInputs): string =>
  `http://${ip}:${inputs.readiness.port}`;

function uuidText(uuid: Buffer): string {
  const hex = uuid.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function earlier(a: Deadline, b: Deadline): Deadline {
  return a.at <= b.at ? a : b;
}

function toError(error: unknown): Error {
  if (error instanceof EgressProxyError) return error;
  if (error instanceof Error) return new TransientError(safeErrorMessage(error), { cause: error });
  return new TransientError(String(error));
}
