/**
 * EgressProxyPool: N egress proxies spread over KVM hosts and Proxmox nodes,
 * each booted with squid's cloud-init, plus the endpoints stacks consume.
 * Compute first, declare after (pulumi-eks): the placement and the squid
 * document are pure functions; this class validates, then declares children.
 */
import * as pulumi from "@pulumi/pulumi";
import { egressCheckSchema } from "../provider/common/egress";
import type { EgressCheckArgs } from "../provider/common/resource-props";
import type { PoolDecisions, PoolMember } from "./backend-kind";
import {
  backendKeyList,
  backendKeysOf,
  kindOf,
  type AnyPoolBackend,
  type BackendPoolSettings,
} from "./backends";
import {
  assertKubernetesAvailable,
  type KubernetesObjects,
  type KubernetesPublishingArgs,
} from "./kubernetes";
import { egressVerdict, type EgressGroup } from "./egress-diversity";
import { memberUrls, poolIpFamilyProblems } from "./dual-stack";
import {
  lifecycleArgsProblems,
  resolveDrainSeconds,
  resolveMaxUnavailable,
  type PoolLifecycleArgs,
} from "./lifecycle-args";
import { rotateEntryProblems, unusedEntries } from "./rotate-entries";
import { checkExporterArgsProblems } from "./kubernetes-exporter";
import {
  placeProxies,
  placementProblems,
  type PlacedProxy,
  type PlacementBackend,
} from "./placement";
import {
  bridgeOf,
  ipv6PrefixProblems,
  ipv6RouteLine,
  memberPrefixOf,
  type Ipv6PrefixArgs,
} from "./prefix-wiring";
import type { PrefixEgressSettings } from "../workloads/prefix-egress";
import { proxyDetailsOf, type ProxyDetails } from "./proxy-details";
import {
  DEFAULT_SQUID_PORT,
  poolUserData,
  squidCloudConfig,
  squidGuestFiles,
  squidSettingsProblems,
  squidUserDataIdentity,
} from "../workloads/squid-cloud-init";
import { squidSettings, type SquidArgs } from "./squid-args";
import { gatewayArgsProblems, type GatewayArgs, type PoolGateway } from "./gateway";
import { publishPool } from "./pool-publishing";

export { proxyUrl } from "./backend-kind";
export type { ProxyDetails } from "./proxy-details";
export type { SquidArgs } from "./squid-args";
export type { GatewayArgs, GatewayUserArgs, PoolGateway } from "./gateway";
// The registry's names, still exported from this module where earlier code imported them (the
// package has no exports map, so `egress-proxies/dist/components/pool` is a path users can require).
export {
  DEFAULT_KVM_IMAGE,
  POOL_DECIDED_KVM_INPUTS,
  POOL_DECIDED_PROXMOX_INPUTS,
  type KvmBackend,
  type KvmBackendSettings,
  type ProxmoxBackend,
  type ProxmoxBackendSettings,
} from "./backends";

/** FROZEN: the component's type token is in every child's URN; a rename replaces the whole pool. */
export const EGRESS_PROXY_POOL_TYPE = "egress-proxies:index:EgressProxyPool";

/** One backend of the pool: a name, its placement, and one kind's settings (components/backends.ts). */
export type PoolBackend = AnyPoolBackend;

/**
 * The pool's arguments: its own, and the pool-wide settings of each backend
 * kind (`BackendPoolSettings`, e.g. `kvmImage`), which the kinds' entries in
 * components/backends.ts declare and read.
 */
export interface EgressProxyPoolArgs extends BackendPoolSettings, PoolLifecycleArgs {
  backends: PoolBackend[];
  /** Total number of proxies, split by weight over backends without their own count. */
  count?: number;
  /** Machine size for every proxy unless a backend sets its own. */
  machine?: { cpus?: number; memoryMiB?: number; diskGiB?: number };
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
  egressCheck?: { url: string; field?: string; ipv6Url?: string; ipv6Samples?: number };
  /**
   * The address families of every VM proxy whose backend sets none: default
   * ["ipv4"]; ["ipv4", "ipv6"] is dual stack (SLAAC), ["ipv6"] IPv6 only. With
   * IPv6, squid.allowedClientCidrs must list an IPv6 range. docs/egress.md.
   */
  ipFamilies?: ("ipv4" | "ipv6")[];
  /**
   * Spread a routed IPv6 prefix over the proxies: each new outgoing connection
   * leaves from its own address of the member's prefix. A /64 serves one
   * proxy; a /56 or /48 is split, member `<backend>-<i>` taking the i-th /64.
   * On the pool it serves the one VM backend that sets none (a backend's own
   * `ipv6Prefix` wins). Needs "ipv6" in ipFamilies; route each member's
   * prefix to it (`ipv6Routes`). docs/many-exit-addresses.md.
   */
  ipv6Prefix?: Ipv6PrefixArgs;
  /** With egressCheck: several proxies sharing one egress address is an error (before publishing), not a warning. */
  requireDistinctEgress?: boolean;
  /**
   * Rotate members: their key (`<backend>-<index>`, as in `proxies[].name`)
   * to any text. A member whose text is new or changed is replaced at the
   * next `up`: the new VM is created and ready before the old one is deleted,
   * so the pool never publishes fewer endpoints than it has. Keep the entry
   * (the same text rotates nothing more); change the text to rotate again.
   * A date is a good text: `{ "kvm1-0": "2026-12-02" }`.
   *
   * A key may be an exit address instead (`{ "203.0.113.9": "burned-2026-12-04" }`):
   * the VM member that leaves from it, as its last egress check recorded, is
   * replaced, its old VM deleted first; a new VM that still leaves from it is
   * not rotated again until the text changes. docs/day2.md.
   */
  rotate?: Record<string, string>;
  /** Publish the endpoints to Kubernetes (Secret + selector-less Service + EndpointSlice). */
  kubernetes?: KubernetesPublishingArgs;
  /**
   * One endpoint in front of the members (squid): each request to the next
   * healthy member, `<user>-session-<id>` on one member, `<user>-host-<label>`
   * on a backend's members only. docs/gateway.md.
   */
  gateway?: GatewayArgs;
}

export class PoolArgsError extends Error {}

/** Every problem with the pool's arguments at once, each naming the field and the fix. */
export function poolArgsProblems(args: EgressProxyPoolArgs): string[] {
  const backends = args.backends ?? [];
  const kinds = backends.map((backend) => backendKeysOf(backend));
  const problems = placementProblems(
    backends.map((backend, index) => placementOf(backend, kinds[index]!)),
    args.count,
  );
  kinds.forEach((keys, index) => {
    if (keys.length !== 1)
      problems.push(
        `backends[${index}] must have exactly one of ${backendKeyList()} (found ${keys.length === 0 ? "none" : keys.join(" and ")})`,
      );
  });
  problems.push(...egressArgsProblems(args));
  problems.push(...poolIpFamilyProblems(args));
  problems.push(...ipv6PrefixProblems(args));
  problems.push(...lifecycleArgsProblems(args));
  problems.push(...checkExporterArgsProblems(args.kubernetes?.exporter));
  problems.push(
    ...gatewayArgsProblems(
      args.gateway,
      backends.map((backend) => backend.name),
      backends.filter((_, index) => kinds[index]![0] !== "static").map((backend) => backend.name),
    ),
  );
  if (problems.length === 0) problems.push(...rotateProblems(args));
  // The password may be unknown until apply; it is checked again once known.
  problems.push(...squidSettingsProblems(squidSettings(args.squid, "placeholder")));
  return problems;
}

/** The pool's members by key (`<backend>-<index>`), with their backend kind. */
function memberKinds(args: EgressProxyPoolArgs): Map<string, string> {
  const backends = new Map(args.backends.map((backend) => [backend.name, backend]));
  return new Map(
    placeProxies(
      args.backends.map((backend) => placementOf(backend, backendKeysOf(backend))),
      args.count,
    ).map((proxy) => [proxy.key, kindOf(backends.get(proxy.backend)!).key]),
  );
}

/** `rotate` as the pool checks it, against the members it has (components/rotate-entries.ts). */
function rotateProblems(args: EgressProxyPoolArgs): string[] {
  return args.rotate === undefined ? [] : rotateEntryProblems(args.rotate, memberKinds(args));
}

/** The `rotate` entries that name no member of the pool: ignored, and said so. */
export function unusedRotateEntries(args: EgressProxyPoolArgs): string[] {
  return args.rotate === undefined ? [] : unusedEntries(args.rotate, memberKinds(args));
}

/** A backend as placement sees it: its name, weight, count and the most proxies its kind can hold. */
function placementOf(backend: PoolBackend, keys: readonly string[]): PlacementBackend {
  const capacity =
    keys.length === 1 ? kindOf(backend).kind.capacity(kindOf(backend).settings) : undefined;
  return {
    name: backend.name,
    weight: backend.weight,
    count: backend.count,
    ...(capacity === undefined ? {} : { capacity }),
  };
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

export class EgressProxyPool extends pulumi.ComponentResource {
  /** Proxy URLs without credentials (plain in state). */
  readonly endpoints: pulumi.Output<string[]>;
  /** Proxy URLs a client can use as they are: with `user:password@` under basic auth. Secret. */
  readonly endpointsWithCredentials: pulumi.Output<string[]>;
  readonly proxies: pulumi.Output<ProxyDetails[]>;
  readonly count: pulumi.Output<number>;
  /** Each egress address with the proxies behind it, most shared first; empty without egressCheck. */
  readonly egress: pulumi.Output<EgressGroup[]>;
  /** With ipv6Prefix: the host route each member's prefix needs (`ip -6 route add …`), once its IPv6 address is known. */
  readonly ipv6Routes: pulumi.Output<string[]>;
  /** The squid port every proxy listens on. */
  readonly port: number;
  /** The child resources by key (`<backend>-<index>`). */
  readonly children: ReadonlyMap<string, pulumi.CustomResource>;
  readonly kubernetes?: KubernetesObjects;
  /** With `gateway`: its URL, users and objects. */
  readonly gateway?: PoolGateway;

  constructor(name: string, args: EgressProxyPoolArgs, opts: pulumi.ComponentResourceOptions = {}) {
    super(EGRESS_PROXY_POOL_TYPE, name, {}, opts);
    const problems = poolArgsProblems(args);
    if (problems.length > 0)
      throw new PoolArgsError(`EgressProxyPool ${name}: ${problems.join("; ")}`);
    if (args.kubernetes !== undefined || args.gateway?.kubernetes !== undefined)
      assertKubernetesAvailable(`EgressProxyPool ${name}`);
    for (const warning of unusedRotateEntries(args))
      void pulumi.log.warn(`EgressProxyPool ${name}: ${warning}`, this);

    const placed = placeProxies(
      args.backends.map((backend) => placementOf(backend, backendKeysOf(backend))),
      args.count,
    );
    const decisions = this.decisions(name, args, placed.length);
    const port = decisions.port;
    const backendsByName = new Map(args.backends.map((backend) => [backend.name, backend]));

    const children = new Map<string, pulumi.CustomResource>();
    const members: PoolMember[] = [];
    const details: pulumi.Output<ProxyDetails>[] = [];
    const routes: pulumi.Output<string | null>[] = [];
    for (const proxy of placed) {
      const backend = backendsByName.get(proxy.backend)!;
      const prefix = memberPrefixOf(backend, args.ipv6Prefix, proxy.index);
      // A weighted share can outgrow the prefix where no count said so up front.
      if (typeof prefix === "string")
        throw new PoolArgsError(`EgressProxyPool ${name}: backends ${proxy.backend}: ${prefix}`);
      const member = this.declareMember(name, args, proxy, decisions, prefix);
      children.set(proxy.key, member.resource);
      members.push(member);
      const { kind } = kindOf(backend);
      const detail = proxyDetailsOf(member, proxy, kind.kind, {
        checked: args.egressCheck !== undefined || (args.readiness?.mode ?? "port") === "port",
        rotateAfterDays: args.rotateAfterDays,
      });
      details.push(
        prefix === undefined ? detail : detail.apply((d) => ({ ...d, ipv6Prefix: prefix.prefix })),
      );
      if (prefix !== undefined)
        routes.push(
          member.ipv6.address.apply((via) =>
            via ? ipv6RouteLine(prefix.prefix, via, bridgeOf(backend)) : null,
          ),
        );
    }
    this.ipv6Routes = pulumi.all(routes).apply((lines) => lines.flatMap((line) => line ?? []));

    this.port = port;
    this.children = children;
    this.proxies = pulumi.all(details);
    this.count = pulumi.output(placed.length);
    this.egress = pulumi
      .all([this.proxies, pulumi.all(members.map((member) => member.rotateEgress))])
      .apply(([all, entries]) => this.egressGroups(name, args, all, entries));
    // Everything published waits for the diversity verdict: requireDistinctEgress fails it first.
    const verdict = pulumi.all([this.proxies, this.egress]);
    // A dual-stack member publishes its IPv6 URL right after its first one (memberUrls).
    this.endpoints = pulumi
      .all([
        verdict,
        pulumi.all(members.map((member) => pulumi.all([member.endpoint, member.ipv6.endpoint]))),
      ])
      .apply(([, urls]) => urls.flatMap(([primary, ipv6]) => memberUrls(primary, ipv6)));
    this.endpointsWithCredentials = pulumi
      .all([
        verdict,
        pulumi.all(
          members.map((member) =>
            pulumi.all([member.endpointWithCredentials, member.ipv6.endpointWithCredentials]),
          ),
        ),
      ])
      .apply(([, urls]) => urls.flatMap(([primary, ipv6]) => memberUrls(primary, ipv6)));
    const published = publishPool(
      name,
      args,
      {
        members,
        verdict,
        port,
        proxies: this.proxies,
        egress: this.egress,
        endpointsWithCredentials: this.endpointsWithCredentials,
        backends: args.backends,
        decisions,
      },
      this,
    );
    this.kubernetes = published.kubernetes;
    this.gateway = published.gateway;

    this.registerOutputs({
      endpoints: this.endpoints,
      endpointsWithCredentials: this.endpointsWithCredentials,
      proxies: this.proxies,
      count: this.count,
      egress: this.egress,
      ipv6Routes: this.ipv6Routes,
      ...(this.gateway === undefined ? {} : { gatewayUrl: this.gateway.url }),
    });
  }

  /**
   * Declares one member. A member that spreads a prefix gets its own squid
   * document (the same pool document plus its prefix: still deterministic)
   * and an egress check that samples the prefix; the others share the pool's.
   */
  private declareMember(
    name: string,
    args: EgressProxyPoolArgs,
    proxy: PlacedProxy,
    decisions: PoolDecisions<EgressProxyPoolArgs>,
    prefix: PrefixEgressSettings | undefined,
  ): PoolMember {
    const backend = args.backends.find((candidate) => candidate.name === proxy.backend)!;
    const { kind, settings } = kindOf(backend);
    const own =
      prefix === undefined
        ? decisions
        : {
            ...decisions,
            ...this.guestSoftware(args, decisions.basicAuth?.password, prefix),
            egressCheck: this.egressCheck(args, prefix),
          };
    return kind.declare(`${name}-${proxy.key}`, settings, proxy, own);
  }

  /** What the pool decides for every proxy (components/backend-kind.ts, PoolDecisions). */
  private decisions(
    name: string,
    args: EgressProxyPoolArgs,
    members: number,
  ): PoolDecisions<EgressProxyPoolArgs> {
    const port = args.squid?.port ?? DEFAULT_SQUID_PORT;
    const basicAuth = args.squid?.basicAuth;
    const password = basicAuth === undefined ? undefined : pulumi.secret(basicAuth.password);
    return {
      machine: args.machine,
      poolSettings: args,
      tags: args.tags,
      ...this.guestSoftware(args, password),
      readiness: { mode: args.readiness?.mode ?? "port", port },
      egressCheck: this.egressCheck(args),
      ...(args.ipFamilies === undefined ? {} : { ipFamilies: args.ipFamilies }),
      rotate: args.rotate,
      egressRecheck: args.recheckEgress ?? true,
      ...(args.rotateAfterDays === undefined ? {} : { rotateAfterDays: args.rotateAfterDays }),
      disruptionBudget: {
        group: name,
        maxUnavailable: resolveMaxUnavailable(args.maxUnavailable, members),
        drainSeconds: resolveDrainSeconds(args.drainSeconds),
        ...(args.onCollision === "rotate" ? { onCollision: "rotate" as const } : {}),
      },
      port,
      basicAuth:
        basicAuth === undefined || password === undefined
          ? undefined
          : { user: basicAuth.user, password },
      parent: this,
    };
  }

  /** Groups by egress address; shared addresses warn in `pulumi up`, or fail with requireDistinctEgress. */
  private egressGroups(
    name: string,
    args: EgressProxyPoolArgs,
    proxies: ProxyDetails[],
    entries: (Record<string, string> | null | undefined)[],
  ): EgressGroup[] {
    const verdict = egressVerdict(
      name,
      {
        requireDistinct: args.requireDistinctEgress === true,
        onCollision: args.onCollision ?? "fail",
        rotate: args.rotate,
      },
      proxies,
      entries,
    );
    if (verdict.refusal !== undefined) throw new PoolArgsError(verdict.refusal);
    if (verdict.warning !== undefined) void pulumi.log.warn(verdict.warning, this);
    return verdict.groups;
  }

  /**
   * One document for the whole pool, and the files of it that running members
   * get in place when they change; secret because they may carry the password
   * hash and the user's extra cloud-init.
   */
  private guestSoftware(
    args: EgressProxyPoolArgs,
    password: pulumi.Output<string> | undefined,
    prefixEgress?: PrefixEgressSettings,
  ): Pick<PoolDecisions<EgressProxyPoolArgs>, "userData" | "guestFiles"> {
    const settings = pulumi
      .secret(pulumi.all([password, args.extraCloudInit]))
      .apply(([knownPassword, extra]) => {
        const settings = squidSettings(args.squid, knownPassword ?? "", prefixEgress);
        const problems = squidSettingsProblems(settings);
        if (problems.length > 0) throw new PoolArgsError(problems.join("; "));
        return { settings, extra };
      });
    return {
      userData: settings.apply(({ settings, extra }) =>
        poolUserData(squidCloudConfig(settings), extra),
      ),
      guestFiles: settings.apply(({ settings, extra }) => ({
        ...squidGuestFiles(settings),
        userDataIdentity: squidUserDataIdentity(settings, extra),
      })),
    };
  }

  /** The pool's egress check, with squid's basic auth so the request is let through. */
  private egressCheck(
    args: EgressProxyPoolArgs,
    prefix?: PrefixEgressSettings,
  ): EgressCheckArgs | undefined {
    if (args.egressCheck === undefined) return undefined;
    const sampled = args.egressCheck.ipv6Url !== undefined && prefix !== undefined;
    const basicAuth = args.squid?.basicAuth;
    return {
      url: args.egressCheck.url,
      field: args.egressCheck.field,
      ...(args.egressCheck.ipv6Url === undefined ? {} : { ipv6Url: args.egressCheck.ipv6Url }),
      // Only a member with a prefix samples (ipv6Samples alone changes no other member's inputs).
      ...(sampled ? { ipv6Prefix: prefix } : {}),
      ...(sampled && args.egressCheck.ipv6Samples !== undefined
        ? { ipv6Samples: args.egressCheck.ipv6Samples }
        : {}),
      proxyAuth:
        basicAuth === undefined
          ? undefined
          : { user: basicAuth.user, password: pulumi.secret(basicAuth.password) },
    };
  }
}
