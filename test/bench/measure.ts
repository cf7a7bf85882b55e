/** Shared measuring helpers: every figure is printed on its own line as `bench <key>=<number>`. */
import { performance } from "node:perf_hooks";

export function timeMs(action: () => unknown): number {
  const start = performance.now();
  action();
  return performance.now() - start;
}

export async function timeMsAsync(action: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await action();
  return performance.now() - start;
}

export function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2;
}

export function printBench(key: string, value: number): void {
  const rounded =
    Number.isInteger(value) || Math.abs(value) >= 100 ? value.toFixed(0) : value.toPrecision(4);
  console.log(`bench ${key}=${rounded}`);
}
