/**
 * libvirt over SSH with ssh2: log in (login.ts; through jump hosts when the
 * target has some), forward the host's libvirt unix socket
 * (direct-streamlocal@openssh.com, what `ssh -L local:/var/run/...` uses) and
 * speak the libvirt protocol over that channel. No ssh binary, no libvirt
 * library. Host keys are verified against known_hosts unless the caller
 * explicitly chooses the insecure opt-out.
 *
 * Deadlines: the SSH handshake (TCP connect + key exchange + auth) has its
 * own; opening the forward and the libvirt handshake have theirs. Dead links
 * are found by SSH keepalives (a silent peer) and libvirt keepalives.
 */
import type { Client, ClientChannel } from "ssh2";
import {
  LibvirtConnection,
  LibvirtTransportError,
  type ConnectionOptions,
} from "../libvirt-rpc-xdr";
import { bareHost, hostAndPort } from "./address";
import { installChannelDataWriter, type ChannelDataWriter } from "./channel-data";
import { ssh2CryptoFacts } from "./ciphers";
import { SshConnectError } from "./errors";
import { describeHop, type SshHop } from "./jump";
import { DEFAULT_LIBVIRT_SOCKET } from "./local";
import { dialOneHop, loginTransportOf, tcpLinkOf, type SshLoginOptions } from "./login";

/** The hypervisor: a hop of its own (user, credentials, host key) plus where libvirt listens there. */
export interface SshTarget extends SshHop {
  /** libvirtd's socket on the host. Default /var/run/libvirt/libvirt-sock. */
  socketPath?: string;
  /** URI for CONNECT_OPEN. Default qemu:///system. */
  uri?: string;
  /** Jump hosts, first to last: the host is reached through a TCP forward from the last one. */
  jumps?: SshHop[];
}

/** A login's options (login.ts) and what comes after it: the forward and the libvirt connection. */
export interface SshDialOptions extends SshLoginOptions {
  /** Opening the socket forward. Default 10 s. */
  forwardTimeoutMs?: number;
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
  const link = tcpLinkOf(client);
  if (!link || ssh2CryptoFacts()?.nativeBinding !== false) return null;
  return installChannelDataWriter(client, link.socket, channel, () => tcpLinkOf(client)!.cipher);
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
  const transport = loginTransportOf(client);
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
