import { Deadline } from "../common/deadline";
import { checkWithAutonaming, plainJson as plain } from "../common/check";
import { sameValue } from "../common/diff";
import { containsUnknown, readinessSchema, timeoutsSchema } from "../common/inputs";
import { isNotFound, isPermanent, PermanentError, withContext } from "../common/errors";
import { createMark, MARK_TAG, ownershipOf, OwnerIdentity, OwnershipMark } from "../common/mark";
import {
  carriedOutputs,
  checkedInputs as checkedInputsOf,
  continueCreate as continueCreateOf,
  deadlineFor,
  recordingPartialCreate,
  type DeleteOutcome,
  requireOurs as requireOursOf,
  stepsWithin as stepRunner,
  type Timeouts,
} from "../common/lifecycle";
import { logToEngine } from "../common/engine-log";
import { isIncompleteCreate, PartialCreateError } from "../common/partial-create";
import {
  EgressHealFailedError,
  needsEgressRestart,
  recheckInputsOf,
  recheckOnRead,
  rotationDue,
  withEgressHeal,
} from "../common/egress-recheck";
import { egressAtReadiness } from "../common/egress";
import { isGoneForGood, leaveBehind, rememberGoneHosts, withWayOut } from "../common/gone-hosts";
import {
  ReplaceOnNextUpError,
  replacementReason,
  withRepairReplacement,
  withReplacementReason,
} from "../common/replacement";
import { waitForTcpPort } from "../common/readiness";
import { FormFields, ProxmoxClient } from "./client";
import { isCredentialRejected, isTaskFailure, isVmidTaken } from "./classify";
import { ConnectionInputs, rememberProviderConfig, resolveConnection } from "./connection";
import { brokenVmReason, seedIsPresent, vmGoneReason } from "./damage";
import { decideProxmoxDiff, DiffDecision, PROXMOX_CHANGE_TABLE } from "./diff";
import {
  CheckFailure,
  normalizeTags,
  proxmoxProxyInputsSchema,
  ProxmoxProxyInputs,
  ProxmoxProxyOutputs,
  validateInputs,
} from "./schema";
import { deleteSeed, SeedUpload, seedVolumeId } from "./seed";
import { waitForStarted, waitForTask } from "./tasks";
import {
  bootDisk,
  diskSizeBytes,
  GIB,
  ide2Problem,
  macOf,
  markOfConfig,
  rewriteNet0,
  tagsValue,
  vmDescription,
} from "./vm-config";
import {
  agentAddress,
  ClusterVmEntry,
  destroyVm,
  getConfig,
  getStatus,
  isVmidFree,
  listVms,
  requestConfigWrite,
  requestResize,
  startClone,
  startVm,
  stopVm,
  VmRef,
  VmStatus,
  waitForAgentAddress,
  waitUntilUnlocked,
  writeConfig,
} from "./vm";
import { vmidCandidates } from "./vmid";
import { observedInputs } from "./observed";

/**
 * ProxmoxProxy's check/diff/create/read/update/delete, each a short story over
 * the steps in vm.ts and seed.ts. The flow, the facts (Fn) and the rules are
 * those of docs/proxmox.md, "Proxmox VE behaviours we rely on".
 *
 * FROZEN: this module's path (dist/provider/proxmox/provider.js) and the
 * exports configure, check, diff, create, read, update and remove are
 * required by the provider code stored in every ProxmoxProxy's state (see
 * resource.ts); so is deleteProxy, the name earlier versions' stored code calls.
 */

type Props = Record<string, unknown>;

/** A progress line in the user's `pulumi up` output (redacted; a no-op outside a provider process). */
function progress(vmName: string, message: string): void {
  logToEngine(`ProxmoxProxy ${vmName}: ${message}`);
}

// ---------------------------------------------------------------- configure

export async function configure(request: {
  config?: { get(key: string): string | undefined };
}): Promise<void> {
  rememberProviderConfig(request.config);
  rememberGoneHosts(request.config);
}

// ---------------------------------------------------------------- check / diff: offline and pure

export async function check(
  olds: Props,
  news: Props,
): Promise<{ inputs: Props; failures: CheckFailure[] }> {
  return checkWithAutonaming(PROXMOX_CHANGE_TABLE, olds, news, validateInputs, (inputs) => ({
    ...inputs,
    // At preview the list may be unknown, or hold an unknown tag: kept as given.
    tags: containsUnknown(inputs.tags) ? inputs.tags : normalizeTags(inputs.tags),
  }));
}

export async function diff(_id: string, olds: Props, news: Props): Promise<DiffDecision> {
  // A repair replacement (common/replacement.ts) outranks an in-place egress heal.
  return withRepairReplacement(withEgressHeal(decideProxmoxDiff(olds, news), olds, news), olds);
}

// ---------------------------------------------------------------- create

/**
 * Never leaks: a failed clone is removed by PVE itself, and once the VM exists
 * every failure hands Pulumi a partial create (the VM is in state; the next
 * `up` continues it through update, `destroy` removes it with its seed).
 */
export async function create(inputs: Props): Promise<{ id: string; outs: ProxmoxProxyOutputs }> {
  return recordingPartialCreate(inputs, () => createSteps(inputs));
}

async function createSteps(
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
    const [seed, config] = await bothSettled(
      step("upload seed", () => seedUpload.result()),
      step("read config", () => getConfig(client, vm.ref, deadline)),
    );
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
    return { id, outs: { ...outs, ...(await egressAtReadiness(outs.ip, spec, deadline)) } };
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
 * Finds our VM (resumed create) or clones a new one. Rule 1: a nameless or
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
    const mark = createMark(spec.owner);
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
  if (mark === undefined) throw failure;
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
  return {
    ref,
    mark: requireOurs(config, ref, spec.vmName, spec.owner),
    running: status.status === "running",
  };
}

/** Ownership is enforced everywhere: the VM must carry our mark, for this project and stack. */
function requireOurs(
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
    config.net0 === undefined ? undefined : rewriteNet0(config.net0, spec.bridge, spec.vlanTag);
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
async function becomeReady(
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
  const ip = await waitForAgentAddress(client, ref, outs.mac, deadline);
  progress(spec.vmName, `address ${ip}`);
  const withAddress = { ...outs, ip, endpoint: `http://${ip}:${spec.readiness.port}` };
  if (spec.readiness.mode === "address") return withAddress;
  try {
    await waitForTcpPort(ip, spec.readiness.port, deadline);
  } catch (error) {
    const cause = withContext(error, {
      operation: "readiness",
      resource: `VM ${spec.vmName} (VMID ${ref.vmid})`,
    });
    throw new PartialCreateError(resourceId(ref), plain(withAddress), cause);
  }
  return withAddress;
}

// ---------------------------------------------------------------- read

/**
 * Refresh and `.get`: the current state, address and mark, and the VM's
 * config (name, cores, memory, tags, net0, disk) as props and as `inputs`, so
 * refresh shows drift and the next `up` proposes what the change table says.
 * Never blocks on the agent (one short attempt; a failure keeps the known
 * address). A locked VM is in progress, not gone (rule 1); a gone VM removes
 * the resource. Identity is the VMID and our mark, not the name.
 */
export async function read(
  id: string,
  props: Props,
): Promise<{ id?: string; props: Props; inputs?: Props }> {
  const ref = parseResourceId(id);
  const client = clientFor(props as ConnectionInputs);
  // `.get` passes the user's arguments only: no output of ours has been recorded yet.
  const adopting = props.createdAt === undefined;
  // A host gone for good is not asked: state stays as recorded, for delete to give up on.
  if (!adopting && isGoneForGood(endpointNamesOf(props))) return { id, props };
  const settings = settingsOf(props);
  const deadline = deadlineFor(settings.timeouts, "read");
  const step = stepsWithin(deadline);
  const status = await step("read status", () => getStatus(client, ref, deadline)).catch(
    notFoundAsUndefined,
  );
  const seedVolume = seedVolumeOf(props);
  const seedPresent = (): Promise<boolean> =>
    step("read seed", () => seedIsPresent(client, ref.node, seedVolume, deadline));
  const gone = () => goneVm(ref, props, seedVolume, adopting, seedPresent);
  if (status === undefined) return gone();
  // Ours in progress: report it as it was. Adopting one still needs its mark checked.
  if (isLocked(status) && !adopting)
    return { id, props: { ...props, state: stateOf(status) }, inputs: inputsOf(props) };
  // Independent questions: asked together.
  const [config, seedThere] = await Promise.all([
    step("read config", () => getConfig(client, ref, deadline)).catch(notFoundAsUndefined),
    // Unknown (the storage unreadable) says nothing: only a seed seen missing replaces.
    adopting ? Promise.resolve(true) : seedPresent().catch(() => true),
  ]);
  if (config === undefined) return gone();
  const mark = ourVmAt(config, ref, props, adopting);
  if (mark === undefined) return gone();
  const mac = macOf(config) ?? null;
  const ip = await freshAddress(client, ref, status, mac, props.ip);
  const port = settings.readiness.port;
  const recheckInputs = recheckInputsOf(props, port);
  const serving = stateOf(status) === "running";
  const recheck = await recheckOnRead(recheckInputs, { serving, address: ip }, props, deadline);
  const rotation = rotationDue(recheckInputs, mark.createdAt, recheck.finding);
  const outputs: Props = {
    ...observedInputs(props, config, adopting),
    // Paused counts as running: reported, never started or killed (rule 6).
    running: status.status === "running",
    node: ref.node,
    host: ref.node,
    vmid: ref.vmid,
    mac,
    state: stateOf(status),
    ip,
    endpoint: ip === null ? null : `http://${ip}:${port}`,
    createdAt: mark.createdAt,
    ...recheck.outputs,
    ...(rotation === undefined ? {} : { rotation }),
  };
  // A boot disk or seed gone replaces the VM; a reason an earlier update recorded stays until then.
  const reason = brokenVmReason(config, seedVolume, seedThere) ?? replacementReason(props);
  return {
    id,
    props: plain(withReplacementReason(outputs, reason)),
    inputs: withReplacementReason(inputsOf(outputs), reason),
  };
}

/**
 * The VM is gone. With its seed gone too (or adopting), Pulumi drops it from
 * state and the next `up` creates it again. A seed left behind keeps it in
 * state, so a refresh never turns it into a leftover that state does not
 * name: a partial create as it was (destroy removes it), a complete one
 * marked for replacement (whose delete removes the seed).
 */
async function goneVm(
  ref: VmRef,
  props: Props,
  seedVolume: string,
  adopting: boolean,
  seedPresent: () => Promise<boolean>,
): Promise<{ id?: string; props: Props; inputs?: Props }> {
  // A seed that cannot be looked up counts as gone: the resource drops, as before seeds were looked for.
  if (adopting || !(await seedPresent().catch(() => false))) return { props: {} };
  const id = resourceId(ref);
  if (isIncompleteCreate(props)) return { id, props };
  const outputs = withReplacementReason(
    { ...props, running: false, state: "stopped", ip: null, endpoint: null },
    vmGoneReason(ref.vmid, seedVolume),
  );
  return {
    id,
    props: plain(outputs),
    inputs: withReplacementReason(inputsOf(outputs), replacementReason(outputs)),
  };
}

function seedVolumeOf(props: Props): string {
  return typeof props.seedVolume === "string"
    ? props.seedVolume
    : seedVolumeId(String(props.seedStorage), String(props.vmName));
}

/** The ways a user may write the API host in egress-proxies:goneHosts: its name, or name:port. */
function endpointNamesOf(props: Props): string[] {
  try {
    const url = new URL(resolveConnection(props as ConnectionInputs).endpoint);
    return [url.hostname, url.host, `${url.hostname}:${url.port || "8006"}`];
  } catch {
    return [];
  }
}

/**
 * Whether the VM at our VMID is the one this resource stands for. Identity is
 * the VMID plus our mark (a VM of ours renamed by hand is still ours), and the
 * mark's creation time when one was recorded: another VM of this stack at the
 * VMID means ours was deleted and the VMID reused (undefined: gone). A VM
 * without our mark is refused when it has our name (or is being adopted), and
 * by another name it is someone else's VM on a reused VMID: ours is gone.
 */
function ourVmAt(
  config: Record<string, string | undefined>,
  ref: VmRef,
  props: Props,
  adopting: boolean,
): OwnershipMark | undefined {
  const reading = markOfConfig(config);
  const owner = (props.owner as OwnerIdentity | undefined) ?? ownerFromMark(config, ref);
  if (reading.kind === "marked" && ownershipOf(reading, owner) === "ours") {
    const recorded = props.createdAt;
    return typeof recorded === "string" && recorded !== reading.mark.createdAt
      ? undefined
      : reading.mark;
  }
  const vmName = typeof props.vmName === "string" ? props.vmName : undefined;
  if (!adopting && vmName !== undefined && config.name !== vmName) return undefined;
  return requireOurs(config, ref, vmName ?? config.name ?? "", owner, adopting);
}

const isLocked = (status: VmStatus): boolean => status.lock !== undefined && status.lock !== "";

/** F14 / rule 6: paused is reported as paused, never as stopped; rule 1: locked is in progress. */
function stateOf(status: VmStatus): string {
  if (isLocked(status)) return `locked (${status.lock})`;
  if (status.status === "running") return status.qmpstatus === "paused" ? "paused" : "running";
  return status.status;
}

/** One short agent call; any failure keeps the address we knew. */
async function freshAddress(
  client: ProxmoxClient,
  ref: VmRef,
  status: VmStatus,
  mac: string | null,
  known: unknown,
): Promise<string | null> {
  const previous = typeof known === "string" ? known : null;
  if (mac === null || status.status !== "running" || status.qmpstatus === "paused") return previous;
  try {
    return (await agentAddress(client, ref, mac, 3000)) ?? previous;
  } catch {
    return previous;
  }
}

function ownerFromMark(config: Record<string, string | undefined>, ref: VmRef): OwnerIdentity {
  const reading = markOfConfig(config);
  if (reading.kind === "marked") return reading.mark.owner;
  throw new PermanentError(
    `VM ${ref.vmid} on node ${ref.node} carries no egress-proxies mark; it cannot be read as a ProxmoxProxy`,
  );
}

// ---------------------------------------------------------------- update

/**
 * In place: the tags and onboot (metadata, one config write), and the VM's
 * power: started again when a refresh found it stopped (then readiness and
 * the egress check, as at create), or stopped on request. A partial create in
 * state is the exception: the engine calls update on it at the next `up`, and
 * update continues the create on the VMID state records.
 */
export async function update(id: string, olds: Props, news: Props): Promise<{ outs: Props }> {
  if (isIncompleteCreate(olds))
    return continueCreateOf(id, news, (inputs) => createSteps(inputs, parseResourceId(id)));
  const spec = checkedInputs(news);
  const ref = parseResourceId(id);
  const deadline = deadlineFor(spec.timeouts, "create");
  const step = stepsWithin(deadline, spec.vmName);
  const context = { operation: "update", resource: `VM ${ref.vmid} on node ${ref.node}` };
  const client = clientFor(spec);
  const changes: FormFields = {};
  if (!sameValue(olds.tags, spec.tags)) changes.tags = tagsValue([MARK_TAG, ...spec.tags]);
  // Absent in state written before it existed: PVE's value is unknown, so it is written.
  if (olds.startOnBoot !== spec.startOnBoot) changes.onboot = spec.startOnBoot ? 1 : 0;
  const carried = carriedOutputs(olds, spec, CARRIED_KEYS) as unknown as ProxmoxProxyOutputs;
  const restart = needsEgressRestart(olds, spec);
  try {
    if (Object.keys(changes).length > 0)
      await step("write config", () => writeConfig(client, ref, changes, deadline));
    if (olds.running === spec.running && !restart) return { outs: plain({ ...carried }) };
    if (!spec.running) {
      progress(spec.vmName, `stopping VMID ${ref.vmid} (running: false)`);
      await step("stop", () => stopVm(client, ref, deadline));
      return { outs: plain({ ...carried, state: "stopped", ip: null, endpoint: null }) };
    }
    if (restart) {
      // squid does not answer on a running VM: a hard stop and a start, as a crashed VM would get.
      progress(spec.vmName, `restarting VMID ${ref.vmid} (refresh found its proxy not answering)`);
      await step("stop", () => stopVm(client, ref, deadline));
    } else progress(spec.vmName, `starting VMID ${ref.vmid} again (refresh found it not running)`);
    await step("start", () => startVm(client, ref, deadline));
    const startedAt = Date.now();
    const running = { ...carried, state: "running" };
    const ready = await becomeReady(client, spec, ref, running).catch((error: unknown) => {
      // At create this records a partial VM; here the VM is in state already: the cause is the error.
      const cause = error instanceof PartialCreateError ? (error.cause ?? error) : error;
      // Its readiness budget spent: starting it again did not heal it; stored marked, the next up replaces it.
      const spent = Math.round((Date.now() - startedAt) / 1000);
      if (isPermanent(cause) || spent < spec.timeouts.readySeconds - 2) throw cause;
      throw new ReplaceOnNextUpError(
        id,
        plain(running),
        `it was not ready ${spent} s after \`up\` started it again`,
        cause as Error,
        news,
      );
    });
    const egress = await egressAtReadiness(ready.ip, spec, deadline);
    return { outs: plain({ ...ready, ...egress, egressProblem: null }) };
  } catch (error) {
    if (restart) {
      // The re-check's restart did not heal it, ready or not: its rule replaces the VM new-VM-first
      // at the next refresh + up (egress-recheck.ts), gentler than the delete-first repair.
      const cause = error instanceof ReplaceOnNextUpError ? (error.cause ?? error) : error;
      throw new EgressHealFailedError(id, { ...carried }, withContext(cause, context), news);
    }
    throw error instanceof ReplaceOnNextUpError ? error : withContext(error, context);
  }
}

/** What only PVE knows; update carries these unchanged (names frozen: they are state keys). */
const CARRIED_KEYS = [
  "vmid",
  "host",
  "ip",
  "mac",
  "state",
  "endpoint",
  "seedVolume",
  "seedSha256",
  "createdAt",
  "egressIp",
  "checkedAt",
  "egressProblem",
] as const satisfies readonly (keyof ProxmoxProxyOutputs)[];

// ---------------------------------------------------------------- delete

/**
 * Ownership checked; stop first ("VM is running - destroy failed" otherwise),
 * purge and destroy unreferenced disks, then the seed (an imgdel task, waited
 * for). Idempotent: a VM already gone still gets its seed removed.
 */
export async function remove(id: string, props: Props): Promise<DeleteOutcome> {
  const ref = parseResourceId(id);
  const vmName = String(props.vmName);
  const hostNames = endpointNamesOf(props);
  if (isGoneForGood(hostNames)) {
    leaveBehind(`ProxmoxProxy ${vmName}`, hostNames[1] ?? ref.node, [
      `VM ${ref.vmid} (${vmName}) on node ${ref.node} with its disks`,
      `seed ${seedVolumeOf(props)}`,
    ]);
    return "already gone";
  }
  const client = clientFor(props as ConnectionInputs);
  const deadline = deadlineFor(settingsOf(props).timeouts, "delete");
  try {
    const step = stepsWithin(deadline, vmName);
    let removed = false;
    await step("remove VM", async () => {
      removed = (await removeVm(client, ref, vmName, props, deadline)) || removed;
    });
    const seedVolume = seedVolumeOf(props);
    progress(vmName, `removing the seed ${seedVolume}`);
    await step("remove seed", () => deleteSeed(client, ref.node, seedVolume, deadline));
    return removed ? "removed" : "already gone";
  } catch (error) {
    throw withWayOut(
      withContext(error, {
        operation: "delete",
        resource: `VM ${vmName} (VMID ${ref.vmid}) on node ${ref.node}`,
      }),
      hostNames[1] ?? ref.node,
    );
  }
}

async function removeVm(
  client: ProxmoxClient,
  ref: VmRef,
  vmName: string,
  props: Props,
  deadline: Deadline,
): Promise<boolean> {
  let status = await getStatus(client, ref, deadline).catch(notFoundAsUndefined);
  if (status === undefined) return false;
  if (status.lock !== undefined && status.lock !== "") {
    status = await waitUntilUnlocked(client, ref, deadline).catch(notFoundAsUndefined);
    if (status === undefined) return false;
  }
  const config = await getConfig(client, ref, deadline).catch(notFoundAsUndefined);
  if (config === undefined) return false;
  // Ours is already gone when the VMID holds another VM; never touch theirs.
  if (ourVmAt(config, ref, { ...props, vmName }, false) === undefined) return false;
  if (status.status === "running") {
    progress(vmName, `stopping VMID ${ref.vmid}`);
    await stopVm(client, ref, deadline);
  }
  progress(vmName, `destroying VMID ${ref.vmid}`);
  await destroyVm(client, ref, deadline).catch(ignoreNotFound);
  return true;
}

// ---------------------------------------------------------------- helpers

/** The shared step runner (common/lifecycle.ts), its retries shown in the progress output. */
function stepsWithin(deadline: Deadline, vmName?: string) {
  return stepRunner(
    deadline,
    vmName === undefined ? undefined : (message) => progress(vmName, message),
  );
}

/**
 * What read and delete need beyond the connection: the timeouts and the
 * readiness port, with their defaults. Lenient on purpose (refreshed state,
 * `.get`'s arguments): a missing or unreadable setting takes its default.
 */
function settingsOf(props: Props): { timeouts: Timeouts; readiness: { port: number } } {
  const timeouts = timeoutsSchema.safeParse(props.timeouts ?? {});
  const port = readinessSchema.shape.port.safeParse(
    (props.readiness as { port?: unknown } | undefined)?.port,
  );
  return {
    timeouts: timeouts.success ? timeouts.data : timeoutsSchema.parse({}),
    readiness: { port: port.success ? port.data : readinessSchema.shape.port.parse(undefined) },
  };
}

function checkedInputs(inputs: Props): ProxmoxProxyInputs {
  const checked = checkedInputsOf("ProxmoxProxy", inputs, validateInputs, OUTPUT_KEYS);
  return { ...checked, tags: normalizeTags(checked.tags) };
}

const OUTPUT_KEYS: readonly string[] = CARRIED_KEYS;
/** The output keys the resource class declares. */
export const PROXMOX_OUTPUT_KEYS = OUTPUT_KEYS;

function clientFor(inputs: ConnectionInputs): ProxmoxClient {
  return new ProxmoxClient(resolveConnection(inputs));
}

function seedSpec(spec: ProxmoxProxyInputs) {
  return {
    node: spec.node,
    seedStorage: spec.seedStorage,
    vmName: spec.vmName,
    installGuestAgent: spec.installGuestAgent,
    ...(spec.userData === undefined ? {} : { userData: spec.userData }),
    ...(spec.vendorData === undefined ? {} : { vendorData: spec.vendorData }),
  };
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

/** The id is stable for the VM's life: `nodes/<node>/qemu/<vmid>`. FROZEN: stored in state, used by `.get`. */
export function resourceId(ref: VmRef): string {
  return `nodes/${ref.node}/qemu/${ref.vmid}`;
}

export function parseResourceId(id: string): VmRef {
  const match = /^nodes\/([^/]+)\/qemu\/(\d+)$/.exec(id);
  if (match === null)
    throw new PermanentError(
      `resource id ${JSON.stringify(id)} is not nodes/<node>/qemu/<vmid>; use that form with .get()`,
    );
  return { node: match[1], vmid: Number(match[2]) };
}

/** Every input the schema knows: read hands them back as the resource's inputs. */
const INPUT_KEYS = Object.keys(proxmoxProxyInputsSchema.shape);

function inputsOf(props: Props): Props {
  return plain(pick(props, INPUT_KEYS));
}

function pick(props: Props, keys: string[]): Props {
  const out: Props = {};
  for (const key of keys) if (props[key] !== undefined) out[key] = props[key];
  return out;
}

function notFoundAsUndefined(error: unknown): undefined {
  if (isNotFound(error)) return undefined;
  throw error;
}

function ignoreNotFound(error: unknown): void {
  if (!isNotFound(error)) throw error;
}

/** Both results once both have settled (nothing left running); the first failure in flow order is thrown. */
async function bothSettled<A, B>(first: Promise<A>, second: Promise<B>): Promise<[A, B]> {
  const [a, b] = await Promise.allSettled([first, second]);
  if (a.status === "rejected") throw a.reason;
  if (b.status === "rejected") throw b.reason;
  return [a.value, b.value];
}

/**
 * FROZEN: `remove` under the name the provider code stored in state by
 * earlier releases calls (KvmProxy and StaticProxy always said `remove`).
 */
export const deleteProxy = remove;
