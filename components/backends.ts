/**
 * The pool's backend registry: what EgressProxyPool, its placement and the
 * stack config need to know about each kind of backend, one entry per kind.
 * pool.ts and stack-config.ts loop over `POOL_BACKENDS` and name no backend;
 * adding a backend is a folder in provider/ plus an entry here (and one in
 * reaper/backends.ts). See docs/architecture.md, "Adding a backend".
 */
import * as pulumi from "@pulumi/pulumi";
import { z } from "zod";
import { connectionSchema, kvmProxyInputsSchema } from "../provider/kvm/schema";
import { KvmProxy, type KvmProxyArgs } from "../provider/kvm/resource";
import { ProxmoxProxy, type ProxmoxProxyArgs } from "../provider/proxmox/resource";
import { proxmoxProxyInputsSchema } from "../provider/proxmox/schema";
import { StaticProxy, type StaticProxyArgs } from "../provider/static/resource";
import {
  proxyAddressOf,
  proxyUrlSchemaFor,
  staticProxyInputsSchema,
} from "../provider/static/schema";
import {
  backendSettingsSchema,
  IPV4,
  lifecycleOf,
  vmMember,
  NO_IPV6,
  type PoolBackendKind,
  type PoolSetting,
  type StackSecret,
} from "./backend-kind";
import { memberIpFamilies } from "./dual-stack";
import type { Ipv6PrefixArgs } from "./prefix-wiring";

/** Debian 12's official cloud image: has cloud-init, and squid in its archive. */
export const DEFAULT_KVM_IMAGE = {
  url: "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2",
  format: "qcow2" as const,
};

/** Inputs that the pool decides for every proxy, so a backend cannot set them. */
export const POOL_DECIDED_KVM_INPUTS = [
  "vmName",
  "userData",
  "userDataBase64",
  "guestFiles",
  "readiness",
  "egressCheck",
  "egressRecheck",
  "rotation",
  "rotateEgress",
  "disruptionBudget",
  "rotateAfterDays",
] as const;
export const POOL_DECIDED_PROXMOX_INPUTS = [
  "vmName",
  "userData",
  "guestFiles",
  "readiness",
  "egressCheck",
  "egressRecheck",
  "rotation",
  "rotateEgress",
  "disruptionBudget",
  "rotateAfterDays",
] as const;

export type KvmBackendSettings = Omit<
  KvmProxyArgs,
  (typeof POOL_DECIDED_KVM_INPUTS)[number] | "image"
> & {
  /** Default: the pool's `kvmImage`, else Debian 12 genericcloud. */
  image?: KvmProxyArgs["image"];
};
export type ProxmoxBackendSettings = Omit<
  ProxmoxProxyArgs,
  (typeof POOL_DECIDED_PROXMOX_INPUTS)[number]
>;

/**
 * The KVM kind's pool-wide settings. `kvmImage` is public and frozen: it is
 * an EgressProxyPoolArgs input and a key of the stack config's `pool` object
 * (Pulumi.<stack>.yaml files carry it), so it keeps its KVM name there.
 */
export interface KvmPoolSettings {
  /** Default image for KVM backends. */
  kvmImage?: KvmProxyArgs["image"];
}

/**
 * The KVM kind's stack-config secrets. `egress-proxies:kvmPrivateKey` is
 * frozen: stacks set it, and KvmProxy's provider config reads the same key
 * (provider/kvm/connect.ts), so one setting serves the program and the provider.
 */
export interface KvmStackSecrets {
  /** `egress-proxies:kvmPrivateKey` (secret): used for every KVM backend without its own key. */
  kvmPrivateKey?: string;
}

const kvmPoolSettings = {
  // KvmProxy's own image schema; its messages say `image.`, reported under this key.
  kvmImage: { schema: kvmProxyInputsSchema.shape.image.optional(), messagesName: "image" },
} satisfies Record<keyof KvmPoolSettings, PoolSetting>;

const kvmPrivateKey: StackSecret<KvmBackendSettings> & { name: keyof KvmStackSecrets } = {
  name: "kvmPrivateKey",
  problem: (text: string, key: string) =>
    connectionSchema.shape.privateKey.safeParse(text).success
      ? undefined
      : `${key} must be the private key's text (-----BEGIN ... PRIVATE KEY-----), not a path; ` +
        `set it from the file: \`pulumi config set --secret ${key} < ~/.ssh/id_ed25519\``,
  fold(settings: KvmBackendSettings, value: pulumi.Input<string>): KvmBackendSettings {
    const connection = settings.connection as Record<string, unknown> | undefined;
    if (connection === undefined || connection.privateKey !== undefined) return settings;
    return { ...settings, connection: { ...connection, privateKey: value } as never };
  },
};

const kvm: PoolBackendKind<KvmBackendSettings, KvmPoolSettings> = {
  key: "kvm",
  describes: "a KVM host",
  kind: "kvm",
  decided: POOL_DECIDED_KVM_INPUTS,
  // The image is optional on a backend: the pool's kvmImage, else Debian 12, is the default.
  configSchema: backendSettingsSchema(
    kvmProxyInputsSchema,
    POOL_DECIDED_KVM_INPUTS,
    "kvm must be an object (use {} for the local libvirt socket)",
  ).extend({ image: kvmProxyInputsSchema.shape.image.optional() }),
  configShape: "{ name, kvm: {...} }",
  capacity: () => undefined,
  poolSettings: kvmPoolSettings,
  stackSecrets: [kvmPrivateKey],
  declare(resourceName, settings, proxy, pool) {
    const resource = new KvmProxy(
      resourceName,
      {
        ...settings,
        vcpus: settings.vcpus ?? pool.machine?.cpus,
        memoryMiB: settings.memoryMiB ?? pool.machine?.memoryMiB,
        diskGiB: settings.diskGiB ?? pool.machine?.diskGiB,
        image: settings.image ?? pool.poolSettings.kvmImage ?? DEFAULT_KVM_IMAGE,
        ...memberIpFamilies(pool.ipFamilies, settings.ipFamilies),
        userData: pool.userData,
        guestFiles: pool.guestFiles,
        readiness: pool.readiness,
        egressCheck: pool.egressCheck,
        ...lifecycleOf(pool, proxy.key),
      },
      { parent: pool.parent },
    );
    return { resource, ...vmMember(resource, pool) };
  },
};

const proxmox: PoolBackendKind<ProxmoxBackendSettings> = {
  key: "proxmox",
  describes: "a Proxmox node",
  kind: "proxmox",
  decided: POOL_DECIDED_PROXMOX_INPUTS,
  configSchema: backendSettingsSchema(
    proxmoxProxyInputsSchema,
    POOL_DECIDED_PROXMOX_INPUTS,
    "proxmox must be an object with node, templateVmid, diskStorage and seedStorage",
  ),
  configShape: "{ name, proxmox: {...} }",
  capacity: () => undefined,
  declare(resourceName, settings, proxy, pool) {
    const resource = new ProxmoxProxy(
      resourceName,
      {
        ...settings,
        cores: settings.cores ?? pool.machine?.cpus,
        memoryMiB: settings.memoryMiB ?? pool.machine?.memoryMiB,
        diskGiB: settings.diskGiB ?? pool.machine?.diskGiB,
        tags: mergeTags(pool.tags, settings.tags),
        ...memberIpFamilies(pool.ipFamilies, settings.ipFamilies),
        userData: pool.userData,
        guestFiles: pool.guestFiles,
        readiness: pool.readiness,
        egressCheck: pool.egressCheck,
        ...lifecycleOf(pool, proxy.key),
      },
      { parent: pool.parent },
    );
    return { resource, ...vmMember(resource, pool) };
  },
};

function mergeTags(
  poolTags: string[] | undefined,
  backendTags: ProxmoxBackendSettings["tags"],
): ProxmoxBackendSettings["tags"] {
  if (poolTags === undefined) return backendTags;
  if (backendTags === undefined) return poolTags;
  return pulumi.output(backendTags).apply((tags) => [...new Set([...poolTags, ...tags])]);
}

/** Proxies that already exist: each URL is one proxy; count and weight pick among them. */
export interface StaticBackendSettings {
  /** `http://[user:password@]host:port`, one per proxy (secret when they carry credentials). */
  urls: pulumi.Input<string>[];
  /** Default: as the pool's readiness ("port", or "none" when the pool waits for no port). */
  readiness?: StaticProxyArgs["readiness"];
  timeouts?: StaticProxyArgs["timeouts"];
}

const staticBackend: PoolBackendKind<StaticBackendSettings> = {
  key: "static",
  describes: "a list of existing proxies",
  kind: "static",
  decided: ["egressCheck", "egressRecheck"],
  configSchema: z.strictObject(
    {
      urls: z
        .array(proxyUrlSchemaFor("a proxy URL"), {
          error: "urls must be a list of http://[user:password@]host:port",
        })
        .min(1, { error: "urls must list at least one proxy" }),
      readiness: staticProxyInputsSchema.shape.readiness.unwrap().optional(),
      timeouts: staticProxyInputsSchema.shape.timeouts.unwrap().optional(),
    },
    { error: 'static must be an object like { urls: ["http://proxy.example:3128"] }' },
  ),
  configShape: "{ name, static: { urls: [...] } }",
  capacity: (settings) => settings.urls.length,
  declare(resourceName, settings, proxy, pool) {
    const resource = new StaticProxy(
      resourceName,
      {
        url: settings.urls[proxy.index]!,
        readiness: settings.readiness ?? { mode: pool.readiness.mode === "port" ? "port" : "none" },
        egressRecheck: pool.egressRecheck,
        ...(settings.timeouts === undefined ? {} : { timeouts: settings.timeouts }),
        // The proxy's own credentials go with the check (StaticProxy's default), not squid's.
        ...(pool.egressCheck === undefined
          ? {}
          : {
              egressCheck: pulumi
                .output(pool.egressCheck)
                .apply(({ url, field }) => ({ url, ...(field === undefined ? {} : { field }) })),
            }),
      },
      { parent: pool.parent },
    );
    const ip = resource.ip.apply((value) => value ?? null);
    return {
      resource,
      vmName: pulumi.output(resourceName),
      host: resource.host,
      ip,
      egressIp: resource.egressIp,
      checkedAt: resource.checkedAt,
      egressProblem: resource.egressProblem,
      createdAt: pulumi.output(null),
      rotateEgress: pulumi.output(undefined),
      state: resource.state,
      endpoint: resource.endpoint,
      // Secret whether or not this URL has credentials: which one does is not known before apply.
      endpointWithCredentials: pulumi.secret(resource.url),
      // Only an address the Service can route to on the pool's port joins the EndpointSlice.
      serviceAddress: pulumi
        .all([resource.url, ip])
        .apply(([url, address]) =>
          address !== null && IPV4.test(address) && proxyAddressOf(url).port === pool.port
            ? address
            : null,
        ),
      ipv6: NO_IPV6(),
    };
  },
};

/**
 * Every kind of backend the pool knows, by the key that holds its settings.
 * The order is the order messages list them in.
 */
export const POOL_BACKENDS = {
  kvm,
  proxmox,
  static: staticBackend,
} as const;

export type BackendKey = keyof typeof POOL_BACKENDS;
type SettingsOf<K extends BackendKey> =
  (typeof POOL_BACKENDS)[K] extends PoolBackendKind<infer S> ? S : never;

export const BACKEND_KEYS = Object.keys(POOL_BACKENDS) as BackendKey[];

/** Placement fields every backend has, whatever its kind. */
export interface BackendPlacement {
  /** Unique in the pool, a short DNS label; part of each proxy's resource name, so keep it stable. */
  name: string;
  /** Share of the pool's `count` (default 1). */
  weight?: number;
  /** A fixed number of proxies here instead of a weighted share. */
  count?: number;
  /** A VM backend only: the routed IPv6 prefix its proxies spread (components/prefix-wiring.ts). */
  ipv6Prefix?: Ipv6PrefixArgs;
}

/** One backend of a pool: placement plus exactly one kind's settings under its key. */
export type BackendOf<K extends BackendKey> = BackendPlacement & { [P in K]: SettingsOf<P> };
export type KvmBackend = BackendOf<"kvm">;
export type ProxmoxBackend = BackendOf<"proxmox">;
export type AnyPoolBackend = { [K in BackendKey]: BackendOf<K> }[BackendKey];

/** The kind keys present on a backend (exactly one in a valid one). */
export function backendKeysOf(backend: object): BackendKey[] {
  return BACKEND_KEYS.filter((key) => key in backend);
}

/** A valid backend's kind and settings. */
export function kindOf(backend: AnyPoolBackend): {
  key: BackendKey;
  kind: PoolBackendKind<unknown>;
  settings: unknown;
} {
  const key = backendKeysOf(backend)[0]!;
  return {
    key,
    kind: POOL_BACKENDS[key] as PoolBackendKind<unknown>,
    settings: (backend as unknown as Record<string, unknown>)[key],
  };
}

/** "kvm, proxmox or static": for messages. */
export function backendKeyList(conjunction = "or"): string {
  return BACKEND_KEYS.length === 1
    ? BACKEND_KEYS[0]!
    : `${BACKEND_KEYS.slice(0, -1).join(", ")} ${conjunction} ${BACKEND_KEYS.at(-1)}`;
}

/**
 * The pool-wide settings of every kind (keys of EgressProxyPoolArgs and of the
 * stack config's `pool` object): one interface per kind, joined here.
 */
export type BackendPoolSettings = KvmPoolSettings;

/** The stack-config secrets of every kind (keys of RawStackConfig), joined here. */
export type BackendStackSecrets = KvmStackSecrets;

/** Each kind's pool-wide settings by name, for the stack config's schema (kinds without any add none). */
export const BACKEND_POOL_SETTINGS = { ...kvmPoolSettings };

/** Every kind's stack-config secrets, with the key of the kind that owns each. */
export const BACKEND_STACK_SECRETS: ReadonlyArray<{
  key: BackendKey;
  secret: StackSecret<unknown>;
}> = BACKEND_KEYS.flatMap((key) =>
  ((POOL_BACKENDS[key] as PoolBackendKind<unknown>).stackSecrets ?? []).map((secret) => ({
    key,
    secret,
  })),
);
