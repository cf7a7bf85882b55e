/**
 * Reading the stack states the reaper trusts: `pulumi stack export` output
 * (deployment format version 3), a file backend's `.pulumi/stacks/` directory
 * (checkpoint files, plain or gzipped), or a command printing an export.
 * Any state that cannot be read throws StateReadError: a sweep without a
 * state it was told to trust would see that stack's VMs as orphans.
 */
import { execFile } from "node:child_process";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { basename, join, relative, sep } from "node:path";
import { gunzipSync } from "node:zlib";
import { z } from "zod";
import type { StackState } from "./plan";
import type { StateSource } from "./config";

export class StateReadError extends Error {
  override readonly name = "StateReadError";
}

const resourceSchema = z.looseObject({
  urn: z.string(),
  id: z.string().optional(),
  outputs: z.record(z.string(), z.unknown()).optional(),
});

const deploymentSchema = z.looseObject({
  resources: z.array(resourceSchema).nullish(),
});

/** `pulumi stack export`: {version: 3, deployment: {...}}. */
const exportSchema = z.looseObject({
  version: z.literal(3, { error: "version must be 3 (pulumi stack export format)" }),
  deployment: deploymentSchema,
});

/** A file backend's checkpoint: {version: 3, checkpoint: {stack, latest: {...}}}. */
const checkpointSchema = z.looseObject({
  version: z.literal(3, { error: "version must be 3 (checkpoint format)" }),
  checkpoint: z.looseObject({
    stack: z.string().optional(),
    latest: deploymentSchema.nullish(),
  }),
});

type Resource = z.infer<typeof resourceSchema>;

export interface StateNames {
  project?: string;
  stack?: string;
}

/** Parses an export or a checkpoint; throws StateReadError naming the source and what is wrong. */
export function parseState(text: string, source: string, names: StateNames = {}): StackState {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    throw new StateReadError(
      `state ${source} is not JSON (${(error as Error).message}); give the output of pulumi stack export`,
    );
  }
  const asExport = exportSchema.safeParse(json);
  const asCheckpoint = asExport.success ? undefined : checkpointSchema.safeParse(json);
  let resources: Resource[];
  if (asExport.success) resources = asExport.data.deployment.resources ?? [];
  else if (asCheckpoint?.success) resources = asCheckpoint.data.checkpoint.latest?.resources ?? [];
  else {
    const issue = asExport.error.issues[0];
    throw new StateReadError(
      `state ${source} is neither a stack export nor a checkpoint of version 3: ${issue?.path.join(".") || "(top)"}: ${issue?.message}; give the output of pulumi stack export`,
    );
  }
  return stackStateOf(resources, source, names);
}

function stackStateOf(resources: Resource[], source: string, names: StateNames): StackState {
  const fromUrns = new Set<string>();
  const resourceIds = new Set<string>();
  const vmNames = new Set<string>();
  for (const resource of resources) {
    const match = /^urn:pulumi:([^:]+)::([^:]+)::/.exec(resource.urn);
    if (!match)
      throw new StateReadError(
        `state ${source}: resource urn ${JSON.stringify(resource.urn)} is not urn:pulumi:<stack>::<project>::...`,
      );
    fromUrns.add(`${match[2]}/${match[1]}`);
    if (resource.id) resourceIds.add(resource.id);
    const vmName = resource.outputs?.vmName;
    if (typeof vmName === "string") vmNames.add(vmName);
  }
  if (fromUrns.size > 1)
    throw new StateReadError(
      `state ${source} mixes resources of ${[...fromUrns].join(", ")}; give one stack per state`,
    );
  const [project, stack] = [...fromUrns][0]?.split("/") ?? [];
  const finalProject = names.project ?? project;
  const finalStack = names.stack ?? stack;
  if (finalProject === undefined || finalStack === undefined)
    throw new StateReadError(
      `state ${source} has no resources to tell its project and stack; set project and stack on this state in the config`,
    );
  if (
    (project !== undefined && project !== finalProject) ||
    (stack !== undefined && stack !== finalStack)
  )
    throw new StateReadError(
      `state ${source} belongs to ${project}/${stack}, but the config says ${finalProject}/${finalStack}; fix project/stack in the config`,
    );
  return { project: finalProject, stack: finalStack, source, resourceIds, vmNames };
}

export async function readStates(sources: readonly StateSource[]): Promise<StackState[]> {
  const states: StackState[] = [];
  for (const source of sources) states.push(...(await readStateSource(source)));
  return states;
}

async function readStateSource(source: StateSource): Promise<StackState[]> {
  if ("fileBackend" in source) return readFileBackend(source.fileBackend);
  const names = { project: source.project, stack: source.stack };
  if ("checkpointFile" in source)
    return [parseState(readText(source.checkpointFile), source.checkpointFile, names)];
  const output = await runStateCommand(source.command, source.cwd, source.timeoutSeconds);
  return [parseState(output, `command ${source.command[0]}`, names)];
}

function readText(path: string): string {
  try {
    const bytes = readFileSync(path);
    // A file backend may gzip its checkpoints (PULUMI_SELF_MANAGED_STATE_GZIP).
    return (path.endsWith(".gz") ? gunzipSync(bytes) : bytes).toString("utf8");
  } catch (error) {
    throw new StateReadError(`state ${path} cannot be read: ${(error as Error).message}`);
  }
}

/**
 * Every stack in a file backend: `<root>/.pulumi/stacks/<project>/<stack>.json`
 * (or the older `<root>/.pulumi/stacks/<stack>.json`). Backups (.bak) and
 * history are not states.
 */
function readFileBackend(root: string): StackState[] {
  const stacksDir = join(root, ".pulumi", "stacks");
  let isDirectory = false;
  try {
    isDirectory = statSync(stacksDir).isDirectory();
  } catch {
    isDirectory = false;
  }
  if (!isDirectory)
    throw new StateReadError(
      `fileBackend ${root} has no .pulumi/stacks directory; give the directory your file:// backend URL points at`,
    );
  const states: StackState[] = [];
  for (const file of walk(stacksDir)) {
    const name = basename(file);
    const stackName = name.endsWith(".json.gz")
      ? name.slice(0, -".json.gz".length)
      : name.endsWith(".json")
        ? name.slice(0, -".json".length)
        : undefined;
    if (stackName === undefined) continue;
    const parts = relative(stacksDir, file).split(sep);
    const names =
      parts.length === 2 ? { project: parts[0], stack: stackName } : { stack: stackName };
    states.push(parseState(readText(file), file, names));
  }
  return states;
}

function walk(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    return entry.isDirectory() ? walk(path) : entry.isFile() ? [path] : [];
  });
}

/** Only the exit status is reported: a failing export may print secrets or tokens on stderr. */
function runStateCommand(
  command: readonly string[],
  cwd: string | undefined,
  timeoutSeconds: number,
) {
  return new Promise<string>((resolve, reject) => {
    execFile(
      command[0]!,
      command.slice(1),
      { cwd, timeout: timeoutSeconds * 1000, maxBuffer: 1024 * 1024 * 1024, encoding: "utf8" },
      (error, stdout) => {
        if (error === null) return resolve(stdout);
        const code = (error as { code?: unknown }).code;
        const why = error.killed
          ? `was stopped after ${timeoutSeconds} s (raise timeoutSeconds)`
          : typeof code === "number"
            ? `exited with status ${code}`
            : `could not run (${String(code ?? error.message)})`;
        reject(
          new StateReadError(
            `state command ${command[0]} ${why}; run it by hand to see its output`,
          ),
        );
      },
    );
  });
}
