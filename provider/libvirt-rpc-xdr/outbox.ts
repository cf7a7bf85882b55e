/**
 * Small packets written in one turn of the event loop (a sweep's hundreds of
 * calls, a create's pipelined look-ups) leave as one transport write: over
 * SSH every write is an encrypted packet of its own and a TCP segment or
 * three, which cost more than the call itself. Large packets (stream data)
 * go at once, after whatever is batched, so order and backpressure hold.
 */
import type { Duplex } from "node:stream";

/** Packets from this size on are written at once; smaller ones are batched up to it. */
const WRITE_AT_ONCE_BYTES = 16 * 1024;

type Written = (error?: Error | null) => void;

export class Outbox {
  private packets: Buffer[] = [];
  private bytes = 0;
  /** Told once the batch holding their packet was written (an upload reuses its frames). */
  private written: Written[] = [];
  private flushScheduled = false;
  private closed = false;

  constructor(
    private readonly transport: Duplex,
    /** Told before every transport write (the acknowledgement nudge counts them). */
    private readonly onTransportWrite: () => void,
  ) {}

  /** Queues or writes `packet`; false when the transport is backed up (wait for its drain). */
  write(packet: Buffer, onWritten?: Written): boolean {
    if (this.closed || this.transport.destroyed) return true;
    if (packet.length >= WRITE_AT_ONCE_BYTES) {
      this.flush();
      return this.writeNow(packet, onWritten);
    }
    this.packets.push(packet);
    if (onWritten) this.written.push(onWritten);
    this.bytes += packet.length;
    if (this.bytes >= WRITE_AT_ONCE_BYTES) this.flush();
    else if (!this.flushScheduled) {
      this.flushScheduled = true;
      // After the promise jobs of this turn: calls issued from their continuations join the batch.
      process.nextTick(this.flushScheduledBatch);
    }
    return !this.transport.writableNeedDrain;
  }

  /** Writes whatever is batched. */
  flush(): void {
    if (this.packets.length === 0) return;
    const batch =
      this.packets.length === 1 ? this.packets[0]! : Buffer.concat(this.packets, this.bytes);
    const written = this.written;
    this.packets = [];
    this.bytes = 0;
    this.written = [];
    if (this.closed || this.transport.destroyed) return;
    this.writeNow(
      batch,
      written.length === 0
        ? undefined
        : (error) => {
            for (const listener of written) listener(error);
          },
    );
  }

  /** Writes `bytes` to the transport at once, past the batch (the caller flushed it first if order matters). */
  writeNow(bytes: Buffer, onWritten?: Written): boolean {
    this.onTransportWrite();
    return onWritten ? this.transport.write(bytes, onWritten) : this.transport.write(bytes);
  }

  /** Drops what is batched; nothing is written from now on (the connection is finished). */
  close(): void {
    this.closed = true;
    this.packets = [];
    this.bytes = 0;
    this.written = [];
  }

  private readonly flushScheduledBatch = (): void => {
    this.flushScheduled = false;
    this.flush();
  };
}
