/**
 * A scripted libvirt peer on an in-memory duplex pair, only for what a real
 * daemon will not do on demand: go silent, answer out of order, send garbage,
 * fail a stream at an exact moment, hold back drain.
 */
import { Duplex } from "node:stream";
import {
  KEEPALIVE_PROGRAM,
  LibvirtConnection,
  MessageStatus,
  MessageType,
  PacketDecoder,
  REMOTE_PROGRAM,
  XdrWriter,
  encodePacket,
  writeRemoteError,
  type ConnectionOptions,
  type Packet,
  type RemoteErrorFields,
} from "../../../provider/libvirt-rpc-xdr";

export class FakeDaemon {
  readonly clientSide: Duplex;
  readonly received: Packet[] = [];
  private readonly decoder = new PacketDecoder();
  private waiters: { match: (p: Packet) => boolean; resolve: (p: Packet) => void }[] = [];
  /** When set, the client's writes are not acknowledged (its write() returns false until released). */
  private heldWrites: (() => void)[] = [];
  holdWrites = false;
  /** Answer the handshake automatically. */
  autoHandshake = true;
  /** What AUTH_LIST answers: a list of auth types, or "unknown procedure" like an old daemon. */
  authTypes: number[] | "unknown-procedure" = [0];
  /** Polkit authentication has run (a daemon that asks for it refuses other calls until then). */
  private authenticated = false;
  /**
   * Refuse the first keepalive check and open as libvirtd does when they overtake AUTH_LIST on a
   * polkit socket that AUTH_LIST opens to root (it runs a client's calls side by side).
   */
  refuseCallsThatOvertakeAuthList = false;

  constructor(options: { clientHighWaterMark?: number } = {}) {
    // eslint-disable-next-line @typescript-eslint/no-this-alias
    const daemon = this;
    this.clientSide = new Duplex({
      writableHighWaterMark: options.clientHighWaterMark ?? 16 * 1024,
      read() {},
      write(chunk: Buffer, _encoding, callback) {
        for (const packet of daemon.decoder.push(chunk)) daemon.onPacket(packet);
        if (daemon.holdWrites) daemon.heldWrites.push(callback);
        else callback();
      },
    });
  }

  releaseWrites(): void {
    this.holdWrites = false;
    for (const callback of this.heldWrites.splice(0)) callback();
  }

  private onPacket(packet: Packet): void {
    this.received.push(packet);
    if (this.autoHandshake && packet.header.type === MessageType.CALL) {
      const { procedure } = packet.header;
      if (procedure === 66) {
        if (this.authTypes === "unknown-procedure") {
          return this.replyError(packet, { code: 39, domain: 7, message: "unknown procedure: 66" });
        }
        return this.reply(
          packet,
          new XdrWriter().array(this.authTypes, 20, (w, t) => w.int(t)).finish(),
        );
      }
      if (procedure === 70) {
        this.authenticated = true;
        return this.reply(packet, new XdrWriter().int(1).finish());
      }
      if ((procedure === 60 || procedure === 1) && this.refuseCallsThatOvertakeAuthList) {
        if (procedure === 1) this.refuseCallsThatOvertakeAuthList = false;
        return this.replyError(packet, { code: 39, domain: 7, message: "authentication required" });
      }
      // libvirtd's dispatcher: every call but the AUTH_* ones needs authentication first.
      if (
        (procedure === 60 || procedure === 1) &&
        Array.isArray(this.authTypes) &&
        !this.authTypes.includes(0) &&
        !this.authenticated
      )
        return this.replyError(packet, { code: 39, domain: 7, message: "authentication required" });
      if (procedure === 60) return this.reply(packet, new XdrWriter().int(1).finish());
      if (procedure === 1) return this.reply(packet);
    }
    const index = this.waiters.findIndex((w) => w.match(packet));
    if (index >= 0) this.waiters.splice(index, 1)[0]!.resolve(packet);
  }

  /** Resolves with the next packet (already received or future) that matches. */
  next(match: (p: Packet) => boolean = () => true, afterIndex = 0): Promise<Packet> {
    const seen = this.received.slice(afterIndex).find(match);
    if (seen) {
      this.received.splice(this.received.indexOf(seen), 1);
      return Promise.resolve(seen);
    }
    return new Promise((resolve) =>
      this.waiters.push({
        match,
        resolve: (p) => {
          this.received.splice(this.received.indexOf(p), 1);
          resolve(p);
        },
      }),
    );
  }

  nextCall(procedure: number): Promise<Packet> {
    return this.next((p) => p.header.type === MessageType.CALL && p.header.procedure === procedure);
  }

  nextStream(serial: number, status?: number): Promise<Packet> {
    return this.next(
      (p) =>
        p.header.type === MessageType.STREAM &&
        p.header.serial === serial &&
        (status === undefined || p.header.status === status),
    );
  }

  send(bytes: Buffer): void {
    this.clientSide.push(bytes);
  }

  reply(call: Packet, body: Buffer = Buffer.alloc(0), status: number = MessageStatus.OK): void {
    this.send(encodePacket({ ...call.header, type: MessageType.REPLY, status }, body));
  }

  replyError(call: Packet, error: Partial<RemoteErrorFields> = {}): void {
    this.reply(call, remoteErrorBody(error), MessageStatus.ERROR);
  }

  stream(call: Packet, status: number, body: Buffer = Buffer.alloc(0)): void {
    this.send(encodePacket({ ...call.header, type: MessageType.STREAM, status }, body));
  }

  ping(): void {
    this.send(
      encodePacket({
        program: KEEPALIVE_PROGRAM,
        version: 1,
        procedure: 1,
        type: MessageType.MESSAGE,
        serial: 0,
        status: 0,
      }),
    );
  }

  event(): void {
    this.send(
      encodePacket(
        {
          program: REMOTE_PROGRAM,
          version: 1,
          procedure: 107,
          type: MessageType.MESSAGE,
          serial: 0,
          status: 0,
        },
        Buffer.alloc(40, 1),
      ),
    );
  }

  /** The peer vanishes (like a killed process). */
  hangUp(): void {
    this.clientSide.push(null);
  }

  async open(options: ConnectionOptions = {}): Promise<LibvirtConnection> {
    return LibvirtConnection.open(this.clientSide, { keepalive: false, ...options });
  }
}

export function remoteErrorBody(error: Partial<RemoteErrorFields> = {}): Buffer {
  const writer = new XdrWriter();
  writeRemoteError(writer, {
    code: 1,
    domain: 10,
    message: "internal error: test",
    level: 2,
    dom: null,
    str1: null,
    str2: null,
    str3: null,
    int1: -1,
    int2: -1,
    net: null,
    ...error,
  });
  return Buffer.from(writer.finish());
}

export const tick = (ms = 0) => new Promise((resolve) => setTimeout(resolve, ms));
