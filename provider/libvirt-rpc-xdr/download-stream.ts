/**
 * The download state machine (storageVolDownload): awaiting-reply →
 * receiving → finishing → done (see stream.ts for the whole picture).
 */
import type { Writable } from "node:stream";
import type { Packet } from "./core";
import { LibvirtStreamEndpointError, LibvirtTransportError } from "./errors";
import { decodeLibvirtError, MessageStatus, MessageType } from "./protocol";
import { StreamMachine, type DownloadPhase, type StreamPort } from "./stream-machine";

/** Data the daemon may send before the call's reply, at most (64 of its 256 KiB packets). */
const MAX_EARLY_BYTES = 16 * 1024 * 1024;

/**
 * Downloads a stream into a Node writable. When the sink is backed up we stop
 * reading the transport (libvirt has no window; this is how its own client
 * behaves too) and resume on the sink's drain.
 */
export class DownloadMachine extends StreamMachine<DownloadPhase> {
  phase: DownloadPhase = "awaiting-reply";
  private inboundPaused = false;
  private daemonConfirmed = false;
  bytesReceived = 0;
  /**
   * Stream packets that overtook the call's reply. libvirtd sends the reply
   * from the worker thread that ran the call, and the stream's data from its
   * event loop as soon as the call registered the stream, so the first data
   * can arrive first; dropping it lost one 256 KiB packet of a download now
   * and then on a busy machine (found by a full test run). Held, then taken in
   * order once the reply says OK; dropped with a failed call.
   */
  private early: Packet[] = [];
  private earlyBytes = 0;

  private readonly onDrain = (): void => this.resume();
  private readonly onSinkError = (error: unknown): void => {
    if (this.finished) return;
    this.failAndAbort(new LibvirtStreamEndpointError(this.procedure, "sink", { cause: error }));
  };

  constructor(
    port: StreamPort,
    procedure: string,
    private readonly sink: Writable,
    private readonly endSink = true,
  ) {
    super(port, procedure);
    sink.on("drain", this.onDrain);
    sink.on("error", this.onSinkError);
  }

  onReply(packet: Packet): void {
    if (this.handleLateReply(packet)) return;
    if (this.phase !== "awaiting-reply") return;
    const early = this.early;
    this.early = [];
    if (packet.header.status !== MessageStatus.OK) {
      this.fail(decodeLibvirtError(this.procedure, packet.body));
      return;
    }
    this.phase = "receiving";
    for (const overtaking of early) this.onStream(overtaking);
  }

  onStream(packet: Packet): void {
    if (this.finished) return;
    if (this.phase === "awaiting-reply") {
      this.holdUntilReply(packet);
      return;
    }
    const { status, type } = packet.header;
    if (status === MessageStatus.ERROR) {
      this.fail(decodeLibvirtError(this.procedure, packet.body));
      return;
    }
    if (type === MessageType.STREAM_HOLE) {
      // We never ask for sparse streams, so a hole is a daemon bug we must not turn into zeros silently.
      this.failAndAbort(
        new LibvirtTransportError("protocol", `libvirt sent a hole during ${this.procedure}`),
      );
      return;
    }
    if (status === MessageStatus.CONTINUE) {
      if (this.phase !== "receiving") return;
      if (packet.body.length === 0) {
        // End of data: confirm, then wait for the daemon's own OK.
        this.phase = "finishing";
        this.port.send(MessageStatus.OK);
        return;
      }
      this.bytesReceived += packet.body.length;
      if (!this.sink.write(packet.body) && !this.inboundPaused) {
        this.inboundPaused = true;
        this.port.pauseInbound();
      }
      return;
    }
    if (status === MessageStatus.OK) {
      if (this.phase === "finishing") this.finishSink();
      else
        this.failAndAbort(
          new LibvirtTransportError("protocol", `libvirt ended ${this.procedure} without EOF`),
        );
    }
  }

  /**
   * Reading on is the only way to reach the reply (it comes on the same
   * link), so the wait is bounded by bytes instead of by pausing: a daemon
   * whose reply lags this far behind its data is not one we can follow.
   */
  private holdUntilReply(packet: Packet): void {
    this.earlyBytes += packet.body.length;
    if (this.earlyBytes > MAX_EARLY_BYTES) {
      this.early = [];
      // As a deadline in this phase: failed now, the stream aborted when its reply comes.
      this.cancel(
        new LibvirtTransportError(
          "protocol",
          `libvirt sent more than ${MAX_EARLY_BYTES / 1024 / 1024} MiB of ${this.procedure} before its reply`,
        ),
      );
      return;
    }
    this.early.push(packet);
  }

  cancel(error: Error): void {
    if (this.finished) return;
    if (this.phase === "awaiting-reply") {
      this.abortOnLateReply = true;
      this.fail(error);
    } else {
      this.failAndAbort(error);
    }
  }

  private failAndAbort(error: Error): void {
    // After the daemon's final OK the stream no longer exists on its side: nothing to abort.
    if ((this.phase === "receiving" || this.phase === "finishing") && !this.daemonConfirmed) {
      this.port.send(MessageStatus.ERROR);
    }
    this.fail(error);
  }

  private finishSink(): void {
    this.daemonConfirmed = true;
    if (!this.endSink) {
      this.succeed();
      return;
    }
    // Success only once the sink has flushed everything; a sink failing while it ends fails the call.
    this.sink.once("finish", () => this.succeed());
    this.sink.end();
  }

  private resume(): void {
    if (!this.inboundPaused) return;
    this.inboundPaused = false;
    this.port.resumeInbound();
  }

  protected cleanup(): void {
    this.early = [];
    this.sink.off("drain", this.onDrain);
    this.sink.off("error", this.onSinkError);
    // Never leave the shared connection paused on behalf of a stream that is over.
    this.resume();
  }
}
