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
import type { PlacedProxy } from "./placement";
import { memberIpFamilies } from "./dual-stack";

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
  "readiness",
  "egressCheck",
  "egressRecheck",
  "rotation",
  "rotateAfterDays",
] as const;
export const POOL_DECIDED_PROXMOX_INPUTS = [
  "vmName",
  "userData",
  "readiness",
  "egressCheck",
  "egressRecheck",
  "rotation",
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

/** What the pool decides for every proxy, handed to each backend's `declare`. */
export interface PoolDecisions {
  machine?: { cpus?: number; memoryMiB?: number; diskGiB?: number };
  kvmImage?: KvmProxyArgs["image"];
  tags?: string[];
  /** squid's cloud-init (secret). */
  userData: pulumi.Output<string>;
  readiness: { mode: "port" | "address" | "none"; port: number };
  egressCheck: KvmProxyArgs["egressCheck"];
  /** The squid port every VM proxy listens on. */
  port: number;
  /** squid's basic auth, for the URLs with credentials. */
  basicAuth?: { user: string; password: pulumi.Output<string> };
  /** The pool's ipFamilies, for VM members whose backend sets none. */
  ipFamilies?: ("ipv4" | "ipv6")[];
  /** The pool's `rotate`: member key → rotation text (a VM member is replaced when its text changes). */
  rotate?: Record<string, string>;
  /** Re-check every member's egress on refresh (the members' `egressRecheck`). */
  egressRecheck: boolean;
  /** The members' `rotateAfterDays`, when the pool rotates by age. */
  rotateAfterDays?: number;
  parent: pulumi.Resource;
}

/** What the pool needs from each proxy, whatever its backend. */
export interface PoolMember {
  resource: pulumi.CustomResource;
  /** The VM's name; for a proxy without a VM, the name it is known by. */
  vmName: pulumi.Output<string>;
  host: pulumi.Output<string>;
  ip: pulumi.Output<string | null>;
  egressIp: pulumi.Output<string | null | undefined>;
  checkedAt: pulumi.Output<string | null | undefined>;
  /** What the last egress re-check found wrong; null or undefined when it passed or none ran. */
  egressProblem: pulumi.Output<{ reason: string } | null | undefined>;
  /** When the VM was created (its mark); null for a proxy without a VM. */
  createdAt: pulumi.Output<string | null | undefined>;
  /** The resource's `state` output as the last create or refresh found it ("running", "stopped", …). */
  state: pulumi.Output<string | undefined>;
  /** The proxy URL without credentials, null while the address is unknown. */
  endpoint: pulumi.Output<string | null>;
  /** The URL a client can use as it is (with credentials when it needs them); secret when it has some. */
  endpointWithCredentials: pulumi.Output<string | null>;
  /** An IPv4 address serving on the pool's port, for the Kubernetes Service; null when there is none. */
  serviceAddress: pulumi.Output<string | null>;
  /**
   * A VM member that takes IPv6: its IPv6 address (undefined for an IPv4-only
   * member, whose details then stay as they were), its URLs when that address
   * is a second one (null for an IPv6-only member, whose `endpoint` it is),
   * and its exit address over IPv6.
   */
  ipv6: MemberIpv6;
}

export interface MemberIpv6 {
  address: pulumi.Output<string | null | undefined>;
  egressIp: pulumi.Output<string | null | undefined>;
  endpoint: pulumi.Output<string | null>;
  endpointWithCredentials: pulumi.Output<string | null>;
  /** The IPv6 address for the Kubernetes Service's IPv6 EndpointSlice; null when there is none. */
  serviceAddress: pulumi.Output<string | null>;
}

/** A member without IPv6 (a static proxy: its URL is what it is). */
const NO_IPV6: () => MemberIpv6 = () => ({
  address: pulumi.output(undefined),
  egressIp: pulumi.output(undefined),
  endpoint: pulumi.output(null),
  endpointWithCredentials: pulumi.output(null),
  serviceAddress: pulumi.output(null),
});

export interface PoolBackendKind<Settings> {
  /** The key that holds this kind's settings in a pool backend and in stack config. */
  key: string;
  /** How a message names such a backend: "a KVM host". */
  describes: string;
  /** What `proxies[].kind` says. */
  kind: string;
  /** Inputs the pool decides (stack config refuses them on a backend, saying where they are set). */
  decided: readonly string[];
  /** The stack-config schema of the settings: the resource's own inputs, minus what the pool decides. */
  configSchema: z.ZodObject;
  /** The stack config's message when the settings are not an object. */
  configShape: string;
  /** The most proxies a backend of this kind can hold (a static one: its URLs); undefined: no limit. */
  capacity(settings: Settings): number | undefined;
  /** Shared stack-config secrets folded into a backend's settings. */
  withStackSecrets?(
    settings: Settings,
    secrets: { kvmPrivateKey?: pulumi.Input<string> },
  ): Settings;
  /** Declares the proxy's resource (the pool's child) and says what the pool publishes of it. */
  declare(
    resourceName: string,
    settings: Settings,
    proxy: PlacedProxy,
    pool: PoolDecisions,
  ): PoolMember;
}

/** `http://[user:password@]ip:port`, IPv6 in brackets, credentials percent-encoded. */
export function proxyUrl(
  ip: string,
  port: number,
  credentials?: { user: string; password: string },
): string {
  const host = ip.includes(":") ? `[${ip}]` : ip;
  const userinfo =
    credentials === undefined
      ? ""
      : `${encodeURIComponent(credentials.user)}:${encodeURIComponent(credentials.password)}@`;
  return `http://${userinfo}${host}:${port}`;
}

const IPV4 = /^\d{1,3}(\.\d{1,3}){3}$/;

/** The member of a VM backend: squid on the pool's port at the VM's address. */
function vmMember(
  resource: KvmProxy | ProxmoxProxy,
  pool: PoolDecisions,
): Omit<PoolMember, "resource"> {
  const { port, basicAuth } = pool;
  const endpoint = resource.ip.apply((ip) => (ip ? proxyUrl(ip, port) : null));
  return {
    vmName: resource.vmName,
    host: resource.host,
    ip: resource.ip,
    egressIp: resource.egressIp,
    checkedAt: resource.checkedAt,
    egressProblem: resource.egressProblem,
    createdAt: resource.createdAt,
    state: resource.state,
    endpoint,
    endpointWithCredentials:
      basicAuth === undefined
        ? endpoint
        : pulumi
            .secret(pulumi.all([resource.ip, basicAuth.password]))
            .apply(([ip, password]) =>
              ip ? proxyUrl(ip, port, { user: basicAuth.user, password }) : null,
            ),
    serviceAddress: resource.ip.apply((ip) => (ip && IPV4.test(ip) ? ip : null)),
    ipv6: vmMemberIpv6(resource, pool),
  };
}

function vmMemberIpv6(resource: KvmProxy | ProxmoxProxy, pool: PoolDecisions): MemberIpv6 {
  const { port, basicAuth } = pool;
  // A second address only: an IPv6-only member's IPv6 URL is its `endpoint` already.
  const second = pulumi
    .all([resource.ip, resource.ipv6Address])
    .apply(([ip, ipv6]) => (ipv6 && ipv6 !== ip ? ipv6 : null));
  const endpoint = second.apply((ipv6) => (ipv6 ? proxyUrl(ipv6, port) : null));
  return {
    address: resource.ipv6Address,
    egressIp: resource.egressIpv6,
    endpoint,
    endpointWithCredentials:
      basicAuth === undefined
        ? endpoint
        : pulumi
            .secret(pulumi.all([second, basicAuth.password]))
            .apply(([ipv6, password]) =>
              ipv6 ? proxyUrl(ipv6, port, { user: basicAuth.user, password }) : null,
            ),
    serviceAddress: resource.ipv6Address.apply((ipv6) => ipv6 ?? null),
  };
}

/** Set by the resource itself, never by its user. */
const RESOURCE_SET_INPUTS = ["owner", "vmNameChosenBy"];

/** A resource's input schema minus what the pool or the resource decides: what a backend may set. */
export function backendSettingsSchema(
  inputs: z.ZodObject,
  decided: readonly string[],
  error: string,
): z.ZodObject {
  const excluded = new Set([...decided, ...RESOURCE_SET_INPUTS]);
  const shape = Object.fromEntries(
    Object.entries(inputs.shape).filter(([key]) => !excluded.has(key)),
  ) as z.ZodRawShape;
  return z.strictObject(shape, { error });
}

const kvm: PoolBackendKind<KvmBackendSettings> = {
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
  withStackSecrets(settings, { kvmPrivateKey }) {
    const connection = settings.connection as Record<string, unknown> | undefined;
    if (connection === undefined || connection.privateKey !== undefined || !kvmPrivateKey)
      return settings;
    return { ...settings, connection: { ...connection, privateKey: kvmPrivateKey } as never };
  },
  declare(resourceName, settings, proxy, pool) {
    const resource = new KvmProxy(
      resourceName,
      {
        ...settings,
        vcpus: settings.vcpus ?? pool.machine?.cpus,
        memoryMiB: settings.memoryMiB ?? pool.machine?.memoryMiB,
        diskGiB: settings.diskGiB ?? pool.machine?.diskGiB,
        image: settings.image ?? pool.kvmImage ?? DEFAULT_KVM_IMAGE,
        ...memberIpFamilies(pool.ipFamilies, settings.ipFamilies),
        userData: pool.userData,
        readiness: pool.readiness,
        egressCheck: pool.egressCheck,
        ...lifecycleOf(pool, proxy.key),
      },
      { parent: pool.parent },
    );
    return { resource, ...vmMember(resource, pool) };
  },
};

/**
 * A VM member's rotation input only when the pool's `rotate` names it, and
 * rotateAfterDays only when the pool sets it (unset otherwise: no diff).
 */
const lifecycleOf = (
  pool: PoolDecisions,
  key: string,
): { rotation?: string; egressRecheck: boolean; rotateAfterDays?: number } => ({
  egressRecheck: pool.egressRecheck,
  ...(pool.rotate?.[key] === undefined ? {} : { rotation: pool.rotate[key] }),
  ...(pool.rotateAfterDays === undefined ? {} : { rotateAfterDays: pool.rotateAfterDays }),
});

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
}

/** One backend of a pool: placement plus exactly one kind's settings under its key. */
export type BackendOf<K extends BackendKey> = BackendPlacement & { [P in K]: SettingsOf<P> };
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

/** The SSH key schema stack config checks `kvmPrivateKey` with (KvmProxy's own). */
export const kvmPrivateKeySchema = connectionSchema.shape.privateKey;
