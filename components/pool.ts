/**
 * EgressProxyPool: N egress proxies spread over KVM hosts and Proxmox nodes,
 * each booted with squid's cloud-init, plus the endpoints stacks consume.
 * Compute first, declare after (pulumi-eks): the placement and the squid
 * document are pure functions; this class validates, then declares children.
 */
import * as pulumi from "@pulumi/pulumi";
import { egressCheckSchema } from "../provider/common/egress";
import { KvmProxy, type KvmProxyArgs } from "../provider/kvm/resource";
import { ProxmoxProxy, type ProxmoxProxyArgs } from "../provider/proxmox/resource";
import {
  assertKubernetesAvailable,
  publishToKubernetes,
  type KubernetesObjects,
  type KubernetesPublishingArgs,
} from "./kubernetes";
import { groupByEgress, sharedEgressMessage, type EgressGroup } from "./egress-diversity";
import { placeProxies, placementProblems, type PlacedProxy } from "./placement";
import type { EndpointCheck } from "./published-checks";
import {
  DEFAULT_ALLOWED_CLIENT_CIDRS,
  DEFAULT_SQUID_PORT,
  poolUserData,
  squidCloudConfig,
  squidSettingsProblems,
  type SquidSettings,
} from "./squid-cloud-init";

/** Frozen: renaming the type would replace every pool (and so every VM) in existing stacks. */
/** FROZEN: the component's type token is in every child's URN; a rename replaces the whole pool. */
export const EGRESS_PROXY_POOL_TYPE = "egress-proxies:index:EgressProxyPool";

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
] as const;
export const POOL_DECIDED_PROXMOX_INPUTS = [
  "vmName",
  "userData",
  "readiness",
  "egressCheck",
] as const;
type PoolDecidedKvmInputs = (typeof POOL_DECIDED_KVM_INPUTS)[number];
type PoolDecidedProxmoxInputs = (typeof POOL_DECIDED_PROXMOX_INPUTS)[number];

export type KvmBackendSettings = Omit<KvmProxyArgs, PoolDecidedKvmInputs | "image"> & {
  /** Default: the pool's `kvmImage`, else Debian 12 genericcloud. */
  image?: KvmProxyArgs["image"];
};
export type ProxmoxBackendSettings = Omit<ProxmoxProxyArgs, PoolDecidedProxmoxInputs>;

interface BackendPlacement {
  /** Unique in the pool, a short DNS label; part of each proxy's resource name, so keep it stable. */
  name: string;
  /** Share of the pool's `count` (default 1). */
  weight?: number;
  /** A fixed number of proxies here instead of a weighted share. */
  count?: number;
}
export interface KvmBackend extends BackendPlacement {
  kvm: KvmBackendSettings;
}
export interface ProxmoxBackend extends BackendPlacement {
  proxmox: ProxmoxBackendSettings;
}
export type PoolBackend = KvmBackend | ProxmoxBackend;

export interface SquidArgs {
  /** Default 3128. */
  port?: number;
  /** Who may use the proxies. Default: the private ranges 10/8, 172.16/12, 192.168/16. */
  allowedClientCidrs?: string[];
  /** Require a user and password; the password is kept secret and only its hash reaches the VM. */
  basicAuth?: { user: string; password: pulumi.Input<string> };
  /** squid.conf lines placed before the access rules, e.g. `acl blocked dstdomain .example.com`. */
  extraConfigLines?: string[];
}

export interface EgressProxyPoolArgs {
  backends: PoolBackend[];
  /** Total number of proxies, split by weight over backends without their own count. */
  count?: number;
  /** Machine size for every proxy unless a backend sets its own. */
  machine?: { cpus?: number; memoryMiB?: number; diskGiB?: number };
  /** Default image for KVM backends. */
  kvmImage?: KvmProxyArgs["image"];
  squid?: SquidArgs;
  /**
   * More cloud-init, any format cloud-init accepts. It is not merged into the
   * squid document: it boots as its own MIME part, byte for byte, before ours.
   * Stored as a secret.
   */
  extraCloudInit?: pulumi.Input<string>;
  /** Proxmox tags for every proxy (KVM has no tags; its VMs carry the ownership mark). */
  tags?: string[];
  /** When a proxy counts as created. Default: its squid port accepts connections. */
  readiness?: { mode?: "port" | "address" | "none" };
  /**
   * Verify each proxy's public address at create: `url` answers with the
   * caller's address (plain text or JSON `field`) and is fetched through the
   * proxy, with the pool's basic auth. Each proxy then reports `egressIp`, and
   * the pool groups them in `egress`. See docs/egress.md.
   */
  egressCheck?: { url: string; field?: string };
  /** With egressCheck: several proxies sharing one egress address is an error (before publishing), not a warning. */
  requireDistinctEgress?: boolean;
  /** Publish the endpoints to Kubernetes (Secret + selector-less Service + EndpointSlice). */
  kubernetes?: KubernetesPublishingArgs;
}

export interface ProxyDetails {
  /** The proxy's key in the pool: `<backend>-<index>`. */
  name: string;
  backend: string;
  kind: "kvm" | "proxmox";
  vmName: string;
  host: string;
  ip: string | null;
  /** The resource's provider id. */
  id: string;
  /** http://ip:port, or null while the address is unknown. */
  endpoint: string | null;
  /** The address targets see through this proxy (egress check at create); null without a check. */
  egressIp: string | null;
  /** When readiness (and the egress check) passed at create, ISO 8601; null if nothing was checked. */
  checkedAt: string | null;
  /** true when readiness checked that the proxy answers; null when it did not (readiness "address"/"none"). */
  ready: boolean | null;
}

export class PoolArgsError extends Error {}

/** Every problem with the pool's arguments at once, each naming the field and the fix. */
export function poolArgsProblems(args: EgressProxyPoolArgs): string[] {
  const problems = placementProblems(args.backends ?? [], args.count);
  (args.backends ?? []).forEach((backend, index) => {
    const kinds = ["kvm", "proxmox"].filter((kind) => kind in backend);
    if (kinds.length !== 1)
      problems.push(
        `backends[${index}] must have exactly one of kvm or proxmox (found ${kinds.length === 0 ? "neither" : "both"})`,
      );
  });
  problems.push(...egressArgsProblems(args));
  // The password may be unknown until apply; it is checked again once known.
  problems.push(...squidSettingsProblems(squidSettings(args.squid, "placeholder")));
  return problems;
}

function egressArgsProblems(args: EgressProxyPoolArgs): string[] {
  if (args.egressCheck === undefined)
    return args.requireDistinctEgress === true
      ? [
          "requireDistinctEgress needs egressCheck: set egressCheck.url to a service that answers with the caller's address",
        ]
      : [];
  const parsed = egressCheckSchema.safeParse(args.egressCheck);
  return parsed.success ? [] : parsed.error.issues.map((issue) => issue.message);
}

function squidSettings(squid: SquidArgs | undefined, password: string): SquidSettings {
  return {
    port: squid?.port ?? DEFAULT_SQUID_PORT,
    allowedClientCidrs: squid?.allowedClientCidrs ?? DEFAULT_ALLOWED_CLIENT_CIDRS,
    basicAuth:
      squid?.basicAuth === undefined ? undefined : { user: squid.basicAuth.user, password },
    extraConfigLines: squid?.extraConfigLines ?? [],
  };
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

const isKvmBackend = (backend: PoolBackend): backend is KvmBackend => "kvm" in backend;

export class EgressProxyPool extends pulumi.ComponentResource {
  /** Proxy URLs without credentials (plain in state). */
  readonly endpoints: pulumi.Output<string[]>;
  /** Proxy URLs a client can use as they are: with `user:password@` under basic auth. Secret. */
  readonly endpointsWithCredentials: pulumi.Output<string[]>;
  readonly proxies: pulumi.Output<ProxyDetails[]>;
  readonly count: pulumi.Output<number>;
  /** Each egress address with the proxies behind it, most shared first; empty without egressCheck. */
  readonly egress: pulumi.Output<EgressGroup[]>;
  /** The squid port every proxy listens on. */
  readonly port: number;
  /** The child resources by key (`<backend>-<index>`). */
  readonly children: ReadonlyMap<string, KvmProxy | ProxmoxProxy>;
  readonly kubernetes?: KubernetesObjects;

  constructor(name: string, args: EgressProxyPoolArgs, opts: pulumi.ComponentResourceOptions = {}) {
    super(EGRESS_PROXY_POOL_TYPE, name, {}, opts);
    const problems = poolArgsProblems(args);
    if (problems.length > 0)
      throw new PoolArgsError(`EgressProxyPool ${name}: ${problems.join("; ")}`);
    if (args.kubernetes !== undefined) assertKubernetesAvailable(`EgressProxyPool ${name}`);

    const placed = placeProxies(args.backends, args.count);
    const port = args.squid?.port ?? DEFAULT_SQUID_PORT;
    const basicAuth = args.squid?.basicAuth;
    const password = basicAuth === undefined ? undefined : pulumi.secret(basicAuth.password);
    const userData = this.userData(args, password);
    const backendsByName = new Map(args.backends.map((backend) => [backend.name, backend]));

    const children = new Map<string, KvmProxy | ProxmoxProxy>();
    const details: pulumi.Output<ProxyDetails>[] = [];
    for (const proxy of placed) {
      const backend = backendsByName.get(proxy.backend)!;
      const child = this.declareProxy(name, proxy, backend, args, userData, port);
      children.set(proxy.key, child);
      const checked = args.egressCheck !== undefined || (args.readiness?.mode ?? "port") === "port";
      details.push(
        pulumi
          .all([child.vmName, child.host, child.ip, child.id, child.egressIp, child.checkedAt])
          .apply(([vmName, host, ip, id, egressIp, checkedAt]) => ({
            name: proxy.key,
            backend: proxy.backend,
            kind: isKvmBackend(backend) ? ("kvm" as const) : ("proxmox" as const),
            vmName,
            host,
            ip: ip ?? null,
            id,
            endpoint: ip ? proxyUrl(ip, port) : null,
            // Absent in state written before the egress check existed.
            egressIp: egressIp ?? null,
            checkedAt: checkedAt ?? null,
            ready: checkedAt && checked ? true : null,
          })),
      );
    }

    this.port = port;
    this.children = children;
    this.proxies = pulumi.all(details);
    this.count = pulumi.output(placed.length);
    this.egress = this.proxies.apply((all) => this.egressGroups(name, args, all));
    // Everything published waits for the diversity verdict: requireDistinctEgress fails it first.
    const addresses = pulumi
      .all([this.proxies, this.egress])
      .apply(([all]) => all.flatMap((proxy) => (proxy.ip === null ? [] : [proxy.ip])));
    this.endpoints = addresses.apply((ips) => ips.map((ip) => proxyUrl(ip, port)));
    this.endpointsWithCredentials =
      basicAuth === undefined || password === undefined
        ? this.endpoints
        : pulumi
            .secret(pulumi.all([addresses, password]))
            .apply(([ips, secretPassword]) =>
              ips.map((ip) =>
                proxyUrl(ip, port, { user: basicAuth.user, password: secretPassword }),
              ),
            );

    if (args.kubernetes !== undefined)
      this.kubernetes = publishToKubernetes(
        name,
        args.kubernetes,
        {
          addresses: addresses.apply((ips) => ips.filter((ip) => !ip.includes(":"))),
          // With requireDistinctEgress even the Service waits for the verdict; else preview shows the port.
          port: args.requireDistinctEgress === true ? this.egress.apply(() => port) : port,
          urls: this.endpointsWithCredentials,
          checks: pulumi.all([this.proxies, this.egress]).apply(([all]) => endpointChecks(all)),
        },
        this,
      );

    this.registerOutputs({
      endpoints: this.endpoints,
      endpointsWithCredentials: this.endpointsWithCredentials,
      proxies: this.proxies,
      count: this.count,
      egress: this.egress,
    });
  }

  /** Groups by egress address; shared addresses warn in `pulumi up`, or fail with requireDistinctEgress. */
  private egressGroups(
    name: string,
    args: EgressProxyPoolArgs,
    proxies: ProxyDetails[],
  ): EgressGroup[] {
    const groups = groupByEgress(proxies);
    const message = sharedEgressMessage(name, groups);
    if (message === undefined) return groups;
    if (args.requireDistinctEgress === true)
      throw new PoolArgsError(
        `${message}. requireDistinctEgress is true, so nothing is published: place the proxies on different networks or drop requireDistinctEgress`,
      );
    void pulumi.log.warn(message, this);
    return groups;
  }

  /** One document for the whole pool; secret because it may carry the password hash and the user's extra cloud-init. */
  private userData(
    args: EgressProxyPoolArgs,
    password: pulumi.Output<string> | undefined,
  ): pulumi.Output<string> {
    return pulumi
      .secret(pulumi.all([password, args.extraCloudInit]))
      .apply(([knownPassword, extra]) => {
        const settings = squidSettings(args.squid, knownPassword ?? "");
        const problems = squidSettingsProblems(settings);
        if (problems.length > 0) throw new PoolArgsError(problems.join("; "));
        return poolUserData(squidCloudConfig(settings), extra);
      });
  }

  private declareProxy(
    poolName: string,
    proxy: PlacedProxy,
    backend: PoolBackend,
    args: EgressProxyPoolArgs,
    userData: pulumi.Output<string>,
    port: number,
  ): KvmProxy | ProxmoxProxy {
    const resourceName = `${poolName}-${proxy.key}`;
    const readiness = { mode: args.readiness?.mode ?? "port", port };
    const egressCheck = this.egressCheck(args);
    const options = { parent: this };
    if (isKvmBackend(backend))
      return new KvmProxy(
        resourceName,
        {
          ...backend.kvm,
          vcpus: backend.kvm.vcpus ?? args.machine?.cpus,
          memoryMiB: backend.kvm.memoryMiB ?? args.machine?.memoryMiB,
          diskGiB: backend.kvm.diskGiB ?? args.machine?.diskGiB,
          image: backend.kvm.image ?? args.kvmImage ?? DEFAULT_KVM_IMAGE,
          userData,
          readiness,
          egressCheck,
        },
        options,
      );
    return new ProxmoxProxy(
      resourceName,
      {
        ...backend.proxmox,
        cores: backend.proxmox.cores ?? args.machine?.cpus,
        memoryMiB: backend.proxmox.memoryMiB ?? args.machine?.memoryMiB,
        diskGiB: backend.proxmox.diskGiB ?? args.machine?.diskGiB,
        tags: mergeTags(args.tags, backend.proxmox.tags),
        userData,
        readiness,
        egressCheck,
      },
      options,
    );
  }

  /** The pool's egress check, with squid's basic auth so the request is let through. */
  private egressCheck(args: EgressProxyPoolArgs): KvmProxyArgs["egressCheck"] {
    if (args.egressCheck === undefined) return undefined;
    const basicAuth = args.squid?.basicAuth;
    return {
      url: args.egressCheck.url,
      field: args.egressCheck.field,
      proxyAuth:
        basicAuth === undefined
          ? undefined
          : { user: basicAuth.user, password: pulumi.secret(basicAuth.password) },
    };
  }
}

function mergeTags(
  poolTags: string[] | undefined,
  backendTags: ProxmoxBackendSettings["tags"],
): ProxmoxBackendSettings["tags"] {
  if (poolTags === undefined) return backendTags;
  if (backendTags === undefined) return poolTags;
  return pulumi.output(backendTags).apply((tags) => [...new Set([...poolTags, ...tags])]);
}

/** What the Kubernetes publishing says about each proxy with an address. */
function endpointChecks(proxies: readonly ProxyDetails[]): EndpointCheck[] {
  return proxies.flatMap((proxy) =>
    proxy.ip === null
      ? []
      : [
          {
            address: proxy.ip,
            ready: proxy.ready,
            egressIp: proxy.egressIp,
            checkedAt: proxy.checkedAt,
          },
        ],
  );
}
