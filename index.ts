// The root Pulumi program: `pulumi up` in this repository deploys the pool
// described by stack config (see Pulumi.example.yaml). Without any config it
// puts one proxy on the libvirt daemon of the machine it runs on.
import * as pulumi from "@pulumi/pulumi";
import type * as EgressProxies from "./components";

// The package is loaded by its name (node_modules/egress-proxies, a link to
// this repository made by `npm ci`'s prepare step, with --preserve-symlinks
// from Pulumi.yaml) and not as "./components": Pulumi serializes a dynamic
// provider from outside node_modules by value, which fails, while one from
// node_modules becomes a `require` of the built package, as for every user.
// eslint-disable-next-line @typescript-eslint/no-require-imports
const egressProxies = require("egress-proxies") as typeof EgressProxies;

const config = new pulumi.Config(egressProxies.CONFIG_NAMESPACE);
// The whole config is checked here, before anything is declared. The secret keys are read as text
// to be checked too (length, format; never printed) and wrapped with pulumi.secret before use.
const parsed = egressProxies.poolArgsFromStackConfig(
  {
    pool: config.getObject<unknown>("pool"),
    basicAuthPassword: config.get("basicAuthPassword"),
    kvmPrivateKey: config.get("kvmPrivateKey"),
    extraCloudInit: config.get("extraCloudInit"),
    gatewayPasswords: config.get("gatewayPasswords"),
  },
  pulumi.secret,
);
if (!parsed.ok)
  throw new pulumi.RunError(`stack config is not valid:\n  - ${parsed.problems.join("\n  - ")}`);

// The pool's resource name, and so the prefix of every VM name; default "egress".
const pool = new egressProxies.EgressProxyPool(config.get("poolName") ?? "egress", parsed.args);

export const endpoints = pool.endpoints;
export const endpointsWithCredentials = pool.endpointsWithCredentials;
export const proxies = pool.proxies;
export const count = pool.count;
export const egress = pool.egress;
export const gatewayUrl = pool.gateway?.url;
