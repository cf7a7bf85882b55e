// A pool the Pulumi Kubernetes Operator keeps in shape: its Stack object (operator/stack.yaml) runs
// `pulumi up --refresh` on this program every few minutes, so a proxy that stopped is started again, a
// silent one restarted (never most of them at once: docs/day2.md), and the Secret, Service and
// EndpointSlice it publishes in the cluster follow the pool. The program itself is an ordinary one.
import * as pulumi from "@pulumi/pulumi";
import { EgressProxyPool } from "egress-proxies";

const config = new pulumi.Config();
const hosts = config.requireObject<string[]>("kvmHosts");
const privateKey = config.requireSecret("kvmPrivateKey");

const pool = new EgressProxyPool("crawl", {
  count: config.requireNumber("count"),
  backends: hosts.map((host) => ({
    name: host.split(".")[0]!,
    kvm: { connection: { host, user: "egress", privateKey }, network: { bridge: "br0" } },
  })),
  squid: {
    basicAuth: { user: "crawler", password: config.requireSecret("proxyPassword") },
  },
  // A resync every few minutes: at most one member out of service at a time, each drained a minute.
  maxUnavailable: 1,
  drainSeconds: 60,
  kubernetes: config.requireObject<{ namespace: string; name: string }>("kubernetes"),
});

export const endpoints = pool.endpoints;
export const proxies = pool.proxies;
