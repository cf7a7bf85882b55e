/**
 * A way out of a delete that can never succeed: the host is gone for good
 * (retired, its credentials revoked). Listed in provider config,
 *
 *   pulumi config set egress-proxies:goneHosts 'kvm9.example.com, pve2.example.com:8006'
 *
 * a host is never contacted again by delete or refresh: delete gives up at
 * once and says exactly what it leaves behind there, refresh keeps what state
 * records. Whatever is left carries this stack's ownership mark, so the
 * reaper finds it if the host ever comes back. Module state of the provider
 * process (set by configure), like the SSH credentials from config.
 */
import { logToEngine } from "./engine-log";
import { TransientError, isTransient } from "./errors";

export const GONE_HOSTS_CONFIG_KEY = "egress-proxies:goneHosts";

let goneHosts = new Set<string>();

/** Reads the list: names or host:port, separated by commas or spaces, or a JSON array of them. */
export function rememberGoneHosts(
  config: { get(key: string): string | undefined } | undefined,
): void {
  goneHosts = new Set(parseGoneHosts(config?.get(GONE_HOSTS_CONFIG_KEY)));
}

export function parseGoneHosts(value: string | undefined): string[] {
  if (value === undefined || value.trim() === "") return [];
  let entries: unknown = value;
  if (value.trim().startsWith("[")) {
    try {
      entries = JSON.parse(value);
    } catch {
      // Not JSON after all: read it as a plain list.
    }
  }
  const list = Array.isArray(entries) ? entries.map(String) : String(entries).split(/[\s,]+/);
  return list.map((entry) => entry.trim().toLowerCase()).filter((entry) => entry !== "");
}

/**
 * Whether the host is listed. `names` are the ways it can be written: the
 * label in the resource's id ("kvm9" or "kvm9:2222"), its bare name, its
 * host:port. Any of them listed counts.
 */
export function isGoneForGood(names: readonly string[]): boolean {
  return names.some((name) => goneHosts.has(name.toLowerCase()));
}

/** The warning delete gives instead of deleting: what is left on the host, and who finds it. */
export function leaveBehind(resource: string, host: string, leftovers: readonly string[]): void {
  logToEngine(
    `${resource}: host ${host} is listed in ${GONE_HOSTS_CONFIG_KEY}: not contacted; removed from state, ` +
      `left behind there if it ever comes back: ${leftovers.join(", ")}. They carry this stack's ` +
      `ownership mark: egress-reaper finds and removes them then.`,
    "warning",
  );
}

/** A delete that ran out of time on an unreachable host says what the way out is. */
export function withWayOut(error: unknown, host: string): unknown {
  if (!isTransient(error)) return error;
  return new TransientError(
    `${error.message}; if ${host} is gone for good, list it in ${GONE_HOSTS_CONFIG_KEY} and run this again: ` +
      `delete then gives up at once and says what it leaves behind (docs/troubleshooting.md, "A host that is gone for good")`,
    { cause: error },
  );
}
