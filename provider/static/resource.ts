import * as pulumi from "@pulumi/pulumi";
import {
  resourceOptions,
  resourceProps,
  type EgressCheckArgs,
  type TimeoutsArgs,
} from "../common/resource-props";
import * as implementation from "./provider";
import { staticProxyInputsSchema } from "./schema";
import type { EgressProblem } from "../common/egress-recheck";

/**
 * The provider Pulumi serializes into state: the implementation module itself,
 * which the closure serializer emits as one `require` of this package (about
 * 300 bytes per copy where seven wrapper functions took 1800), so no
 * credential or live handle ends up in the closure.
 *
 * FROZEN: state stores a closure that requires dist/provider/static/provider.js;
 * the server calls check, diff, create, read, update and delete on it, and
 * closures stored by earlier releases call remove (docs/frozen-api.md).
 */
const staticProvider: pulumi.dynamic.ResourceProvider = implementation;

export interface StaticProxyArgs {
  /** `http://[user:password@]host:port`. Stored as a secret when it carries credentials. */
  url: pulumi.Input<string>;
  /** Default: the port must accept TCP. `probeUrl` also fetches a page through the proxy. */
  readiness?: pulumi.Input<{
    mode?: pulumi.Input<"port" | "none">;
    probeUrl?: pulumi.Input<string>;
  }>;
  /**
   * Optional: fetch `url` through the proxy at create and record the address
   * the target saw as `egressIp`. Without `proxyAuth`, the proxy URL's own
   * credentials are sent. See docs/egress.md.
   */
  egressCheck?: EgressCheckArgs;
  /**
   * Re-check the proxy on every refresh that finds it running: its port, then
   * `egressCheck` through it (3 tries, each capped as at create). A proxy that
   * does not answer is recorded in `egressProblem` and `state: unreachable`
   * (the pool publishes it not ready; it is not ours to heal); a new exit
   * address is accepted. Default off; EgressProxyPool turns it on. docs/day2.md.
   */
  egressRecheck?: pulumi.Input<boolean>;
  timeouts?: TimeoutsArgs;
}

/**
 * A proxy that already exists (a squid on a small box, a proxy a provider
 * sold you), given by URL. Nothing is created or deleted: create and refresh
 * probe it, destroy forgets it. See docs/static.md.
 */
export class StaticProxy extends pulumi.dynamic.Resource {
  /** The URL as given (secret when it carries credentials). */
  declare readonly url: pulumi.Output<string>;
  declare readonly host: pulumi.Output<string>;
  declare readonly port: pulumi.Output<number>;
  /** The host when it is an IP address, else null. */
  declare readonly ip: pulumi.Output<string | null>;
  /** The URL without credentials. */
  declare readonly endpoint: pulumi.Output<string>;
  /** "reachable" or "unreachable" (at create, or the last refresh). */
  declare readonly state: pulumi.Output<string>;
  /** The address targets see through this proxy, from `egressCheck` at create; null without one. */
  declare readonly egressIp: pulumi.Output<string | null>;
  /** When readiness (and the egress check) passed at create, ISO 8601; null if nothing was checked. */
  declare readonly checkedAt: pulumi.Output<string | null>;
  /**
   * What the last egress re-check found wrong; null when it passed or none ran.
   * kind "unanswered": the proxy gave no answer; "egress": it answered without an address.
   */
  declare readonly egressProblem: pulumi.Output<EgressProblem | null>;

  /** Takes an existing proxy into the stack by id (`proxies/<host>:<port>`); give its `url` in args. */
  static get(
    name: string,
    id: pulumi.Input<pulumi.ID>,
    args: Partial<StaticProxyArgs> = {},
    opts: pulumi.CustomResourceOptions = {},
  ): StaticProxy {
    return new StaticProxy(name, args as StaticProxyArgs, { ...opts, id });
  }

  constructor(name: string, args: StaticProxyArgs, opts: pulumi.CustomResourceOptions = {}) {
    const { vmName: _none, ...props } = resourceProps(
      name,
      args,
      implementation.STATIC_OUTPUT_KEYS,
    );
    super(
      staticProvider,
      name,
      props,
      resourceOptions(opts, Object.keys(staticProxyInputsSchema.shape)),
      // FROZEN: type token pulumi-nodejs:dynamic/egress-proxies:StaticProxy; a rename replaces every proxy.
      "egress-proxies",
      "StaticProxy",
    );
  }
}
