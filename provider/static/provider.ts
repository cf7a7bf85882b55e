/**
 * StaticProxy's dynamic-provider methods: a proxy that already exists, so
 * there is nothing to build. check validates the URL; create probes it
 * (readiness as for a VM proxy, then the egress check); read probes it once,
 * briefly; update carries what create saw; delete forgets it. Everything else
 * is the shared lifecycle (common/lifecycle.ts).
 */
import type * as pulumi from "@pulumi/pulumi";
import { plainJson as plain } from "../common/check";
import { decideDiff, type ChangeTableOf, type DiffDecision } from "../common/diff";
import { egressAtReadiness, type EgressCheck, type EgressFinding } from "../common/egress";
import { recheckEgress, type EgressProblem } from "../common/egress-recheck";
import { PermanentError } from "../common/errors";
import { containsUnknown, type CheckFailure } from "../common/inputs";
import {
  checkedInputs as checkedInputsOf,
  deadlineFor,
  deleteForServer,
  inputsOnly,
  stepsWithin,
  type DeleteOutcome,
} from "../common/lifecycle";
import { tryTcpConnect } from "../common/readiness";
import { waitUntilServing } from "./probe";
import {
  proxyAddressOf,
  validateStaticInputs,
  type ProxyAddress,
  type StaticProxyInputs,
} from "./schema";

type Props = Record<string, unknown>;

export interface StaticProxyOutputs extends StaticProxyInputs {
  host: string;
  port: number;
  /** The host when it is an IP address, else null (no name is resolved here). */
  ip: string | null;
  /** The URL without credentials. */
  endpoint: string;
  /** "reachable" when the port answered at create or the last refresh, else "unreachable". */
  state: string;
  egressIp: string | null;
  checkedAt: string | null;
  /** What the last egress re-check found wrong (common/egress-recheck.ts); null or absent when none. */
  egressProblem?: EgressProblem | null;
}

/** A different URL is a different proxy: replace (nothing is built, so replacing is free). */
export const STATIC_CHANGE_TABLE: ChangeTableOf<StaticProxyInputs> = {
  url: "replace",
  readiness: "update",
  egressCheck: "update",
  egressRecheck: "update",
  timeouts: "update",
  owner: "update",
};

const CARRIED_KEYS = [
  "host",
  "port",
  "ip",
  "endpoint",
  "state",
  "egressIp",
  "checkedAt",
  "egressProblem",
] as const satisfies readonly (keyof StaticProxyOutputs)[];
/** The output keys the resource class declares. */
export const STATIC_OUTPUT_KEYS: readonly string[] = CARRIED_KEYS;

export async function check(
  _olds: Props,
  news: Props,
): Promise<{ inputs: Props; failures: CheckFailure[] }> {
  const result = validateStaticInputs(news);
  if (result.ok) return { inputs: plain(result.inputs), failures: [] };
  if (result.known !== undefined) return { inputs: plain(result.known), failures: [] };
  return { inputs: news, failures: result.failures };
}

export async function diff(_id: string, olds: Props, news: Props): Promise<DiffDecision> {
  return decideDiff(STATIC_CHANGE_TABLE, olds, news);
}

/** Probes the proxy; nothing is made, so a failure leaves nothing behind to record. */
export async function create(raw: Props): Promise<{ id: string; outs: Props }> {
  const inputs = checkedInputs(raw);
  const proxy = proxyAddressOf(inputs.url);
  const deadline = deadlineFor(inputs.timeouts, "create");
  const ready = deadlineFor(inputs.timeouts, "ready");
  const within = ready.at < deadline.at ? ready : deadline;
  await stepsWithin(within)("readiness", () => waitUntilServing(proxy, inputs.readiness, within));
  const egress = await egressOf(proxy, inputs, within);
  const outs: Props = { ...outputsOf(inputs, proxy, "reachable", egress) };
  return { id: staticResourceId(proxy), outs: plain(outs) };
}

/**
 * Refresh and `.get`: one TCP attempt of a few seconds. A proxy that does not
 * answer stays in state as "unreachable": it is not ours to declare gone.
 */
export async function read(id: string, props: Props): Promise<pulumi.dynamic.ReadResult> {
  if (typeof props.url !== "string")
    throw new PermanentError(
      `StaticProxy ${id}: give the proxy's url (StaticProxy.get(name, id, { url }))`,
    );
  const inputs = checkedInputs(props);
  const proxy = proxyAddressOf(inputs.url);
  const egress = {
    egressIp: typeof props.egressIp === "string" ? props.egressIp : null,
    checkedAt: typeof props.checkedAt === "string" ? props.checkedAt : null,
  };
  if (inputs.egressRecheck === true && inputs.readiness.mode === "port") {
    // The same re-check as a VM's, with the URL's own credentials unless the check names others.
    const finding = await recheckEgress(
      proxy,
      checkWithCredentials(inputs, proxy),
      props,
      deadlineFor(inputs.timeouts, "read"),
    );
    // Answered without an address (an echo service down, say): reachable, with the problem reported.
    const state = finding.egressProblem?.kind === "unanswered" ? "unreachable" : "reachable";
    const outputs = { ...outputsOf(inputs, proxy, state, finding), ...finding };
    return { id: staticResourceId(proxy), props: plain(outputs), inputs: plain(inputs) };
  }
  const state = await tryTcpConnect(proxy.host, proxy.port, 3000).then(
    () => "reachable",
    () => "unreachable",
  );
  const outputs = { ...outputsOf(inputs, proxy, state, egress), egressProblem: null };
  return { id: staticResourceId(proxy), props: plain(outputs), inputs: plain(inputs) };
}

/** Readiness, the egress check and timeouts change in place; what create saw is kept. */
export async function update(_id: string, olds: Props, news: Props): Promise<{ outs: Props }> {
  const inputs = checkedInputs(news);
  const egress = {
    egressIp: typeof olds.egressIp === "string" ? olds.egressIp : null,
    checkedAt: typeof olds.checkedAt === "string" ? olds.checkedAt : null,
  };
  const state = typeof olds.state === "string" ? olds.state : "reachable";
  const outs: Props = {
    ...outputsOf(inputs, proxyAddressOf(inputs.url), state, egress),
    egressProblem: olds.egressProblem ?? null,
  };
  return { outs: plain(outs) };
}

/** Forgets the proxy: it was never ours to remove. */
export async function remove(_id: string, _props: Props): Promise<DeleteOutcome> {
  return "already gone";
}

/** `proxies/<host>:<port>`: stable for the proxy's life, and free of credentials. */
export function staticResourceId(proxy: Pick<ProxyAddress, "host" | "port">): string {
  const host = proxy.host.includes(":") ? `[${proxy.host}]` : proxy.host;
  return `proxies/${host}:${proxy.port}`;
}

function checkedInputs(raw: Props): StaticProxyInputs {
  if (containsUnknown(raw.url))
    throw new PermanentError("StaticProxy url is still unknown where a known one is needed");
  return checkedInputsOf(
    "StaticProxy",
    inputsOnly(raw, STATIC_OUTPUT_KEYS),
    validateStaticInputs,
    [],
  );
}

/** The egress check with the URL's own credentials unless the check names others. */
async function egressOf(
  proxy: ProxyAddress,
  inputs: StaticProxyInputs,
  deadline: ReturnType<typeof deadlineFor>,
): Promise<EgressFinding> {
  const check = checkWithCredentials(inputs, proxy);
  const readiness = { mode: inputs.readiness.mode, port: proxy.port };
  return egressAtReadiness(proxy.host, { readiness, egressCheck: check }, deadline);
}

function checkWithCredentials(
  inputs: StaticProxyInputs,
  proxy: ProxyAddress,
): EgressCheck | undefined {
  return inputs.egressCheck === undefined
    ? undefined
    : { ...inputs.egressCheck, proxyAuth: inputs.egressCheck.proxyAuth ?? proxy.credentials };
}

function outputsOf(
  inputs: StaticProxyInputs,
  proxy: ProxyAddress,
  state: string,
  egress: EgressFinding,
): StaticProxyOutputs {
  return {
    ...inputs,
    host: proxy.host,
    port: proxy.port,
    ip: isIpAddress(proxy.host) ? proxy.host : null,
    endpoint: proxy.endpoint,
    state,
    ...egress,
  };
}

const isIpAddress = (host: string): boolean =>
  /^\d{1,3}(\.\d{1,3}){3}$/.test(host) || host.includes(":");

/**
 * FROZEN: what the dynamic-provider server calls to delete, on the stored
 * provider that since this release is this module itself (resource.ts).
 */
const deleteProxyForServer = deleteForServer(remove);
export { deleteProxyForServer as delete };
