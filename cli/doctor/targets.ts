/**
 * Which hosts the doctor examines, and what the VMs will ask of each: the KVM
 * backends of a stack config (the output of `pulumi config --json`), or one
 * host described by flags (by default the local libvirt socket with
 * KvmProxy's defaults — the zero-config root program's host). Pure apart from
 * reading the key and known_hosts files flags name.
 */
import { readFileSync } from "node:fs";
import { z } from "zod";
import {
  CONFIG_NAMESPACE,
  DEFAULT_POOL_CONFIG,
  poolArgsFromStackConfig,
} from "../../components/stack-config";
import { kindOf } from "../../components/backends";
import { hostLabel } from "../../provider/kvm/naming";
import type { PreflightWants } from "../../provider/kvm/preflight";
import { kvmProxyInputsSchema, type KvmProxyInputs } from "../../provider/kvm/schema";

export interface DoctorTarget {
  /** The backend's name in the stack config, or the host's label. */
  name: string;
  /** How the host appears in ids ("local", "kvm1.lan", "host:2222"). */
  label: string;
  /** Prefix of the input paths in messages, e.g. "egress-proxies:pool.backends[0].kvm.". */
  inputPrefix: string;
  connectTo: Pick<KvmProxyInputs, "connection" | "socketPath">;
  wants: PreflightWants;
  /** Where connection.privateKey came from, for a refused login's message. */
  privateKeySource?: string;
}

export class TargetError extends Error {
  override readonly name = "TargetError";
}

const shape = kvmProxyInputsSchema.shape;
/** The KvmProxy inputs that decide where the VM goes and what it needs; other keys are ignored. */
const hostPartSchema = z.object({
  connection: shape.connection,
  socketPath: shape.socketPath,
  pool: shape.pool,
  network: shape.network,
  firmware: shape.firmware,
  domainType: shape.domainType,
});

function targetOf(name: string, inputPrefix: string, raw: unknown): DoctorTarget {
  const parsed = hostPartSchema.safeParse(raw);
  if (!parsed.success)
    throw new TargetError(
      parsed.error.issues
        .map((issue) => `${inputPrefix}${issue.path.join(".")}: ${issue.message}`)
        .join("\n"),
    );
  const { connection, socketPath, pool, network, firmware, domainType } = parsed.data;
  return {
    name,
    label: hostLabel(connection),
    inputPrefix,
    connectTo: { connection, socketPath },
    wants: { pool, network, firmware, domainType },
    privateKeySource: `${inputPrefix}connection.privateKey (or ${CONFIG_NAMESPACE}:kvmPrivateKey)`,
  };
}

export interface HostFlags {
  host?: string;
  port?: string;
  user?: string;
  identity?: string;
  knownHosts?: string;
  /** Jump hosts in OpenSSH's -J form; they use --identity and --known-hosts too. */
  jump?: string;
  insecureIgnoreHostKey?: boolean;
  socket?: string;
  pool?: string;
  network?: string;
  bridge?: string;
  firmware?: string;
  domainType?: string;
}

function readFlagFile(flag: string, path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch (error) {
    throw new TargetError(`${flag} ${path} cannot be read: ${(error as Error).message}`);
  }
}

/** One host from flags; what is not given is KvmProxy's default. */
export function targetFromFlags(flags: HostFlags): DoctorTarget {
  if (flags.network !== undefined && flags.bridge !== undefined)
    throw new TargetError("give --network or --bridge, not both");
  if (
    flags.host === undefined &&
    (flags.port ?? flags.user ?? flags.identity ?? flags.jump) !== undefined
  )
    throw new TargetError(
      "--port, --user, --identity and --jump need --host (without it the local socket is used)",
    );
  const connection =
    flags.host === undefined
      ? undefined
      : {
          host: flags.host,
          ...(flags.port !== undefined ? { port: Number(flags.port) } : {}),
          ...(flags.user !== undefined ? { user: flags.user } : {}),
          ...(flags.identity !== undefined
            ? { privateKey: readFlagFile("--identity", flags.identity) }
            : {}),
          ...(flags.knownHosts !== undefined
            ? { knownHosts: readFlagFile("--known-hosts", flags.knownHosts) }
            : {}),
          ...(flags.jump !== undefined ? { proxyJump: flags.jump } : {}),
          ...(flags.insecureIgnoreHostKey ? { insecureIgnoreHostKey: true } : {}),
        };
  const raw = {
    ...(connection ? { connection } : {}),
    ...(flags.socket !== undefined ? { socketPath: flags.socket } : {}),
    ...(flags.pool !== undefined ? { pool: flags.pool } : {}),
    ...(flags.network !== undefined ? { network: { name: flags.network } } : {}),
    ...(flags.bridge !== undefined ? { network: { bridge: flags.bridge } } : {}),
    ...(flags.firmware !== undefined ? { firmware: flags.firmware } : {}),
    ...(flags.domainType !== undefined ? { domainType: flags.domainType } : {}),
  };
  const target = targetOf("", "", raw);
  return {
    ...target,
    name: target.label,
    privateKeySource: flags.identity !== undefined ? `--identity ${flags.identity}` : undefined,
  };
}

/** One entry of `pulumi config --json`: structured values come as objectValue, the rest as text. */
const configEntrySchema = z.object({
  value: z.string().optional(),
  objectValue: z.unknown().optional(),
  secret: z.boolean().optional(),
});
export type StackConfigJson = Record<string, z.output<typeof configEntrySchema>>;

function configValue(config: StackConfigJson, key: string): unknown {
  const entry = config[key];
  if (entry === undefined) return undefined;
  if (entry.objectValue !== undefined) return entry.objectValue;
  if (entry.secret && entry.value === "[secret]")
    throw new TargetError(
      `${key} is a secret shown as [secret]: run pulumi config with --show-secrets`,
    );
  if (entry.value !== undefined && /^\s*[[{]/.test(entry.value)) {
    try {
      return JSON.parse(entry.value) as unknown;
    } catch {
      return entry.value;
    }
  }
  return entry.value;
}

/**
 * The KVM backends of a stack config. Without `egress-proxies:pool` that is
 * the root program's default: one proxy on the local libvirt socket.
 */
export function targetsFromStackConfig(json: unknown, source: string): DoctorTarget[] {
  const entries = z.record(z.string(), configEntrySchema).safeParse(json);
  if (!entries.success)
    throw new TargetError(
      `${source} is not the output of \`pulumi config --json\` (an object of { value, secret } entries)`,
    );
  const config = entries.data;
  const poolKey = `${CONFIG_NAMESPACE}:pool`;
  const rawPool = configValue(config, poolKey) ?? DEFAULT_POOL_CONFIG;
  const privateKey = configValue(config, `${CONFIG_NAMESPACE}:kvmPrivateKey`);
  const password = configValue(config, `${CONFIG_NAMESPACE}:basicAuthPassword`);
  // The root program's own check, so the doctor reports a config mistake exactly as `pulumi up` would.
  const checked = poolArgsFromStackConfig({
    pool: rawPool,
    kvmPrivateKey: typeof privateKey === "string" ? privateKey : undefined,
    basicAuthPassword: typeof password === "string" ? password : undefined,
  });
  if (!checked.ok) throw new TargetError(checked.problems.join("\n"));
  const targets: DoctorTarget[] = [];
  // The pool's own arguments (kvmPrivateKey already folded in), its KVM backends found by the registry.
  checked.args.backends.forEach((backend, index) => {
    const { key, settings } = kindOf(backend);
    if (key !== "kvm") return;
    const kvm = settings as Record<string, unknown>;
    targets.push(targetOf(backend.name, `${poolKey}.backends[${index}].${key}.`, kvm));
  });
  if (targets.length === 0)
    throw new TargetError(`${poolKey} has no KVM backend: the doctor checks libvirt hosts only`);
  return targets;
}
