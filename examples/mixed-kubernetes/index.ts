// KVM and Proxmox proxies in one pool, published to a cluster: pods use
// http://egress.crawlers.svc:3128, or read the URLs from the "egress" Secret.
import * as k8s from "@pulumi/kubernetes";
import * as pulumi from "@pulumi/pulumi";
import { EgressProxyPool } from "egress-proxies";

const config = new pulumi.Config();
const cluster = new k8s.Provider("cluster", { kubeconfig: config.requireSecret("kubeconfig") });
const namespace = new k8s.core.v1.Namespace(
  "crawlers",
  { metadata: { name: "crawlers" } },
  { provider: cluster },
);

const pool = new EgressProxyPool("mixed", {
  count: 3,
  backends: [
    { name: "kvm1", kvm: { connection: { host: "kvm1.lan" }, network: { bridge: "br0" } } },
    {
      name: "pve1",
      count: 1,
      proxmox: { node: "pve1", templateVmid: 9000, diskStorage: "local-lvm", seedStorage: "local" },
    },
  ],
  squid: { allowedClientCidrs: ["10.42.0.0/16"] }, // the cluster's pod network
  extraCloudInit: "#cloud-config\npackages: [prometheus-node-exporter]\n",
  kubernetes: { namespace: namespace.metadata.name, name: "egress", provider: cluster },
});

export const endpoints = pool.endpoints;
export const inClusterUrl = pulumi.interpolate`http://egress.${namespace.metadata.name}.svc:${pool.port}`;
