/**
 * What the scale bench (scale.ts) measures a refresh by: the provider
 * process's peak RSS, and the pure bookkeeping of what a refresh cost (calls
 * by endpoint, state bytes). The refresh itself, as the engine runs it, is
 * test/engine/refresh-as-engine.ts. The pure parts have their tests in
 * test/unit/bench-scale.test.ts.
 */
import { readFileSync } from "node:fs";

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
