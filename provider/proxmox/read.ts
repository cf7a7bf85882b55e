/** ProxmoxProxy read: the VM as PVE reports it, drift, damage, and adoption by `.get`. Facts (Fn) and rules: docs/proxmox.md. */
import { plainJson as plain } from "../common/check";
import { ADOPTED_KEY, isAdoptedState } from "../common/diff";
import { PermanentError } from "../common/errors";
import { ownershipOf, OwnerIdentity, OwnershipMark } from "../common/mark";
import { deadlineFor } from "../common/lifecycle";
import { isIncompleteCreate } from "../common/partial-create";
import { rotationDue } from "../common/egress-recheck";
import { recheckInputsOf, recheckOnRead } from "../common/recheck-on-read";
import { isGoneForGood } from "../common/gone-hosts";
import { replacementReason, withReplacementReason } from "../common/replacement";
import { ProxmoxClient } from "./client";
import { ConnectionInputs, resolveConnection } from "./connection";
import { brokenVmReason, seedIsPresent, vmGoneReason } from "./damage";
import { seedVolumeId } from "./seed";
import { macOf, markOfConfig } from "./vm-config";
import {
  familiesOf,
  ipFamiliesShape,
  proxyEndpoint,
  type Ipv6Settings,
} from "../common/ip-families";
import {
  agentAddresses,
  getConfig,
  guestViewOfVm,
  statusFromNodeIndex,
  VmRef,
  VmStatus,
} from "./vm";
import { observedInputs } from "./observed";
import { adoptedCreation } from "./adoption";
import {
  Props,
  clientFor,
  inputsOf,
  notFoundAsUndefined,
  parseResourceId,
  resourceId,
  settingsOf,
  stepsWithin,
} from "./steps";
import { requireOurs } from "./create";

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
  const status = await step("read status", () => statusFromNodeIndex(client, ref, deadline)).catch(
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
  const families = familiesOfProps(props);
  const { ip, ipv6 } = await freshAddresses(client, ref, status, mac, props);
  const port = settings.readiness.port;
  const recheckInputs = recheckInputsOf(props, port);
  const serving = stateOf(status) === "running";
  const recheck = await recheckOnRead(
    recheckInputs,
    { serving, address: ip, ...(families.ipv6 ? { ipv6 } : {}) },
    props,
    deadline,
    {
      name: String(config.name ?? `VM ${ref.vmid}`),
      view: (guestPort, within) => guestViewOfVm(client, ref, guestPort, within),
    },
  );
  const rotation = rotationDue(recheckInputs, mark.createdAt, recheck.finding);
  // Adopting: what the host cannot report comes from the mark (adoption.ts), when it says.
  const creation = adopting ? adoptedCreation(mark) : undefined;
  const outputs: Props = {
    ...observedInputs(props, config, creation?.asClonedSet),
    ...creation?.inputs,
    ...(adopting ? { [ADOPTED_KEY]: true } : {}),
    // Paused counts as running: reported, never started or killed (rule 6).
    running: status.status === "running",
    node: ref.node,
    host: ref.node,
    vmid: ref.vmid,
    mac,
    state: stateOf(status),
    ip,
    endpoint: ip === null ? null : proxyEndpoint(ip, port),
    // Only a proxy that takes IPv6 has the output: an IPv4-only one's stay as they were.
    ...(families.ipv6 ? { ipv6Address: ipv6 } : {}),
    createdAt: mark.createdAt,
    ...recheck.outputs,
    ...(rotation === undefined ? {} : { rotation }),
  };
  // A boot disk or seed gone replaces the VM; a reason an earlier update recorded stays until then.
  const reason = brokenVmReason(config, seedVolume, seedThere) ?? replacementReason(props);
  return {
    id,
    props: plain(withReplacementReason(outputs, reason)),
    inputs: withReplacementReason(adoptedInputsOf(outputs), reason),
  };
}

/** The inputs of read's props; an adopted state says so in its inputs too (Check's olds; common/diff.ts). */
function adoptedInputsOf(outputs: Props): Props {
  return isAdoptedState(outputs)
    ? { ...inputsOf(outputs), [ADOPTED_KEY]: true }
    : inputsOf(outputs);
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
    {
      ...props,
      running: false,
      state: "stopped",
      ip: null,
      endpoint: null,
      ...(props.ipv6Address === undefined ? {} : { ipv6Address: null }),
    },
    vmGoneReason(ref.vmid, seedVolume),
  );
  return {
    id,
    props: plain(outputs),
    inputs: withReplacementReason(inputsOf(outputs), replacementReason(outputs)),
  };
}

export function seedVolumeOf(props: Props): string {
  return typeof props.seedVolume === "string"
    ? props.seedVolume
    : seedVolumeId(String(props.seedStorage), String(props.vmName));
}

/** The ways a user may write the API host in egress-proxies:goneHosts: its name, or name:port. */
export function endpointNamesOf(props: Props): string[] {
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
export function ourVmAt(
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

/** The families and IPv6 settings stored props ask for, leniently (state from before dual stack has none). */
function familiesOfProps(props: Props): { ipv4: boolean; ipv6: boolean; settings?: Ipv6Settings } {
  const families = ipFamiliesShape.ipFamilies.safeParse(props.ipFamilies);
  const settings = ipFamiliesShape.ipv6.safeParse(props.ipv6);
  return {
    ...familiesOf({ ipFamilies: families.success ? families.data : undefined }),
    ...(settings.success && settings.data !== undefined ? { settings: settings.data } : {}),
  };
}

/**
 * One short agent call, asked as create asked it: net0's IPv4 and IPv6
 * addresses. Any failure keeps the addresses we knew; an agent that answers
 * without an IPv6 address on net0 means the VM lost it (null: the drift
 * refresh shows, and the re-check counts as a silent IPv6 side). An
 * IPv6-only proxy's `ip` is its IPv6 address, as at create.
 */
async function freshAddresses(
  client: ProxmoxClient,
  ref: VmRef,
  status: VmStatus,
  mac: string | null,
  known: Props,
): Promise<{ ip: string | null; ipv6: string | null }> {
  const previous = (value: unknown) => (typeof value === "string" ? value : null);
  const kept = { ip: previous(known.ip), ipv6: previous(known.ipv6Address) };
  if (mac === null || status.status !== "running" || status.qmpstatus === "paused") return kept;
  const families = familiesOfProps(known);
  try {
    const found = await agentAddresses(client, ref, mac, 3000, families.settings);
    const ipv6 = found.ipv6 ?? null;
    return { ip: (families.ipv4 ? found.ipv4 : (ipv6 ?? undefined)) ?? kept.ip, ipv6 };
  } catch {
    return kept;
  }
}

function ownerFromMark(config: Record<string, string | undefined>, ref: VmRef): OwnerIdentity {
  const reading = markOfConfig(config);
  if (reading.kind === "marked") return reading.mark.owner;
  throw new PermanentError(
    `VM ${ref.vmid} on node ${ref.node} carries no egress-proxies mark; it cannot be read as a ProxmoxProxy`,
  );
}
