/** What every ProxmoxProxy step shares: the step runner, settings, ids, the client, small helpers. */
import { Deadline } from "../common/deadline";
import { plainJson as plain } from "../common/check";
import { readinessSchema, timeoutsSchema } from "../common/inputs";
import { isNotFound, PermanentError } from "../common/errors";
import {
  checkedInputs as checkedInputsOf,
  stepsWithin as stepRunner,
  type Timeouts,
} from "../common/lifecycle";
import { logToEngine } from "../common/engine-log";
import { ProxmoxClient } from "./client";
import { ConnectionInputs, resolveConnection } from "./connection";
import {
  normalizeTags,
  proxmoxProxyInputsSchema,
  ProxmoxProxyInputs,
  ProxmoxProxyOutputs,
  validateInputs,
} from "./schema";
import { guestNetworkConfig } from "../common/ip-families";
import { VmRef } from "./vm";
import { proxmoxMacFor } from "./vm-config";

export type Props = Record<string, unknown>;

/** A progress line in the user's `pulumi up` output (redacted; a no-op outside a provider process). */
export function progress(vmName: string, message: string): void {
  logToEngine(`ProxmoxProxy ${vmName}: ${message}`);
}

/** What only PVE knows; update carries these unchanged (names frozen: they are state keys). */
export const CARRIED_KEYS = [
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
  "ipv6Address",
  "egressIpv6",
  "egressIpv6Distinct",
] as const satisfies readonly (keyof ProxmoxProxyOutputs)[];

/** The shared step runner (common/lifecycle.ts), its retries shown in the progress output. */
export function stepsWithin(deadline: Deadline, vmName?: string) {
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
export function settingsOf(props: Props): { timeouts: Timeouts; readiness: { port: number } } {
  const timeouts = timeoutsSchema.safeParse(props.timeouts ?? {});
  const port = readinessSchema.shape.port.safeParse(
    (props.readiness as { port?: unknown } | undefined)?.port,
  );
  return {
    timeouts: timeouts.success ? timeouts.data : timeoutsSchema.parse({}),
    readiness: { port: port.success ? port.data : readinessSchema.shape.port.parse(undefined) },
  };
}

export function checkedInputs(inputs: Props): ProxmoxProxyInputs {
  const checked = checkedInputsOf("ProxmoxProxy", inputs, validateInputs, OUTPUT_KEYS);
  return { ...checked, tags: normalizeTags(checked.tags) };
}

const OUTPUT_KEYS: readonly string[] = CARRIED_KEYS;
/** The output keys the resource class declares. */
export const PROXMOX_OUTPUT_KEYS = OUTPUT_KEYS;

export function clientFor(inputs: ConnectionInputs): ProxmoxClient {
  return new ProxmoxClient(resolveConnection(inputs));
}

export function seedSpec(spec: ProxmoxProxyInputs) {
  const networkConfig = guestNetworkConfig(proxmoxMacFor(spec.vmName), spec);
  return {
    node: spec.node,
    seedStorage: spec.seedStorage,
    vmName: spec.vmName,
    installGuestAgent: spec.installGuestAgent,
    ...(spec.userData === undefined ? {} : { userData: spec.userData }),
    ...(spec.vendorData === undefined ? {} : { vendorData: spec.vendorData }),
    ...(networkConfig === undefined ? {} : { networkConfig }),
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

export function inputsOf(props: Props): Props {
  return plain(pick(props, INPUT_KEYS));
}

function pick(props: Props, keys: string[]): Props {
  const out: Props = {};
  for (const key of keys) if (props[key] !== undefined) out[key] = props[key];
  return out;
}

export function notFoundAsUndefined(error: unknown): undefined {
  if (isNotFound(error)) return undefined;
  throw error;
}

export function ignoreNotFound(error: unknown): void {
  if (!isNotFound(error)) throw error;
}
