/**
 * What a pool publishes once its members' verdict is in: the Kubernetes
 * objects (components/kubernetes.ts) and the gateway (components/gateway.ts).
 * Everything here waits for the diversity verdict: a pool that
 * requireDistinctEgress refuses publishes and routes nowhere.
 */
import * as pulumi from "@pulumi/pulumi";
import type { PoolDecisions, PoolMember } from "./backend-kind";
import { kindOf, type AnyPoolBackend } from "./backends";
import type { EgressGroup } from "./egress-diversity";
import { poolTakesIpv6, type PoolIpFamilyArgs } from "./dual-stack";
import {
  declareGateway,
  type DeclareGatewayVm,
  type GatewayArgs,
  type PoolGateway,
} from "./gateway";
import {
  publishToKubernetes,
  type KubernetesObjects,
  type KubernetesPublishingArgs,
} from "./kubernetes";
import { endpointChecks, type ProxyDetails } from "./proxy-details";
import type { SquidArgs } from "./squid-args";

/** The pool's arguments this module reads. */
export interface PublishingArgs extends PoolIpFamilyArgs {
  kubernetes?: KubernetesPublishingArgs;
  gateway?: GatewayArgs;
  requireDistinctEgress?: boolean;
  squid?: SquidArgs;
}

/** What the pool has computed by the time it publishes. */
export interface PoolToPublish {
  members: readonly PoolMember[];
  /** Resolves once the pool's egress verdict is in (and fails with it). */
  verdict: pulumi.Output<[ProxyDetails[], EgressGroup[]]>;
  port: number;
  proxies: pulumi.Output<ProxyDetails[]>;
  egress: pulumi.Output<EgressGroup[]>;
  endpointsWithCredentials: pulumi.Output<string[]>;
  backends: readonly AnyPoolBackend[];
  /** What the pool decided for its members: a gateway VM is made the same way, as itself. */
  decisions: PoolDecisions<unknown>;
}

const known = (values: (string | null)[]): string[] => values.flatMap((value) => value ?? []);

export function publishPool(
  name: string,
  args: PublishingArgs,
  pool: PoolToPublish,
  parent: pulumi.Resource,
): { kubernetes?: KubernetesObjects; gateway?: PoolGateway } {
  const { verdict, port } = pool;
  const addresses = (pick: (member: PoolMember) => pulumi.Input<string | null>) =>
    pulumi
      .all([verdict, pulumi.all(pool.members.map(pick))])
      .apply(([, ips]) => known(ips as (string | null)[]));
  const kubernetes =
    args.kubernetes === undefined
      ? undefined
      : publishToKubernetes(
          name,
          args.kubernetes,
          {
            addresses: addresses((member) => member.serviceAddress),
            ...(poolTakesIpv6(args)
              ? { ipv6Addresses: addresses((member) => member.ipv6.serviceAddress) }
              : {}),
            // With requireDistinctEgress even the Service waits for the verdict; else preview shows the port.
            port: args.requireDistinctEgress === true ? pool.egress.apply(() => port) : port,
            urls: pool.endpointsWithCredentials,
            checks: pulumi.all([pool.proxies, pool.egress]).apply(([all]) => endpointChecks(all)),
          },
          parent,
        );
  const gateway =
    args.gateway === undefined
      ? undefined
      : declareGateway(
          name,
          args.gateway,
          { proxies: verdict.apply(([all]) => all), port, login: args.squid?.basicAuth },
          parent,
          gatewayVmMaker(name, pool),
        );
  return { kubernetes, gateway };
}

/**
 * How the pool makes its gateway VM: through the backend kind's own
 * `declare`, as a member is made (image, network, storage, machine size),
 * with the gateway's software and none of what makes a member a member: no
 * egress check or re-check, no rotation, no place in the disruption budget,
 * no basic auth of its own (its users are in its files).
 */
function gatewayVmMaker(poolName: string, pool: PoolToPublish): DeclareGatewayVm {
  return (backendName, software, port) => {
    const backend = pool.backends.find((candidate) => candidate.name === backendName)!;
    const { kind, settings } = kindOf(backend);
    return kind.declare(
      `${poolName}-gateway`,
      settings,
      { backend: backendName, index: 0, key: "gateway" },
      {
        ...pool.decisions,
        userData: software.apply((known) => known.userData),
        guestFiles: software.apply((known) => known.guestFiles),
        // Ready once its own configuration serves: the package's squid listens on the port first.
        readiness: { mode: "port", port, authRequired: true },
        port,
        egressCheck: undefined,
        basicAuth: undefined,
        rotate: undefined,
        egressRecheck: false,
        rotateAfterDays: undefined,
        disruptionBudget: undefined,
      },
    );
  };
}
