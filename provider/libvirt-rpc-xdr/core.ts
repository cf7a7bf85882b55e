/**
 * The transport-independent heart of the client ("sans-IO"): it turns bytes
 * into packets and packets into routed events, and tells its owner which
 * packets to send. It never touches a socket or a timer, so every rule here
 * (framing, size limits, serial routing, keepalive answers, ignoring events)
 * is testable by feeding it bytes.
 */
import { LibvirtTransportError } from "./errors";
import {
  KEEPALIVE_PROGRAM,
  KEEPALIVE_PROTOCOL_VERSION,
  KeepaliveProcedure,
  Limits,
  MessageStatus,
  MessageType,
  QEMU_PROGRAM,
  REMOTE_PROGRAM,
} from "./protocol";

/** The 4-byte length word plus six u32 header words. */
export const HEADER_BYTES = 28;

export interface MessageHeader {
  program: number;
  version: number;
  procedure: number;
  type: number;
  serial: number;
  status: number;
}

export interface Packet {
  header: MessageHeader;
  body: Buffer;
}

/**
 * ArrayBuffers whose first HEADER_BYTES are kept free for a packet header, so
 * a body written behind them becomes a packet without being copied. An upload
 * frames every byte it sends: copying each 256 KiB body once more into a new
 * packet was a tenth of the uploading process's CPU on Node 26, and as much
 * garbage again as the data itself.
 */
const headerRoom = new WeakSet<ArrayBufferLike>();

/**
 * A body buffer of `bodyBytes` with room for the header in front of it:
 * `encodePacket` frames it (or a prefix of it) in place, once. Write the body
 * completely before framing it and do not touch it afterwards.
 */
export function allocateFramedBody(bodyBytes: number): Buffer {
  // allocUnsafeSlow: a buffer of its own, never a slice of Node's shared pool.
  const frame = Buffer.allocUnsafeSlow(HEADER_BYTES + bodyBytes);
  headerRoom.add(frame.buffer);
  return frame.subarray(HEADER_BYTES);
}

/**
 * Gives a framed body back its header room once the packet made of it was
 * written, so an upload sends every frame from a few reused buffers.
 */
export function reuseFramedBody(body: Buffer): void {
  if (body.byteOffset === HEADER_BYTES) headerRoom.add(body.buffer);
}

export function encodePacket(header: MessageHeader, body: Uint8Array = Buffer.alloc(0)): Buffer {
  const inPlace = body.byteOffset === HEADER_BYTES && headerRoom.delete(body.buffer);
  const packet = inPlace
    ? Buffer.from(body.buffer, 0, HEADER_BYTES + body.length)
    : Buffer.allocUnsafe(HEADER_BYTES + body.length);
  packet.writeUInt32BE(HEADER_BYTES + body.length, 0);
  packet.writeUInt32BE(header.program, 4);
  packet.writeUInt32BE(header.version, 8);
  packet.writeInt32BE(header.procedure, 12);
  packet.writeInt32BE(header.type, 16);
  packet.writeUInt32BE(header.serial, 20);
  packet.writeInt32BE(header.status, 24);
  if (!inPlace) packet.set(body, HEADER_BYTES);
  return packet;
}

/**
 * Splits a byte stream into packets. Chunks are kept as a list and only the
 * bytes of a packet that straddles chunks are copied, so a 256 KiB stream
 * chunk usually reaches its consumer without a copy.
 */
export class PacketDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;

  /** @param maxPacketBytes the largest packet accepted, length word included. */
  constructor(private readonly maxPacketBytes = Limits.messageMax + HEADER_BYTES) {}

  /** Feeds bytes; returns every complete packet. Throws LibvirtTransportError("protocol") on a bad length. */
  push(chunk: Buffer): Packet[] {
    if (chunk.length > 0) {
      this.chunks.push(chunk);
      this.buffered += chunk.length;
    }
    const packets: Packet[] = [];
    while (this.buffered >= 4) {
      const length = this.peekLength();
      if (length < HEADER_BYTES || length > this.maxPacketBytes) {
        throw new LibvirtTransportError(
          "protocol",
          `peer sent a packet of ${length} bytes; a libvirt packet is ${HEADER_BYTES}..${this.maxPacketBytes} bytes`,
        );
      }
      if (this.buffered < length) break;
      const bytes = this.take(length);
      packets.push({
        header: {
          program: bytes.readUInt32BE(4),
          version: bytes.readUInt32BE(8),
          procedure: bytes.readInt32BE(12),
          type: bytes.readInt32BE(16),
          serial: bytes.readUInt32BE(20),
          status: bytes.readInt32BE(24),
        },
        body: bytes.subarray(HEADER_BYTES),
      });
    }
    return packets;
  }

  get bufferedBytes(): number {
    return this.buffered;
  }

  private peekLength(): number {
    const first = this.chunks[0]!;
    if (first.length >= 4) return first.readUInt32BE(0);
    const head = Buffer.concat(this.chunks, Math.min(this.buffered, 8));
    return head.readUInt32BE(0);
  }

  private take(length: number): Buffer {
    const first = this.chunks[0]!;
    let out: Buffer;
    if (first.length >= length) {
      out = first.subarray(0, length);
      if (first.length === length) this.chunks.shift();
      else this.chunks[0] = first.subarray(length);
    } else {
      out = Buffer.allocUnsafe(length);
      let filled = 0;
      while (filled < length) {
        const chunk = this.chunks[0]!;
        const wanted = Math.min(chunk.length, length - filled);
        chunk.copy(out, filled, 0, wanted);
        filled += wanted;
        if (wanted === chunk.length) this.chunks.shift();
        else this.chunks[0] = chunk.subarray(wanted);
      }
    }
    this.buffered -= length;
    return out;
  }
}

/** Whoever waits for packets of one serial: a plain call or a stream. */
export interface SerialHandler {
  /** The REPLY to the call. */
  onReply(packet: Packet): void;
  /** A STREAM (or STREAM_HOLE) packet carrying this call's serial. */
  onStream(packet: Packet): void;
  /** The connection died; nothing more will arrive. */
  onConnectionLost(error: LibvirtTransportError): void;
  /**
   * True once nobody waits for this serial any more and it stays registered
   * only to answer a late reply (a stream cancelled before the daemon
   * answered its call). Such a serial is not a call in flight: it must not
   * keep an idle link open.
   */
  readonly lingering?: boolean;
}

export interface CoreStats {
  /** Replies and stream packets for serials nobody waits for (cancelled calls): dropped. */
  droppedPackets: number;
  /** Asynchronous event messages: ignored, since we never register for events. */
  ignoredEvents: number;
  pingsAnswered: number;
  pongsReceived: number;
}

/**
 * Routes packets by serial, answers keepalive pings and reports fatal
 * protocol errors. `send` is how the core asks its owner to write a packet.
 */
export class RpcCore {
  private readonly decoder: PacketDecoder;
  private readonly handlers = new Map<number, SerialHandler>();
  private lastSerial = 0;
  private lostWith: LibvirtTransportError | undefined;
  readonly stats: CoreStats = {
    droppedPackets: 0,
    ignoredEvents: 0,
    pingsAnswered: 0,
    pongsReceived: 0,
  };

  constructor(
    private readonly send: (packet: Buffer) => void,
    maxPacketBytes?: number,
  ) {
    this.decoder = new PacketDecoder(maxPacketBytes);
  }

  get lost(): LibvirtTransportError | undefined {
    return this.lostWith;
  }

  /** Calls somebody still waits for (serials kept only for a late reply do not count). */
  get inFlight(): number {
    let waiting = 0;
    for (const handler of this.handlers.values()) if (handler.lingering !== true) waiting++;
    return waiting;
  }

  /**
   * A fresh serial for a call. Serials only need to be unique among calls in
   * flight; wrapping at 2^32 skips any still in use (and 0, which events use).
   */
  allocateSerial(): number {
    for (;;) {
      this.lastSerial = this.lastSerial >= 0xffffffff ? 1 : this.lastSerial + 1;
      if (!this.handlers.has(this.lastSerial)) return this.lastSerial;
    }
  }

  register(serial: number, handler: SerialHandler): void {
    if (this.lostWith) {
      handler.onConnectionLost(this.lostWith);
      return;
    }
    this.handlers.set(serial, handler);
  }

  /** Stop routing to a serial; anything that still arrives for it is dropped. */
  release(serial: number, handler?: SerialHandler): void {
    if (handler === undefined || this.handlers.get(serial) === handler)
      this.handlers.delete(serial);
  }

  /** Feeds bytes from the transport. Protocol violations end the connection. */
  receive(chunk: Buffer): void {
    if (this.lostWith) return;
    let packets: Packet[];
    try {
      packets = this.decoder.push(chunk);
    } catch (error) {
      this.connectionLost(
        error instanceof LibvirtTransportError
          ? error
          : new LibvirtTransportError("protocol", "undecodable data from peer", { cause: error }),
      );
      return;
    }
    for (const packet of packets) {
      if (this.lostWith) return;
      this.dispatch(packet);
    }
  }

  /** The transport is gone (or we decided it is): fail everybody waiting, once. */
  connectionLost(error: LibvirtTransportError): void {
    if (this.lostWith) return;
    this.lostWith = error;
    const waiting = [...this.handlers.values()];
    this.handlers.clear();
    for (const handler of waiting) handler.onConnectionLost(error);
  }

  private dispatch(packet: Packet): void {
    const { header } = packet;
    if (header.program === KEEPALIVE_PROGRAM) {
      this.handleKeepalive(packet);
      return;
    }
    if (header.program !== REMOTE_PROGRAM && header.program !== QEMU_PROGRAM) {
      this.connectionLost(
        new LibvirtTransportError(
          "protocol",
          `peer sent program 0x${header.program.toString(16)}; is this a libvirt socket?`,
        ),
      );
      return;
    }
    switch (header.type) {
      case MessageType.MESSAGE:
        // Domain events and the like: we never subscribe, so these are ignored.
        this.stats.ignoredEvents++;
        return;
      case MessageType.REPLY:
      case MessageType.REPLY_WITH_FDS: {
        const handler = this.handlers.get(header.serial);
        if (!handler) {
          this.stats.droppedPackets++;
          return;
        }
        handler.onReply(packet);
        return;
      }
      case MessageType.STREAM:
      case MessageType.STREAM_HOLE: {
        const handler = this.handlers.get(header.serial);
        if (!handler) {
          this.stats.droppedPackets++;
          return;
        }
        handler.onStream(packet);
        return;
      }
      default:
        this.connectionLost(
          new LibvirtTransportError(
            "protocol",
            `peer sent message type ${header.type}, which a client never gets`,
          ),
        );
    }
  }

  private handleKeepalive(packet: Packet): void {
    const { procedure } = packet.header;
    if (procedure === KeepaliveProcedure.PING) {
      // Always answer, also in the middle of a stream: the daemon drops a peer that stays silent.
      this.stats.pingsAnswered++;
      this.send(keepalivePacket(KeepaliveProcedure.PONG));
    } else if (procedure === KeepaliveProcedure.PONG) {
      this.stats.pongsReceived++;
    }
  }
}

export function keepalivePacket(procedure: number): Buffer {
  return encodePacket({
    program: KEEPALIVE_PROGRAM,
    version: KEEPALIVE_PROTOCOL_VERSION,
    procedure,
    type: MessageType.MESSAGE,
    serial: 0,
    status: MessageStatus.OK,
  });
}
