/**
 * The reaper's config file (JSON): which stack states to trust and which
 * backends to sweep. Validated up front; every message names the field path
 * and what to write instead. Secrets are referenced by file or environment
 * variable, never written into the config.
 */
import { readFileSync } from "node:fs";
import { z } from "zod";

const NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/;

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

const ownerSchema = z.strictObject({
  project: z.string().min(1, { error: "project must not be empty" }),
  stack: z.string().min(1, { error: "stack must not be empty" }),
});

const kvmBackendSchema = z.strictObject({
  name: z.string().regex(NAME, { error: "name must be letters, digits, _ . - (e.g. kvm1)" }),
  /** How KvmProxy ids name this host (`host`, `host:port` or `local`); defaults to that rule. */
  label: z.string().min(1).optional(),
  /** Without a connection the local socket is used. */
  connection: z
    .strictObject({
      host: z.string().min(1, { error: "host must be the hypervisor's name or address" }),
      port: z.number().int().min(1).max(65535).default(22),
      user: z.string().min(1).default("root"),
      privateKeyFile: z.string().optional(),
      /** Name of an environment variable holding the key's passphrase. */
      passphraseEnv: z.string().optional(),
      knownHostsFile: z.string().optional(),
      insecureIgnoreHostKey: z.boolean().default(false),
      agentSocket: z.string().optional(),
      dialTimeoutSeconds: z.number().int().min(1).max(600).default(15),
    })
    .optional(),
  socketPath: z.string().default("/var/run/libvirt/libvirt-sock"),
  pools: z
    .array(z.string().regex(NAME, { error: "each pool must be a libvirt pool name" }))
    .min(1, { error: 'pools must name at least one storage pool, e.g. ["default"]' }),
  /**
   * Volumes carry no mark. Per-VM volumes without a domain whose VM name starts
   * with namePrefix are taken to be this stack's; without this they are
   * reported as "unknown owner" and never touched.
   */
  unmarkedVolumes: z
    .strictObject({ owner: ownerSchema, namePrefix: z.string().default("") })
    .optional(),
});

const proxmoxBackendSchema = z.strictObject({
  name: z.string().regex(NAME, { error: "name must be letters, digits, _ . - (e.g. pve1)" }),
  apiEndpoint: z
    .string({ error: 'apiEndpoint must be a URL, e.g. "https://pve.lan:8006"' })
    .regex(/^https?:\/\/[^/\s]+/, {
      error: 'apiEndpoint must be a URL, e.g. "https://pve.lan:8006"',
    }),
  /** Name of an environment variable holding `user@realm!tokenid=secret`. */
  apiTokenEnv: z.string().default("PROXMOX_VE_API_TOKEN"),
  apiTokenFile: z.string().optional(),
  caCertFile: z.string().optional(),
  insecure: z.boolean().default(false),
  nodes: z
    .array(
      z.strictObject({
        node: z.string().min(1, { error: "node must be the Proxmox node name" }),
        /** Where this node's seeds live (the ProxmoxProxy seedStorage). */
        seedStorage: z.string().min(1, { error: "seedStorage must be a storage id, e.g. local" }),
      }),
    )
    .min(1, { error: "nodes must list at least one node" }),
  deleteTimeoutSeconds: z.number().int().min(10).max(3600).default(300),
});

export const reaperConfigSchema = z.strictObject({
  states: z.array(stateSourceSchema).min(1, {
    error: "states must list at least one stack state: without states nothing is an orphan",
  }),
  kvm: z.array(kvmBackendSchema).default([]),
  proxmox: z.array(proxmoxBackendSchema).default([]),
});

export type ReaperConfig = z.output<typeof reaperConfigSchema>;
export type StateSource = ReaperConfig["states"][number];
export type KvmBackendConfig = ReaperConfig["kvm"][number];
export type ProxmoxBackendConfig = ReaperConfig["proxmox"][number];

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
  const names = [...result.data.kvm, ...result.data.proxmox].map((backend) => backend.name);
  const repeated = names.find((name, index) => names.indexOf(name) !== index);
  if (repeated !== undefined)
    throw new ConfigError(
      `${source}: backend name ${JSON.stringify(repeated)} is used twice; give each backend its own name`,
    );
  return result.data;
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
