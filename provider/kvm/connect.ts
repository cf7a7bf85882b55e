/**
 * One libvirt connection per host for the whole provider process: the
 * dynamic provider serves every KvmProxy of a `pulumi up` from one process,
 * so ten proxies on one host share one SSH login and one libvirt link. A
 * dead link is dialled again on the next use; an idle one is closed so the
 * process can exit. Nothing here is captured by the serialized provider.
 */
import type { Deadline } from "../common/deadline";
import { SecretValue } from "../common/redact";
import type { LibvirtConnection } from "../libvirt-rpc-xdr";
import {
  LibvirtConnectionPool,
  openLibvirtOverSsh,
  openLocalLibvirt,
  sshTargetKey,
  type SshTarget,
} from "../ssh";
import { classifyLibvirtError } from "./classify";
import { LibvirtHost } from "./host";
import { hostLabel } from "./naming";
import type { KvmProxyInputs } from "./schema";

export interface HostSession {
  host: LibvirtHost;
  /**
   * The same host with another budget: undoing a failed create must not be
   * refused because the create's own deadline is what ran out. Each call asks
   * the pool for the link, so a link that died is dialled afresh.
   */
  within(deadline: Deadline): LibvirtHost;
  /** Stable identity of the host for caches and single flight. */
  hostKey: string;
  /** How the host appears in ids and outputs. */
  label: string;
}

type HostTarget = Pick<KvmProxyInputs, "connection" | "socketPath">;

/**
 * SSH credentials from provider config (`pulumi config set --secret
 * egress-proxies:kvmPrivateKey "$(cat ~/.ssh/id_ed25519)"`), used when a
 * resource's connection gives none; after them come SSH_AUTH_SOCK and
 * ~/.ssh/id_*. Module state of the provider process, never serialized.
 */
const KVM_CONFIG_KEYS = {
  privateKey: "egress-proxies:kvmPrivateKey",
  passphrase: "egress-proxies:kvmPassphrase",
  knownHosts: "egress-proxies:kvmKnownHosts",
} as const;
let configured: Partial<Record<keyof typeof KVM_CONFIG_KEYS, string>> = {};

export function rememberKvmProviderConfig(
  config: { get(key: string): string | undefined } | undefined,
): void {
  configured = {};
  if (config === undefined) return;
  for (const [name, key] of Object.entries(KVM_CONFIG_KEYS)) {
    const value = config.get(key);
    if (typeof value === "string" && value !== "")
      configured[name as keyof typeof KVM_CONFIG_KEYS] = value;
  }
}

type DialTarget =
  { kind: "local"; socketPath: string } | ({ kind: "ssh"; dialTimeoutMs: number } & SshTarget);

function dialTargetOf(target: HostTarget, privateKeySource?: string): DialTarget {
  const { connection, socketPath } = target;
  if (connection === undefined) return { kind: "local", socketPath };
  return {
    kind: "ssh",
    host: connection.host,
    port: connection.port,
    username: connection.user,
    socketPath,
    dialTimeoutMs: connection.dialTimeoutSeconds * 1000,
    insecureSkipHostKeyVerification: connection.insecureIgnoreHostKey,
    ...optional(
      "privateKey",
      connection.privateKey ?? configured.privateKey,
      (key) => new SecretValue(key),
    ),
    // A refused login names where its key came from.
    privateKeySource:
      privateKeySource ??
      (connection.privateKey !== undefined
        ? "connection.privateKey"
        : `provider config ${KVM_CONFIG_KEYS.privateKey}`),
    ...optional(
      "passphrase",
      connection.passphrase ?? configured.passphrase,
      (phrase) => new SecretValue(phrase),
    ),
    ...optional("knownHosts", connection.knownHosts ?? configured.knownHosts, (text) => text),
    ...(connection.agentSocket !== undefined ? { agentSocket: connection.agentSocket } : {}),
  };
}

function optional<K extends string, T>(
  key: K,
  value: string | undefined,
  wrap: (value: string) => T,
): Partial<Record<K, T>> {
  return value === undefined ? {} : ({ [key]: wrap(value) } as Record<K, T>);
}

const keyOf = (target: DialTarget): string =>
  target.kind === "local" ? `unix:${target.socketPath}` : `ssh:${sshTargetKey(target)}`;

const links = new LibvirtConnectionPool<DialTarget>({
  keyOf,
  dial: (target) =>
    target.kind === "local"
      ? openLocalLibvirt({ socketPath: target.socketPath })
      : openLibvirtOverSsh(target, { handshakeTimeoutMs: target.dialTimeoutMs }),
});

/** How many links were dialled in this process (tests check that ten creates share one). */
export const dialCount = (): number => links.dialCount;

/**
 * `privateKeySource` says where connection.privateKey came from when that is
 * not a resource input (the doctor's --identity): a refused login names it.
 */
export async function openHost(
  target: HostTarget,
  deadline: Deadline,
  { privateKeySource }: { privateKeySource?: string } = {},
): Promise<HostSession> {
  const label = hostLabel(target.connection);
  const dialTarget = dialTargetOf(target, privateKeySource);
  const linkWithin = (budget: Deadline) => async (): Promise<LibvirtConnection> => {
    try {
      return await links.get(dialTarget, { timeoutMs: budget.capped(60_000) });
    } catch (error) {
      throw classifyLibvirtError(error, { operation: "connect", resource: label });
    }
  };
  // Dial now, so a host that cannot be reached fails the operation at its first step.
  await linkWithin(deadline)();
  return {
    host: new LibvirtHost(linkWithin(deadline), label, deadline),
    within: (budget) => new LibvirtHost(linkWithin(budget), label, budget),
    hostKey: keyOf(dialTarget),
    label,
  };
}

/** Calls in flight on this process's links (tests check that a failed create leaves none). */
export const callsInFlight = (): number => links.callsInFlight;

/** Closes every pooled link (tests, and the end of a provider process). */
export function closeAllHosts(): Promise<void> {
  return links.closeAll();
}
