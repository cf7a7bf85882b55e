// Reads the endpoints another stack exported (e.g. the repository's root
// program, `organization/egress-proxies/prod`) without owning any VM.
import * as pulumi from "@pulumi/pulumi";
import type { ProxyDetails } from "egress-proxies";

const config = new pulumi.Config();
const proxies = new pulumi.StackReference(config.require("proxyStack"));

const endpoints = proxies.requireOutput("endpoints") as pulumi.Output<string[]>;
const details = proxies.requireOutput("proxies") as pulumi.Output<ProxyDetails[]>;

export const firstProxy = endpoints.apply((urls) => urls[0]);
export const kvmProxies = details.apply(
  (all) => all.filter((proxy) => proxy.kind === "kvm").length,
);
// Secret outputs stay secret through a StackReference.
export const withCredentials = proxies.getOutput("endpointsWithCredentials");
