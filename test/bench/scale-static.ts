/**
 * The scale bench on StaticProxy: members that are proxies already running
 * (squid-like servers on loopback addresses of their own, in a child process:
 * check-proxies-child.ts), created for real through the dynamic-provider
 * server with the inputs the pool gives a static member, egress check and
 * re-check on (the pool's default), against an echo service that answers
 * after DISTANT_ECHO_MS as one across the internet does. StaticProxy's Read is
 * exactly the egress re-check: one connection to the member's proxy and a
 * request through it, no hypervisor.
 *
 * The same farm answers whether the server serializes calls: members whose
 * re-check waits SLOW_ECHO_MS on the network, read one at a time and then all
 * at once (serverConcurrency).
 */
import { spawn, type ChildProcess } from "node:child_process";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { performance } from "node:perf_hooks";
import {
  CONSUMER_IDENTITY,
  DynamicProviderServer,
  urnOf,
  type ConsumerProject,
  type Props,
} from "../engine/harness";
import { median } from "./measure";
import type { StoredMember } from "../engine/refresh-as-engine";

const TYPE = "pulumi-nodejs:dynamic/egress-proxies:StaticProxy";
/** Creates in flight while the fleet is built (not measured). */
const CREATE_PARALLEL = 32;

export interface ProxyFarm {
  echoUrl: string;
  distantEchoUrl: string;
  slowEchoUrl: string;
  urls: string[];
  stop(): void;
}

/** Starts `count` loopback proxies and the echo services in a child process (stopped by its PID). */
export async function startProxyFarm(count: number): Promise<ProxyFarm> {
  const child: ChildProcess = spawn(
    process.execPath,
    [join(__dirname, "check-proxies-child.js"), String(count)],
    { stdio: ["ignore", "pipe", "inherit"] },
  );
  try {
    const line = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stdout! }).once("line", resolve);
      child.once("exit", (code) => reject(new Error(`the proxy farm exited (${code})`)));
    });
    const farm = JSON.parse(line) as {
      echo: number;
      distantEcho: number;
      slowEcho: number;
      urls: string[];
    };
    return {
      echoUrl: `http://127.0.0.1:${farm.echo}/json`,
      distantEchoUrl: `http://127.0.0.1:${farm.distantEcho}/json`,
      slowEchoUrl: `http://127.0.0.1:${farm.slowEcho}/json`,
      urls: farm.urls,
      stop: () => child.kill("SIGTERM"),
    };
  } catch (error) {
    child.kill("SIGKILL");
    throw error;
  }
}

/**
 * Creates one StaticProxy member per URL through `server` (Check, then
 * Create, as `pulumi up` does), each with `memberInputs` (a static member's
 * inputs as the pool registered them) and its own URL and egress check URL.
 */
export async function createStaticMembers(
  server: DynamicProviderServer,
  memberInputs: Props,
  urls: readonly string[],
  egressUrl: string,
  prefix: string,
): Promise<StoredMember[]> {
  const members: StoredMember[] = new Array(urls.length);
  let next = 0;
  const worker = async () => {
    while (next < urls.length) {
      const index = next++;
      const name = `${prefix}-${index}`;
      const urn = urnOf(CONSUMER_IDENTITY, TYPE, name);
      const news = {
        ...memberInputs,
        url: urls[index],
        egressCheck: { url: egressUrl, field: "ip" },
        owner: { ...CONSUMER_IDENTITY, resource: name },
      };
      const checked = await server.check(urn, {}, news);
      if (checked.failures.length > 0) throw new Error(JSON.stringify(checked.failures));
      const created = await server.create(urn, checked.inputs);
      members[index] = { urn, id: created.id, outputs: created.properties, inputs: checked.inputs };
    }
  };
  await Promise.all(Array.from({ length: CREATE_PARALLEL }, worker));
  return members;
}

/** Why a reply is not the member as created (reachable, same egress, no problem), or undefined. */
export function staticReadProblem(
  member: StoredMember,
  reply: { id: string; properties: Props },
): string | undefined {
  const props = reply.properties;
  if (reply.id !== member.id) return `id ${reply.id}`;
  if (props.state !== "reachable") return `state ${String(props.state)}`;
  if (props.egressProblem !== null) return `egressProblem ${JSON.stringify(props.egressProblem)}`;
  if (props.egressIp !== member.outputs.egressIp)
    return `egressIp ${String(props.egressIp)} ≠ ${String(member.outputs.egressIp)}`;
  return undefined;
}

export interface ServerConcurrency {
  /** Members read at once. */
  calls: number;
  /** One Read alone (median of several), ms: mostly the echo's wait. */
  oneReadMs: number;
  /** All `calls` Reads at once, ms. */
  wallMs: number;
  /** calls × oneReadMs ÷ wallMs: ~1 when the server runs one call at a time, ~calls when all overlap. */
  concurrency: number;
}

/**
 * Whether the dynamic-provider server runs calls side by side: `members`
 * whose Read waits on the network, read one at a time on a warm server, then
 * all at once. A server that serializes calls makes the second take the
 * first's sum.
 */
export async function serverConcurrency(
  project: ConsumerProject,
  members: readonly StoredMember[],
  problem: (member: StoredMember, reply: { id: string; properties: Props }) => string | undefined,
): Promise<ServerConcurrency> {
  const server = await DynamicProviderServer.start(project);
  try {
    const read = async (member: StoredMember) => {
      const reply = await server.read(member.urn, member.id, member.outputs, member.inputs);
      const wrong = problem(member, reply);
      if (wrong !== undefined) throw new Error(`${member.urn}: ${wrong}`);
    };
    await read(members[0]!); // loads the provider's code, as the first call of a refresh does
    const singles: number[] = [];
    for (const member of members.slice(0, 7)) {
      const started = performance.now();
      await read(member);
      singles.push(performance.now() - started);
    }
    const oneReadMs = median(singles);
    const started = performance.now();
    await Promise.all(members.map(read));
    const wallMs = performance.now() - started;
    return {
      calls: members.length,
      oneReadMs,
      wallMs,
      concurrency: (members.length * oneReadMs) / wallMs,
    };
  } finally {
    await server.stop();
  }
}
