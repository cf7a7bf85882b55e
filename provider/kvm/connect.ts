/**
 * One libvirt connection per host for the whole provider process: the
 * dynamic provider serves every KvmProxy of a `pulumi up` from one process,
 * so ten proxies on one host share one SSH login and one libvirt link. A
 * dead link is dialled again on the next use; an idle one is closed so the
 * process can exit. Nothing here is captured by the serialized provider.
 */
import type { Deadline } from "../common/deadline";
import { SecretValue } from "../common/redact";
import type { CallCounter, LibvirtConnection } from "../libvirt-rpc-xdr";
import {
  LibvirtConnectionPool,
  openLibvirtOverSsh,
  openLocalLibvirt,
  parseProxyJump,
  sshTargetKey,
  type SshHop,
  type SshTarget,
} from "../ssh";
import { classifyLibvirtError } from "./classify";
import { LibvirtHost } from "./host";
import { hostLabel } from "./naming";
import type { JumpHostInput, KvmProxyInputs } from "./schema";

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
  // A refused login names where its key came from.
  const keySource =
    privateKeySource ??
    (connection.privateKey !== undefined
      ? "connection.privateKey"
      : `provider config ${KVM_CONFIG_KEYS.privateKey}`);
  const inherited = {
    privateKey: connection.privateKey ?? configured.privateKey,
    passphrase: connection.passphrase ?? configured.passphrase,
    knownHosts: connection.knownHosts ?? configured.knownHosts,
    agentSocket: connection.agentSocket,
  };
  return {
    kind: "ssh",
    host: connection.host,
    port: connection.port,
    username: connection.user,
    socketPath,
    dialTimeoutMs: connection.dialTimeoutSeconds * 1000,
    insecureSkipHostKeyVerification: connection.insecureIgnoreHostKey,
    ...sshLoginOf(inherited),
    ...(inherited.privateKey === undefined ? {} : { privateKeySource: keySource }),
    ...(connection.proxyJump === undefined
      ? {}
      : { jumps: jumpHostsOf(connection.proxyJump, connection.user, inherited, keySource) }),
  };
}

type Connection = NonNullable<HostTarget["connection"]>;
type LoginSettings = Partial<
  Record<"privateKey" | "passphrase" | "knownHosts" | "agentSocket", string>
>;

/** Credentials and known_hosts as the SSH layer takes them: keys and passphrases kept secret. */
function sshLoginOf(settings: LoginSettings): Partial<SshHop> {
  return {
    ...optional("privateKey", settings.privateKey, (key) => new SecretValue(key)),
    ...optional("passphrase", settings.passphrase, (phrase) => new SecretValue(phrase)),
    ...optional("knownHosts", settings.knownHosts, (text) => text),
    ...optional("agentSocket", settings.agentSocket, (path) => path),
  };
}

/**
 * connection.proxyJump as hops. A hop without a user logs in as the
 * connection's user; one without a key or agent of its own uses the
 * connection's (a key with its passphrase, or the agent); one without
 * known_hosts uses the connection's. Skipping the host-key check is never
 * inherited: each hop says so itself.
 */
function jumpHostsOf(
  proxyJump: NonNullable<Connection["proxyJump"]>,
  user: string,
  inherited: LoginSettings,
  inheritedKeySource: string,
): SshHop[] {
  const hops: JumpHostInput[] = proxyJump.flatMap((item) =>
    typeof item !== "string"
      ? [item]
      : parseProxyJump(item, "connection.proxyJump").map((hop) => ({
          host: hop.host,
          port: hop.port ?? 22,
          insecureIgnoreHostKey: false,
          ...(hop.user === undefined ? {} : { user: hop.user }),
        })),
  );
  return hops.map((hop) => {
    const ownCredentials = hop.privateKey !== undefined || hop.agentSocket !== undefined;
    const credentials: LoginSettings = ownCredentials
      ? { privateKey: hop.privateKey, passphrase: hop.passphrase, agentSocket: hop.agentSocket }
      : inherited;
    // A hop with a key of its own is one of proxyJump's objects (the one-line form carries none).
    const keySource = ownCredentials
      ? `connection.proxyJump[${proxyJump.indexOf(hop)}].privateKey`
      : inheritedKeySource;
    return {
      host: hop.host,
      port: hop.port,
      username: hop.user ?? user,
      insecureSkipHostKeyVerification: hop.insecureIgnoreHostKey,
      ...sshLoginOf({ ...credentials, knownHosts: hop.knownHosts ?? inherited.knownHosts }),
      ...(credentials.privateKey === undefined ? {} : { privateKeySource: keySource }),
    };
  });
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

/** Counts the libvirt calls of this process's links by procedure (tests, benches); undefined stops. */
export function countLibvirtCalls(counter: CallCounter | undefined): void {
  links.countCallsInto(counter);
}

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
  const hostKey = keyOf(dialTarget);
  return {
    host: new LibvirtHost(linkWithin(deadline), label, deadline, hostKey),
    within: (budget) => new LibvirtHost(linkWithin(budget), label, budget, hostKey),
    hostKey,
    label,
  };
}

/**
 * The pooled link itself, for the reaper's listing: the same link KvmProxy's
 * delete then uses, so a sweep holds one link per host. Not closed by the
 * caller: closeAllHosts ends it after the run.
 */
export async function openPooledLink(
  target: HostTarget,
  timeoutMs: number,
  { privateKeySource }: { privateKeySource?: string } = {},
): Promise<LibvirtConnection> {
  try {
    return await links.get(dialTargetOf(target, privateKeySource), { timeoutMs });
  } catch (error) {
    throw classifyLibvirtError(error, {
      operation: "connect",
      resource: hostLabel(target.connection),
    });
  }
}

/** Calls in flight on this process's links (tests check that a failed create leaves none). */
export const callsInFlight = (): number => links.callsInFlight;

/** Closes every pooled link (tests, and the end of a provider process). */
export function closeAllHosts(): Promise<void> {
  return links.closeAll();
}
