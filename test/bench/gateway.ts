/**
 * The pool's gateway on real squid (test/support/gateway-netns.ts: the
 * configuration the pool generates, run by the pod's entrypoint, in front of
 * four member squids, in a network namespace of lo only), against the same
 * client and target going straight to one member: what putting the gateway in
 * front costs, and whether it keeps its routing promises under load.
 *
 * Printed, all measured in this run on this machine:
 * - `gateway_added_latency_p50_ms`, `gateway_added_latency_p99_ms`: one
 *   request at a time, plain HTTP GET, through the gateway minus straight to
 *   member 1 (percentile of each side, then the difference);
 * - `gateway_rps_ratio_vs_direct`: requests/s with 32 concurrent clients
 *   (HTTP and CONNECT alternating) through the gateway over straight to one
 *   member, the gateway squid (and its helpers) on a core of its own and
 *   the client, members and echo on the other, as the gateway is sized
 *   (docs/gateway.md); `gateway_rps_ratio_vs_direct_shared_cores`: the same
 *   with everything on both cores, where the gateway's squid takes CPU from
 *   the members and the client; `gateway_rps_per_gateway_core`: the
 *   gateway's requests per second of its squid's own CPU (shared cores);
 * - `gateway_sticky_percent`: of 200 sessions x 20 requests, those that left
 *   through one exit address;
 * - `gateway_sessions_moved_percent_on_member_loss`: one of N members removed
 *   (reloaded in place), the sessions whose exit changed;
 * - `gateway_failover_error_percent`: a member killed during 1000 requests;
 * - `gateway_reload_failed_requests` (and its percent): a reload in place
 *   during steady load.
 * Everything shares the machine (client, gateway, members, echo service), so
 * the direct side runs in the same conditions, interleaved with the gateway's.
 * test-needs: root (ip netns)
 */
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { cpus } from "node:os";
import { join } from "node:path";
import { gatewayUserName } from "../../workloads/gateway/user-names";
import {
  alternatingModes,
  calls,
  failuresOf,
  GATEWAY_USER,
  GatewayNetns,
  MEMBER_LOGIN,
  memberName,
} from "../support/gateway-netns";
import type { GatewayProbeRequest, ProbeCall, ProbeOutcome } from "../support/gateway-probe";
import { printBench } from "./measure";
import { clockTicksPerSecond, processKey, readProcStat, type ProcStat } from "./proc-cpu";

const MEMBERS = [1, 2, 3, 4];
/** Member 1 as a client reaches it without the gateway: the baseline of every comparison. */
const DIRECT: GatewayProbeRequest["proxy"] = { host: "127.0.1.1", port: 3128 };
const LATENCY_REQUESTS = 2000;
/** Gateway and direct take turns in blocks, so a drift of the machine's load hits both alike. */
const LATENCY_BLOCKS = 8;
const THROUGHPUT_REQUESTS = 8000;
const THROUGHPUT_CLIENTS = 32;
const SESSIONS = 200;
const REQUESTS_PER_SESSION = 20;

const labelsOf = (index: number): string[] => (index <= 2 ? ["kvm-a"] : ["kvm-b"]);
const membersOf = (indices: number[]) =>
  indices.map((index) => GatewayNetns.member(index, labelsOf(index)));
const directCalls = (count: number): ProbeCall[] =>
  Array.from({ length: count }, () => ({ ...MEMBER_LOGIN, mode: "http" }));
const percentOf = (part: number, whole: number) => (100 * part) / whole;
const sleep = (ms: number) => new Promise((wake) => setTimeout(wake, ms));

/** Nearest rank: the smallest value with at least `percent` % of them at or below it. */
function percentile(values: readonly number[], percent: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.max(0, Math.ceil((percent / 100) * sorted.length) - 1)]!;
}

/**
 * A latency or a rate is only the gateway's cost when every request was
 * served: a failure in steady state is a broken lab, not a figure.
 */
function allServed(outcomes: readonly ProbeOutcome[], what: string): readonly ProbeOutcome[] {
  const failed = failuresOf(outcomes);
  if (failed.length > 0)
    throw new Error(
      `${what}: ${failed.length} of ${outcomes.length} failed, e.g. ${JSON.stringify(failed.slice(0, 3))}`,
    );
  return outcomes;
}

/** From the first request's start to the last one's answer, in seconds. */
function spanSeconds(outcomes: readonly ProbeOutcome[]): number {
  const first = Math.min(...outcomes.map((outcome) => outcome.startedAt));
  const last = Math.max(...outcomes.map((outcome) => outcome.startedAt + outcome.ms));
  return (last - first) / 1000;
}

/** `perSession` requests of each session, interleaved, HTTP and CONNECT. */
function sessionCalls(perSession: number, prefix = "s"): ProbeCall[] {
  const list: ProbeCall[] = [];
  for (let round = 0; round < perSession; round++)
    for (let session = 0; session < SESSIONS; session++)
      list.push({
        user: gatewayUserName(GATEWAY_USER.name, { session: `${prefix}${session}` }),
        password: GATEWAY_USER.password,
        mode: (session + round) % 2 === 0 ? "http" : "connect",
      });
  return list;
}

/** Each session's exit addresses; a failed request counts as an exit of its own (""). */
function exitsPerSession(outcomes: readonly ProbeOutcome[]): Map<string, Set<string>> {
  const exits = new Map<string, Set<string>>();
  for (const outcome of outcomes) {
    if (!exits.has(outcome.user)) exits.set(outcome.user, new Set());
    exits.get(outcome.user)!.add(outcome.exit);
  }
  return exits;
}

async function measureAddedLatency(lab: GatewayNetns): Promise<void> {
  const gateway = {
    run: (count: number) => lab.probe(calls(count, GATEWAY_USER.name), { concurrency: 1 }),
    ms: [] as number[],
  };
  const direct = {
    run: (count: number) => lab.probe(directCalls(count), { concurrency: 1, proxy: DIRECT }),
    ms: [] as number[],
  };
  // squid's first requests pay for its start, the auth helper's first check and cold sockets.
  allServed([...(await gateway.run(200)), ...(await direct.run(200))], "latency warm-up");
  for (let round = 0; round < LATENCY_BLOCKS; round++)
    // Who goes first alternates: whatever a block's start costs is paid by each side equally.
    for (const side of round % 2 === 0 ? [gateway, direct] : [direct, gateway])
      side.ms.push(
        ...allServed(await side.run(LATENCY_REQUESTS / LATENCY_BLOCKS), "latency").map(
          (outcome) => outcome.ms,
        ),
      );
  for (const percent of [50, 99]) {
    printBench(`gateway_latency_p${percent}_ms`, percentile(gateway.ms, percent));
    printBench(`direct_latency_p${percent}_ms`, percentile(direct.ms, percent));
    printBench(
      `gateway_added_latency_p${percent}_ms`,
      percentile(gateway.ms, percent) - percentile(direct.ms, percent),
    );
  }
}

/** The gateway squid's own CPU (user + kernel, ticks); it must be one process throughout. */
function gatewayTicksSince(before: ProcStat, pid: number): number {
  const after = readProcStat(pid);
  if (after === undefined || processKey(after) !== processKey(before))
    throw new Error(`the gateway squid (${processKey(before)}) was replaced during the run`);
  return after.utime + after.stime - (before.utime + before.stime);
}

/** Every process of the namespace, and this one (the probe clients it spawns inherit its cores). */
function namespacePids(lab: GatewayNetns): number[] {
  return execFileSync("ip", ["netns", "pids", lab.namespace], { encoding: "utf8" })
    .split("\n")
    .filter(Boolean)
    .map(Number);
}

/** The gateway squid and what it runs (auth helpers, the log daemon), by parent links in /proc. */
function gatewayProcessTree(lab: GatewayNetns): number[] {
  const root = lab.gatewayPid();
  const parentOf = new Map<number, number>();
  for (const pid of namespacePids(lab)) {
    const stat = readProcStat(pid);
    if (stat !== undefined) parentOf.set(pid, stat.ppid);
  }
  const inTree = (pid: number): boolean =>
    pid === root || (parentOf.has(pid) && pid !== parentOf.get(pid) && inTree(parentOf.get(pid)!));
  return [...parentOf.keys()].filter(inTree);
}

/** Moves processes (all their threads) to `cpus`, e.g. "0" or "0-1"; one that ended meanwhile is skipped. */
const pin = (pids: readonly number[], cpus: string) => {
  for (const pid of pids)
    try {
      execFileSync("taskset", ["-a", "-p", "-c", cpus, String(pid)], {
        stdio: ["ignore", "ignore", "pipe"],
      });
    } catch (error) {
      if (existsSync(`/proc/${pid}`)) throw error;
    }
};

/**
 * The same throughput comparison with the gateway on a core of its own and
 * everything else (client, members, echo) on the other, as docs/gateway.md
 * sizes it: what the gateway costs a client when it is not also taking the
 * members' CPU. On shared cores (measureThroughput) a request through the
 * gateway is two squids' work on the same cores where a direct one is one.
 */
async function measureThroughputOwnCore(lab: GatewayNetns): Promise<void> {
  const cores = cpus().length;
  if (cores < 2) {
    console.log("# gateway throughput on a core of its own: needs two cores, this machine has one");
    return;
  }
  const everything = `0-${cores - 1}`;
  const others = [process.pid, ...namespacePids(lab)];
  pin(others, "0");
  pin(gatewayProcessTree(lab), "1");
  try {
    const rates = await throughputRates(lab);
    printBench("gateway_rps_32_clients_own_core", rates.gatewayRps);
    printBench("direct_rps_32_clients_one_core", rates.directRps);
    printBench("gateway_rps_ratio_vs_direct", rates.gatewayRps / rates.directRps);
  } finally {
    pin([process.pid, ...namespacePids(lab)], everything);
  }
}

async function measureThroughput(lab: GatewayNetns): Promise<void> {
  const rates = await throughputRates(lab);
  printBench("gateway_rps_32_clients", rates.gatewayRps);
  printBench("direct_rps_32_clients", rates.directRps);
  printBench("gateway_rps_ratio_vs_direct_shared_cores", rates.gatewayRps / rates.directRps);
  printBench("gateway_cpu_seconds_32_clients", rates.cpuSeconds);
  printBench("gateway_rps_per_gateway_core", rates.gatewayServed / rates.cpuSeconds);
}

async function throughputRates(lab: GatewayNetns): Promise<{
  gatewayRps: number;
  directRps: number;
  cpuSeconds: number;
  gatewayServed: number;
}> {
  const options = { concurrency: THROUGHPUT_CLIENTS };
  const throughGateway = (count: number) =>
    lab.probe(alternatingModes(calls(count, GATEWAY_USER.name)), options);
  const direct = (count: number) =>
    lab.probe(alternatingModes(directCalls(count)), { ...options, proxy: DIRECT });
  allServed([...(await throughGateway(500)), ...(await direct(500))], "throughput warm-up");
  const pid = lab.gatewayPid();
  const rates = { gateway: { served: 0, seconds: 0, ticks: 0 }, direct: { served: 0, seconds: 0 } };
  // Two halves each, gateway-direct-direct-gateway: a trend in the machine's load cancels out.
  for (const side of ["gateway", "direct", "direct", "gateway"] as const) {
    const count = THROUGHPUT_REQUESTS / 2;
    if (side === "direct") {
      const outcomes = allServed(await direct(count), "direct at 32 clients");
      rates.direct.served += outcomes.length;
      rates.direct.seconds += spanSeconds(outcomes);
      continue;
    }
    const before = readProcStat(pid);
    if (before === undefined) throw new Error(`no gateway squid at pid ${pid}`);
    const outcomes = allServed(await throughGateway(count), "gateway at 32 clients");
    rates.gateway.ticks += gatewayTicksSince(before, pid);
    rates.gateway.served += outcomes.length;
    rates.gateway.seconds += spanSeconds(outcomes);
  }
  return {
    gatewayRps: rates.gateway.served / rates.gateway.seconds,
    directRps: rates.direct.served / rates.direct.seconds,
    cpuSeconds: rates.gateway.ticks / clockTicksPerSecond(),
    gatewayServed: rates.gateway.served,
  };
}

/** Stickiness, then one member taken out of the gateway (not killed): which sessions move. */
async function measureSessions(lab: GatewayNetns): Promise<void> {
  const assigned = exitsPerSession(
    await lab.probe(sessionCalls(REQUESTS_PER_SESSION), { concurrency: 16 }),
  );
  const sticky = [...assigned.values()].filter((exits) => exits.size === 1 && !exits.has(""));
  printBench("gateway_sticky_percent", percentOf(sticky.length, SESSIONS));
  lab.writeGateway(membersOf(MEMBERS.slice(0, -1)));
  await lab.waitForReloads(1);
  const after = exitsPerSession(await lab.probe(sessionCalls(2), { concurrency: 16 }));
  // A session that was split before, or is split now, has no one exit to keep: it counts as moved.
  const moved = [...assigned].filter(([user, exits]) => {
    const now = after.get(user);
    return (
      exits.size !== 1 ||
      now === undefined ||
      now.size !== 1 ||
      now.has("") ||
      [...now][0] !== [...exits][0]
    );
  });
  printBench("gateway_member_count", MEMBERS.length);
  printBench("gateway_sessions_moved_percent_on_member_loss", percentOf(moved.length, SESSIONS));
  // The later phases need every member behind the gateway again.
  lab.writeGateway(membersOf(MEMBERS));
  await lab.waitForReloads(2);
}

/**
 * No goal: squid 5 fails the requests it is routing at the instant of a
 * reconfigure (a 502 or 500, or the client's connection closed unanswered);
 * this measures that cost. The reload is squid's own
 * (`-k reconfigure`, as the pod's loop runs it) with unchanged files.
 */
async function measureReload(lab: GatewayNetns): Promise<void> {
  const accepting = () =>
    (lab.gatewayCacheLog().match(/Accepting HTTP Socket connections/g) ?? []).length;
  const acceptedBefore = accepting();
  const requests = sessionCalls(10, "r");
  const running = lab.probe(requests, { concurrency: 16, spreadMs: 6000 });
  await sleep(2500);
  execFileSync("ip", [
    "netns",
    "exec",
    lab.namespace,
    "squid",
    "-k",
    "reconfigure",
    "-f",
    join(lab.dir, "gateway", "squid.conf"),
  ]);
  const failed = failuresOf(await running);
  printBench("gateway_reload_failed_requests", failed.length);
  printBench("gateway_reload_failed_percent", percentOf(failed.length, requests.length));
  // Which way they fail says whether a client's retry of a 5xx is enough (status 0: no answer at all).
  const byStatus = new Map<number, number>();
  for (const { status } of failed) byStatus.set(status, (byStatus.get(status) ?? 0) + 1);
  if (failed.length > 0)
    console.log(
      `# gateway reload: failed by status ${[...byStatus].map(([status, count]) => `${status}: ${count}`).join(", ")}`,
    );
  // The next phase must not meet the reload still under way.
  const deadline = Date.now() + 20_000;
  while (accepting() <= acceptedBefore) {
    if (Date.now() > deadline) throw new Error("the gateway did not finish its reload in 20 s");
    await sleep(100);
  }
}

/** Last: the killed member stays dead. */
async function measureFailover(lab: GatewayNetns): Promise<void> {
  // Plain and session requests alternate, both modes: both of a member's peer sets meet the kill.
  const requests: ProbeCall[] = Array.from({ length: 1000 }, (_, index) => ({
    user:
      index % 2 === 0
        ? GATEWAY_USER.name
        : gatewayUserName(GATEWAY_USER.name, { session: `k${index % 100}` }),
    password: GATEWAY_USER.password,
    mode: index % 4 < 2 ? "http" : "connect",
  }));
  const running = lab.probe(requests, { concurrency: 8, spreadMs: 8000 });
  await sleep(2000);
  lab.killMember(2);
  const failed = failuresOf(await running);
  printBench("gateway_failover_error_percent", percentOf(failed.length, requests.length));
}

export async function runGatewayBenchmarks(): Promise<void> {
  const lab = new GatewayNetns();
  try {
    for (const index of MEMBERS) lab.startMember(index);
    lab.writeGateway(membersOf(MEMBERS));
    await lab.waitForListeners([
      ...MEMBERS.map((index) => `127.0.1.${index}:3128`),
      "127.0.3.1:8080",
      "*:3130",
    ]);
    await measureAddedLatency(lab);
    await measureThroughput(lab);
    await measureThroughputOwnCore(lab);
    await measureSessions(lab);
    await measureReload(lab);
    await measureFailover(lab);
    if (!lab.gatewayCacheLog().includes(`Detected DEAD Parent: ${memberName(2)}`))
      console.log("# gateway failover: squid never counted the killed member dead");
  } finally {
    lab.close();
  }
}
