/**
 * What a continuous reconciler (the Pulumi Kubernetes Operator's resync, a
 * systemd timer running `pulumi up --refresh --yes`) asks a provider each
 * time it runs over an unchanged program: refresh (Read with the stored
 * state and inputs, whose answer replaces both), then the plan of `up`
 * (Check of the program's inputs against the refreshed ones, Diff against
 * the refreshed state). A healthy, untouched resource must plan no change,
 * every round: otherwise a resync every few minutes would churn it.
 */
import type { DiffReply, DynamicProviderServer, Props } from "./harness";

export interface StoredResource {
  id: string;
  outputs: Props;
  inputs: Props;
}

export interface ResyncRound {
  diff: DiffReply;
  /** The refreshed state and the checked inputs, what the engine stores after a no-change step. */
  stored: StoredResource;
}

export async function refreshThenPlan(
  server: DynamicProviderServer,
  urn: string,
  start: StoredResource,
  programInputs: Props,
  rounds = 3,
): Promise<ResyncRound[]> {
  const results: ResyncRound[] = [];
  let stored = start;
  for (let round = 0; round < rounds; round++) {
    const read = await server.read(urn, stored.id, stored.outputs, stored.inputs);
    if (read.id !== stored.id)
      throw new Error(
        `refresh round ${round + 1} lost the resource: id ${JSON.stringify(read.id)}`,
      );
    const checked = await server.check(urn, read.inputs, programInputs);
    if (checked.failures.length > 0)
      throw new Error(
        `refresh round ${round + 1}: check failed ${JSON.stringify(checked.failures)}`,
      );
    const diff = await server.diff(urn, stored.id, read.properties, checked.inputs);
    stored = { id: stored.id, outputs: read.properties, inputs: checked.inputs };
    results.push({ diff, stored });
  }
  return results;
}

/** The plans of `rounds`, as the engine would print them: "none" when nothing would change. */
export const planSummary = (rounds: readonly ResyncRound[]): string[] =>
  rounds.map(({ diff }) =>
    diff.changes === "none" ? "none" : `${diff.changes} (replaces: ${diff.replaces.join(",")})`,
  );
