/**
 * libvirt over SSH with ssh2: log in, forward the host's libvirt unix socket
 * (direct-streamlocal@openssh.com, what `ssh -L local:/var/run/...` uses) and
 * speak the libvirt protocol over that channel. No ssh binary, no libvirt
 * library. Host keys are verified against known_hosts unless the caller
 * explicitly chooses the insecure opt-out.
 *
 * Deadlines: the SSH handshake (TCP connect + key exchange + auth) has its
 * own; opening the forward and the libvirt handshake have theirs. Dead links
 * are found by SSH keepalives (a silent peer) and libvirt keepalives.
 */
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { connect, type Socket } from "node:net";
import { join } from "node:path";
import { Client, type ClientChannel, type ConnectConfig } from "ssh2";
import {
  LibvirtConnection,
  LibvirtTransportError,
  type ConnectionOptions,
} from "../libvirt-rpc-xdr";
import { resolveAuthMethods, type SshCredentials } from "./auth";
import { cipherOffer, linkAlgorithms, ssh2CryptoFacts, type SshLinkAlgorithms } from "./ciphers";
import { SshAuthError, SshConfigError, SshConnectError, SshHostKeyError } from "./errors";
import {
  isNoCommonHostKeyType,
  parseKnownHosts,
  pinnedHostKeyAlgorithms,
  pinnedKeyTypes,
  verifyHostKey,
  type KnownHostEntry,
} from "./known-hosts";
import { DEFAULT_LIBVIRT_SOCKET } from "./local";

export interface SshTarget extends SshCredentials {
  host: string;
  /** Default 22. */
  port?: number;
  username: string;
  /** known_hosts content. Wins over `knownHostsFile`. */
  knownHosts?: string;
  /** known_hosts file; default ~/.ssh/known_hosts. */
  knownHostsFile?: string;
  /**
   * INSECURE: accept any host key. Anyone on the path can then impersonate
   * the hypervisor and read everything, including cloud-init secrets.
   */
  insecureSkipHostKeyVerification?: boolean;
  /** libvirtd's socket on the host. Default /var/run/libvirt/libvirt-sock. */
  socketPath?: string;
  /** URI for CONNECT_OPEN. Default qemu:///system. */
  uri?: string;
}

export interface SshDialOptions {
  /** TCP connect + key exchange + authentication. Default 20 s. */
  handshakeTimeoutMs?: number;
  /** Opening the socket forward. Default 10 s. */
  forwardTimeoutMs?: number;
  /** SSH keepalive: a ping every interval; the link is dead after countMax unanswered. Default 5 s × 3. */
  keepaliveIntervalMs?: number;
  keepaliveCountMax?: number;
  signal?: AbortSignal;
  /** Told the algorithms the SSH link negotiated (cipher, MAC, …; nothing secret), once, before login. */
  onHandshake?: (algorithms: SshLinkAlgorithms) => void;
  /** Told the local end of the TCP link once SSH is up (for logs, and for tests that find the server side). */
  onLinkEstablished?: (link: { localAddress: string; localPort: number }) => void;
  /** libvirt connection options (default call deadline, libvirt keepalive, handshake deadline). */
  libvirt?: Omit<ConnectionOptions, "uri" | "signal" | "onClosed">;
}

function loadKnownHosts(target: SshTarget): KnownHostEntry[] {
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

/** Logs in over SSH and returns the ready ssh2 client. */
/** The TCP socket under each client dialSsh made (ssh2 keeps its own reference private). */
const socketOf = new WeakMap<Client, Socket>();

export function dialSsh(target: SshTarget, options: SshDialOptions = {}): Promise<Client> {
  const port = target.port ?? 22;
  const handshakeTimeoutMs = options.handshakeTimeoutMs ?? 20_000;
  const where = `${target.username}@${target.host}:${port}`;
  let hostKeyError: SshHostKeyError | undefined;
  /** The key types known_hosts pins for this host; empty when unverified or nothing is pinned. */
  let pinned: string[] = [];
  const config: ConnectConfig = {
    host: target.host,
    port,
    username: target.username,
    authHandler: resolveAuthMethods(target.username, target),
    readyTimeout: handshakeTimeoutMs,
    keepaliveInterval: options.keepaliveIntervalMs ?? 5000,
    keepaliveCountMax: options.keepaliveCountMax ?? 3,
  };
  const cryptoFacts = ssh2CryptoFacts();
  if (cryptoFacts) config.algorithms = { cipher: cipherOffer(cryptoFacts) as never };
  if (target.insecureSkipHostKeyVerification === true) {
    config.hostVerifier = () => true;
  } else {
    const entries = loadKnownHosts(target);
    const algorithms = pinnedHostKeyAlgorithms(entries, target.host, port);
    if (algorithms)
      config.algorithms = { ...config.algorithms, serverHostKey: algorithms as never };
    pinned = pinnedKeyTypes(entries, target.host, port);
    config.hostVerifier = (key: Buffer): boolean => {
      const verdict = verifyHostKey(entries, target.host, port, key);
      if (!verdict.ok) hostKeyError = verdict.error;
      return verdict.ok;
    };
  }

  return new Promise<Client>((resolve, reject) => {
    const client = new Client();
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
    client.once("handshake", (negotiated) =>
      options.onHandshake?.(linkAlgorithms(negotiated, cryptoFacts?.nativeBinding ?? null)),
    );
    client.once("ready", () => {
      options.onLinkEstablished?.({
        localAddress: link.socket?.localAddress ?? "",
        localPort: link.socket?.localPort ?? 0,
      });
      finish();
    });
    client.on("error", (error: Error & { level?: string }) => {
      if (hostKeyError) finish(hostKeyError);
      else if (pinned.length > 0 && isNoCommonHostKeyType(error)) {
        finish(new SshHostKeyError("type-not-offered", target.host, port, "", "", pinned));
      } else if (error.level === "client-authentication") {
        finish(
          new SshAuthError(
            `ssh to ${where}: the host accepted none of the offered credentials; ` +
              "check the user name and that the key is in the host's authorized_keys",
            { cause: error },
          ),
        );
      } else if (error.level === "client-timeout") {
        finish(
          new SshConnectError(`ssh to ${where}: no handshake within ${handshakeTimeoutMs} ms`, {
            cause: error,
          }),
        );
      } else {
        finish(new SshConnectError(`ssh to ${where} failed: ${error.message}`, { cause: error }));
      }
    });
    client.once("close", () =>
      finish(new SshConnectError(`ssh to ${where}: the connection closed during login`)),
    );
    // We open the TCP connection ourselves so the deadline covers it and we know our end of it.
    const tcp = connect({ host: target.host, port });
    link.socket = tcp;
    socketOf.set(client, tcp);
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

function forwardSocket(
  client: Client,
  socketPath: string,
  timeoutMs: number,
  where: string,
): Promise<ClientChannel> {
  return new Promise<ClientChannel>((resolve, reject) => {
    let settled = false;
    const timer = setTimeout(() => {
      settled = true;
      reject(
        new SshConnectError(
          `ssh ${where}: forwarding ${socketPath} took longer than ${timeoutMs} ms`,
        ),
      );
    }, timeoutMs);
    timer.unref();
    client.openssh_forwardOutStreamLocal(socketPath, (error, channel) => {
      clearTimeout(timer);
      if (settled) {
        channel?.destroy();
        return;
      }
      settled = true;
      if (error) {
        reject(
          new SshConnectError(
            `ssh ${where}: cannot forward ${socketPath}: ${error.message}; ` +
              "is libvirtd running there, is the SSH user allowed to use the socket (root, or in the libvirt group: " +
              "usermod -aG libvirt <user>, effective from the next login), and does sshd allow AllowStreamLocalForwarding?",
            { cause: error },
          ),
        );
      } else {
        resolve(channel);
      }
    });
  });
}

/**
 * Right after login sshd sends several things in a row: the host-key
 * announcement (hostkeys-00), its answer to ssh2's proof request, our
 * channel's confirmation. sshd sets TCP_NODELAY only for interactive
 * sessions, so Nagle holds each of those segments until the one before is
 * acknowledged, and Linux delays that acknowledgement up to 40 ms when we
 * have nothing to send: most logins waited 40 ms for the channel. So, until
 * the channel is confirmed, any data that arrives gets an SSH packet back in
 * the next turn, which carries the acknowledgement at once (the libvirt
 * layer's AcknowledgementNudge does the same once the channel is there).
 * The packet is OpenSSH's no-more-sessions: it has no reply, and this link
 * never opens a session (it only forwards libvirt's socket). A server that is
 * not OpenSSH gets nothing (ssh2 sends it to OpenSSH only). Returns the stop.
 */
function acknowledgeWhileForwarding(client: Client): () => void {
  const socket = socketOf.get(client);
  if (socket === undefined) return () => undefined;
  let next: NodeJS.Immediate | undefined;
  const onData = (): void => {
    next ??= setImmediate(() => {
      next = undefined;
      if (!socket.writable) return;
      try {
        // No callback: no reply asked (ssh2's types demand one; its code does not).
        (client.openssh_noMoreSessions as () => Client).call(client);
      } catch {
        // The link closed meanwhile: forwardSocket reports that.
      }
    });
  };
  socket.on("data", onData);
  return () => {
    socket.off("data", onData);
    if (next !== undefined) clearImmediate(next);
  };
}

/** Ends an ssh2 client without waiting on the peer: polite end, then destroy shortly after. */
export function releaseSshClient(client: Client): void {
  client.on("error", () => undefined);
  client.end();
  const timer = setTimeout(() => client.destroy(), 500);
  timer.unref();
}

/**
 * SSH to the host, forward its libvirt socket and open a libvirt connection
 * over it. Closing the libvirt connection also ends the SSH session; losing
 * the SSH session fails every libvirt call in flight at once.
 */
export async function openLibvirtOverSsh(
  target: SshTarget,
  options: SshDialOptions = {},
): Promise<LibvirtConnection> {
  const port = target.port ?? 22;
  const where = `${target.username}@${target.host}:${port}`;
  const client = await dialSsh(target, options);
  let connection: LibvirtConnection | undefined;
  const linkLost = (reason: string) => (): void => {
    connection?.destroy(new LibvirtTransportError("io", `ssh link to ${where} ${reason}`));
  };
  client.on("error", (error: Error) => linkLost(`failed: ${error.message}`)());
  client.on("close", linkLost("closed"));
  const stopAcknowledging = acknowledgeWhileForwarding(client);
  try {
    const channel = await forwardSocket(
      client,
      target.socketPath ?? DEFAULT_LIBVIRT_SOCKET,
      options.forwardTimeoutMs ?? 10_000,
      where,
    ).finally(stopAcknowledging);
    connection = await LibvirtConnection.open(channel, {
      ...options.libvirt,
      uri: target.uri ?? "qemu:///system",
      ...(options.signal ? { signal: options.signal } : {}),
      onClosed: () => releaseSshClient(client),
    });
    return connection;
  } catch (error) {
    releaseSshClient(client);
    throw error;
  }
}
