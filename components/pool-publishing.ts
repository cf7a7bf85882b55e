/**
 * What a pool publishes once its members' verdict is in: the Kubernetes
 * objects (components/kubernetes.ts) and the gateway (components/gateway.ts).
 * Everything here waits for the diversity verdict: a pool that
 * requireDistinctEgress refuses publishes and routes nowhere.
 */
import * as pulumi from "@pulumi/pulumi";
import type { PoolMember } from "./backend-kind";
import type { EgressGroup } from "./egress-diversity";
import { poolTakesIpv6, type PoolIpFamilyArgs } from "./dual-stack";
import { declareGateway, type GatewayArgs, type PoolGateway } from "./gateway";
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
        );
  return { kubernetes, gateway };
}
