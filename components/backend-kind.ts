/**
 * What a kind of backend is to the pool: the seam between EgressProxyPool
 * (and the stack config) and the backends. Everything here is said without
 * naming a backend; each kind's entry (components/backends.ts) fills it in,
 * and its pool-wide settings and stack-config secrets travel with the entry.
 */
import * as pulumi from "@pulumi/pulumi";
import { z } from "zod";
import type { EgressCheckArgs, GuestFilesValue } from "../provider/common/resource-props";
import type { PlacedProxy } from "./placement";
import { addressEntries } from "./rotate-entries";

/** What the pool decides for every proxy, handed to each backend's `declare`. */
export interface PoolDecisions<PoolSettings = unknown> {
  machine?: { cpus?: number; memoryMiB?: number; diskGiB?: number };
  /**
   * The pool's arguments as the kinds' pool-wide settings (`poolSettings`):
   * each kind reads its own, e.g. the default image of VM backends.
   */
  poolSettings: PoolSettings;
  tags?: string[];
  /** squid's cloud-init (secret). */
  userData: pulumi.Output<string>;
  /** What of it a running VM member gets in place when it changes (secret; common/guest-files.ts). */
  guestFiles: pulumi.Output<GuestFilesValue>;
  readiness: { mode: "port" | "address" | "none"; port: number; authRequired?: boolean };
  egressCheck: EgressCheckArgs | undefined;
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
  /** Every VM member's `disruptionBudget`: the pool's name, its `maxUnavailable` resolved, and its drain. */
  disruptionBudget?: {
    group: string;
    maxUnavailable: number;
    drainSeconds?: number;
    onCollision?: "rotate";
  };
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
  egressProblem: pulumi.Output<
    { reason: string; kind: "unanswered" | "egress" | "path-unknown" } | null | undefined
  >;
  /** When the VM was created (its mark); null for a proxy without a VM. */
  createdAt: pulumi.Output<string | null | undefined>;
  /** The exit-address entries the VM was made or last updated with (a VM member's state); undefined otherwise. */
  rotateEgress: pulumi.Output<Record<string, string> | null | undefined>;
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
export const NO_IPV6: () => MemberIpv6 = () => ({
  address: pulumi.output(undefined),
  egressIp: pulumi.output(undefined),
  endpoint: pulumi.output(null),
  endpointWithCredentials: pulumi.output(null),
  serviceAddress: pulumi.output(null),
});

/**
 * A pool-wide setting a kind owns. Its name is public (a key of
 * EgressProxyPoolArgs and of the stack config's `pool` object), so frozen.
 */
export interface PoolSetting {
  /** The stack-config schema of its value. */
  schema: z.ZodType;
  /**
   * The field the schema's messages name, when the schema is a resource
   * input's own ("image." for KvmProxy's image): messages are reported
   * under the setting's key instead.
   */
  messagesName?: string;
}

/** A secret stack-config key (`egress-proxies:<name>`) a kind owns; its name is public, so frozen. */
export interface StackSecret<Settings> {
  name: string;
  /** What is wrong with the text, led by `key` (never quoting the text); undefined when it is fine. */
  problem(text: string, key: string): string | undefined;
  /** The backend's settings with the secret folded in, unless they carry their own. */
  fold(settings: Settings, value: pulumi.Input<string>): Settings;
}

export interface PoolBackendKind<Settings, PoolSettings = unknown> {
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
  /**
   * Pool-wide settings only this kind reads: keys of the pool's arguments and
   * of the stack config's `pool` object, each with its stack-config schema.
   */
  poolSettings?: Record<string, PoolSetting>;
  /** Secret stack-config keys (`egress-proxies:<name>`) that fill in this kind's settings. */
  stackSecrets?: readonly StackSecret<Settings>[];
  /** Declares the proxy's resource (the pool's child) and says what the pool publishes of it. */
  declare(
    resourceName: string,
    settings: Settings,
    proxy: PlacedProxy,
    pool: PoolDecisions<PoolSettings>,
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

export const IPV4 = /^\d{1,3}(\.\d{1,3}){3}$/;

/** The outputs every VM proxy resource has, whatever its backend. */
export type VmProxyResource = Pick<
  PoolMember,
  "vmName" | "host" | "egressIp" | "checkedAt" | "egressProblem" | "createdAt" | "state"
> & {
  /** Present when the program gave the input (the pool always does with onCollision "rotate"). */
  rotateEgress?: PoolMember["rotateEgress"];
  ip: pulumi.Output<string | null>;
  ipv6Address: pulumi.Output<string | null | undefined>;
  egressIpv6: pulumi.Output<string | null | undefined>;
};

/** The member of a VM backend: squid on the pool's port at the VM's address. */
export function vmMember(
  resource: VmProxyResource,
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
    rotateEgress: resource.rotateEgress ?? pulumi.output(undefined),
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

function vmMemberIpv6(resource: VmProxyResource, pool: PoolDecisions): MemberIpv6 {
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

/**
 * A VM member's rotation input only when the pool's `rotate` names it, the
 * exit-address entries of `rotate` (every VM member gets them all), and
 * rotateAfterDays only when the pool sets it (unset otherwise: no diff), and
 * the pool's disruption budget.
 */
export const lifecycleOf = (
  pool: PoolDecisions,
  key: string,
): {
  rotation?: string;
  rotateEgress?: Record<string, string>;
  egressRecheck: boolean;
  rotateAfterDays?: number;
  disruptionBudget?: PoolDecisions["disruptionBudget"];
} => {
  // With onCollision "rotate" the map is always given, so its output shows what a member was made with.
  const rotateEgress =
    addressEntries(pool.rotate) ??
    (pool.disruptionBudget?.onCollision === "rotate" ? {} : undefined);
  return {
    egressRecheck: pool.egressRecheck,
    ...(pool.rotate?.[key] === undefined ? {} : { rotation: pool.rotate[key] }),
    ...(rotateEgress === undefined ? {} : { rotateEgress }),
    ...(pool.rotateAfterDays === undefined ? {} : { rotateAfterDays: pool.rotateAfterDays }),
    ...(pool.disruptionBudget === undefined ? {} : { disruptionBudget: pool.disruptionBudget }),
  };
};
