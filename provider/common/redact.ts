import { inspect } from "node:util";

/**
 * Secrets (SSH keys, API tokens, cloud-init, URL userinfo) must never reach a
 * log line, an error message or plaintext state. Everything that formats text
 * for people about a request or a config runs it through here first.
 */
export const REDACTED = "[redacted]";

const PEM_BLOCK = /-----BEGIN [A-Z0-9 ]+-----[\s\S]*?-----END [A-Z0-9 ]+-----/g;
const PVE_TOKEN = /PVEAPIToken=[^\s"']+/gi;
const AUTH_HEADER =
  /\b(authorization|cookie|csrfpreventiontoken)(\s*[:=]\s*)("[^"]*"|[^\s,;]+(\s[^\s,;]+)?)/gi;
const URL_USERINFO = /\b([a-z][a-z0-9+.-]*:\/\/)[^/\s@]*@/gi;

/** Removes `user:password@` from a URL, keeping everything else. Not a URL? Text rules apply. */
export function redactUrl(url: string): string {
  try {
    const parsed = new URL(url);
    if (parsed.username === "" && parsed.password === "") return url;
    parsed.username = "";
    parsed.password = "";
    return parsed.toString().replace("://", `://${REDACTED}@`);
  } catch {
    return redactText(url);
  }
}

/**
 * Replaces known secret values and anything that looks like a credential
 * (PEM blocks, PVE API tokens, Authorization headers, URL userinfo).
 */
export function redactText(text: string, secrets: Iterable<string | undefined> = []): string {
  let out = text;
  // Longest first, so a secret that contains another is removed whole.
  const known = [...secrets].filter((s): s is string => typeof s === "string" && s.length >= 4);
  known.sort((a, b) => b.length - a.length);
  for (const secret of known) out = out.split(secret).join(REDACTED);
  return out
    .replace(PEM_BLOCK, REDACTED)
    .replace(PVE_TOKEN, `PVEAPIToken=${REDACTED}`)
    .replace(AUTH_HEADER, (_m, name: string, sep: string) => `${name}${sep}${REDACTED}`)
    .replace(URL_USERINFO, (_m, scheme: string) => `${scheme}${REDACTED}@`);
}

/**
 * A value that refuses to be printed. `String(secret)`, `JSON.stringify` and
 * `console.log` all show "[redacted]"; only `reveal()` gives the value.
 */
export class SecretValue<T = string> {
  readonly #value: T;
  constructor(value: T) {
    this.#value = value;
  }
  reveal(): T {
    return this.#value;
  }
  toString(): string {
    return REDACTED;
  }
  toJSON(): string {
    return REDACTED;
  }
  [inspect.custom](): string {
    return `SecretValue(${REDACTED})`;
  }
}

/** An error message safe to show: its own message with secrets removed. */
export function safeErrorMessage(
  error: unknown,
  secrets: Iterable<string | undefined> = [],
): string {
  const message = error instanceof Error ? error.message : String(error);
  return redactText(message, secrets);
}
