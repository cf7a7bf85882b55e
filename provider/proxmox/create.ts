/**
 * ProxmoxProxy create: clone, configure, seed, start, wait; each step
 * recorded so a failed create continues at the next up. The flow steps, the
 * facts (Fn) and the rules are those of docs/proxmox.md.
 */
import { Deadline } from "../common/deadline";
import { plainJson as plain } from "../common/check";
import { PermanentError, withContext } from "../common/errors";
import { createMark, MARK_TAG, OwnerIdentity, OwnershipMark } from "../common/mark";
import {
  deadlineFor,
  recordingPartialCreate,
  requireOurs as requireOursOf,
} from "../common/lifecycle";
import { PartialCreateError } from "../common/partial-create";
import { egressAtReadiness } from "../common/egress";
import { familiesOf, proxyEndpoint } from "../common/ip-families";
import { waitForProxyAuthRequired, waitForTcpPort } from "../common/readiness";
import { allSettledOrFirstFailure } from "../common/settled";
import { FormFields, ProxmoxClient } from "./client";
import { isCredentialRejected, isTaskFailure, isVmidTaken } from "./classify";
import { ProxmoxProxyInputs, ProxmoxProxyOutputs } from "./schema";
import { SeedUpload, seedVolumeId } from "./seed";
import { waitForStarted, waitForTask } from "./tasks";
import {
  bootDisk,
  diskSizeBytes,
  GIB,
  ide2Problem,
  macOf,
  markOfConfig,
  proxmoxMacFor,
  rewriteNet0,
  tagsValue,
  vmDescription,
} from "./vm-config";
import {
  ClusterVmEntry,
  getConfig,
  getStatus,
  isVmidFree,
  listVms,
  requestConfigWrite,
  requestResize,
  startClone,
  startVm,
  VmRef,
  waitForAgentAddress,
  waitUntilUnlocked,
} from "./vm";
import { vmidCandidates } from "./vmid";
import { creationMismatch, creationOf } from "./adoption";
import {
  Props,
  checkedInputs,
  clientFor,
  ignoreNotFound,
  progress,
  resourceId,
  seedSpec,
  stepsWithin,
} from "./steps";

/**
 * Never leaks: a failed clone is removed by PVE itself, and once the VM exists
 * every failure hands Pulumi a partial create (the VM is in state; the next
 * `up` continues it through update, `destroy` removes it with its seed).
 */
export async function create(inputs: Props): Promise<{ id: string; outs: ProxmoxProxyOutputs }> {
  return recordingPartialCreate(inputs, () => createSteps(inputs));
}

export async function createSteps(
  inputs: Props,
  /** Set when update continues a recorded partial create: the id (and so the VMID) is fixed. */
  pinned?: VmRef,
): Promise<{ id: string; outs: ProxmoxProxyOutputs }> {
  const spec = checkedInputs(inputs);
  const client = clientFor(spec);
  const deadline = deadlineFor(spec.timeouts, "create");
  const where = `VM ${spec.vmName} on node ${spec.node}`;
  const step = stepsWithin(deadline, spec.vmName);
  // The seed needs no VM: it uploads while the clone task runs (flow step 3 beside step 2).
  const seedUpload = new SeedUpload(client, seedSpec(spec), deadline, () =>
    progress(spec.vmName, `uploading the seed to ${spec.seedStorage}`),
  );
  const vm = await step("clone", () =>
    ensureVm(client, spec, deadline, pinned, () => seedUpload.startEarly()),
  ).catch((error) => cloneFailed(client, spec, error, where, seedUpload, pinned));
  const id = resourceId(vm.ref);
  let outs = initialOutputs(spec, vm);
  try {
    const [seed, config] = await allSettledOrFirstFailure([
      step("upload seed", () => seedUpload.result()),
      step("read config", () => getConfig(client, vm.ref, deadline)),
    ] as const);
    outs = { ...outs, seedSha256: seed.sha256 };
    const planned = configChanges(spec, vm, seed.volumeId, config);
    const resize = bootDiskResize(spec, planned.config);
    await step("configure", () =>
      configureVm(client, spec, vm.ref, planned.changes, resize, deadline),
    );
    outs = { ...outs, mac: macOf(planned.config) ?? null };
    // running: false keeps it defined and off, as asked (an adopted running VM is left running).
    if (!spec.running) return { id, outs: { ...outs, state: vm.running ? "running" : "stopped" } };
    // Freshly cloned VMs are stopped; an adopted one was looked at when adopted.
    if (!vm.running) await step("start", () => startVm(client, vm.ref, deadline));
    progress(spec.vmName, `VMID ${vm.ref.vmid} is running`);
    outs = { ...outs, state: "running" };
    outs = await becomeReady(client, spec, vm.ref, outs);
    const egress = await egressAtReadiness(outs.ip, spec, deadline, outs.ipv6Address);
    return { id, outs: { ...outs, ...egress } };
  } catch (error) {
    if (error instanceof PartialCreateError) throw error;
    // The VM exists: let Pulumi record it (marked failed) rather than leak it.
    const cause = withContext(error, {
      operation: "create",
      resource: `${where} (VMID ${vm.ref.vmid})`,
    });
    throw new PartialCreateError(id, plain(outs), cause);
  }
}

interface EnsuredVm {
  ref: VmRef;
  mark: OwnershipMark;
  /** Running (or paused) when found; a fresh clone is stopped. */
  running: boolean;
}

/**
 * Finds our VM (resumed create) or clones a new one. Rule 1 (docs/proxmox.md
 * section 9, rules): a nameless or
 * locked entry is in progress, never absent. Rule 2: a taken VMID is
 * inspected; ours is adopted, someone else's with our name refused, anyone
 * else's skipped.
 */
async function ensureVm(
  client: ProxmoxClient,
  spec: ProxmoxProxyInputs,
  deadline: Deadline,
  pinned: VmRef | undefined,
  /** Called once Proxmox has accepted a clone: what needs no VM may start. */
  onCloneAccepted: () => void,
): Promise<EnsuredVm> {
  for (;;) {
    deadline.check(`finding or cloning ${spec.vmName}`);
    const entries = await listVms(client, deadline);
    const existing = entries.find(
      (entry) => entry.node === spec.node && entry.name === spec.vmName,
    );
    if (existing !== undefined && pinned !== undefined && existing.vmid !== pinned.vmid)
      throw new PermanentError(
        `${spec.vmName} is VMID ${existing.vmid} on node ${spec.node}, but state records VMID ${pinned.vmid}; run pulumi refresh, then up again`,
      );
    if (existing !== undefined) {
      progress(spec.vmName, `found VMID ${existing.vmid} from an earlier attempt; adopting it`);
      return adoptExisting(client, spec, { node: spec.node, vmid: existing.vmid }, deadline);
    }
    const choice = await chooseVmid(client, spec, entries, deadline, pinned);
    if (choice.busy) {
      progress(
        spec.vmName,
        `VMID ${choice.ref.vmid} is being cloned (maybe by an earlier attempt); waiting`,
      );
      await waitUntilUnlocked(client, choice.ref, deadline).catch(ignoreNotFound);
      continue;
    }
    // The creating arguments PVE cannot report, for `.get` (adoption.ts).
    const mark = createMark(spec.owner, new Date(), creationOf(spec));
    try {
      progress(spec.vmName, `cloning template ${spec.templateVmid} into VMID ${choice.ref.vmid}`);
      const upid = await startClone(
        client,
        {
          node: spec.node,
          templateVmid: spec.templateVmid,
          newid: choice.ref.vmid,
          name: spec.vmName,
          storage: spec.diskStorage,
          description: vmDescription(spec.vmName, mark),
        },
        deadline,
      );
      onCloneAccepted();
      await waitForTask(client, upid, { deadline }).catch((error) =>
        recordIfCloneExists(client, spec, { ref: choice.ref, mark, running: false }, error),
      );
      return { ref: choice.ref, mark, running: false };
    } catch (error) {
      // F4: someone (a parallel create, or our crashed attempt) got there first: look again.
      if (isVmidTaken(error)) continue;
      throw error;
    }
  }
}

/**
 * The clone was accepted but waiting for it failed. A failed clone task is
 * cleaned up by PVE (retry or give up); one we merely stopped waiting for
 * (deadline, network) leaves a VM that Pulumi must record, not forget.
 */
async function recordIfCloneExists(
  client: ProxmoxClient,
  spec: ProxmoxProxyInputs,
  vm: EnsuredVm,
  error: unknown,
): Promise<never> {
  if (isTaskFailure(error) || isCredentialRejected(error)) throw error;
  const existenceCheck = new Deadline(10_000, "the 10 s existence check");
  const stillThere = await getStatus(client, vm.ref, existenceCheck).then(
    () => true,
    () => false,
  );
  if (!stillThere) throw error;
  const where = `VM ${spec.vmName} (VMID ${vm.ref.vmid})`;
  const cause = withContext(error, { operation: "create", resource: where });
  throw new PartialCreateError(resourceId(vm.ref), plain(initialOutputs(spec, vm)), cause);
}

async function chooseVmid(
  client: ProxmoxClient,
  spec: ProxmoxProxyInputs,
  entries: ClusterVmEntry[],
  deadline: Deadline,
  pinned?: VmRef,
): Promise<{ ref: VmRef; busy: boolean }> {
  const byVmid = new Map(entries.map((entry) => [entry.vmid, entry]));
  const candidates =
    pinned === undefined ? vmidCandidates(spec.vmName, spec.vmidRange) : [pinned.vmid];
  for (const vmid of candidates) {
    const entry = byVmid.get(vmid);
    const ref = { node: entry?.node ?? spec.node, vmid };
    // A nameless entry is mid-clone (F8) and may be our own crashed attempt.
    if (entry !== undefined) {
      if (entry.name === undefined || entry.name === "") return { ref, busy: true };
      continue;
    }
    // Not visible to us (permission-filtered) yet taken: demonstrably not ours.
    if (await isVmidFree(client, vmid, deadline)) return { ref, busy: false };
  }
  if (pinned !== undefined)
    throw new PermanentError(
      `VMID ${pinned.vmid}, which state records for ${spec.vmName}, now holds another VM; run pulumi refresh, then up again`,
    );
  throw new PermanentError(
    `no free VMID in vmidRange ${spec.vmidRange.first}-${spec.vmidRange.last}; widen vmidRange`,
  );
}

/**
 * The clone step failed for good (deadline, network). A clone whose answer or
 * task we lost may still have made our VM: if a VM by our name and with our
 * mark is there, it is recorded rather than left behind. One look, 10 s.
 */
async function recordCloneLeftBehind(
  client: ProxmoxClient,
  spec: ProxmoxProxyInputs,
  error: unknown,
  where: string,
  pinned?: VmRef,
): Promise<never> {
  if (error instanceof PartialCreateError) throw error;
  const failure = withContext(error, { operation: "create", resource: where });
  // A failed clone task is cleaned up by PVE, and a refused request made nothing: nothing of
  // ours can be left (and a refused token would only be refused again).
  if (isTaskFailure(error) || isCredentialRejected(error)) throw failure;
  const look = new Deadline(10_000, "the 10 s look for a clone left behind");
  const found = await listVms(client, look).then(
    (entries) => entries.find((entry) => entry.node === spec.node && entry.name === spec.vmName),
    () => undefined,
  );
  // A continued create records only the VMID state already names.
  if (found === undefined || (pinned !== undefined && found.vmid !== pinned.vmid)) throw failure;
  const ref = { node: spec.node, vmid: found.vmid };
  const mark = await getConfig(client, ref, look).then(
    (config) => requireOurs(config, ref, spec.vmName, spec.owner),
    () => undefined,
  );
  // One made for another program (adoption refused it) is not this clone's.
  if (mark === undefined || creationMismatch(mark, spec) !== undefined) throw failure;
  throw new PartialCreateError(
    resourceId(ref),
    plain(initialOutputs(spec, { ref, mark, running: false })),
    failure,
  );
}

/**
 * The clone step failed for good. A VM recorded as a partial create keeps the
 * seed uploaded beside its clone (state names it; delete removes it); with no
 * VM left, that seed is removed too.
 */
async function cloneFailed(
  client: ProxmoxClient,
  spec: ProxmoxProxyInputs,
  error: unknown,
  where: string,
  seedUpload: SeedUpload,
  pinned?: VmRef,
): Promise<never> {
  try {
    return await recordCloneLeftBehind(client, spec, error, where, pinned);
  } catch (outcome) {
    if (outcome instanceof PartialCreateError) await seedUpload.settled();
    else await seedUpload.discard();
    throw outcome;
  }
}

async function adoptExisting(
  client: ProxmoxClient,
  spec: ProxmoxProxyInputs,
  ref: VmRef,
  deadline: Deadline,
): Promise<EnsuredVm> {
  const status = await waitUntilUnlocked(client, ref, deadline);
  const config = await getConfig(client, ref, deadline);
  const mark = requireOurs(config, ref, spec.vmName, spec.owner);
  const mismatch = creationMismatch(mark, spec);
  if (mismatch !== undefined)
    throw new PermanentError(`VM ${ref.vmid} (${spec.vmName}) on node ${ref.node}: ${mismatch}`);
  return { ref, mark, running: status.status === "running" };
}

/** Ownership is enforced everywhere: the VM must carry our mark, for this project and stack. */
export function requireOurs(
  config: Record<string, string | undefined>,
  ref: VmRef,
  vmName: string,
  owner: Pick<OwnerIdentity, "project" | "stack">,
  adopting = false,
): OwnershipMark {
  return requireOursOf(markOfConfig(config), {
    resource: "ProxmoxProxy",
    subject: `VM ${ref.vmid} (${JSON.stringify(config.name ?? "")}) on node ${ref.node}`,
    owner,
    adopting,
    markPlace: "description",
    fixForeign: "choose another vmName",
    fixUnmarked: `the name ${vmName} is taken; choose another vmName or remove that VM`,
    inspect: "inspect its description in the PVE web UI before deleting by hand",
  });
}

/**
 * Flow step 4's changes (ide2, cores, memory, net0, tags, description) to the
 * config as cloned, and the config they make.
 */
function configChanges(
  spec: ProxmoxProxyInputs,
  vm: EnsuredVm,
  seedVolume: string,
  config: Record<string, string | undefined>,
): { changes: FormFields; config: Record<string, string | undefined> } {
  const problem = ide2Problem(config, seedVolume);
  if (problem !== undefined)
    throw new PermanentError(`template ${spec.templateVmid}: ${problem}`, {
      resource: `VM ${vm.ref.vmid}`,
    });
  const changes: FormFields = {
    ide2: `${seedVolume},media=cdrom`,
    cores: spec.cores,
    memory: spec.memoryMiB,
    tags: tagsValue([MARK_TAG, ...spec.tags]),
    description: vmDescription(spec.vmName, vm.mark),
    onboot: spec.startOnBoot ? 1 : 0,
  };
  // The address comes from the guest agent; make sure its channel exists.
  if (config.agent === undefined || /^(0|enabled=0)/.test(config.agent)) changes.agent = 1;
  const net0 =
    config.net0 === undefined
      ? undefined
      : rewriteNet0(
          config.net0,
          spec.bridge,
          spec.vlanTag,
          familiesOf(spec).ipv6 ? proxmoxMacFor(spec.vmName) : undefined,
        );
  if (net0 !== undefined) changes.net0 = net0;
  const changed = Object.entries(changes).map(([key, value]) => [key, String(value)]);
  return { changes, config: { ...config, ...Object.fromEntries(changed) } };
}

/** Flow step 5: absolute size; equal is skipped; smaller is refused before any task (F20). */
function bootDiskResize(
  spec: ProxmoxProxyInputs,
  config: Record<string, string | undefined>,
): { disk: string; gib: number } | undefined {
  if (spec.diskGiB === undefined) return undefined;
  const disk = bootDisk(config);
  if (disk === undefined)
    throw new PermanentError(
      `template ${spec.templateVmid} has no boot disk to resize; unset diskGiB or fix its boot order`,
    );
  const current = diskSizeBytes(config[disk]) ?? 0;
  const wanted = spec.diskGiB * GIB;
  if (wanted === current) return undefined;
  if (wanted < current)
    throw new PermanentError(
      `diskGiB ${spec.diskGiB} is smaller than the template's ${disk} (${(current / GIB).toFixed(1)} GiB); set diskGiB to at least ${Math.ceil(current / GIB)} or leave it unset`,
    );
  return { disk, gib: spec.diskGiB };
}

/**
 * Flow steps 4 and 5: the config write and the resize touch different keys
 * and queue on the VM's lock in the order sent, so both go out at once and
 * the resize is waited for after the write (asked about at once by then).
 */
async function configureVm(
  client: ProxmoxClient,
  spec: ProxmoxProxyInputs,
  ref: VmRef,
  changes: FormFields,
  resize: { disk: string; gib: number } | undefined,
  deadline: Deadline,
): Promise<void> {
  const write = await requestConfigWrite(client, ref, changes, deadline);
  if (resize !== undefined) progress(spec.vmName, `resizing ${resize.disk} to ${resize.gib} GiB`);
  const resizing =
    resize === undefined
      ? undefined
      : await requestResize(client, ref, resize.disk, resize.gib, deadline);
  await waitForStarted(client, write, deadline);
  if (resizing !== undefined) await waitForStarted(client, resizing, deadline);
}

/**
 * Flow step 7 and readiness, within timeouts.readySeconds: the address from
 * the agent, then (mode "port") the proxy port. A failure after the address
 * is known keeps it in the recorded outputs.
 */
export async function becomeReady(
  client: ProxmoxClient,
  spec: ProxmoxProxyInputs,
  ref: VmRef,
  outs: ProxmoxProxyOutputs,
): Promise<ProxmoxProxyOutputs> {
  if (spec.readiness.mode === "none") return outs;
  const deadline = deadlineFor(spec.timeouts, "ready");
  if (outs.mac === null)
    throw new PermanentError(`VM ${ref.vmid} has no usable net0 to read its address from`);
  progress(spec.vmName, "waiting for the guest agent to report the address");
  const families = familiesOf(spec);
  const { ip, ipv6 } = await waitForAgentAddress(client, ref, outs.mac, deadline, {
    ...families,
    settings: spec.ipv6,
  });
  progress(spec.vmName, `address ${ip}${ipv6 !== undefined && ipv6 !== ip ? ` and ${ipv6}` : ""}`);
  const withAddress = {
    ...outs,
    ip,
    endpoint: proxyEndpoint(ip, spec.readiness.port),
    ...(families.ipv6 ? { ipv6Address: ipv6 ?? null } : {}),
  };
  if (spec.readiness.mode === "address") return withAddress;
  try {
    await waitForTcpPort(ip, spec.readiness.port, deadline);
    // squid must answer over every family the proxy is published with.
    if (ipv6 !== undefined && ipv6 !== ip)
      await waitForTcpPort(ipv6, spec.readiness.port, deadline);
    if (spec.readiness.authRequired === true)
      for (const address of new Set([ip, ...(ipv6 === undefined ? [] : [ipv6])]))
        await waitForProxyAuthRequired(address, spec.readiness.port, deadline);
  } catch (error) {
    const cause = withContext(error, {
      operation: "readiness",
      resource: `VM ${spec.vmName} (VMID ${ref.vmid})`,
    });
    throw new PartialCreateError(resourceId(ref), plain(withAddress), cause);
  }
  return withAddress;
}

function initialOutputs(spec: ProxmoxProxyInputs, vm: EnsuredVm): ProxmoxProxyOutputs {
  return {
    ...spec,
    vmid: vm.ref.vmid,
    host: spec.node,
    ip: null,
    mac: null,
    state: "stopped",
    endpoint: null,
    seedVolume: seedVolumeId(spec.seedStorage, spec.vmName),
    seedSha256: "",
    createdAt: vm.mark.createdAt,
  };
}
