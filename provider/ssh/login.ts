/**
 * One SSH login (a hop): the host key checked against known_hosts (or the
 * explicit insecure opt-out), the credentials from auth.ts, ssh2's cipher
 * offer, one deadline over TCP connect, key exchange and authentication, and
 * a failure that says which of those went wrong and what to fix. Jump hosts
 * and the libvirt socket forward over a login: transport.ts.
 */
import { readFileSync } from "node:fs";
import { connect, type Socket } from "node:net";
import { homedir } from "node:os";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import type { Client, ClientChannel, ConnectConfig } from "ssh2";
import { bareHost, hostAndPort } from "./address";
import { resolveAuth } from "./auth";
import { cipherOffer, linkAlgorithms, ssh2CryptoFacts, type SshLinkAlgorithms } from "./ciphers";
import { SshAuthError, SshConfigError, SshConnectError, SshHostKeyError } from "./errors";
import type { SshHop } from "./jump";
import {
  isNoCommonHostKeyType,
  parseKnownHosts,
  pinnedHostKeyAlgorithms,
  pinnedKeyTypes,
  verifyHostKey,
  type KnownHostEntry,
} from "./known-hosts";
import { Ssh2Client } from "./ssh2-parts";

export interface SshLoginOptions {
  /** TCP connect + key exchange + authentication. Default 20 s. */
  handshakeTimeoutMs?: number;
  /** SSH keepalive: a ping every interval; the link is dead after countMax unanswered. Default 5 s × 3. */
  keepaliveIntervalMs?: number;
  keepaliveCountMax?: number;
  signal?: AbortSignal;
  /** Told the algorithms the SSH link negotiated (cipher, MAC, …; nothing secret), once, before login. */
  onHandshake?: (algorithms: SshLinkAlgorithms) => void;
  /** Told the local end of the TCP link once SSH is up (for logs, and for tests that find the server side). */
  onLinkEstablished?: (link: { localAddress: string; localPort: number }) => void;
}

/** What a dialled client's link is: our TCP socket and the client-to-server cipher of its latest key exchange. */
const links = new WeakMap<Client, { socket: Socket; cipher: string }>();

/** What each client logs in over: its TCP socket, or a jump host's forward (ssh2 keeps it private). */
const transports = new WeakMap<Client, Duplex>();

/** The TCP socket a client logged in over (none through a jump host) and its current cipher. */
export function tcpLinkOf(client: Client): { socket: Socket; cipher: string } | undefined {
  return links.get(client);
}

/** The stream a client logs in over: its TCP socket or a jump host's forward. */
export function loginTransportOf(client: Client): Duplex | undefined {
  return transports.get(client);
}

function loadKnownHosts(target: SshHop): KnownHostEntry[] {
  if (target.knownHosts !== undefined) return parseKnownHosts(target.knownHosts);
  const file = target.knownHostsFile ?? join(homedir(), ".ssh", "known_hosts");
  try {
    return parseKnownHosts(readFileSync(file, "utf8"));
  } catch (error) {
    throw new SshConfigError(
      `ssh knownHosts: cannot read ${file} (${(error as NodeJS.ErrnoException).code ?? "error"}); ` +
        "pass knownHosts content, point knownHostsFile at a readable file, " +
        "or (insecure) set insecureSkipHostKeyVerification",
      { cause: error },
    );
  }
}

/** Everything a login decides before the first byte: ssh2's config and what a failure message needs. */
interface LoginPlan {
  host: string;
  port: number;
  username: string;
  /** `user@host:port`, for messages. */
  where: string;
  handshakeTimeoutMs: number;
  config: ConnectConfig;
  /** The credentials offered, as a message lists them. */
  offered: string;
  nativeCrypto: boolean | null;
  /** Set by the host-key check when it refused the key. */
  hostKey: { error?: SshHostKeyError; pinned: string[] };
}

function planLogin(given: SshHop, options: SshLoginOptions): LoginPlan {
  const host = bareHost(given.host);
  const target = { ...given, host };
  const port = target.port ?? 22;
  const handshakeTimeoutMs = options.handshakeTimeoutMs ?? 20_000;
  const auth = resolveAuth(target.username, target);
  const config: ConnectConfig = {
    host,
    port,
    username: target.username,
    authHandler: auth.methods,
    readyTimeout: handshakeTimeoutMs,
    keepaliveInterval: options.keepaliveIntervalMs ?? 5000,
    keepaliveCountMax: options.keepaliveCountMax ?? 3,
  };
  const cryptoFacts = ssh2CryptoFacts();
  if (cryptoFacts) config.algorithms = { cipher: cipherOffer(cryptoFacts) as never };
  const hostKey: LoginPlan["hostKey"] = { pinned: [] };
  if (target.insecureSkipHostKeyVerification === true) {
    config.hostVerifier = () => true;
  } else {
    const entries = loadKnownHosts(target);
    const algorithms = pinnedHostKeyAlgorithms(entries, host, port);
    if (algorithms)
      config.algorithms = { ...config.algorithms, serverHostKey: algorithms as never };
    // The key types known_hosts pins for this host; empty when nothing is pinned.
    hostKey.pinned = pinnedKeyTypes(entries, host, port);
    config.hostVerifier = (key: Buffer): boolean => {
      const verdict = verifyHostKey(entries, host, port, key);
      if (!verdict.ok) hostKey.error = verdict.error;
      return verdict.ok;
    };
  }
  return {
    host,
    port,
    username: target.username,
    where: `${target.username}@${hostAndPort(host, port)}`,
    handshakeTimeoutMs,
    config,
    offered: auth.offered,
    nativeCrypto: cryptoFacts?.nativeBinding ?? null,
    hostKey,
  };
}

/** What ssh2's `error` during a login means, as an error that says what to fix. */
function loginFailure(
  error: Error & { level?: string },
  plan: LoginPlan,
  seen: { authenticating: boolean; agentProblem: string | undefined },
): Error {
  const { where, host, port, username } = plan;
  if (plan.hostKey.error) return plan.hostKey.error;
  if (plan.hostKey.pinned.length > 0 && isNoCommonHostKeyType(error))
    return new SshHostKeyError("type-not-offered", host, port, "", "", plan.hostKey.pinned);
  if (error.level === "client-authentication" || (seen.authenticating && isRefusedLogin(error)))
    return new SshAuthError(
      `ssh to ${where}: the host accepted none of the offered credentials ` +
        `(${plan.offered})` +
        (seen.agentProblem === undefined
          ? ""
          : `; the ssh-agent could not be used (${seen.agentProblem}): is SSH_AUTH_SOCK stale?`) +
        `; check that ${username} is the right user and that ` +
        `the key's public half is in ${username}'s authorized_keys on ${host}`,
      { cause: error },
    );
  if (error.level === "client-timeout")
    return new SshConnectError(
      `ssh to ${where}: no handshake within ${plan.handshakeTimeoutMs} ms`,
      { cause: error },
    );
  return new SshConnectError(`ssh to ${where} failed: ${error.message}`, { cause: error });
}

/**
 * sshd ends a login that used up MaxAuthTries with a disconnect ("Too many
 * authentication failures"), not an auth failure: it is the same "no".
 * Reason 14 is SSH_DISCONNECT_NO_MORE_AUTH_METHODS_AVAILABLE (RFC 4253).
 */
function isRefusedLogin(error: Error & { code?: unknown }): boolean {
  return error.code === 14 || /authentication failures|no more auth/i.test(error.message);
}

/** One SSH login: over a TCP connection of our own, or over `sock` (a forward from a jump host). */
export function dialOneHop(
  given: SshHop,
  options: SshLoginOptions,
  sock?: ClientChannel,
): Promise<Client> {
  const plan = planLogin(given, options);
  const { where, handshakeTimeoutMs, config } = plan;
  return new Promise<Client>((resolve, reject) => {
    const client = new Ssh2Client();
    const link: { socket?: Socket } = {};
    let settled = false;
    const finish = (error?: Error): void => {
      if (settled) return;
      settled = true;
      clearTimeout(backstop);
      options.signal?.removeEventListener("abort", onAbort);
      if (error) {
        client.removeAllListeners("ready");
        client.on("error", () => undefined);
        client.destroy();
        link.socket?.destroy();
        sock?.destroy();
        reject(error);
      } else {
        resolve(client);
      }
    };
    const onAbort = (): void =>
      finish(new SshConnectError(`ssh to ${where} was aborted`, { cause: options.signal?.reason }));
    // Covers TCP connect (and a DNS lookup that hangs) plus the SSH handshake as one deadline.
    const backstop = setTimeout(
      () =>
        finish(
          new SshConnectError(`ssh to ${where} did not complete within ${handshakeTimeoutMs} ms`),
        ),
      handshakeTimeoutMs,
    );
    backstop.unref();
    if (options.signal?.aborted) {
      onAbort();
      return;
    }
    options.signal?.addEventListener("abort", onAbort, { once: true });
    /** An agent that cannot be reached or cannot sign: ssh2 says so and goes on with the next key. */
    const seen = { authenticating: false, agentProblem: undefined as string | undefined };
    client.once("handshake", (negotiated) => {
      seen.authenticating = true;
      options.onHandshake?.(linkAlgorithms(negotiated, plan.nativeCrypto));
    });
    // Every key exchange (a rekey too) says which cipher the next packets use.
    client.on("handshake", (negotiated) => {
      if (link.socket) links.set(client, { socket: link.socket, cipher: negotiated.cs.cipher });
    });
    client.once("ready", () => {
      options.onLinkEstablished?.({
        localAddress: link.socket?.localAddress ?? "",
        localPort: link.socket?.localPort ?? 0,
      });
      finish();
    });
    client.on("error", (error: Error & { level?: string }) => {
      if (error.level === "agent") seen.agentProblem = error.message;
      else finish(loginFailure(error, plan, seen));
    });
    client.once("close", () =>
      finish(new SshConnectError(`ssh to ${where}: the connection closed during login`)),
    );
    if (sock !== undefined) {
      transports.set(client, sock);
      client.connect({ ...config, sock });
      return;
    }
    // We open the TCP connection ourselves so the deadline covers it and we know our end of it.
    const tcp = connect({ host: plan.host, port: plan.port });
    link.socket = tcp;
    transports.set(client, tcp);
    tcp.setNoDelay(true);
    tcp.once("error", (error) =>
      finish(new SshConnectError(`ssh to ${where} failed: ${error.message}`, { cause: error })),
    );
    tcp.once("connect", () => {
      tcp.removeAllListeners("error");
      client.connect({ ...config, sock: tcp });
    });
  });
}
