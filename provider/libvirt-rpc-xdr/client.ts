/**
 * A libvirt connection over any Node Duplex (a unix socket, an SSH channel).
 * It owns the IO the core leaves out: writing, deadlines, AbortSignals,
 * keepalive pings, the handshake and closing.
 *
 * Guarantees:
 * - Every call has a deadline (its own or the connection's default), so a
 *   silent peer cannot wedge a caller.
 * - Cancelling one call (deadline or signal) only forgets its serial; other
 *   calls on the same connection go on.
 * - `close()` never blocks: it asks the daemon politely with a short bound,
 *   then destroys the transport regardless.
 * - When the transport dies, every call in flight fails at once with a
 *   LibvirtTransportError.
 */
import type { Duplex, Readable, Writable } from "node:stream";
import { AcknowledgementNudge } from "./ack-nudge";
import type { CallCounter } from "./call-counter";
import { armCallDeadline, CallDeadlines, type CallOptions } from "./deadlines";
import { HEADER_BYTES, RpcCore, encodePacket, keepalivePacket } from "./core";
import { LibvirtTransportError } from "./errors";
import { handshake, type ConnectionInfo } from "./handshake";
import { Outbox } from "./outbox";
import { PendingCall } from "./pending-call";
import {
  KeepaliveProcedure,
  Limits,
  MessageStatus,
  MessageType,
  Procedures,
  type Procedure,
  type StorageVolHandle,
} from "./protocol";
import {
  DownloadMachine,
  UploadMachine,
  type ReadIntoSource,
  type StreamMachineOptions,
  type StreamPort,
} from "./stream";
import { XdrWriter } from "./xdr";

export interface ConnectionOptions {
  /** The URI passed to CONNECT_OPEN, e.g. "qemu:///system" (the default). */
  uri?: string;
  /** Deadline for calls that do not give one. Default 60 s. */
  defaultTimeoutMs?: number;
  /** Deadline for the whole handshake (auth list, keepalive check, open). Default 15 s. */
  handshakeTimeoutMs?: number;
  /** Abandons the handshake. */
  signal?: AbortSignal;
  /**
   * libvirt keepalive: ping after `intervalMs` of silence, declare the link dead after
   * `intervalMs * (count + 1)` without any data. Default 5000 ms × 5, like libvirt's own client.
   * `false` turns our pings off (we still answer the daemon's).
   */
  keepalive?: { intervalMs: number; count: number } | false;
  /** Bound for the polite CONNECT_CLOSE in `close()`. Default 1000 ms. */
  closeTimeoutMs?: number;
  /** Stream tuning (chunk size, abort grace). */
  stream?: StreamMachineOptions;
  /** Called once when the connection is finished, whatever the reason: release the transport here. */
  onClosed?: (error: LibvirtTransportError) => void;
}

export type { CallOptions } from "./deadlines";
export type { ConnectionInfo } from "./handshake";

const DEFAULT_TIMEOUT_MS = 60_000;

export class LibvirtConnection {
  private readonly core: RpcCore;
  private readonly defaultTimeoutMs: number;
  private readonly closeTimeoutMs: number;
  private keepaliveTimer: NodeJS.Timeout | undefined;
  private readonly deadlines = new CallDeadlines();
  /** Plain calls whose reply has not come yet (streams not counted). */
  private callsAwaitingReply = 0;
  /** Streams in flight: one that waits for a single answer from the daemon is owed one too. */
  private readonly streams = new Set<UploadMachine | DownloadMachine>();
  private readonly ackNudge: AcknowledgementNudge;
  private readonly outbox: Outbox;
  private lastReceivedAt = Date.now();
  private inboundPausedBy = 0;
  private closed = false;
  private closing: Promise<void> | undefined;
  info: ConnectionInfo = { authTypes: [], keepalive: false };
  /** Set by a test or bench that counts calls (`countCallsInto`); undefined costs nothing. */
  private callCounter: CallCounter | undefined;

  private readonly onData = (chunk: Buffer): void => {
    this.lastReceivedAt = Date.now();
    this.core.receive(chunk);
    if (this.core.lost) this.shutdown(this.core.lost);
    else this.ackNudge.received();
  };
  private readonly onTransportError = (error: Error): void => {
    this.shutdown(
      new LibvirtTransportError("io", `libvirt transport failed: ${error.message}`, {
        cause: error,
      }),
    );
  };
  private readonly onTransportEnd = (): void => {
    this.shutdown(new LibvirtTransportError("closed", "libvirt connection closed by the peer"));
  };

  private constructor(
    private readonly transport: Duplex,
    private readonly options: ConnectionOptions,
  ) {
    this.defaultTimeoutMs = options.defaultTimeoutMs ?? DEFAULT_TIMEOUT_MS;
    this.closeTimeoutMs = options.closeTimeoutMs ?? 1000;
    this.core = new RpcCore((packet) => this.write(packet));
    this.outbox = new Outbox(transport, () => this.ackNudge.wrote());
    this.ackNudge = new AcknowledgementNudge(
      () => {
        if (this.closed || this.transport.destroyed) return;
        // At once, not batched: the nudge exists to make a segment leave now.
        this.outbox.flush();
        this.outbox.writeNow(keepalivePacket(KeepaliveProcedure.PONG));
      },
      () => this.callsAwaitingReply > 0 || this.streamAwaitsAnswer(),
    );
    transport.on("data", this.onData);
    transport.on("error", this.onTransportError);
    transport.on("end", this.onTransportEnd);
    transport.on("close", this.onTransportEnd);
  }

  /**
   * Speaks the handshake (handshake.ts) and returns a ready connection, its
   * libvirt keepalive running when the daemon supports it. On any failure
   * the transport is destroyed.
   */
  static async open(
    transport: Duplex,
    options: ConnectionOptions = {},
  ): Promise<LibvirtConnection> {
    const connection = new LibvirtConnection(transport, options);
    connection.info = await handshake(connection, options);
    if (connection.info.keepalive && options.keepalive !== false) {
      connection.startKeepalive(options.keepalive ?? { intervalMs: 5000, count: 5 });
    }
    return connection;
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Calls in flight (plain calls and streams). */
  get inFlight(): number {
    return this.core.inFlight;
  }

  get stats(): RpcCore["stats"] {
    return this.core.stats;
  }

  /** Counts every later call and stream by procedure into `counter`; undefined stops counting. */
  countCallsInto(counter: CallCounter | undefined): void {
    this.callCounter = counter;
  }

  /** Makes one call and decodes its reply. Many calls may be in flight at once. */
  call<Args, Ret>(
    procedure: Procedure<Args, Ret>,
    args: Args,
    options: CallOptions = {},
  ): Promise<Ret> {
    this.callCounter?.add(procedure.name);
    if (procedure.stream) {
      return Promise.reject(
        new TypeError(`${procedure.name} is a stream: use upload() or download()`),
      );
    }
    let payload: Buffer;
    try {
      const writer = new XdrWriter();
      procedure.encodeArgs(writer, args);
      payload = writer.finish();
    } catch (error) {
      return Promise.reject(error);
    }
    if (payload.length + HEADER_BYTES > Limits.messageMax) {
      return Promise.reject(
        new RangeError(
          `libvirt ${procedure.name}: arguments of ${payload.length} bytes exceed the protocol's ` +
            `${Limits.messageMax}-byte message limit`,
        ),
      );
    }
    return new Promise<Ret>((resolve, reject) => {
      const serial = this.core.allocateSerial();
      let finished = false;
      let registered = false;
      const stop = this.armDeadline(procedure.name, options, (error) => {
        // Forget the serial: a late reply is dropped, the connection and other calls carry on.
        this.core.release(serial, handler);
        settle({ ok: false, error });
      });
      const settle = (outcome: { ok: true; value: Ret } | { ok: false; error: Error }): void => {
        if (finished) return;
        finished = true;
        if (registered) this.callsAwaitingReply--;
        stop();
        this.core.release(serial, handler);
        if (outcome.ok) resolve(outcome.value);
        else reject(outcome.error);
      };
      const handler = new PendingCall<Ret>(procedure as Procedure<unknown, Ret>, settle);
      if (finished) return;
      this.core.register(serial, handler);
      if (finished) return;
      registered = true;
      this.callsAwaitingReply++;
      this.write(this.callPacket(procedure, serial, payload));
    });
  }

  /**
   * Uploads `source` into a volume (storageVolUpload) and waits for the daemon
   * to confirm it has everything. The deadline covers the whole transfer.
   */
  upload(
    args: {
      vol: StorageVolHandle;
      offset?: number | bigint;
      length?: number | bigint;
      flags?: number;
    },
    source: Readable | ReadIntoSource,
    options: CallOptions = {},
  ): Promise<{ bytes: number }> {
    const procedure = Procedures.storageVolUpload;
    let machine: UploadMachine | undefined;
    return this.runStream(
      procedure,
      { vol: args.vol, offset: args.offset ?? 0, length: args.length ?? 0, flags: args.flags ?? 0 },
      (port) => (machine = new UploadMachine(port, procedure.name, source, this.options.stream)),
      options,
    ).then(() => ({ bytes: machine!.bytesSent }));
  }

  /** Downloads a volume (storageVolDownload) into `sink`, ending it when the daemon confirms. */
  download(
    args: {
      vol: StorageVolHandle;
      offset?: number | bigint;
      length?: number | bigint;
      flags?: number;
    },
    sink: Writable,
    options: CallOptions & { endSink?: boolean } = {},
  ): Promise<{ bytes: number }> {
    const procedure = Procedures.storageVolDownload;
    let machine: DownloadMachine | undefined;
    return this.runStream(
      procedure,
      { vol: args.vol, offset: args.offset ?? 0, length: args.length ?? 0, flags: args.flags ?? 0 },
      (port) =>
        (machine = new DownloadMachine(port, procedure.name, sink, options.endSink ?? true)),
      options,
    ).then(() => ({ bytes: machine!.bytesReceived }));
  }

  private runStream<Args>(
    procedure: Procedure<Args, void>,
    args: Args,
    createMachine: (port: StreamPort) => UploadMachine | DownloadMachine,
    options: CallOptions,
  ): Promise<void> {
    this.callCounter?.add(procedure.name);
    const writer = new XdrWriter();
    procedure.encodeArgs(writer, args);
    const serial = this.core.allocateSerial();
    const port: StreamPort = {
      send: (status, body, onWritten) =>
        this.write(
          encodePacket(
            {
              program: procedure.program,
              version: procedure.version,
              procedure: procedure.number,
              type: MessageType.STREAM,
              serial,
              status,
            },
            body,
          ),
          onWritten,
        ),
      onceDrained: (listener) => {
        if (this.closed) return () => undefined;
        this.transport.once("drain", listener);
        return () => this.transport.off("drain", listener);
      },
      pauseInbound: () => this.pauseInbound(),
      resumeInbound: () => this.resumeInbound(),
      release: () => this.core.release(serial, machine),
    };
    const machine = createMachine(port);
    const stop = this.armDeadline(procedure.name, options, (error) => machine.cancel(error));
    this.streams.add(machine);
    const forget = (): void => {
      stop();
      this.streams.delete(machine);
    };
    machine.done.then(forget, forget);
    this.core.register(serial, machine);
    if (machine.phase === "awaiting-reply")
      this.write(this.callPacket(procedure, serial, writer.finish()));
    return machine.done;
  }

  /**
   * A stream waiting for its call's reply, or an upload waiting for the daemon
   * to confirm its end (or abort). Traced on the lab: after the last data,
   * sshd sent a window adjustment, then held the daemon's confirmation behind
   * it until our delayed ACK, 40 ms later; so the nudge covers these waits
   * too. Not while data flows: an upload writes all the time, and a download's
   * full segments are acknowledged without help.
   */
  private streamAwaitsAnswer(): boolean {
    for (const machine of this.streams) {
      if (machine.phase === "awaiting-reply") return true;
      if (
        machine instanceof UploadMachine &&
        (machine.phase === "finishing" || machine.phase === "aborting")
      )
        return true;
    }
    return false;
  }

  /**
   * Polite close: CONNECT_CLOSE with a short bound, then the transport is destroyed
   * regardless. Never waits longer than `closeTimeoutMs`, even on a silent peer.
   */
  close(): Promise<void> {
    if (this.closing) return this.closing;
    if (this.closed) return Promise.resolve();
    this.closing = this.call(Procedures.connectClose, undefined, { timeoutMs: this.closeTimeoutMs })
      .catch(() => undefined)
      .then(() =>
        this.destroy(
          new LibvirtTransportError("closed", "libvirt connection closed by this client"),
        ),
      );
    return this.closing;
  }

  /** Immediate close: fails everything in flight with `reason` and destroys the transport. */
  destroy(
    reason = new LibvirtTransportError("closed", "libvirt connection closed by this client"),
  ): void {
    this.shutdown(reason);
  }

  private shutdown(reason: LibvirtTransportError): void {
    if (this.closed) return;
    this.closed = true;
    if (this.keepaliveTimer) clearInterval(this.keepaliveTimer);
    this.ackNudge.stop();
    this.outbox.close();
    this.core.connectionLost(reason);
    this.deadlines.clear();
    this.transport.off("data", this.onData);
    this.transport.off("end", this.onTransportEnd);
    this.transport.off("close", this.onTransportEnd);
    // Keep an error listener: a destroyed socket may still report an error we no longer care about.
    this.transport.off("error", this.onTransportError);
    this.transport.on("error", () => undefined);
    this.transport.destroy();
    this.options.onClosed?.(reason);
  }

  /** Batched with the turn's other small packets (outbox.ts). */
  private write(packet: Buffer, onWritten?: (error?: Error | null) => void): boolean {
    if (this.closed) return true;
    return this.outbox.write(packet, onWritten);
  }

  private armDeadline(
    procedureName: string,
    options: CallOptions,
    onExpired: (error: Error) => void,
  ): () => void {
    return armCallDeadline(
      this.deadlines,
      this.defaultTimeoutMs,
      procedureName,
      options,
      onExpired,
    );
  }

  private callPacket<Args, Ret>(
    procedure: Procedure<Args, Ret>,
    serial: number,
    payload: Buffer,
  ): Buffer {
    return encodePacket(
      {
        program: procedure.program,
        version: procedure.version,
        procedure: procedure.number,
        type: MessageType.CALL,
        serial,
        status: MessageStatus.OK,
      },
      payload,
    );
  }

  private startKeepalive({ intervalMs, count }: { intervalMs: number; count: number }): void {
    this.keepaliveTimer = setInterval(() => {
      if (this.closed) return;
      // While a download's sink holds the transport paused, silence is our doing, not the peer's.
      if (this.inboundPausedBy > 0) {
        this.lastReceivedAt = Date.now();
        return;
      }
      const silentMs = Date.now() - this.lastReceivedAt;
      if (silentMs >= intervalMs * (count + 1)) {
        this.shutdown(
          new LibvirtTransportError(
            "keepalive",
            `libvirt peer silent for ${silentMs} ms; the link is presumed dead`,
          ),
        );
      } else if (silentMs >= intervalMs) {
        this.write(keepalivePacket(KeepaliveProcedure.PING));
      }
    }, intervalMs);
    this.keepaliveTimer.unref();
  }

  private pauseInbound(): void {
    if (this.inboundPausedBy++ === 0) this.transport.pause();
  }

  private resumeInbound(): void {
    if (this.inboundPausedBy === 0) return;
    if (--this.inboundPausedBy === 0 && !this.closed) this.transport.resume();
  }
}
