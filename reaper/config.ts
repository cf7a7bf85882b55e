/**
 * The reaper's config file (JSON): which stack states to trust and which
 * backends to sweep. Validated up front; every message names the field path
 * and what to write instead. Secrets are referenced by file or environment
 * variable, never written into the config.
 */
import { readFileSync } from "node:fs";
import { z } from "zod";

import { REAPER_BACKENDS, type ReaperBackendConfigs } from "./backends";

const namesOfState = {
  /** Needed only when the state has no resources to tell them. */
  project: z.string({ error: "project must be the Pulumi project name" }).min(1).optional(),
  stack: z.string({ error: "stack must be the Pulumi stack name" }).min(1).optional(),
};

const stateSourceSchema = z.union(
  [
    z.strictObject({
      checkpointFile: z.string({ error: "checkpointFile must be a path" }).min(1),
      ...namesOfState,
    }),
    z.strictObject({
      fileBackend: z.string({ error: "fileBackend must be a directory" }).min(1),
    }),
    z.strictObject({
      command: z
        .array(z.string(), {
          error: 'command must be an argv array, e.g. ["pulumi", "stack", "export", "-s", "prod"]',
        })
        .min(1, { error: "command must name a program" }),
      cwd: z.string().optional(),
      timeoutSeconds: z.number().int().min(1).max(3600).default(120),
      ...namesOfState,
    }),
  ],
  {
    error:
      'each state is one of {"checkpointFile": path}, {"fileBackend": dir}, {"command": [argv...]}',
  },
);

/** `states`, then one list per kind of backend in the registry (reaper/backends.ts), under its key. */
export const reaperConfigSchema = z.strictObject({
  states: z.array(stateSourceSchema).min(1, {
    error: "states must list at least one stack state: without states nothing is an orphan",
  }),
  ...(Object.fromEntries(
    Object.entries(REAPER_BACKENDS).map(([key, kind]) => [
      key,
      z.array(kind.configSchema).default([]),
    ]),
  ) as {
    [K in keyof ReaperBackendConfigs]: z.ZodDefault<z.ZodArray<z.ZodType<ReaperBackendConfigs[K]>>>;
  }),
});

export type ReaperConfig = { states: StateSource[] } & {
  [K in keyof ReaperBackendConfigs]: ReaperBackendConfigs[K][];
};
export type StateSource = z.output<typeof stateSourceSchema>;
export type { KvmBackendConfig, ProxmoxBackendConfig } from "./backends";

export class ConfigError extends Error {
  override readonly name = "ConfigError";
}

export function parseConfig(json: unknown, source = "config"): ReaperConfig {
  const result = reaperConfigSchema.safeParse(json);
  if (!result.success) {
    const lines = result.error.issues.map((issue) => {
      const path = issue.path
        .map((part) => (typeof part === "number" ? `[${part}]` : `.${String(part)}`))
        .join("");
      return `${source}${path}: ${issue.message}`;
    });
    throw new ConfigError(lines.join("\n"));
  }
  const data = result.data as ReaperConfig;
  const names = Object.keys(REAPER_BACKENDS).flatMap((key) =>
    (data[key as keyof ReaperBackendConfigs] as { name: string }[]).map((backend) => backend.name),
  );
  const repeated = names.find((name, index) => names.indexOf(name) !== index);
  if (repeated !== undefined)
    throw new ConfigError(
      `${source}: backend name ${JSON.stringify(repeated)} is used twice; give each backend its own name`,
    );
  return data;
}

export function loadConfig(path: string): ReaperConfig {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (error) {
    throw new ConfigError(`config ${path} cannot be read: ${(error as Error).message}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (error) {
    throw new ConfigError(`config ${path} is not JSON: ${(error as Error).message}`);
  }
  return parseConfig(json, path);
}
