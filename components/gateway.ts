/**
 * The pool's gateway: one endpoint in front of its members, on squid
 * (workloads/gateway/), kept current as members come, fail and go. This
 * module decides who is routed to and with which labels, and places the
 * gateway: in Kubernetes (components/gateway-kubernetes.ts) or as a VM the
 * pool makes on one of its backends (pool-publishing.ts); the configuration
 * itself is written in workloads/gateway/.
 *
 * Only members the pool publishes as serving are routed to: a member whose
 * last create or refresh found it stopped, paused or silent is left out of
 * the configuration, and a member being replaced or removed leaves it before
 * its VM goes (the engine updates the gateway's Secret, which depends on the
 * member, before it deletes the member; the member's drain covers the
 * kubelet's lag in between).
 */
import * as pulumi from "@pulumi/pulumi";
import { isIP } from "node:net";
import { DEFAULT_ALLOWED_CLIENT_CIDRS } from "../workloads/squid-cloud-init";
import { GATEWAY_POD_METRICS_UDP, gatewayPodFiles } from "../workloads/gateway/pod";
import { gatewayVmSoftware } from "../workloads/gateway/vm";
import {
  DEFAULT_GATEWAY_PORT,
  gatewaySettingsProblems,
  type GatewayMember,
  type GatewaySettings,
} from "../workloads/gateway/squid-gateway";
import { gatewayLabelProblems, gatewayUserListProblems } from "../workloads/gateway/user-names";
import {
  gatewayKubernetesArgsProblems,
  publishGatewayToKubernetes,
  type GatewayKubernetesArgs,
  type GatewayKubernetesObjects,
} from "./gateway-kubernetes";
import type { PoolMember } from "./backend-kind";
import type { ProxyDetails } from "./proxy-details";

/** A user of the gateway: its name (clients add `-session-<id>` and `-host-<label>`) and its own password. */
export interface GatewayUserArgs {
  name: string;
  /** Kept secret: only its hash reaches the gateway. */
  password: pulumi.Input<string>;
}

export interface GatewayArgs {
  /** Who may use the gateway; each user's requests are counted apart. */
  users: GatewayUserArgs[];
  /** Default 3128. */
  port?: number;
  /** Who may connect. Default: the private IPv4 ranges and IPv6 unique-local addresses (fc00::/7). */
  allowedClientCidrs?: string[];
  /**
   * Labels a client may pin to besides the backend's name, per backend:
   * `{ kvm1: ["country-de"] }` lets `crawler-host-country-de` reach kvm1's members only.
   */
  backendLabels?: Record<string, string[]>;
  /** Run the gateway in Kubernetes: a Deployment, a PodDisruptionBudget, a Service and a Secret. */
  kubernetes?: GatewayKubernetesArgs;
  /**
   * Or run it as a VM on one of the pool's KVM or Proxmox backends, made like
   * a member (the backend's image, network, storage) and named `<pool>-gateway`;
   * member changes reach it through its guest agent, never by replacing it.
   * Sized like the backend's members. Its address must be among the members'
   * `squid.allowedClientCidrs`.
   */
  vm?: { backend: string };
}

/** How the pool makes the gateway's VM on one of its backends, with the gateway's software. */
export type DeclareGatewayVm = (
  backend: string,
  software: pulumi.Output<ReturnType<typeof gatewayVmSoftware>>,
  port: number,
) => PoolMember;

/** The gateway as the pool declared it. */
export interface PoolGateway {
  /**
   * In Kubernetes `http://<name>.<namespace>.svc:<port>`; on a VM `http://<its address>:<port>`.
   * Clients add `user[-session-<id>][-host-<label>]:password@`.
   */
  url: pulumi.Output<string>;
  /** The Service's addresses (IPv4 and IPv6 where the cluster has both), or the VM's. */
  addresses: pulumi.Output<string[]>;
  users: string[];
  kubernetes?: GatewayKubernetesObjects;
  /** The gateway VM (a KvmProxy or ProxmoxProxy). */
  vm?: pulumi.CustomResource;
}

export const DEFAULT_GATEWAY_CLIENT_CIDRS: readonly string[] = [
  ...DEFAULT_ALLOWED_CLIENT_CIDRS,
  "fc00::/7",
];

/** Problems with the gateway's arguments against the pool's backends, each naming its field and fix. */
export function gatewayArgsProblems(
  gateway: GatewayArgs | undefined,
  backendNames: readonly string[],
  /** The backends that make VMs (KVM, Proxmox): where a gateway VM may go. */
  vmBackends: readonly string[],
): string[] {
  if (gateway === undefined) return [];
  const problems: string[] = [];
  if (!Array.isArray(gateway.users) || gateway.users.length === 0)
    problems.push(
      'gateway.users must name at least one user, e.g. [{ name: "crawler", password }]',
    );
  problems.push(
    ...gatewayUserListProblems(
      (gateway.users ?? []).map((user) => user?.name),
      "gateway.users",
    ),
  );
  for (const [backend, labels] of Object.entries(gateway.backendLabels ?? {})) {
    if (!backendNames.includes(backend))
      problems.push(
        `gateway.backendLabels.${backend} names no backend of the pool (backends: ${backendNames.join(", ")})`,
      );
    (labels ?? []).forEach((label, index) =>
      problems.push(...gatewayLabelProblems(label, `gateway.backendLabels.${backend}[${index}]`)),
    );
  }
  // Every backend's name is a label a client may pin to.
  backendNames.forEach((backend, index) =>
    problems.push(...gatewayLabelProblems(backend, `backends[${index}].name`)),
  );
  if ((gateway.kubernetes === undefined) === (gateway.vm === undefined))
    problems.push(
      "gateway needs exactly one place to run: gateway.kubernetes: { namespace } (a Deployment of squid) or gateway.vm: { backend } (a VM on one of the pool's KVM or Proxmox backends)",
    );
  if (gateway.kubernetes !== undefined)
    problems.push(...gatewayKubernetesArgsProblems(gateway.kubernetes));
  if (gateway.vm !== undefined && !vmBackends.includes(gateway.vm.backend))
    problems.push(
      `gateway.vm.backend must name one of the pool's KVM or Proxmox backends (${vmBackends.join(", ") || "it has none"}), not ${JSON.stringify(gateway.vm.backend)}`,
    );
  return problems;
}

/**
 * The members the gateway routes to: those the pool publishes as serving
 * (`ready` not false), by the address the gateway reaches (IPv4 first), each
 * labelled with its backend and the backend's declared labels.
 */
export function gatewayMembers(
  proxies: readonly ProxyDetails[],
  port: number,
  gateway: Pick<GatewayArgs, "backendLabels">,
  login: { user: string; password: string } | undefined,
): GatewayMember[] {
  return proxies.flatMap((proxy) => {
    const ipv6Serves =
      proxy.readyIpv6 === undefined ? proxy.ready !== false : proxy.readyIpv6 !== false;
    const address =
      proxy.ip !== null && isIP(proxy.ip) !== 0 && proxy.ready !== false
        ? proxy.ip
        : proxy.ipv6Address && ipv6Serves
          ? proxy.ipv6Address
          : undefined;
    if (address === undefined) return [];
    return [
      {
        name: proxy.name,
        address,
        port,
        labels: [proxy.backend, ...(gateway.backendLabels?.[proxy.backend] ?? [])],
        ...(login === undefined ? {} : { login }),
      },
    ];
  });
}

/** Declares the gateway of pool `name` from its members' details. */
export function declareGateway(
  name: string,
  gateway: GatewayArgs,
  pool: {
    proxies: pulumi.Output<ProxyDetails[]>;
    port: number;
    login?: { user: string; password: pulumi.Input<string> };
  },
  parent: pulumi.Resource,
  declareVm: DeclareGatewayVm,
): PoolGateway {
  const port = gateway.port ?? DEFAULT_GATEWAY_PORT;
  const settings = pulumi
    .all([
      pool.proxies,
      pulumi.all(gateway.users.map((user) => pulumi.output(user.password))),
      pool.login === undefined ? undefined : pulumi.output(pool.login.password),
    ])
    .apply(([proxies, passwords, memberPassword]): Omit<GatewaySettings, "paths"> => {
      const settings = {
        port,
        allowedClientCidrs: gateway.allowedClientCidrs ?? DEFAULT_GATEWAY_CLIENT_CIDRS,
        users: gateway.users.map((user, index) => ({
          name: user.name,
          password: passwords[index]!,
        })),
        members: gatewayMembers(
          proxies,
          pool.port,
          gateway,
          pool.login === undefined || memberPassword === undefined
            ? undefined
            : { user: pool.login.user, password: memberPassword },
        ),
      };
      const problems = gatewaySettingsProblems({ ...settings, paths: { configDir: "/" } });
      if (problems.length > 0) throw new Error(`EgressProxyPool ${name}: ${problems.join("; ")}`);
      return settings;
    });
  const users = gateway.users.map((user) => user.name);
  if (gateway.vm !== undefined) {
    const vm = declareVm(
      gateway.vm.backend,
      pulumi.secret(settings.apply(gatewayVmSoftware)),
      port,
    );
    return {
      url: vm.ip.apply((ip) =>
        ip === null ? "" : `http://${isIP(ip) === 6 ? `[${ip}]` : ip}:${port}`,
      ),
      addresses: vm.ip.apply((ip) => (ip === null ? [] : [ip])),
      users,
      vm: vm.resource,
    };
  }
  // squid sends its log lines to the metrics sidecar only when there is one to receive them.
  const podOptions =
    gateway.kubernetes?.metrics === undefined ? {} : { metricsUdp: GATEWAY_POD_METRICS_UDP };
  const placed = publishGatewayToKubernetes(
    name,
    gateway.kubernetes!,
    { files: pulumi.secret(settings.apply((known) => gatewayPodFiles(known, podOptions))), port },
    parent,
  );
  return { url: placed.url, addresses: placed.clusterIps, users, kubernetes: placed.objects };
}
