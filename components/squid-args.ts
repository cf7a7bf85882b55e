/**
 * The pool's `squid` arguments and the member squid settings they give
 * (workloads/squid-cloud-init.ts writes the configuration from those).
 */
import type * as pulumi from "@pulumi/pulumi";
import type { PrefixEgressSettings } from "../workloads/prefix-egress";
import {
  DEFAULT_ALLOWED_CLIENT_CIDRS,
  DEFAULT_SQUID_PORT,
  type SquidSettings,
} from "../workloads/squid-cloud-init";

export interface SquidArgs {
  /** Default 3128. */
  port?: number;
  /** Who may use the proxies. Default: the private ranges 10/8, 172.16/12, 192.168/16. */
  allowedClientCidrs?: string[];
  /** Require a user and password; the password is kept secret and only its hash reaches the VM. */
  basicAuth?: { user: string; password: pulumi.Input<string> };
  /** squid.conf lines placed before the access rules, e.g. `acl blocked dstdomain .example.com`. */
  extraConfigLines?: string[];
}

export function squidSettings(
  squid: SquidArgs | undefined,
  password: string,
  prefixEgress?: PrefixEgressSettings,
): SquidSettings {
  return {
    ...(prefixEgress === undefined ? {} : { prefixEgress }),
    port: squid?.port ?? DEFAULT_SQUID_PORT,
    allowedClientCidrs: squid?.allowedClientCidrs ?? DEFAULT_ALLOWED_CLIENT_CIDRS,
    basicAuth:
      squid?.basicAuth === undefined ? undefined : { user: squid.basicAuth.user, password },
    extraConfigLines: squid?.extraConfigLines ?? [],
  };
}
