// Proxies that already exist, beside ones this stack boots: a squid on a small
// box and two proxies bought from a provider, given by URL (the credentials are
// secret config), in one pool with a KVM host. Each URL is one proxy; the pool's
// count cannot exceed what the static backend lists. See docs/static.md.
import * as pulumi from "@pulumi/pulumi";
import { EgressProxyPool, StaticProxy } from "egress-proxies";

const config = new pulumi.Config();
// `pulumi config set --secret boughtProxies '["http://user:pass@203.0.113.7:3128", ...]'`
const bought = config.requireSecretObject<string[]>("boughtProxies");

// One proxy on its own: create checks it answers and records its egress address.
const office = new StaticProxy("office", {
  url: "http://192.168.1.20:3128",
  egressCheck: { url: "https://api.ipify.org?format=json", field: "ip" },
});

const pool = new EgressProxyPool("crawl", {
  count: 4,
  backends: [
    { name: "kvm1", kvm: { connection: { host: "kvm1.lan" }, network: { bridge: "br0" } } },
    // At most as many proxies as URLs; here both, whatever the split gives the KVM host.
    { name: "bought", count: 2, static: { urls: [bought[0], bought[1]] } },
  ],
});

export const officeEgressIp = office.egressIp;
export const endpoints = pool.endpoints;
export const endpointsWithCredentials = pool.endpointsWithCredentials;
