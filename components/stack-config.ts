/**
 * The root program's stack config (`egress-proxies:*` keys in
 * Pulumi.<stack>.yaml) turned into pool arguments. Pure: tests call it with
 * plain objects, and every message names the config key and the fix.
 * Backend details beyond the shape checked here (image URLs, storage names,
 * ...) are validated by KvmProxy's and ProxmoxProxy's own check, which name
 * the field too.
 */
import { z } from "zod";
import type { EgressProxyPoolArgs, PoolBackend } from "./pool";

export const CONFIG_NAMESPACE = "egress-proxies";

/** With nothing configured: one proxy on the libvirt daemon of the machine running Pulumi. */
export const DEFAULT_POOL_CONFIG = {
  count: 1,
  backends: [{ name: "local", kvm: {} }],
} as const;

const count = (field: string) =>
  z
    .int({ error: `${field} must be a whole number, e.g. 2` })
    .min(0, { error: `${field} must be 0 or more` })
    .max(1000, { error: `${field} must be at most 1000` });

const backendBase = {
  name: z
    .string({ error: 'name must be a short DNS label, e.g. "kvm1"' })
    .regex(/^[a-z0-9]([a-z0-9-]{0,30}[a-z0-9])?$/, {
      error: 'name must be a short DNS label (a-z, 0-9, -), e.g. "kvm1"',
    }),
  weight: z.number({ error: "weight must be a number above 0, e.g. 2" }).positive().optional(),
  count: count("count").optional(),
};

const kvmBackend = z.strictObject({
  ...backendBase,
  kvm: z.looseObject(
    {
      connection: z
        .looseObject(
          {
            host: z.string({
              error: 'kvm.connection.host must be the hypervisor\'s host name, e.g. "kvm1.lan"',
            }),
          },
          { error: "kvm.connection must be an object like { host: kvm1.lan, user: root }" },
        )
        .optional(),
    },
    { error: "kvm must be an object (use {} for the local libvirt socket)" },
  ),
});

const proxmoxBackend = z.strictObject({
  ...backendBase,
  proxmox: z.looseObject(
    {
      node: z.string({ error: 'proxmox.node must be the node name, e.g. "pve1"' }),
      templateVmid: z.int({ error: "proxmox.templateVmid must be the template's VMID, e.g. 9000" }),
      diskStorage: z.string({
        error: 'proxmox.diskStorage must be a storage id, e.g. "local-lvm"',
      }),
      seedStorage: z.string({
        error: 'proxmox.seedStorage must be a directory storage id, e.g. "local"',
      }),
    },
    { error: "proxmox must be an object with node, templateVmid, diskStorage and seedStorage" },
  ),
});

/**
 * Picks the backend's schema by its key, so a mistake inside `proxmox` is
 * reported at its own path instead of as "matches neither kind".
 */
const backendSchema = z.unknown().pipe(
  z
    .custom<z.output<typeof kvmBackend> | z.output<typeof proxmoxBackend>>()
    .superRefine((value, context) => {
      const isObject = typeof value === "object" && value !== null;
      const kinds = isObject ? ["kvm", "proxmox"].filter((kind) => kind in value) : [];
      if (kinds.length !== 1) {
        context.addIssue({
          code: "custom",
          message: `each backend must be { name, kvm: {...} } or { name, proxmox: {...} } (found ${kinds.length === 0 ? "neither" : "both"})`,
        });
        return;
      }
      const result = (kinds[0] === "kvm" ? kvmBackend : proxmoxBackend).safeParse(value);
      if (!result.success)
        for (const issue of result.error.issues)
          context.addIssue({ code: "custom", message: issue.message, path: issue.path });
    }),
);

export const poolConfigSchema = z.strictObject({
  count: count("count").optional(),
  backends: z
    .array(backendSchema, { error: "backends must be a list of KVM hosts and Proxmox nodes" })
    .min(1, { error: "backends must list at least one backend" }),
  machine: z
    .strictObject({
      cpus: z.int({ error: "machine.cpus must be a whole number" }).min(1).max(128).optional(),
      memoryMiB: z.int({ error: "machine.memoryMiB must be a whole number" }).min(256).optional(),
      diskGiB: z.int({ error: "machine.diskGiB must be a whole number" }).min(1).optional(),
    })
    .optional(),
  kvmImage: z
    .strictObject({
      url: z.string({ error: "kvmImage.url must be the https URL of a cloud image" }),
      sha256: z.string().optional(),
      format: z
        .enum(["qcow2", "raw"], { error: 'kvmImage.format must be "qcow2" or "raw"' })
        .optional(),
    })
    .optional(),
  squid: z
    .strictObject({
      port: z
        .int({ error: "squid.port must be a whole number, e.g. 3128" })
        .min(1)
        .max(65535)
        .optional(),
      allowedClientCidrs: z
        .array(z.string(), { error: 'squid.allowedClientCidrs must be a list like ["10.0.0.0/8"]' })
        .optional(),
      /** The password comes from the secret key `egress-proxies:basicAuthPassword`. */
      basicAuthUser: z.string({ error: "squid.basicAuthUser must be a user name" }).optional(),
      extraConfigLines: z
        .array(z.string(), { error: "squid.extraConfigLines must be a list of squid.conf lines" })
        .optional(),
    })
    .optional(),
  tags: z.array(z.string(), { error: "tags must be a list of strings" }).optional(),
  readiness: z
    .enum(["port", "address", "none"], { error: 'readiness must be "port", "address" or "none"' })
    .optional(),
  egressCheck: z
    .strictObject({
      url: z.string({
        error: "egressCheck.url must be an http:// URL that answers with the caller's address",
      }),
      field: z
        .string({ error: 'egressCheck.field must be a JSON field name, e.g. "ip"' })
        .optional(),
    })
    .optional(),
  requireDistinctEgress: z
    .boolean({ error: "requireDistinctEgress must be true or false" })
    .optional(),
  kubernetes: z
    .strictObject({
      namespace: z.string({ error: "kubernetes.namespace must be the namespace name" }),
      name: z.string({ error: "kubernetes.name must be the Service/Secret name" }),
    })
    .optional(),
});

export type PoolConfig = z.output<typeof poolConfigSchema>;

/** Config values as `pulumi.Config` hands them over; secrets stay wrapped by the caller. */
export interface RawStackConfig<Secret> {
  /** `egress-proxies:pool`, an object (YAML in Pulumi.<stack>.yaml). */
  pool?: unknown;
  /** `egress-proxies:basicAuthPassword` (secret). */
  basicAuthPassword?: Secret;
  /**
   * `egress-proxies:kvmPrivateKey` (secret): used for every KVM backend without its own key. The same
   * key is KvmProxy's provider-config fallback, so one setting serves the program and the provider.
   */
  kvmPrivateKey?: Secret;
  /** `egress-proxies:extraCloudInit`: more cloud-init, its own MIME part. */
  extraCloudInit?: string;
}

export type StackConfigResult =
  { ok: true; args: EgressProxyPoolArgs; config: PoolConfig } | { ok: false; problems: string[] };

const keyOf = (path: PropertyKey[]) =>
  `${CONFIG_NAMESPACE}:pool` +
  path.map((part) => (typeof part === "number" ? `[${part}]` : `.${String(part)}`)).join("");

/** Validates the config and builds the pool's arguments, or lists every problem. */
export function poolArgsFromStackConfig<Secret>(raw: RawStackConfig<Secret>): StackConfigResult {
  const parsed = poolConfigSchema.safeParse(raw.pool ?? DEFAULT_POOL_CONFIG);
  if (!parsed.success)
    return {
      ok: false,
      problems: parsed.error.issues.map((issue) => `${keyOf(issue.path)}: ${issue.message}`),
    };
  const config = parsed.data;
  const problems: string[] = [];
  if (config.squid?.basicAuthUser !== undefined && raw.basicAuthPassword === undefined)
    problems.push(
      `${CONFIG_NAMESPACE}:pool.squid.basicAuthUser is set but there is no password: run \`pulumi config set --secret ${CONFIG_NAMESPACE}:basicAuthPassword <password>\``,
    );
  if (problems.length > 0) return { ok: false, problems };

  const backends = config.backends.map((backend): PoolBackend => {
    if ("proxmox" in backend) return backend as unknown as PoolBackend;
    const connection = backend.kvm.connection as Record<string, unknown> | undefined;
    const kvm =
      connection !== undefined &&
      connection.privateKey === undefined &&
      raw.kvmPrivateKey !== undefined
        ? { ...backend.kvm, connection: { ...connection, privateKey: raw.kvmPrivateKey } }
        : backend.kvm;
    return { ...backend, kvm } as unknown as PoolBackend;
  });
  const args: EgressProxyPoolArgs = {
    backends,
    count: config.count,
    machine: config.machine,
    kvmImage: config.kvmImage,
    squid:
      config.squid === undefined
        ? undefined
        : {
            port: config.squid.port,
            allowedClientCidrs: config.squid.allowedClientCidrs,
            extraConfigLines: config.squid.extraConfigLines,
            basicAuth:
              config.squid.basicAuthUser === undefined
                ? undefined
                : { user: config.squid.basicAuthUser, password: raw.basicAuthPassword as never },
          },
    extraCloudInit: raw.extraCloudInit,
    tags: config.tags,
    readiness: config.readiness === undefined ? undefined : { mode: config.readiness },
    egressCheck: config.egressCheck,
    requireDistinctEgress: config.requireDistinctEgress,
    kubernetes: config.kubernetes,
  };
  return { ok: true, args, config };
}
