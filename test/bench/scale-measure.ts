/**
 * What the scale bench (scale.ts) shares: the engine's refresh as a worker
 * pool of Read calls over the dynamic-provider server, the parallelism the
 * Pulumi CLI gives that pool by default, the provider process's peak RSS, and
 * the pure bookkeeping of what a refresh cost (calls by endpoint, state bytes).
 * The pure parts have their tests in test/unit/bench-scale.test.ts.
 */
import { readFileSync } from "node:fs";
import { performance } from "node:perf_hooks";
import type { DynamicProviderServer, Props } from "../engine/harness";

/** One resource as state holds it after `pulumi up`: what the engine hands Read on refresh. */
export interface StoredMember {
  urn: string;
  id: string;
  /** The outputs (with `__provider`), as the last create or refresh returned them. */
  outputs: Props;
  /** The inputs (with `__provider`), as check returned them. */
  inputs: Props;
}

export interface ReadReply {
  id: string;
  properties: Props;
  inputs: Props;
}

/** The CLI's "unbounded": --parallel 2147483647 (math.MaxInt32) launches every step at once. */
export const UNBOUNDED = 2_147_483_647;

/**
 * The `--parallel` a `pulumi refresh` runs with when the user sets none:
 * PULUMI_PARALLEL when it is a positive number, else 4 × GOMAXPROCS (the
 * CPUs Go may use, `cpus` here), as `defaultParallel()` in the CLI's
 * pkg/cmd/pulumi/operations computes it (pulumi/pulumi#14989 chose 4 × CPUs;
 * earlier CLIs used unbounded). Values past math.MaxInt32 are capped there.
 */
export function engineDefaultParallelism(env: NodeJS.ProcessEnv, cpus: number): number {
  const fromEnv = Number(env.PULUMI_PARALLEL);
  if (Number.isInteger(fromEnv) && fromEnv > 0) return Math.min(fromEnv, UNBOUNDED);
  return 4 * Math.max(1, cpus);
}

/**
 * A refresh as the engine runs it: one refresh step per resource, taken by
 * `parallel` workers (the step executor's fan-out), each worker calling Read
 * and waiting for its answer before it takes the next; unbounded launches
 * them all at once. Resolves with the replies in the members' order and the
 * wall time from the first call to the last answer.
 */
export async function refreshAsEngine(
  server: DynamicProviderServer,
  members: readonly StoredMember[],
  parallel: number,
): Promise<{ wallMs: number; replies: ReadReply[] }> {
  const replies: ReadReply[] = new Array(members.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < members.length) {
      const index = next++;
      const { urn, id, outputs, inputs } = members[index]!;
      replies[index] = await server.read(urn, id, outputs, inputs);
    }
  };
  const started = performance.now();
  await Promise.all(Array.from({ length: Math.min(parallel, members.length) }, worker));
  return { wallMs: performance.now() - started, replies };
}

/** The process's peak resident set (`VmHWM` in /proc/<pid>/status), in MB (10^6 bytes). */
export function peakRssMb(pid: number): number {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const match = /^VmHWM:\s+(\d+)\s+kB$/m.exec(status);
  if (match === null) throw new Error(`no VmHWM in /proc/${pid}/status`);
  return (Number(match[1]) * 1024) / 1e6;
}

/**
 * A simulator request line (`GET /api2/json/nodes/pve1/qemu/1234/config`) as
 * the endpoint it asks (`GET nodes/{node}/qemu/{vmid}/config`): node, VMID,
 * storage and task ids folded, so calls of many members add up per endpoint.
 */
export function endpointOf(requestLine: string): string {
  const [method = "", path = ""] = requestLine.split(" ");
  const segments = path
    .replace(/^\/api2\/json\//, "")
    .split("/")
    .filter((segment) => segment !== "");
  const folded = segments.map((segment, index) => {
    const parent = segments[index - 1];
    if (parent === "nodes") return "{node}";
    if (parent === "qemu") return "{vmid}";
    if (parent === "storage") return "{storage}";
    if (parent === "tasks") return "{upid}";
    return segment;
  });
  return `${method} ${folded.join("/")}`;
}

/** How many requests went to each endpoint, most asked first. */
export function callsByEndpoint(requestLines: readonly string[]): Array<[string, number]> {
  const counts = new Map<string, number>();
  for (const line of requestLines) {
    const endpoint = endpointOf(line);
    counts.set(endpoint, (counts.get(endpoint) ?? 0) + 1);
  }
  return [...counts.entries()].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
}

/** The bytes of a value's JSON, as the engine's checkpoint writes a property map (UTF-8). */
export function jsonBytes(value: unknown): number {
  return Buffer.byteLength(JSON.stringify(value), "utf8");
}

/** The mean of `values` (0 for none). */
export function mean(values: readonly number[]): number {
  return values.length === 0 ? 0 : values.reduce((sum, value) => sum + value, 0) / values.length;
}
