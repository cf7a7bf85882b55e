import { Deadline, shutdownGraceMs, sleepWithin } from "../common/deadline";
import { EgressProxyError, isNotFound, isTransient } from "../common/errors";
import { GUEST_SOCKET_TABLES, guestViewOf, type GuestView } from "../common/guest-view";
import { pickIpv6, type Ipv6Settings } from "../common/ip-families";
import { FormFields, ProxmoxClient, segment } from "./client";
import { StartedTask, waitForStarted, waitForTask } from "./tasks";
import { IndexedVm, sharedVmIndex } from "./node-listings";

/**
 * The Proxmox calls the provider's stories are made of, one function per API
 * step of the create flow in docs/proxmox.md, "Proxmox VE behaviours we rely on"
 * (flow steps, Fn, rules). Each takes the deadline it must finish within; none
 * retries on its own (the caller decides what is safe to repeat).
 */

export interface VmRef {
  node: string;
  vmid: number;
}

export const vmPath = (ref: VmRef): string => `/nodes/${segment(ref.node)}/qemu/${ref.vmid}`;

/** F8 (docs/proxmox.md section 9, facts): a mid-clone entry has no name; `lock` only when set. */
export interface ClusterVmEntry {
  vmid: number;
  node: string;
  name?: string;
  lock?: string;
  status: string;
  template?: number;
}

export interface VmStatus {
  status: "running" | "stopped" | string;
  qmpstatus?: string;
  lock?: string;
  name?: string;
}

const CALL_MS = 30_000;
/** One agent file read: PVE waits for the agent up to its own timeout; a guest this slow is not answering. */
const AGENT_READ_MS = 8_000;

export async function listVms(
  client: ProxmoxClient,
  deadline: Deadline,
): Promise<ClusterVmEntry[]> {
  return client.get<ClusterVmEntry[]>(
    "/cluster/resources",
    { type: "vm" },
    { timeoutMs: deadline.capped(CALL_MS) },
  );
}

/** Flow step 1: `nextid?vmid=N` answers 400 "VM N already exists" when taken; nothing is reserved. */
export async function isVmidFree(
  client: ProxmoxClient,
  vmid: number,
  deadline: Deadline,
): Promise<boolean> {
  try {
    await client.get("/cluster/nextid", { vmid }, { timeoutMs: deadline.capped(CALL_MS) });
    return true;
  } catch (error) {
    if (error instanceof EgressProxyError && /already exists/i.test(error.detail)) return false;
    throw error;
  }
}

export async function getStatus(
  client: ProxmoxClient,
  ref: VmRef,
  deadline: Deadline,
): Promise<VmStatus> {
  return client.get<VmStatus>(
    `${vmPath(ref)}/status/current`,
    {},
    { timeoutMs: deadline.capped(CALL_MS) },
  );
}

/**
 * Read's status of a VM: its entry in the node's VM index (F25: status,
 * paused, lock), the index shared by the Reads of a refresh. A VM the index
 * lacks (gone, moved to another node, hidden from the token) is asked
 * `status/current`, so that F2 (gone) or a 403 reaches read exactly as before
 * the index was shared. An index that failed fails the step with its own
 * error, classified as status/current's would be (the same node, the same
 * token): a 401 stays the operation's last request (F22).
 */
export async function statusFromNodeIndex(
  client: ProxmoxClient,
  ref: VmRef,
  deadline: Deadline,
): Promise<VmStatus> {
  const index = await sharedVmIndex(client.listingScope, ref.node, () =>
    listNodeVms(client, ref.node, deadline),
  );
  return index.get(ref.vmid) ?? getStatus(client, ref, deadline);
}

/** F25: `full=1` so that a paused VM shows (`qmpstatus`). */
async function listNodeVms(
  client: ProxmoxClient,
  node: string,
  deadline: Deadline,
): Promise<ReadonlyMap<number, IndexedVm>> {
  const entries = await client.get<Array<IndexedVm & { vmid: number }>>(
    `/nodes/${segment(node)}/qemu`,
    { full: 1 },
    { timeoutMs: deadline.capped(CALL_MS) },
  );
  return new Map(
    entries.map(({ vmid, status, qmpstatus, lock, name }) => [
      Number(vmid),
      { status, qmpstatus, lock, name },
    ]),
  );
}

export async function getConfig(
  client: ProxmoxClient,
  ref: VmRef,
  deadline: Deadline,
): Promise<Record<string, string | undefined>> {
  const config = await client.get<Record<string, unknown>>(
    `${vmPath(ref)}/config`,
    {},
    { timeoutMs: deadline.capped(CALL_MS) },
  );
  const out: Record<string, string | undefined> = {};
  for (const [key, value] of Object.entries(config))
    out[key] = value === null || value === undefined ? undefined : String(value);
  return out;
}

export interface CloneRequest {
  node: string;
  templateVmid: number;
  newid: number;
  name: string;
  storage: string;
  description: string;
}

/** Flow step 2: full clone; answers a UPID at once (F4 synchronously when the VMID is taken). */
export async function startClone(
  client: ProxmoxClient,
  request: CloneRequest,
  deadline: Deadline,
): Promise<string> {
  return client.post<string>(
    `${vmPath({ node: request.node, vmid: request.templateVmid })}/clone`,
    {
      newid: request.newid,
      name: request.name,
      full: 1,
      storage: request.storage,
      description: request.description,
    },
    { timeoutMs: deadline.capped(CALL_MS) },
  );
}

/**
 * Rule 1: a locked VM (clone, create, …) is in progress, never absent. Waits
 * until the lock is gone; the VM vanishing meanwhile (a failed clone is cleaned
 * up by PVE) surfaces as NotFound.
 */
export async function waitUntilUnlocked(
  client: ProxmoxClient,
  ref: VmRef,
  deadline: Deadline,
): Promise<VmStatus> {
  let pauseMs = 100;
  for (;;) {
    const status = await getStatus(client, ref, deadline);
    if (status.lock === undefined || status.lock === "") return status;
    deadline.check(`VM ${ref.vmid} still locked (${status.lock})`);
    await sleepWithin(pauseMs, deadline);
    pauseMs = Math.min(2000, pauseMs * 2);
  }
}

/** Flow step 4: one config write, not waited for. */
export async function requestConfigWrite(
  client: ProxmoxClient,
  ref: VmRef,
  changes: FormFields,
  deadline: Deadline,
): Promise<StartedTask> {
  const upid = await client.post<string | null>(`${vmPath(ref)}/config`, changes, {
    timeoutMs: deadline.capped(CALL_MS),
  });
  return { upid, startedAt: Date.now() };
}

/** Flow step 4: one config write, waited for. */
export async function writeConfig(
  client: ProxmoxClient,
  ref: VmRef,
  changes: FormFields,
  deadline: Deadline,
): Promise<void> {
  await waitForStarted(client, await requestConfigWrite(client, ref, changes, deadline), deadline);
}

/** Flow step 5 (F20): absolute size, asynchronous since PVE 8; not waited for. */
export async function requestResize(
  client: ProxmoxClient,
  ref: VmRef,
  disk: string,
  gib: number,
  deadline: Deadline,
): Promise<StartedTask> {
  const upid = await client.put<string | null>(
    `${vmPath(ref)}/resize`,
    { disk, size: `${gib}G` },
    { timeoutMs: deadline.capped(CALL_MS) },
  );
  return { upid, startedAt: Date.now() };
}

/** Flow step 5 (F20), waited for. */
export async function resizeDisk(
  client: ProxmoxClient,
  ref: VmRef,
  disk: string,
  gib: number,
  deadline: Deadline,
): Promise<void> {
  await waitForStarted(client, await requestResize(client, ref, disk, gib, deadline), deadline);
}

/** Flow step 6; a start queues behind a lock (F3). "already running" is what we wanted. */
export async function startVm(
  client: ProxmoxClient,
  ref: VmRef,
  deadline: Deadline,
): Promise<void> {
  const upid = await client.post<string>(
    `${vmPath(ref)}/status/start`,
    {},
    { timeoutMs: deadline.capped(CALL_MS) },
  );
  try {
    await waitForTask(client, upid, { deadline });
  } catch (error) {
    if (error instanceof EgressProxyError && /already running/i.test(error.detail)) return;
    throw error;
  }
}

/** A stop on a stopped VM just finishes OK. */
export async function stopVm(client: ProxmoxClient, ref: VmRef, deadline: Deadline): Promise<void> {
  const upid = await client.post<string>(
    `${vmPath(ref)}/status/stop`,
    {},
    { timeoutMs: deadline.capped(CALL_MS) },
  );
  await waitForTask(client, upid, { deadline });
}

/**
 * Powers the VM off the way an operator would: PVE's shutdown first (ACPI, or the guest agent where the
 * VM has one: squid closes its connections, the disk is clean), within a grace period of at most half
 * what the deadline leaves; then a hard stop if the guest did not go (F24: PVE refuses to shut down a
 * paused VM, and a hung guest lets the shutdown task time out). Says which it took.
 */
export async function powerOffVm(
  client: ProxmoxClient,
  ref: VmRef,
  deadline: Deadline,
): Promise<"shut down" | "stopped"> {
  const graceSeconds = Math.max(1, Math.floor(shutdownGraceMs(deadline) / 1000));
  try {
    const upid = await client.post<string>(
      `${vmPath(ref)}/status/shutdown`,
      { timeout: graceSeconds },
      { timeoutMs: deadline.capped(CALL_MS) },
    );
    await waitForTask(client, upid, { deadline });
    return "shut down";
  } catch (error) {
    const refused = error instanceof EgressProxyError && /got timeout|paused/i.test(error.detail);
    if (!refused) throw error;
  }
  await stopVm(client, ref, deadline);
  return "stopped";
}

/** Purge from jobs/HA and destroy disks nothing references any more. */
export async function destroyVm(
  client: ProxmoxClient,
  ref: VmRef,
  deadline: Deadline,
): Promise<void> {
  const upid = await client.delete<string>(
    vmPath(ref),
    { purge: 1, "destroy-unreferenced-disks": 1 },
    { timeoutMs: deadline.capped(CALL_MS) },
  );
  await waitForTask(client, upid, { deadline });
}

/** F21 */
interface AgentInterface {
  name: string;
  "hardware-address"?: string;
  "ip-addresses"?: Array<{
    "ip-address": string;
    "ip-address-type": "ipv4" | "ipv6";
    prefix: number;
  }>;
}

/**
 * The VM's addresses from the guest agent, both families from one answer: the
 * IPv4 on the interface whose MAC is net0's (not docker0 or a VPN the guest
 * brought up first; link-local and unspecified skipped) and its IPv6
 * (common/ip-families.ts pickIpv6). Throws the classified agent error (F5).
 */
export async function agentAddresses(
  client: ProxmoxClient,
  ref: VmRef,
  mac: string,
  timeoutMs: number,
  ipv6Settings?: Ipv6Settings,
): Promise<{ ipv4?: string; ipv6?: string }> {
  const reply = await client.get<{ result?: AgentInterface[] }>(
    `${vmPath(ref)}/agent/network-get-interfaces`,
    {},
    { timeoutMs },
  );
  const nic = (reply?.result ?? []).find(
    (entry) => entry["hardware-address"]?.toLowerCase() === mac.toLowerCase(),
  );
  const address = nic?.["ip-addresses"]?.find(
    (entry) =>
      entry["ip-address-type"] === "ipv4" &&
      !entry["ip-address"].startsWith("169.254.") &&
      entry["ip-address"] !== "0.0.0.0",
  );
  const ipv6 = pickIpv6(
    (nic?.["ip-addresses"] ?? [])
      .filter((entry) => entry["ip-address-type"] === "ipv6")
      .map((entry) => entry["ip-address"]),
    mac,
    ipv6Settings,
  );
  return {
    ...(address === undefined ? {} : { ipv4: address["ip-address"] }),
    ...(ipv6 === undefined ? {} : { ipv6 }),
  };
}

/** A file in the guest, through its agent (`agent/file-read`: VM.GuestAgent.FileRead on PVE 9, VM.Monitor on 8). */
export async function agentFileRead(
  client: ProxmoxClient,
  ref: VmRef,
  file: string,
  timeoutMs: number,
): Promise<string> {
  const reply = await client.get<{ content?: unknown }>(
    `${vmPath(ref)}/agent/file-read`,
    { file },
    { timeoutMs },
  );
  if (typeof reply?.content !== "string")
    throw new Error(`agent/file-read of ${file} in VM ${ref.vmid} answered no content`);
  return reply.content;
}

/** Whether the guest listens on `port`, from its socket tables; "unknown" when its agent cannot tell. */
export async function guestViewOfVm(
  client: ProxmoxClient,
  ref: VmRef,
  port: number,
  deadline: Deadline,
): Promise<GuestView> {
  const tables = await Promise.all(
    GUEST_SOCKET_TABLES.map((table) =>
      agentFileRead(client, ref, table, deadline.capped(AGENT_READ_MS)).catch(() => undefined),
    ),
  );
  return guestViewOf(tables, port);
}

/**
 * Polls the agent until net0's interface has an address. "Agent not running
 * yet", "VM not running yet" and agent timeouts are waiting, not errors (rule 9);
 * a missing agent option or a missing privilege is permanent.
 */
export async function waitForAgentAddress(
  client: ProxmoxClient,
  ref: VmRef,
  mac: string,
  deadline: Deadline,
  wanted: { ipv4: boolean; ipv6: boolean; settings?: Ipv6Settings } = { ipv4: true, ipv6: false },
): Promise<{ ip: string; ipv6?: string }> {
  let pauseMs = 250;
  let lastProblem: unknown;
  for (;;) {
    try {
      const found = await agentAddresses(
        client,
        ref,
        mac,
        deadline.capped(15_000),
        wanted.settings,
      );
      const missing = [
        ...(wanted.ipv4 && found.ipv4 === undefined ? ["IPv4"] : []),
        ...(wanted.ipv6 && found.ipv6 === undefined ? ["IPv6"] : []),
      ];
      // An IPv6-only proxy is reached at its IPv6 address.
      const ip = wanted.ipv4 ? found.ipv4 : found.ipv6;
      if (missing.length === 0 && ip !== undefined)
        return wanted.ipv6 && found.ipv6 !== undefined ? { ip, ipv6: found.ipv6 } : { ip };
      lastProblem = new Error(
        `the guest reports no ${missing.join(" or ")} address on the interface with MAC ${mac} yet`,
      );
    } catch (error) {
      if (isNotFound(error)) throw error;
      if (!isTransient(error)) throw error;
      lastProblem = error;
    }
    if (deadline.expired())
      throw deadline.timeoutError(
        `waiting for VM ${ref.vmid}'s address from the guest agent`,
        lastProblem,
      );
    await sleepWithin(pauseMs, deadline);
    pauseMs = Math.min(2000, Math.round(pauseMs * 1.5));
  }
}
