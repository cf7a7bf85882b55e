/**
 * StaticProxy's inputs: a proxy that already exists, given by its URL
 * `http://[user:password@]host:port`. The userinfo is a secret (common/secrets.ts
 * lists `url` among the URL inputs), so neither messages nor outputs quote it.
 */
import { z } from "zod";
import { egressCheckSchema } from "../common/egress";
import {
  egressRecheckSchema,
  ownerSchema,
  PROXIED_HTTP_URL,
  timeoutsSchema,
  validateWithUnknowns,
  type ValidationResult,
} from "../common/inputs";

/** The parts of a proxy URL; `credentials` only when it has userinfo. */
export interface ProxyAddress {
  host: string;
  port: number;
  /** The URL without userinfo: safe to show and to store in plain state. */
  endpoint: string;
  credentials?: { user: string; password: string };
}

/**
 * The problem with a proxy URL, or undefined. Says the field and the form
 * expected, and never repeats the URL (it may carry a password).
 */
export function proxyUrlProblem(text: string, field = "url"): string | undefined {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    return `${field} must be a URL like http://proxy.example:3128 or http://user:password@203.0.113.7:3128`;
  }
  if (url.protocol !== "http:")
    return `${field} must start with http:// (the proxy is spoken to in plain HTTP; CONNECT carries TLS to the target)`;
  if (url.hostname === "") return `${field} must name the proxy's host`;
  if (url.port === "") return `${field} must give the proxy's port, e.g. http://proxy.example:3128`;
  if ((url.pathname !== "/" && url.pathname !== "") || url.search !== "" || url.hash !== "")
    return `${field} must be only http://[user:password@]host:port, without a path, query or fragment`;
  if (url.username === "" && url.password !== "")
    return `${field} has a password but no user; write http://user:password@host:port`;
  return undefined;
}

/** A valid proxy URL's parts (percent-encoded userinfo decoded). */
export function proxyAddressOf(text: string): ProxyAddress {
  const url = new URL(text);
  const host = url.hostname.startsWith("[") ? url.hostname.slice(1, -1) : url.hostname;
  const port = Number(url.port);
  return {
    host,
    port,
    endpoint: `http://${url.hostname}:${port}`,
    ...(url.username === ""
      ? {}
      : {
          credentials: {
            user: decodeURIComponent(url.username),
            password: decodeURIComponent(url.password),
          },
        }),
  };
}

/** A proxy URL; `field` names it in the messages ("url", or "a proxy URL" in a list). */
export const proxyUrlSchemaFor = (field: string) =>
  z
    .string({ error: `${field} must be the proxy's URL, http://[user:password@]host:port` })
    .superRefine((text, context) => {
      const problem = proxyUrlProblem(text, field);
      if (problem !== undefined) context.addIssue({ code: "custom", message: problem });
    });

export const proxyUrlSchema = proxyUrlSchemaFor("url");

export const staticReadinessSchema = z.strictObject({
  /** "port": the proxy's port must accept TCP (then probeUrl, if set, must answer through it); "none": trusted as given. */
  mode: z
    .enum(["port", "none"], { error: 'readiness.mode must be "port" or "none"' })
    .default("port"),
  /** An http:// URL fetched through the proxy (with the URL's credentials); a 2xx-3xx status means ready. */
  probeUrl: z
    .string({ error: "readiness.probeUrl must be an http:// URL fetched through the proxy" })
    .regex(PROXIED_HTTP_URL, {
      error:
        'readiness.probeUrl must be an http:// URL without credentials, e.g. "http://example.com/"',
    })
    .optional(),
});

export const staticProxyInputsSchema = z.strictObject({
  url: proxyUrlSchema,
  readiness: staticReadinessSchema.default({ mode: "port" }),
  /** Without proxyAuth, the URL's own credentials are used. */
  egressCheck: egressCheckSchema.optional(),
  /** Re-check the port, then the egress check, on every refresh (common/egress-recheck.ts). */
  egressRecheck: egressRecheckSchema,
  timeouts: timeoutsSchema.default({ createSeconds: 900, readySeconds: 600, deleteSeconds: 300 }),
  owner: ownerSchema,
});

export type StaticProxyInputs = z.output<typeof staticProxyInputsSchema>;

export function validateStaticInputs(
  raw: Record<string, unknown>,
): ValidationResult<StaticProxyInputs> {
  return validateWithUnknowns(staticProxyInputsSchema, raw, "StaticProxy", "docs/static.md");
}
