/**
 * The root program's gateway: `egress-proxies:pool.gateway` (users by name,
 * where it runs) and the secret `egress-proxies:gatewayPasswords` (a JSON
 * object of user name to password, never quoted back). Checked here with the
 * pool's own rules, each problem led by the config key to change.
 */
import type * as pulumi from "@pulumi/pulumi";
import { z } from "zod";
import { gatewayArgsProblems, type GatewayArgs } from "./gateway";

/** The config keys problems are said about (stack-config.ts owns the namespace). */
export interface GatewayConfigKeys {
  /** `egress-proxies:pool` */
  pool: string;
  /** `egress-proxies:gatewayPasswords` */
  passwords: string;
}

const setPasswords = (keys: GatewayConfigKeys) =>
  `pulumi config set --secret ${keys.passwords} '{"<user>":"<password>"}'`;

export const gatewayConfigSchema = z
  .strictObject(
    {
      users: z
        .array(z.string({ error: "gateway.users must list user names" }), {
          error: 'gateway.users must list user names, e.g. ["crawler"]',
        })
        .min(1, { error: 'gateway.users must name at least one user, e.g. ["crawler"]' }),
      port: z.number({ error: "gateway.port must be a port number, e.g. 3128" }).optional(),
      allowedClientCidrs: z
        .array(z.string(), {
          error: 'gateway.allowedClientCidrs must list CIDRs, e.g. ["10.0.0.0/8"]',
        })
        .optional(),
      backendLabels: z
        .record(z.string(), z.array(z.string()), {
          error:
            'gateway.backendLabels must map backend names to labels, e.g. { pve1: ["country-de"] }',
        })
        .optional(),
      kubernetes: z
        .strictObject({
          namespace: z.string({ error: "gateway.kubernetes.namespace must be the namespace name" }),
          name: z.string().optional(),
          replicas: z.number().optional(),
          image: z.string().optional(),
          serviceType: z.enum(["ClusterIP", "LoadBalancer", "NodePort"]).optional(),
          // The pool's own rules (gateway-kubernetes.ts) judge the values and name the fix.
          metrics: z
            .strictObject(
              {
                port: z.number().optional(),
                image: z.string().optional(),
                packageSpec: z.string().optional(),
              },
              {
                error:
                  "gateway.kubernetes.metrics must be an object: {} for the defaults, or { port: 9102 }",
              },
            )
            .optional(),
        })
        .optional(),
      vm: z
        .strictObject({ backend: z.string({ error: "gateway.vm.backend must name a backend" }) })
        .optional(),
    },
    {
      error:
        "gateway must be an object like { users: [crawler], kubernetes: { namespace: crawlers } }",
    },
  )
  .optional();

export type GatewayConfig = z.output<typeof gatewayConfigSchema>;

/** The passwords' JSON, or the problem with it (never quoting it). */
function passwordsOf(
  text: string | undefined,
  keys: GatewayConfigKeys,
): Record<string, string> | string {
  if (text === undefined) return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return `${keys.passwords} must be a JSON object of user name to password; set it again with \`${setPasswords(keys)}\``;
  }
  const isMap =
    typeof parsed === "object" &&
    parsed !== null &&
    !Array.isArray(parsed) &&
    Object.values(parsed).every((value) => typeof value === "string");
  return isMap
    ? (parsed as Record<string, string>)
    : `${keys.passwords} must be a JSON object whose values are the passwords (text); set it again with \`${setPasswords(keys)}\``;
}

/**
 * Problems with the gateway's config and its passwords: each configured user
 * needs a password of at least 12 characters, no password without a user,
 * and the pool's gateway rules on the rest (labels, names, where it runs).
 */
export function gatewayStackProblems(
  gateway: unknown,
  passwordsText: string | undefined,
  backends: { names: string[]; vmNames: string[] },
  keys: GatewayConfigKeys,
): string[] {
  const passwords = passwordsOf(passwordsText, keys);
  if (typeof passwords === "string") return [passwords];
  const parsed = gatewayConfigSchema.safeParse(gateway);
  if (!parsed.success || parsed.data === undefined)
    return gateway === undefined && Object.keys(passwords).length > 0
      ? [
          `${keys.passwords} is set but ${keys.pool}.gateway is not: add the gateway, or \`pulumi config rm ${keys.passwords}\``,
        ]
      : []; // the schema's own messages report a malformed gateway
  const users = parsed.data.users;
  const problems: string[] = [];
  for (const user of users)
    if (passwords[user] === undefined)
      problems.push(
        `${keys.pool}.gateway.users names "${user}", who has no password in ${keys.passwords}: \`${setPasswords(keys)}\``,
      );
    else if (passwords[user]!.length < 12 || /[\r\n\0]/.test(passwords[user]!))
      problems.push(
        `${keys.passwords}: the password of "${user}" must be at least 12 characters, without line breaks; set it again with \`${setPasswords(keys)}\``,
      );
  for (const name of Object.keys(passwords))
    if (!users.includes(name))
      problems.push(
        `${keys.passwords} has a password for "${name}", who is not in ${keys.pool}.gateway.users: add the user or remove the password`,
      );
  const args = gatewayArgsOf(parsed.data, {}, (text) => text);
  problems.push(
    ...gatewayArgsProblems(args, backends.names, backends.vmNames).map(
      (text) => `${keys.pool}.${text}`,
    ),
  );
  return problems;
}

/** The pool's `gateway` argument from valid config, the passwords wrapped as secrets. */
export function gatewayArgsOf(
  config: NonNullable<GatewayConfig>,
  passwords: Record<string, string>,
  secret: (text: string) => pulumi.Input<string>,
): GatewayArgs {
  return {
    users: config.users.map((name) => ({ name, password: secret(passwords[name] ?? "") })),
    ...(config.port === undefined ? {} : { port: config.port }),
    ...(config.allowedClientCidrs === undefined
      ? {}
      : { allowedClientCidrs: config.allowedClientCidrs }),
    ...(config.backendLabels === undefined ? {} : { backendLabels: config.backendLabels }),
    ...(config.kubernetes === undefined ? {} : { kubernetes: config.kubernetes }),
    ...(config.vm === undefined ? {} : { vm: config.vm }),
  };
}

/** The pool's `gateway` from the stack config, when it has one (after the checks above passed). */
export function gatewayFromStackConfig(
  gateway: unknown,
  passwordsText: string | undefined,
  secret: (text: string) => pulumi.Input<string>,
): GatewayArgs | undefined {
  const parsed = gatewayConfigSchema.parse(gateway);
  // Only called once the checks passed: the keys do not appear in any message.
  const passwords = passwordsOf(passwordsText, { pool: "", passwords: "" });
  return parsed === undefined || typeof passwords === "string"
    ? undefined
    : gatewayArgsOf(parsed, passwords, secret);
}
