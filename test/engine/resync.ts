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

/**
 * One `pulumi up --refresh` after something drifted: refresh, the plan (which
 * must be an in-place update), the update, then one more refresh and plan,
 * which must be quiet. Returns what refresh found and what update stored.
 */
export async function refreshAndHeal(
  server: DynamicProviderServer,
  urn: string,
  stored: StoredResource,
  programInputs: Props,
): Promise<{ refreshed: { properties: Props; inputs: Props }; healed: StoredResource }> {
  const refreshed = await server.read(urn, stored.id, stored.outputs, stored.inputs);
  const checked = await server.check(urn, refreshed.inputs, programInputs);
  const diff = await server.diff(urn, stored.id, refreshed.properties, checked.inputs);
  if (diff.changes !== "some" || diff.replaces.length > 0)
    throw new Error(`the plan after the drift is not an in-place update: ${JSON.stringify(diff)}`);
  const outputs = await server.update(urn, stored.id, refreshed.properties, checked.inputs);
  const healed = { id: stored.id, outputs, inputs: checked.inputs };
  const after = await refreshThenPlan(server, urn, healed, programInputs, 1);
  if (planSummary(after)[0] !== "none")
    throw new Error(`the plan after healing is not empty: ${planSummary(after)[0]}`);
  return { refreshed, healed };
}
