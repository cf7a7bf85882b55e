/**
 * The KVM side of the reaper: its config schema, and deletes. What a host
 * holds is listed by provider/kvm/leftovers.ts; a planned domain is deleted
 * through KvmProxy's own delete, a planned volume or base image through the
 * leftovers module.
 */
import { readFileSync } from "node:fs";
import { z } from "zod";
import { PermanentError } from "../provider/common/errors";
import type { DeleteOutcome } from "../provider/common/lifecycle";
import {
  closeAllKvmLinks,
  deleteLeftover,
  kvmResourceIdOf,
  openKvmSession as openKvmSessionAt,
  type KvmDialTarget,
  type KvmSession,
} from "../provider/kvm/leftovers";
import { remove as removeKvmProxy } from "../provider/kvm/provider";
import { NAME_PATTERN } from "./names";
import type { PlanEntry } from "./plan";

export {
  backingPathOf,
  listKvmBackend,
  sessionOver,
  volumeTime,
  type KvmListOptions,
  type KvmSession,
} from "../provider/kvm/leftovers";
export type { DeleteOutcome };

/** Deleting gets its own budget: a dead host must not hang the run. */
const DELETE_BUDGET_MS = 180_000;

const ownerSchema = z.strictObject({
  project: z.string().min(1, { error: "project must not be empty" }),
  stack: z.string().min(1, { error: "stack must not be empty" }),
});

/** A jump host with its own login, files named as for the host itself. */
const jumpHostSchema = z.strictObject({
  host: z.string().min(1, { error: "proxyJump[].host must be the jump host's name or address" }),
  port: z.number().int().min(1).max(65535).default(22),
  user: z.string().min(1).optional(),
  privateKeyFile: z.string().optional(),
  passphraseEnv: z.string().optional(),
  knownHostsFile: z.string().optional(),
  insecureIgnoreHostKey: z.boolean().default(false),
  agentSocket: z.string().optional(),
});

/** One KVM host in the reaper config (`kvm: [...]`). */
export const kvmBackendSchema = z.strictObject({
  name: z
    .string()
    .regex(NAME_PATTERN, { error: "name must be letters, digits, _ . - (e.g. kvm1)" }),
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
      /**
       * Jump hosts, like KvmProxy's connection.proxyJump: OpenSSH's one-line
       * form, or a list of that text and hops with files of their own.
       */
      proxyJump: z
        .union([z.string().min(1), z.array(z.union([z.string().min(1), jumpHostSchema])).min(1)])
        .optional(),
    })
    .optional(),
  socketPath: z.string().default("/var/run/libvirt/libvirt-sock"),
  pools: z
    .array(z.string().regex(NAME_PATTERN, { error: "each pool must be a libvirt pool name" }))
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

export type KvmBackendConfig = z.output<typeof kvmBackendSchema>;

/** Deletes one planned entry: a domain through KvmProxy's delete, anything else as listed. */
export async function deleteKvmEntry(
  session: KvmSession,
  config: KvmBackendConfig,
  entry: PlanEntry,
): Promise<DeleteOutcome> {
  if (entry.item.kind === "domain") return deleteDomainEntry(config, entry);
  return deleteLeftover(session, config, entry.item);
}

/**
 * KvmProxy's own delete, given what its state would record of the listed
 * domain: the host's connection, the owner and creation time from the mark
 * (a domain made since under that name is not the one listed: it refuses),
 * and the pool. It destroys, undefines, and removes the per-VM volumes, even
 * when the domain is already gone; then the other configured pools are swept
 * of this VM's volumes, as the reaper lists all of them.
 */
async function deleteDomainEntry(
  config: KvmBackendConfig,
  entry: PlanEntry,
): Promise<DeleteOutcome> {
  const { item } = entry;
  if (item.ownership.kind !== "marked")
    throw new PermanentError(`domain ${item.name} has no readable mark; left alone`);
  const { mark } = item.ownership;
  if (`${mark.owner.project}/${mark.owner.stack}` !== entry.ownerStack)
    throw new PermanentError(
      `domain ${item.name} is planned for another stack than its mark's; left alone`,
    );
  const [firstPool, ...otherPools] = config.pools;
  // Key and known_hosts files read once: the id's label and the props come from the same target.
  const target = kvmDialTargetOf(config);
  const props = {
    socketPath: target.socketPath,
    ...(target.connection === undefined ? {} : { connection: target.connection }),
    pool: firstPool,
    owner: mark.owner,
    createdAt: mark.createdAt,
    timeouts: { deleteSeconds: DELETE_BUDGET_MS / 1000 },
  };
  const id = kvmResourceIdOf(target, item.name);
  const outcome = await removeKvmProxy(id, props);
  let removed = outcome === "removed";
  for (const pool of otherPools) {
    const more = await removeKvmProxy(id, {
      ...props,
      pool,
    });
    removed = more === "removed" || removed;
  }
  return removed ? "removed" : "already gone";
}

/**
 * The host as KvmProxy's inputs spell it, key, passphrase and known_hosts
 * read from where the config says: the one translation of the reaper's SSH
 * settings, used for the listing's link and for KvmProxy's delete alike.
 */
function kvmTargetOf(config: KvmBackendConfig): {
  socketPath: string;
  connection?: Record<string, unknown>;
} {
  const ssh = config.connection;
  if (ssh === undefined) return { socketPath: config.socketPath };
  const { proxyJump } = ssh;
  return {
    socketPath: config.socketPath,
    connection: {
      host: ssh.host,
      port: ssh.port,
      user: ssh.user,
      insecureIgnoreHostKey: ssh.insecureIgnoreHostKey,
      dialTimeoutSeconds: ssh.dialTimeoutSeconds,
      ...loginFromFiles(ssh),
      ...(proxyJump === undefined
        ? {}
        : {
            proxyJump: (typeof proxyJump === "string" ? [proxyJump] : proxyJump).map((hop) =>
              typeof hop === "string"
                ? hop
                : {
                    host: hop.host,
                    port: hop.port,
                    insecureIgnoreHostKey: hop.insecureIgnoreHostKey,
                    ...(hop.user === undefined ? {} : { user: hop.user }),
                    ...loginFromFiles(hop),
                  },
            ),
          }),
    },
  };
}

/** Key, passphrase and known_hosts as KvmProxy takes them: the texts, read from the files named. */
function loginFromFiles(ssh: {
  privateKeyFile?: string | undefined;
  passphraseEnv?: string | undefined;
  knownHostsFile?: string | undefined;
  agentSocket?: string | undefined;
}): Record<string, string> {
  return {
    ...(ssh.privateKeyFile !== undefined
      ? { privateKey: readFileSync(ssh.privateKeyFile, "utf8") }
      : {}),
    ...(ssh.passphraseEnv !== undefined && process.env[ssh.passphraseEnv] !== undefined
      ? { passphrase: process.env[ssh.passphraseEnv]! }
      : {}),
    ...(ssh.knownHostsFile !== undefined
      ? { knownHosts: readFileSync(ssh.knownHostsFile, "utf8") }
      : {}),
    ...(ssh.agentSocket !== undefined ? { agentSocket: ssh.agentSocket } : {}),
  };
}

/** The reaper's backend config as the leftovers module dials it. */
export function kvmDialTargetOf(config: KvmBackendConfig): KvmDialTarget {
  const keyFile = config.connection?.privateKeyFile;
  return {
    ...kvmTargetOf(config),
    ...(config.label === undefined ? {} : { label: config.label }),
    ...(keyFile === undefined ? {} : { privateKeySource: `ssh.privateKeyFile ${keyFile}` }),
  };
}

/** The host's link for the listing: KvmProxy's pooled one, which the deletes after it use too. */
export const openKvmSession = (config: KvmBackendConfig): Promise<KvmSession> =>
  openKvmSessionAt(kvmDialTargetOf(config));

/** The links KvmProxy's delete opened, closed after the run. */
export const closeKvmLinks = (): Promise<void> => closeAllKvmLinks();
