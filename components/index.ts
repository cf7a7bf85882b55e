// The package's full public face: the resources from provider/ and the pool.
// (provider/ never imports components/, so the pool's entry point is here.)
export * from "../provider";
export {
  EgressProxyPool,
  EGRESS_PROXY_POOL_TYPE,
  PoolArgsError,
  poolArgsProblems,
  proxyUrl,
} from "./pool";
export type {
  EgressProxyPoolArgs,
  GatewayArgs,
  GatewayUserArgs,
  PoolBackend,
  PoolGateway,
  ProxyDetails,
  SquidArgs,
} from "./pool";
export { DEFAULT_GATEWAY_IMAGE, DEFAULT_GATEWAY_REPLICAS } from "./gateway-kubernetes";
export type { GatewayKubernetesArgs, GatewayKubernetesObjects } from "./gateway-kubernetes";
export { DEFAULT_KVM_IMAGE } from "./backends";
export type {
  KvmBackend,
  KvmBackendSettings,
  ProxmoxBackend,
  ProxmoxBackendSettings,
  StaticBackendSettings,
} from "./backends";
export { placeProxies, proxiesPerBackend, PlacementError } from "./placement";
export type { PlacedProxy, PlacementBackend } from "./placement";
export { KubernetesPackageMissingError } from "./kubernetes";
export type { KubernetesObjects, KubernetesPublishingArgs } from "./kubernetes";
export { DEFAULT_ALLOWED_CLIENT_CIDRS, DEFAULT_SQUID_PORT } from "../workloads/squid-cloud-init";
export {
  CONFIG_NAMESPACE,
  DEFAULT_POOL_CONFIG,
  poolArgsFromStackConfig,
  poolConfigSchema,
} from "./stack-config";
export type { PoolConfig, RawStackConfig, StackConfigResult } from "./stack-config";
export type { PoolLifecycleArgs } from "./lifecycle-args";
export { groupByEgress, sharedEgress } from "./egress-diversity";
export type { EgressGroup } from "./egress-diversity";
export type { EndpointCheck, PublishedProxy } from "./published-checks";
