/** What every KvmProxy step shares: outputs, progress lines, the host target, checked inputs, the mark check, small helpers. */
import type { z } from "zod";
import { EgressProxyError, PermanentError, TransientError } from "../common/errors";
import { type MarkReading, type OwnershipMark } from "../common/mark";
import {
  checkedInputs as checkedInputsOf,
  requireOurs as requireOursOf,
} from "../common/lifecycle";
import { logToEngine } from "../common/engine-log";
import { type EgressProblem } from "../common/egress-recheck";
import { familiesOf, guestNetworkConfig, proxyEndpoint } from "../common/ip-families";
import { safeErrorMessage } from "../common/redact";
import { macAddressFor } from "./naming";
import type { VmState } from "./host";
import { kvmProxyInputsSchema, validateKvmInputs, type KvmProxyInputs } from "./schema";

export type Props = Record<string, unknown>;

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
  /** With "ipv6" in ipFamilies: the VM's IPv6 address, and what the egress check saw over IPv6. */
  ipv6Address?: string | null;
  egressIpv6?: string | null;
  /** With egressCheck.ipv6Prefix: how many distinct exit addresses the IPv6 samples saw at create. */
  egressIpv6Distinct?: number | null;
  /** What the last egress re-check found wrong (common/egress-recheck.ts); null or absent when none. */
  egressProblem?: EgressProblem | null;
}

/** Progress lines for the user's `pulumi up` (the engine's log when running under Pulumi). */
export type ProgressLog = (message: string) => void;
let progressSink: ProgressLog = (message) => logToEngine(`KvmProxy: ${message}`);
export function setProgressLog(log: ProgressLog): void {
  progressSink = log;
}
export const progressLog: ProgressLog = (message) => progressSink(message);

export function checkedInputs(raw: Props): KvmProxyInputs {
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
export type HostTarget = ReturnType<typeof hostTargetOf>;

export function hostTargetOf(props: Props) {
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
    egressCheck: field("egressCheck"),
    egressRecheck: field("egressRecheck"),
    rotateAfterDays: field("rotateAfterDays"),
    ipFamilies: field("ipFamilies"),
    ipv6: field("ipv6"),
    timeouts,
  };
}

/** What only the host knows; update carries these unchanged (names frozen: they are state keys). */
export const CARRIED_KEYS = [
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
  "egressProblem",
  "ipv6Address",
  "egressIpv6",
  "egressIpv6Distinct",
] as const satisfies readonly (keyof KvmProxyOutputs)[];
export const OUTPUT_KEYS: readonly string[] = CARRIED_KEYS;
/** The output keys the resource class declares. */
export const KVM_OUTPUT_KEYS = OUTPUT_KEYS;

/** Read, delete, `.get` and a resumed create act only on a domain that carries this stack's mark. */
export function requireOurs(
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

export function seedInputOf(inputs: KvmProxyInputs) {
  return {
    vmName: inputs.vmName,
    userData:
      inputs.userDataBase64 !== undefined
        ? Buffer.from(inputs.userDataBase64, "base64")
        : inputs.userData,
    vendorData: inputs.vendorData,
    installGuestAgent: inputs.installGuestAgent,
    networkConfig: inputs.networkConfig ?? guestNetworkConfig(macAddressFor(inputs.vmName), inputs),
  };
}

/** The `ipv6Address` output, only for a proxy that takes IPv6 (an IPv4-only one's outputs stay as they were). */
export function ipv6Output(
  inputs: Pick<KvmProxyInputs, "ipFamilies">,
  ready: { ipv6?: string } | null,
): { ipv6Address: string | null } | undefined {
  return familiesOf(inputs).ipv6 ? { ipv6Address: ready?.ipv6 ?? null } : undefined;
}

export const endpointOf = (ip: string, inputs: KvmProxyInputs): string =>
  proxyEndpoint(ip, inputs.readiness.port);

export function uuidText(uuid: Buffer): string {
  const hex = uuid.toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

export function toError(error: unknown): Error {
  if (error instanceof EgressProxyError) return error;
  if (error instanceof Error) return new TransientError(safeErrorMessage(error), { cause: error });
  return new TransientError(String(error));
}

/** The ways a user may write the host in egress-proxies:goneHosts: the id's label, its name, name:port. */
export function hostNamesOf(label: string, target: HostTarget): string[] {
  const connection = target.connection;
  return connection === undefined
    ? [label]
    : [label, connection.host, `${connection.host}:${connection.port}`];
}
