/**
 * Shared measuring helpers. Every figure is printed on its own line as
 * `bench <key>=<number>` through printBench, the one place that also records
 * it for the run's goal table and bench-results.json (run.ts).
 */
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

/** Every figure printed in this process, as printed (rounded): what the goals are judged on. */
const figures = new Map<string, number>();
/** What a run says about itself that is no number (the Node.js version, a negotiated cipher). */
const facts = new Map<string, string>();

export function printBench(key: string, value: number): void {
  const rounded =
    Number.isInteger(value) || Math.abs(value) >= 100 ? value.toFixed(0) : value.toPrecision(4);
  figures.set(key, Number(rounded));
  console.log(`bench ${key}=${rounded}`);
}

/** A fact about the run, printed as `bench <key>=<text>` and kept in bench-results.json. */
export function printBenchFact(key: string, value: string): void {
  facts.set(key, value);
  console.log(`bench ${key}=${value}`);
}

export function recordedFigures(): ReadonlyMap<string, number> {
  return new Map(figures);
}

export function recordedFacts(): ReadonlyMap<string, string> {
  return new Map(facts);
}
