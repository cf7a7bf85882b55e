// A stack that owns its pool and hands the endpoints to its own workload
// (here: a crawler's settings file written by a Pulumi resource of its own).
import * as pulumi from "@pulumi/pulumi";
import { EgressProxyPool, type ProxyDetails } from "egress-proxies";

const pool = new EgressProxyPool("crawler-egress", {
  count: 2,
  backends: [{ name: "local", kvm: {} }], // the libvirt daemon of this machine
});

export const crawlerSettings = pool.endpoints.apply((urls) =>
  JSON.stringify({ proxies: urls, rotate: "round-robin" }, null, 2),
);
export const byHost = pool.proxies.apply((proxies: ProxyDetails[]) =>
  proxies.reduce<Record<string, number>>((counts, proxy) => {
    counts[proxy.host] = (counts[proxy.host] ?? 0) + 1;
    return counts;
  }, {}),
);
export const proxyCount = pool.count;
export const stack = pulumi.getStack();
