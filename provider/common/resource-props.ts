/**
 * What every resource class passes to `pulumi.dynamic.Resource`: the inputs
 * with secrets wrapped (common/secrets.ts), the owner the mark records, and
 * every output key declared (an output is only exposed on the object when
 * its key is in the props). `.get` is the same constructor with an id.
 */
import * as pulumi from "@pulumi/pulumi";
import { secretOutputNames, withSecretInputs } from "./secrets";

/** `egressCheck`, the same on every resource (provider/common/egress.ts checks it). */
export type EgressCheckArgs = pulumi.Input<{
  url: pulumi.Input<string>;
  field?: pulumi.Input<string>;
  /** With IPv6 in ipFamilies: an http:// URL whose host is an IPv6 literal, fetched through the proxy's IPv6 address. */
  ipv6Url?: pulumi.Input<string>;
  /** With ipv6Prefix: how many requests sample the prefix's exit addresses (default 20, 2 to 1000). */
  ipv6Samples?: pulumi.Input<number>;
  /** A prefix spread over the proxy (the pool fills it in): the samples must leave from it, and spread in random/pool mode. */
  ipv6Prefix?: pulumi.Input<{
    prefix: pulumi.Input<string>;
    mode: pulumi.Input<"random" | "sticky" | "pool">;
    count?: pulumi.Input<number>;
  }>;
  proxyAuth?: pulumi.Input<{ user: pulumi.Input<string>; password: pulumi.Input<string> }>;
}>;

/**
 * `guestFiles`, the same on both VM resources (provider/common/guest-files.ts
 * checks it): files the user-data writes, delivered into the running guest
 * through its agent when they change, then `commands` run there, then
 * `listensOn` must be listened on. With `userDataIdentity`, user-data replaces
 * the VM only when that identity changes. Stored as a secret.
 */
export interface GuestFilesValue {
  files: { path: string; content: string; permissions?: string }[];
  commands?: string[][];
  listensOn?: number;
  userDataIdentity?: string;
}
export type GuestFilesArgs = pulumi.Input<GuestFilesValue>;

/** Which address families a proxy VM takes and how it gets IPv6 (common/ip-families.ts). */
export interface IpFamilyArgs {
  /** Default ["ipv4"]; ["ipv4", "ipv6"] is dual stack; ["ipv6"] takes no IPv4 address. */
  ipFamilies?: pulumi.Input<pulumi.Input<"ipv4" | "ipv6">[]>;
  /** Default SLAAC; or a static address: { mode: "static", address: "2001:db8::5/64", gateway: "2001:db8::1" }. */
  ipv6?: pulumi.Input<
    | { mode: "slaac"; nameservers?: pulumi.Input<pulumi.Input<string>[]> }
    | {
        mode: "static";
        address: pulumi.Input<string>;
        gateway?: pulumi.Input<string>;
        nameservers?: pulumi.Input<pulumi.Input<string>[]>;
      }
  >;
}

/** Our own timeouts, the same on every resource (Pulumi ignores customTimeouts for dynamic resources). */
export type TimeoutsArgs = pulumi.Input<{
  createSeconds?: pulumi.Input<number>;
  readySeconds?: pulumi.Input<number>;
  deleteSeconds?: pulumi.Input<number>;
}>;

export function resourceProps(
  name: string,
  args: object & { vmName?: unknown },
  outputKeys: readonly string[],
): Record<string, unknown> {
  return {
    ...withSecretInputs(args),
    owner: { project: pulumi.getProject(), stack: pulumi.getStack(), resource: name },
    vmName: args.vmName,
    ...Object.fromEntries(outputKeys.map((key) => [key, undefined])),
  };
}

/** The caller's options plus the outputs that hold a secret input (or derive from one). */
export function resourceOptions(
  opts: pulumi.CustomResourceOptions,
  inputNames: readonly string[],
): pulumi.CustomResourceOptions {
  return {
    ...opts,
    additionalSecretOutputs: [
      ...(opts.additionalSecretOutputs ?? []),
      ...secretOutputNames(inputNames),
    ],
  };
}
