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
import type { Duplex } from "node:stream";
import { Client, type ClientChannel, type ConnectConfig } from "ssh2";
import {
  LibvirtConnection,
  LibvirtTransportError,
  type ConnectionOptions,
} from "../libvirt-rpc-xdr";
import { bareHost, hostAndPort } from "./address";
import { resolveAuth } from "./auth";
import { installChannelDataWriter, type ChannelDataWriter } from "./channel-data";
import { describeHop, type SshHop } from "./jump";
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

/** The hypervisor: a hop of its own (user, credentials, host key) plus where libvirt listens there. */
export interface SshTarget extends SshHop {
  /** libvirtd's socket on the host. Default /var/run/libvirt/libvirt-sock. */
  socketPath?: string;
  /** URI for CONNECT_OPEN. Default qemu:///system. */
  uri?: string;
  /** Jump hosts, first to last: the host is reached through a TCP forward from the last one. */
  jumps?: SshHop[];
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
  /**
   * Seal the libvirt channel's data packets ourselves when ssh2 encrypts in
   * JavaScript (see channel-data.ts). Default true; false leaves every packet
   * to ssh2 (for comparison and tests).
   */
  sealChannelData?: boolean;
  /** Told whether our sealing took over the libvirt channel (its packet counts) or ssh2 seals every packet (null). */
  onChannelData?: (sealing: ChannelDataWriter | null) => void;
}

/** What a dialled client's link is: our TCP socket and the client-to-server cipher of its latest key exchange. */
const links = new WeakMap<Client, { socket: Socket; cipher: string }>();

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

/** What each client dialSsh made logs in over: its TCP socket, or a jump host's forward (ssh2 keeps it private). */
const transportOf = new WeakMap<Client, Duplex>();

/**
 * Logs in over SSH and returns the ready ssh2 client; through the target's
 * jump hosts first when it has some, each logged into in turn over a TCP
 * forward from the one before. The jump links end when the returned client
 * closes; an error says which hop failed.
 */
export async function dialSsh(target: SshTarget, options: SshDialOptions = {}): Promise<Client> {
  const jumps = target.jumps ?? [];
  if (jumps.length === 0) return dialOneHop(target, options);
  const opened: Client[] = [];
  const releaseJumps = (): void => {
    for (const client of opened.reverse()) releaseSshClient(client);
  };
  const hopOptions: SshDialOptions = {
    ...options,
    onHandshake: undefined,
    onLinkEstablished: undefined,
  };
  const forwardTimeoutMs = options.forwardTimeoutMs ?? 10_000;
  try {
    let through: { client: Client; name: string } | undefined;
    for (const [index, hop] of jumps.entries()) {
      const name = describeHop(
        index,
        jumps.length,
        `${hop.username}@${hostAndPort(hop.host, hop.port ?? 22)}`,
      );
      const sock =
        through && (await forwardTcp(through.client, hop, forwardTimeoutMs, through.name));
      const client = await dialOneHop(hop, hopOptions, sock).catch((error: unknown) => {
        throw namedAfter(error, name);
      });
      opened.push(client);
      through = { client, name };
    }
    const sock = await forwardTcp(through!.client, target, forwardTimeoutMs, through!.name);
    const client = await dialOneHop(target, options, sock);
    client.once("close", releaseJumps);
    return client;
  } catch (error) {
    releaseJumps();
    throw error;
  }
}

/** The same error, its message led by the hop it came from (the class, and so the error class, stays). */
function namedAfter(error: unknown, hop: string): unknown {
  if (error instanceof Error) error.message = `${hop}: ${error.message}`;
  return error;
}

/** A TCP connection to the next host, opened by the hop before it. */
function forwardTcp(
  client: Client,
  next: { host: string; port?: number },
  timeoutMs: number,
  hop: string,
): Promise<ClientChannel> {
  const where = hostAndPort(next.host, next.port ?? 22);
  return channelWithin(
    timeoutMs,
    (opened) => client.forwardOut("127.0.0.1", 0, bareHost(next.host), next.port ?? 22, opened),
    () =>
      new SshConnectError(
        `${hop}: opening a connection to ${where} took longer than ${timeoutMs} ms`,
      ),
    (error) =>
      new SshConnectError(
        `${hop} cannot open a connection to ${where}: ${error.message}; check that the jump host reaches it ` +
          "and that its sshd allows TCP forwarding (AllowTcpForwarding)",
        { cause: error },
      ),
  );
}

/** A channel ssh2 opens with a callback, within a deadline; one that comes too late is closed, not leaked. */
function channelWithin(
  timeoutMs: number,
  open: (opened: (error: Error | undefined, channel: ClientChannel) => void) => void,
  late: () => Error,
  refused: (error: Error) => Error,
): Promise<ClientChannel> {
  return new Promise<ClientChannel>((resolve, reject) => {
    let settled = false;
    const timer = setTimeout(() => {
      settled = true;
      reject(late());
    }, timeoutMs);
    timer.unref();
    open((error, channel) => {
      clearTimeout(timer);
      if (settled) {
        channel?.destroy();
        return;
      }
      settled = true;
      if (error) reject(refused(error));
      else resolve(channel);
    });
  });
}

/** One SSH login: over a TCP connection of our own, or over `sock` (a forward from a jump host). */
function dialOneHop(given: SshHop, options: SshDialOptions, sock?: ClientChannel): Promise<Client> {
  const target = { ...given, host: bareHost(given.host) };
  const port = target.port ?? 22;
  const handshakeTimeoutMs = options.handshakeTimeoutMs ?? 20_000;
  const where = `${target.username}@${hostAndPort(target.host, port)}`;
  let hostKeyError: SshHostKeyError | undefined;
  /** The key types known_hosts pins for this host; empty when unverified or nothing is pinned. */
  let pinned: string[] = [];
  const auth = resolveAuth(target.username, target);
  const config: ConnectConfig = {
    host: target.host,
    port,
    username: target.username,
    authHandler: auth.methods,
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
    let authenticating = false;
    /** An agent that cannot be reached or cannot sign: ssh2 says so and goes on with the next key. */
    let agentProblem: string | undefined;
    client.once("handshake", (negotiated) => {
      authenticating = true;
      options.onHandshake?.(linkAlgorithms(negotiated, cryptoFacts?.nativeBinding ?? null));
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
      if (error.level === "agent") {
        agentProblem = error.message;
        return;
      }
      if (hostKeyError) finish(hostKeyError);
      else if (pinned.length > 0 && isNoCommonHostKeyType(error)) {
        finish(new SshHostKeyError("type-not-offered", target.host, port, "", "", pinned));
      } else if (
        error.level === "client-authentication" ||
        (authenticating && isRefusedLogin(error))
      ) {
        finish(
          new SshAuthError(
            `ssh to ${where}: the host accepted none of the offered credentials ` +
              `(${auth.offered})` +
              (agentProblem === undefined
                ? ""
                : `; the ssh-agent could not be used (${agentProblem}): is SSH_AUTH_SOCK stale?`) +
              `; check that ${target.username} is the right user and that ` +
              `the key's public half is in ${target.username}'s authorized_keys on ${target.host}`,
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
    if (sock !== undefined) {
      transportOf.set(client, sock);
      client.connect({ ...config, sock });
      return;
    }
    // We open the TCP connection ourselves so the deadline covers it and we know our end of it.
    const tcp = connect({ host: target.host, port });
    link.socket = tcp;
    transportOf.set(client, tcp);
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

/**
 * sshd ends a login that used up MaxAuthTries with a disconnect ("Too many
 * authentication failures"), not an auth failure: it is the same "no".
 * Reason 14 is SSH_DISCONNECT_NO_MORE_AUTH_METHODS_AVAILABLE (RFC 4253).
 */
function isRefusedLogin(error: Error & { code?: unknown }): boolean {
  return error.code === 14 || /authentication failures|no more auth/i.test(error.message);
}

function forwardSocket(
  client: Client,
  socketPath: string,
  timeoutMs: number,
  where: string,
): Promise<ClientChannel> {
  return channelWithin(
    timeoutMs,
    (opened) => client.openssh_forwardOutStreamLocal(socketPath, opened),
    () =>
      new SshConnectError(
        `ssh ${where}: forwarding ${socketPath} took longer than ${timeoutMs} ms`,
      ),
    (error) =>
      new SshConnectError(
        `ssh ${where}: cannot forward ${socketPath}: ${error.message}; ` +
          "is libvirtd running there, is the SSH user allowed to use the socket (root, or in the libvirt group: " +
          "usermod -aG libvirt <user>, effective from the next login), and does its sshd allow socket forwarding " +
          "(AllowStreamLocalForwarding yes, and AllowTcpForwarding not no or remote: it gates socket forwards too)?",
        { cause: error },
      ),
  );
}

/**
 * Lets channel-data.ts seal `channel`'s data packets when ssh2 encrypts in
 * JavaScript (with its native binding ssh2 is fast on its own); null when it
 * does not take over.
 */
export function sealChannelData(client: Client, channel: ClientChannel): ChannelDataWriter | null {
  const link = links.get(client);
  if (!link || ssh2CryptoFacts()?.nativeBinding !== false) return null;
  return installChannelDataWriter(client, link.socket, channel, () => links.get(client)!.cipher);
}

/**
 * Right after login sshd sends several things in a row: the host-key
 * announcement (hostkeys-00), its answer to ssh2's proof request, our
 * channel's confirmation, the libvirt handshake's replies. sshd sets
 * TCP_NODELAY only for interactive sessions, so Nagle holds each of those
 * segments until the one before is acknowledged, and Linux delays that
 * acknowledgement up to 40 ms when we have nothing to send: most logins
 * waited 40 ms for the channel, and the handshake's replies often waited
 * behind the proof's answer (which the libvirt layer never sees, so its own
 * AcknowledgementNudge cannot react to it). So, until the libvirt handshake
 * is done, any data that arrives gets an SSH packet back in the next turn,
 * which carries the acknowledgement at once.
 * The packet is OpenSSH's no-more-sessions: it has no reply, and this link
 * never opens a session (it only forwards libvirt's socket). A server that is
 * not OpenSSH gets nothing (ssh2 sends it to OpenSSH only). Through a jump
 * host the same holds for the jump host's connection to the target, which the
 * packet crosses. Returns the stop.
 */
function acknowledgeWhileForwarding(client: Client): () => void {
  const transport = transportOf.get(client);
  if (transport === undefined) return () => undefined;
  let next: NodeJS.Immediate | undefined;
  const onData = (): void => {
    next ??= setImmediate(() => {
      next = undefined;
      if (!transport.writable) return;
      try {
        // No callback: no reply asked (ssh2's types demand one; its code does not).
        (client.openssh_noMoreSessions as () => Client).call(client);
      } catch {
        // The link closed meanwhile: forwardSocket reports that.
      }
    });
  };
  transport.on("data", onData);
  return () => {
    transport.off("data", onData);
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
  const where = `${target.username}@${hostAndPort(target.host, target.port ?? 22)}`;
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
    );
    const sealing = options.sealChannelData === false ? null : sealChannelData(client, channel);
    options.onChannelData?.(sealing);
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
  } finally {
    stopAcknowledging();
  }
}
