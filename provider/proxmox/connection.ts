import { existsSync, readFileSync } from "node:fs";
import { PermanentError } from "../common/errors";
import { SecretValue } from "../common/redact";
import { ProxmoxConnection } from "./client";

/**
 * Where credentials come from, first match wins: the resource's own inputs,
 * then provider config (`pulumi config set egress-proxies:proxmoxApiToken
 * --secret …`), then the environment variables Proxmox users already set for
 * other tools. Resolved only when a call needs the API (never in check/diff).
 */
export const CONFIG_KEYS = {
  endpoint: "egress-proxies:proxmoxEndpoint",
  apiToken: "egress-proxies:proxmoxApiToken",
  caCert: "egress-proxies:proxmoxCaCert",
  insecure: "egress-proxies:proxmoxInsecure",
} as const;

const ENV_KEYS = {
  endpoint: "PROXMOX_VE_ENDPOINT",
  apiToken: "PROXMOX_VE_API_TOKEN",
  /** PEM text, or a path to a PEM file. */
  caCert: "PROXMOX_VE_CA_CERT",
  insecure: "PROXMOX_VE_INSECURE",
} as const;

interface ConfigSource {
  get(key: string): string | undefined;
}

/**
 * Provider config as the dynamic-provider server hands it to `configure`.
 * Module state of the provider process, never part of the serialized closure.
 */
let providerConfig: Record<string, string | undefined> = {};

export function rememberProviderConfig(config: ConfigSource | undefined): void {
  providerConfig = {};
  if (config === undefined) return;
  for (const key of Object.values(CONFIG_KEYS)) {
    const value = config.get(key);
    if (value !== undefined)
      providerConfig[key] = typeof value === "string" ? value : JSON.stringify(value);
  }
}

export interface ConnectionInputs {
  apiEndpoint?: string;
  apiToken?: string;
  /** Where `apiToken` was set, for messages; default "apiToken" (the resource input). */
  apiTokenSource?: string;
  caCertPem?: string;
  insecure?: boolean;
}

export function resolveConnection(
  inputs: ConnectionInputs,
  env: NodeJS.ProcessEnv = process.env,
): ProxmoxConnection {
  const endpoint =
    inputs.apiEndpoint ?? providerConfig[CONFIG_KEYS.endpoint] ?? env[ENV_KEYS.endpoint];
  if (endpoint === undefined || endpoint === "")
    throw new PermanentError(
      `no Proxmox API endpoint: set apiEndpoint, config ${CONFIG_KEYS.endpoint}, or ${ENV_KEYS.endpoint} (e.g. https://pve.example:8006)`,
    );
  const [token, apiTokenSource] =
    inputs.apiToken !== undefined
      ? [inputs.apiToken, inputs.apiTokenSource ?? "apiToken"]
      : providerConfig[CONFIG_KEYS.apiToken] !== undefined
        ? [providerConfig[CONFIG_KEYS.apiToken], `config ${CONFIG_KEYS.apiToken}`]
        : [env[ENV_KEYS.apiToken], ENV_KEYS.apiToken];
  if (token === undefined || token === "")
    throw new PermanentError(
      `no Proxmox API token: set apiToken (as a secret), config ${CONFIG_KEYS.apiToken} --secret, or ${ENV_KEYS.apiToken}`,
    );
  const insecureText = providerConfig[CONFIG_KEYS.insecure] ?? env[ENV_KEYS.insecure];
  const insecure =
    inputs.insecure ?? (insecureText === undefined ? false : /^(1|true|yes)$/i.test(insecureText));
  const caCertPem =
    inputs.caCertPem ?? readCaCert(providerConfig[CONFIG_KEYS.caCert] ?? env[ENV_KEYS.caCert]);
  return {
    endpoint,
    apiToken: new SecretValue(token),
    apiTokenSource,
    ...(caCertPem === undefined ? {} : { caCertPem }),
    insecure,
  };
}

function readCaCert(value: string | undefined): string | undefined {
  if (value === undefined || value === "") return undefined;
  if (value.includes("-----BEGIN CERTIFICATE-----")) return value;
  if (!existsSync(value))
    throw new PermanentError(
      `${ENV_KEYS.caCert} / ${CONFIG_KEYS.caCert} is neither PEM text nor an existing file: ${JSON.stringify(value)}; point it at the CA certificate (e.g. /etc/pve/pve-root-ca.pem copied from the host)`,
    );
  return readFileSync(value, "utf8");
}
