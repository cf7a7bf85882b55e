/**
 * `pulumi up --refresh` over a set of resources (a pool's members), asked of
 * the real dynamic-provider server the way the engine asks it: refresh every
 * member (Read; an empty id drops it from state), then plan and apply each
 * (Check, Diff, then Create, Update, or a replacement: delete first when Diff
 * says so, else create first). A create or update that fails with a
 * partially created resource is stored with its init errors, as the engine
 * stores it, and the next `up` updates it even when nothing changed.
 */
import { EngineCallError, type DynamicProviderServer, type Props } from "./harness";
import type { StoredResource } from "./resync";

export interface Member {
  /** The Pulumi resource name; its URN and program inputs come from captureResourceInputs. */
  name: string;
  urn: string;
  /** The program's inputs for it (what captureResourceInputs returned). */
  program: Props;
  /** What state holds for it; undefined when it is not in state. */
  stored?: StoredResource & { initErrors?: string[] };
}

export type StepKind = "same" | "create" | "update" | "replace";

export interface StepResult {
  member: string;
  kind: StepKind;
  /** The failure this step reported (the engine prints it and the `up` fails). */
  error?: string;
  /** For a replacement: whether the old one went first. */
  deleteFirst?: boolean;
}

/** Refresh: read every member in state; drop those whose id comes back empty. */
export async function refreshAll(
  server: DynamicProviderServer,
  members: readonly Member[],
): Promise<Array<{ member: string; dropped: boolean; outputs?: Props; inputs?: Props }>> {
  const results = [];
  for (const member of members) {
    const stored = member.stored;
    if (stored === undefined) continue;
    const read = await server.read(member.urn, stored.id, stored.outputs, stored.inputs);
    if (read.id === "") {
      member.stored = undefined;
      results.push({ member: member.name, dropped: true });
      continue;
    }
    const inputs = Object.keys(read.inputs).length > 0 ? read.inputs : stored.inputs;
    member.stored = { ...stored, id: read.id, outputs: read.properties, inputs };
    results.push({ member: member.name, dropped: false, outputs: read.properties, inputs });
  }
  return results;
}

/** The plan and its application for every member, one after the other. */
export async function upAll(
  server: DynamicProviderServer,
  members: readonly Member[],
): Promise<StepResult[]> {
  const steps: StepResult[] = [];
  for (const member of members) steps.push(await (await plan(server, member))());
  return steps;
}

/**
 * As the engine runs independent resources: check and diff one registration
 * at a time, then every step at once (a create boots while updates go on).
 */
export async function upAllAtOnce(
  server: DynamicProviderServer,
  members: readonly Member[],
): Promise<StepResult[]> {
  const steps: Array<() => Promise<StepResult>> = [];
  for (const member of members) steps.push(await plan(server, member));
  return Promise.all(steps.map((step) => step()));
}

/** `up --refresh`: both of the above. */
export async function upWithRefresh(
  server: DynamicProviderServer,
  members: readonly Member[],
): Promise<StepResult[]> {
  await refreshAll(server, members);
  return upAll(server, members);
}

/**
 * The steps as the engine would print them: "name:kind" (with "!" when it
 * failed). A failed step's error goes to the log as the engine would print
 * it, so an assertion on the summary never hides why a step failed.
 */
export const stepSummary = (steps: readonly StepResult[]): string[] =>
  steps.map((step) => {
    if (step.error)
      process.stderr.write(`      [step] ${step.member}:${step.kind} failed: ${step.error}\n`);
    return `${step.member}:${step.kind}${step.deleteFirst ? "(delete first)" : ""}${step.error ? "!" : ""}`;
  });

/** A member's check and diff, and its step, to run when the engine gets to it. */
async function plan(
  server: DynamicProviderServer,
  member: Member,
): Promise<() => Promise<StepResult>> {
  const stored = member.stored;
  const checked = await server.check(member.urn, stored?.inputs ?? {}, member.program);
  if (checked.failures.length > 0)
    throw new Error(`${member.name}: check failed ${JSON.stringify(checked.failures)}`);
  const news = checked.inputs;
  if (stored === undefined) return () => create(server, member, news, "create");
  const diff = await server.diff(member.urn, stored.id, stored.outputs, news);
  if (diff.replaces.length > 0) {
    if (diff.deleteBeforeReplace)
      return async () => {
        await server.delete(member.urn, stored.id, stored.outputs);
        member.stored = undefined;
        return { ...(await create(server, member, news, "replace")), deleteFirst: true };
      };
    return async () => {
      const step = await create(server, member, news, "replace");
      // The engine deletes the old one once the new one is in state (a failed one too, at the latest
      // at the next up); a create that left nothing keeps the old one.
      if (member.stored !== stored) await server.delete(member.urn, stored.id, stored.outputs);
      return { ...step, deleteFirst: false };
    };
  }
  if (diff.changes === "none" && (stored.initErrors ?? []).length === 0) {
    member.stored = { ...stored, inputs: news };
    return () => Promise.resolve({ member: member.name, kind: "same" });
  }
  return async () => {
    try {
      const outputs = await server.update(member.urn, stored.id, stored.outputs, news);
      member.stored = { id: stored.id, outputs, inputs: news };
      return { member: member.name, kind: "update" };
    } catch (error) {
      return failed(member, error, news, "update");
    }
  };
}

async function create(
  server: DynamicProviderServer,
  member: Member,
  news: Props,
  kind: StepKind,
): Promise<StepResult> {
  try {
    const created = await server.create(member.urn, news);
    member.stored = { id: created.id, outputs: created.properties, inputs: news };
    return { member: member.name, kind };
  } catch (error) {
    return failed(member, error, news, kind);
  }
}

/** A failure with a partially created resource is stored with its init errors; others leave state as it was. */
function failed(member: Member, error: unknown, news: Props, kind: StepKind): StepResult {
  if (!(error instanceof EngineCallError)) throw error;
  const record = error.initFailure;
  if (record !== undefined)
    member.stored = {
      id: record.id,
      outputs: record.properties,
      inputs: news,
      initErrors: record.reasons,
    };
  return { member: member.name, kind, error: error.message };
}
