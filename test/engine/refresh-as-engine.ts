/**
 * A refresh as the engine runs it over the dynamic-provider server: one Read
 * per resource in state, taken by `--parallel` workers, at the parallelism
 * the Pulumi CLI gives them by default. The scale bench (test/bench/scale.ts)
 * times it; the engine test of issue 32 (proxmox-scale.test.ts) checks what
 * it reads and what it asks of the hosts.
 */
import { performance } from "node:perf_hooks";
import type { DynamicProviderServer, Props } from "./harness";

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
