/**
 * The root program's stack config (`egress-proxies:*` keys in
 * Pulumi.<stack>.yaml) turned into pool arguments. Pure: tests call it with
 * plain objects. The config is checked whole before anything is declared,
 * with KvmProxy's and ProxmoxProxy's own schemas for each backend's settings,
 * and every message names the config key the user wrote and the fix.
 */
import type * as pulumi from "@pulumi/pulumi";
import { z } from "zod";
import { egressCheckSchema } from "../provider/common/egress";
import { ipFamiliesShape } from "../provider/common/ip-families";
import { ipv6PrefixConfigSchema, ipv6PrefixProblems } from "./prefix-wiring";
import type { PoolBackendKind, PoolSetting } from "./backend-kind";
import {
  BACKEND_KEYS,
  BACKEND_POOL_SETTINGS,
  BACKEND_STACK_SECRETS,
  backendKeyList,
  backendKeysOf,
  kindOf,
  POOL_BACKENDS,
  type BackendPoolSettings,
  type BackendStackSecrets,
} from "./backends";
import { describeIssues } from "./config-keys";
import { placementProblems } from "./placement";
import type { EgressProxyPoolArgs, PoolBackend } from "./pool";
import {
  gatewayConfigSchema,
  gatewayFromStackConfig,
  gatewayStackProblems,
} from "./stack-config-gateway";
import {
  DEFAULT_ALLOWED_CLIENT_CIDRS,
  DEFAULT_SQUID_PORT,
  squidSettingsProblems,
} from "../workloads/squid-cloud-init";

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
  ipv6Prefix: ipv6PrefixConfigSchema,
};

/** What to do about an input the pool decides for every proxy, set on a backend. */
const POOL_DECIDED_ADVICE: Record<string, string> = {
  vmName: `remove it (VM names are made from ${CONFIG_NAMESPACE}:poolName and the backend's name)`,
  userData: `remove it and put your cloud-init in ${CONFIG_NAMESPACE}:extraCloudInit`,
  userDataBase64: `remove it and put your cloud-init in ${CONFIG_NAMESPACE}:extraCloudInit`,
  readiness: `remove it and set ${CONFIG_NAMESPACE}:pool.readiness for the whole pool`,
};

/** Each kind's stack-config schema, from the registry (components/backends.ts). */
const BACKEND_KINDS = Object.fromEntries(
  BACKEND_KEYS.map((key) => {
    const kind = POOL_BACKENDS[key] as PoolBackendKind<unknown>;
    return [
      key,
      {
        schema: z.strictObject({ ...backendBase, [key]: kind.configSchema }),
        decided: kind.decided,
        shape: kind.configShape,
      },
    ];
  }),
) as Record<string, { schema: z.ZodObject; decided: readonly string[]; shape: string }>;

/**
 * Picks the backend's schema by its key, so a mistake inside `proxmox` is
 * reported at its own path instead of as "matches neither kind".
 */
const backendSchema = z.unknown().pipe(
  z.custom<PoolBackend>().superRefine((value, context) => {
    const isObject = typeof value === "object" && value !== null;
    const kinds = isObject ? backendKeysOf(value as object) : [];
    if (kinds.length !== 1) {
      const shapes = Object.values(BACKEND_KINDS).map((kind) => kind.shape);
      context.addIssue({
        code: "custom",
        message: `each backend must be ${shapes.slice(0, -1).join(", ")} or ${shapes.at(-1)} (found ${kinds.length === 0 ? "none" : kinds.join(" and ")})`,
      });
      return;
    }
    const kind = BACKEND_KINDS[kinds[0]!];
    const result = kind.schema.safeParse(value);
    if (!result.success)
      for (const issue of describeIssues(result.error.issues, kind.schema, {
        path: [kinds[0]!],
        keys: kind.decided,
        advice: POOL_DECIDED_ADVICE,
      }))
        context.addIssue(issue);
  }),
);

/** The stack-config schemas of pool-wide settings, by name. */
function schemasOf<S extends Record<string, PoolSetting>>(
  settings: S,
): { [K in keyof S]: S[K]["schema"] } {
  return Object.fromEntries(
    Object.entries(settings).map(([name, setting]) => [name, setting.schema]),
  ) as { [K in keyof S]: S[K]["schema"] };
}

export const poolConfigSchema = z.strictObject({
  count: count("count").optional(),
  backends: z
    .array(backendSchema, {
      error: `backends must be a list of backends, each with one of ${backendKeyList()}`,
    })
    .min(1, { error: "backends must list at least one backend" }),
  machine: z
    .strictObject({
      cpus: z.int({ error: "machine.cpus must be a whole number" }).min(1).max(128).optional(),
      memoryMiB: z.int({ error: "machine.memoryMiB must be a whole number" }).min(256).optional(),
      diskGiB: z.int({ error: "machine.diskGiB must be a whole number" }).min(1).optional(),
    })
    .optional(),
  // Each backend kind's pool-wide settings (e.g. the default image of KVM backends), from the registry.
  ...schemasOf(BACKEND_POOL_SETTINGS),
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
      ipv6Url: egressCheckSchema.shape.ipv6Url,
      ipv6Samples: egressCheckSchema.shape.ipv6Samples,
    })
    .optional(),
  ipFamilies: ipFamiliesShape.ipFamilies,
  ipv6Prefix: ipv6PrefixConfigSchema,
  requireDistinctEgress: z
    .boolean({ error: "requireDistinctEgress must be true or false" })
    .optional(),
  rotate: z
    .record(z.string(), z.string({ error: 'rotate values must be text, e.g. "2026-12-02"' }), {
      error:
        'rotate must map member keys or exit addresses to text, e.g. { kvm1-0: "2026-12-02", "203.0.113.9": "burned-2026-12-04" }',
    })
    .optional(),
  recheckEgress: z.boolean({ error: "recheckEgress must be true or false" }).optional(),
  rotateAfterDays: z
    .number({ error: "rotateAfterDays must be a number of days, e.g. 30" })
    .optional(),
  // Checked with the pool's own rule (components/lifecycle-args.ts), which names the fix.
  maxUnavailable: z
    .union([z.number(), z.string()], {
      error: 'maxUnavailable must be a count of members (e.g. 2) or a share (e.g. "25%")',
    })
    .optional(),
  drainSeconds: z
    .number({ error: "drainSeconds must be a whole number of seconds, e.g. 30 (0: no drain)" })
    .optional(),
  onCollision: z
    .enum(["fail", "rotate"], { error: 'onCollision must be "fail" or "rotate"' })
    .optional(),
  kubernetes: z
    .strictObject({
      namespace: z.string({ error: "kubernetes.namespace must be the namespace name" }),
      name: z.string({ error: "kubernetes.name must be the Service/Secret name" }),
      // Checked field by field with the pool's own rules (kubernetes-exporter.ts), which name the fix.
      exporter: z
        .strictObject({
          target: z.string({ error: "kubernetes.exporter.target must be an http:// URL" }),
          connect: z.string().optional(),
          egressUrl: z.string().optional(),
          egressField: z.string().optional(),
          egressUrlIpv6: z.string().optional(),
          intervalSeconds: z.number().optional(),
          timeoutSeconds: z.number().optional(),
          port: z.number().optional(),
          image: z.string().optional(),
          packageSpec: z.string().optional(),
        })
        .optional(),
    })
    .optional(),
  gateway: gatewayConfigSchema,
});

export type PoolConfig = z.output<typeof poolConfigSchema>;

/**
 * Config values as `pulumi.Config` reads them. The secret ones arrive as text
 * so they can be checked here (never quoted back); `poolArgsFromStackConfig`
 * wraps them with its `secret` function before they go anywhere. Besides the
 * pool's own keys, each backend kind's secrets (`BackendStackSecrets`, e.g.
 * `kvmPrivateKey`), declared by its entry in components/backends.ts.
 */
export interface RawStackConfig extends BackendStackSecrets {
  /** `egress-proxies:pool`, an object (YAML in Pulumi.<stack>.yaml). */
  pool?: unknown;
  /** `egress-proxies:basicAuthPassword` (secret). */
  basicAuthPassword?: string;
  /** `egress-proxies:extraCloudInit`: more cloud-init, its own MIME part. */
  extraCloudInit?: string;
  /** `egress-proxies:gatewayPasswords` (secret): a JSON object of gateway user name to password. */
  gatewayPasswords?: string;
}

export type StackConfigResult =
  { ok: true; args: EgressProxyPoolArgs; config: PoolConfig } | { ok: false; problems: string[] };

/** How the secret values are wrapped (the root program passes `pulumi.secret`). */
export type SecretWrapper = (text: string) => pulumi.Input<string>;

const POOL_KEY = `${CONFIG_NAMESPACE}:pool`;
const PASSWORD_KEY = `${CONFIG_NAMESPACE}:basicAuthPassword`;

const fieldPath = (path: readonly PropertyKey[]) =>
  path
    .map((part, index) =>
      typeof part === "number" ? `[${part}]` : `${index === 0 ? "" : "."}${String(part)}`,
    )
    .join("");

const keyOf = (path: readonly PropertyKey[]) =>
  path.length === 0 ? POOL_KEY : `${POOL_KEY}.${fieldPath(path)}`;

/**
 * One line per problem, led by the config key. A message that starts with the
 * field it is about ("connection.port must be ...", written for the resource's
 * own inputs) continues the full key instead of repeating the field.
 */
function problemLine(issue: z.core.$ZodIssue): string {
  const key = keyOf(issue.path);
  if (issue.code === "custom" && issue.params?.continuesKey === true)
    return `${key} ${issue.message}`;
  const message = underSettingName(issue);
  for (let start = 0; start < issue.path.length; start++) {
    const field = fieldPath(issue.path.slice(start));
    if (message.startsWith(`${field} `)) return `${key}${message.slice(field.length)}`;
  }
  return `${key}: ${message}`;
}

/** Validates the config and builds the pool's arguments, or lists every problem. */
export function poolArgsFromStackConfig(
  raw: RawStackConfig,
  secret: SecretWrapper = (text) => text,
): StackConfigResult {
  const pool = raw.pool ?? DEFAULT_POOL_CONFIG;
  const parsed = poolConfigSchema.safeParse(pool);
  const issues = parsed.success ? [] : parsed.error.issues;
  const problems = describeIssues(issues, poolConfigSchema).map((issue) =>
    problemLine(issue as z.core.$ZodIssue),
  );
  const reportedKeys = problems.map((problem) => /^\S+/.exec(problem)![0]);
  // Checks beyond the shape (unique names, counts that add up, CIDRs, the password), each once per key.
  for (const problem of [...poolProblems(pool), ...secretProblems(raw, pool)]) {
    const key = /^\S+/.exec(problem)![0];
    const covered = reportedKeys.some(
      (reported) =>
        key === reported || key.startsWith(`${reported}.`) || key.startsWith(`${reported}[`),
    );
    if (!covered) problems.push(problem);
  }
  if (!parsed.success || problems.length > 0) return { ok: false, problems };
  return { ok: true, args: poolArgs(pool as PoolConfigInput, raw, secret), config: parsed.data };
}

type PoolConfigInput = z.input<typeof poolConfigSchema>;

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value);

/**
 * The pool's own rules (placement.ts, squid-cloud-init.ts), run on whatever of
 * the config has the right types; problems their messages name by field
 * (`backends[1].name`, `squid.port`) get the config key in front.
 */
function poolProblems(pool: unknown): string[] {
  if (!isRecord(pool)) return [];
  const problems: string[] = [];
  if (Array.isArray(pool.backends)) {
    const backends = pool.backends.map((backend: unknown) => {
      const fields = isRecord(backend) ? backend : {};
      return {
        name: typeof fields.name === "string" ? fields.name : "",
        weight: typeof fields.weight === "number" ? fields.weight : undefined,
        count: typeof fields.count === "number" ? fields.count : undefined,
        capacity: capacityOf(fields),
      };
    });
    const total = typeof pool.count === "number" ? pool.count : undefined;
    problems.push(...placementProblems(backends, total).map((text) => `${POOL_KEY}.${text}`));
  }
  const squid = isRecord(pool.squid) ? pool.squid : {};
  const cidrs = squid.allowedClientCidrs;
  const lines = squid.extraConfigLines;
  problems.push(
    ...squidSettingsProblems(
      {
        port: typeof squid.port === "number" ? squid.port : DEFAULT_SQUID_PORT,
        allowedClientCidrs:
          Array.isArray(cidrs) && cidrs.every((cidr) => typeof cidr === "string")
            ? cidrs
            : DEFAULT_ALLOWED_CLIENT_CIDRS,
        extraConfigLines:
          Array.isArray(lines) && lines.every((line) => typeof line === "string") ? lines : [],
      },
      `${POOL_KEY}.squid`,
    ),
  );
  problems.push(...ipv6PrefixProblems(pool).map((text) => `${POOL_KEY}.${text}`));
  return problems;
}

/** The most proxies a backend of a known kind can hold, as far as its settings can tell. */
function capacityOf(backend: Record<string, unknown>): number | undefined {
  const keys = backendKeysOf(backend);
  if (keys.length !== 1) return undefined;
  try {
    return kindOf(backend as unknown as PoolBackend).kind.capacity(backend[keys[0]!]);
  } catch {
    return undefined; // settings of the wrong shape: reported by the schema
  }
}

/** The secret keys, checked without ever being quoted. */
function secretProblems(raw: RawStackConfig, pool: unknown): string[] {
  const problems: string[] = [];
  const squid = isRecord(pool) && isRecord(pool.squid) ? pool.squid : {};
  const user = squid.basicAuthUser;
  if (user !== undefined && raw.basicAuthPassword === undefined)
    problems.push(
      `${POOL_KEY}.squid.basicAuthUser is set but there is no password: run \`pulumi config set --secret ${PASSWORD_KEY} <password>\``,
    );
  if (user === undefined && raw.basicAuthPassword !== undefined)
    problems.push(
      `${PASSWORD_KEY} is set but ${POOL_KEY}.squid.basicAuthUser is not, so the proxies would ask for no password: ` +
        `set the user, or remove the password with \`pulumi config rm ${PASSWORD_KEY}\``,
    );
  if (raw.basicAuthPassword !== undefined) {
    const settings = {
      port: DEFAULT_SQUID_PORT,
      allowedClientCidrs: DEFAULT_ALLOWED_CLIENT_CIDRS,
      extraConfigLines: [],
      basicAuth: {
        user: typeof user === "string" ? user : "user",
        password: raw.basicAuthPassword,
      },
    };
    // The pool's rules for basicAuth, said about the keys the user set.
    for (const problem of squidSettingsProblems(settings, "squid"))
      if (problem.startsWith("squid.basicAuth.password "))
        problems.push(
          `${PASSWORD_KEY}${problem.slice("squid.basicAuth.password".length)}; set it again with \`pulumi config set --secret ${PASSWORD_KEY} <password>\``,
        );
      else if (problem.startsWith("squid.basicAuth.user "))
        problems.push(
          `${POOL_KEY}.squid.basicAuthUser${problem.slice("squid.basicAuth.user".length)}`,
        );
  }
  const backends =
    isRecord(pool) && Array.isArray(pool.backends) ? pool.backends.filter(isRecord) : [];
  const named = (list: Record<string, unknown>[]) =>
    list.flatMap((backend) => (typeof backend.name === "string" ? [backend.name] : []));
  problems.push(
    ...gatewayStackProblems(
      isRecord(pool) ? pool.gateway : undefined,
      raw.gatewayPasswords,
      {
        names: named(backends),
        vmNames: named(backends.filter((backend) => !("static" in backend))),
      },
      { pool: POOL_KEY, passwords: `${CONFIG_NAMESPACE}:gatewayPasswords` },
    ),
  );
  for (const { secret } of BACKEND_STACK_SECRETS) {
    const text = stackSecretText(raw, secret.name);
    const problem =
      text === undefined ? undefined : secret.problem(text, `${CONFIG_NAMESPACE}:${secret.name}`);
    if (problem !== undefined) problems.push(problem);
  }
  return problems;
}

function poolArgs(
  config: PoolConfigInput,
  raw: RawStackConfig,
  secret: SecretWrapper,
): EgressProxyPoolArgs {
  // The backends' settings go to the resources as the user wrote them (defaults are the resources' job).
  const backends = (config.backends as unknown as PoolBackend[]).map((backend) =>
    withStackSecrets(backend, raw, secret),
  );
  const basicAuthUser = config.squid?.basicAuthUser;
  return {
    backends,
    count: config.count,
    machine: config.machine,
    ...(Object.fromEntries(
      Object.keys(BACKEND_POOL_SETTINGS).map((name) => [name, config[name as keyof typeof config]]),
    ) as BackendPoolSettings),
    squid:
      config.squid === undefined
        ? undefined
        : {
            port: config.squid.port,
            allowedClientCidrs: config.squid.allowedClientCidrs,
            extraConfigLines: config.squid.extraConfigLines,
            basicAuth:
              basicAuthUser === undefined || raw.basicAuthPassword === undefined
                ? undefined
                : { user: basicAuthUser, password: secret(raw.basicAuthPassword) },
          },
    extraCloudInit: raw.extraCloudInit,
    tags: config.tags,
    readiness: config.readiness === undefined ? undefined : { mode: config.readiness },
    egressCheck: config.egressCheck,
    ...(config.ipFamilies === undefined ? {} : { ipFamilies: config.ipFamilies }),
    ...(config.ipv6Prefix === undefined ? {} : { ipv6Prefix: config.ipv6Prefix }),
    requireDistinctEgress: config.requireDistinctEgress,
    rotate: config.rotate,
    recheckEgress: config.recheckEgress,
    rotateAfterDays: config.rotateAfterDays,
    ...(config.maxUnavailable === undefined ? {} : { maxUnavailable: config.maxUnavailable }),
    ...(config.drainSeconds === undefined ? {} : { drainSeconds: config.drainSeconds }),
    ...(config.onCollision === undefined ? {} : { onCollision: config.onCollision }),
    kubernetes: config.kubernetes,
    gateway: gatewayFromStackConfig(config.gateway, raw.gatewayPasswords, secret),
  };
}

/** The secret stack-config key `name` as the program read it (text), if it is set. */
const stackSecretText = (raw: RawStackConfig, name: string): string | undefined =>
  (raw as Record<string, unknown>)[name] as string | undefined;

/** A backend's settings with the secrets its kind takes from stack config folded in. */
function withStackSecrets(
  backend: PoolBackend,
  raw: RawStackConfig,
  secret: SecretWrapper,
): PoolBackend {
  const { key, settings } = kindOf(backend);
  let folded = settings;
  for (const owned of BACKEND_STACK_SECRETS) {
    const text = owned.key === key ? stackSecretText(raw, owned.secret.name) : undefined;
    if (text !== undefined) folded = owned.secret.fold(folded, secret(text));
  }
  return folded === settings ? backend : ({ ...backend, [key]: folded } as PoolBackend);
}

/**
 * A message a pool-wide setting's schema wrote about the resource field it
 * borrows (KvmProxy's `image.`), said about the setting's own key.
 */
function underSettingName(issue: z.core.$ZodIssue): string {
  const name = String(issue.path[0]);
  const settings: Readonly<Record<string, PoolSetting>> = BACKEND_POOL_SETTINGS;
  const field = Object.hasOwn(settings, name) ? settings[name]!.messagesName : undefined;
  return field === undefined
    ? issue.message
    : issue.message.replace(new RegExp(`\\b${field}\\.`, "g"), `${name}.`);
}
