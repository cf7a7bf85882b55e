// The package's public face. Resources join here as they land.
export { packageVersion } from "./common/version";
export * from "./common/errors";
export { KvmProxy } from "./kvm/resource";
export type { KvmProxyArgs, KvmConnectionArgs } from "./kvm/resource";
export { ProxmoxProxy } from "./proxmox/resource";
export type { ProxmoxProxyArgs } from "./proxmox/resource";
export { StaticProxy } from "./static/resource";
export type { StaticProxyArgs } from "./static/resource";
