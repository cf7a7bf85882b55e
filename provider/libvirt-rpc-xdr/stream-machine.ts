/**
 * What upload and download streams share: the port a stream machine talks
 * to its connection through, and the base class that settles a stream once
 * (succeed or fail), answers a reply that comes after a cancel, and lets go
 * of the stream's serial. The machines themselves: upload-stream.ts,
 * download-stream.ts; the phases they run through: stream.ts.
 */
import type { Packet, SerialHandler } from "./core";
import type { LibvirtTransportError } from "./errors";
import { MessageStatus } from "./protocol";

export interface StreamPort {
  /**
   * Writes a STREAM packet. Returns false when the transport is backed up (wait for `onceDrained`).
   * `onWritten` is told once the transport no longer needs `body` (its memory may then be reused).
   */
  send(status: MessageStatus, body?: Buffer, onWritten?: (error?: Error | null) => void): boolean;
  /** Calls `listener` once when the transport can take more; returns an unsubscribe function. */
  onceDrained(listener: () => void): () => void;
  /** Stop reading from the transport (the download's sink is backed up). */
  pauseInbound(): void;
  resumeInbound(): void;
  /** The machine needs no more packets for its serial. */
  release(): void;
}

export type UploadPhase =
  "awaiting-reply" | "sending" | "finishing" | "aborting" | "done" | "failed";
export type DownloadPhase = "awaiting-reply" | "receiving" | "finishing" | "done" | "failed";

export interface StreamMachineOptions {
  /**
   * Upload data packet payload: default UPLOAD_FRAME_BODY_BYTES, at most
   * Limits.streamChunk (262120, what libvirt's own client sends and every daemon takes).
   */
  chunkBytes?: number;
  /** After a source failure, how long to wait for the daemon to confirm the abort. */
  abortGraceMs?: number;
}

export abstract class StreamMachine<Phase extends string> implements SerialHandler {
  abstract phase: Phase;
  readonly done: Promise<void>;
  private settle!: { resolve: () => void; reject: (error: Error) => void };
  /** Cancelled before the call's reply arrived: answer a late OK with an abort so the daemon frees the stream. */
  protected abortOnLateReply = false;

  constructor(
    protected readonly port: StreamPort,
    protected readonly procedure: string,
  ) {
    this.done = new Promise<void>((resolve, reject) => {
      this.settle = { resolve, reject };
    });
    // The connection awaits `done`; this keeps an early rejection from being reported as unhandled.
    this.done.catch(() => undefined);
  }

  /** Finished for the caller, registered only to abort the stream a late reply would open. */
  get lingering(): boolean {
    return this.finished && this.abortOnLateReply;
  }

  protected get finished(): boolean {
    return this.phase === "done" || this.phase === "failed";
  }

  private markFinished(outcome: "done" | "failed"): void {
    // Every machine's phases end in "done" or "failed" (UploadPhase, DownloadPhase).
    this.phase = outcome as Phase;
  }

  protected abstract cleanup(): void;
  abstract onReply(packet: Packet): void;
  abstract onStream(packet: Packet): void;
  /** The call's deadline passed or its signal fired. */
  abstract cancel(error: Error): void;

  onConnectionLost(error: LibvirtTransportError): void {
    this.abortOnLateReply = false;
    this.fail(error);
  }

  /** Handles the REPLY that arrives after we already gave up on the call. */
  protected handleLateReply(packet: Packet): boolean {
    if (!this.finished) return false;
    if (this.abortOnLateReply) {
      // We kept listening only for this reply: abort the stream it opened, then let go.
      if (packet.header.status === MessageStatus.OK) this.port.send(MessageStatus.ERROR);
      this.abortOnLateReply = false;
      this.port.release();
    }
    return true;
  }

  protected succeed(): void {
    if (this.finished) return;
    this.markFinished("done");
    this.cleanup();
    this.port.release();
    this.settle.resolve();
  }

  protected fail(error: Error): void {
    if (this.finished) return;
    this.markFinished("failed");
    this.cleanup();
    if (!this.abortOnLateReply) this.port.release();
    this.settle.reject(error);
  }
}
