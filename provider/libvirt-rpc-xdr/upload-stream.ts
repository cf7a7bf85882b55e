/**
 * The upload state machine (storageVolUpload): awaiting-reply → sending →
 * finishing → done, with an aborting phase when the source fails (see
 * stream.ts for the whole picture).
 */
import type { Readable } from "node:stream";
import { allocateFramedBody, HEADER_BYTES, reuseFramedBody, type Packet } from "./core";
import { LibvirtStreamEndpointError, LibvirtTransportError } from "./errors";
import { decodeLibvirtError, Limits, MessageStatus, MessageType } from "./protocol";
import {
  StreamMachine,
  type StreamMachineOptions,
  type StreamPort,
  type UploadPhase,
} from "./stream-machine";
import { isReadIntoSource, type ReadIntoSource } from "./upload-source";

/**
 * The upload's data payload: what makes a whole packet, header included,
 * exactly 256 KiB. libvirt's own client sends 262120 bytes (its legacy
 * payload limit, which every daemon accepts), a packet of 256 KiB + 4; over
 * SSH, whose channels carry 32 KiB packets (OpenSSH's size), that is eight
 * full SSH packets and a 4-byte one, and each SSH packet costs ssh2 a cipher
 * context, random padding and two buffers in JavaScript. 262116 stays under
 * the legacy limit and splits evenly.
 */
export const UPLOAD_FRAME_BODY_BYTES = 256 * 1024 - HEADER_BYTES;

/**
 * Frames kept for reuse. Backpressure bounds how many are out at once (one
 * being filled, one ready, those the transport holds), so the spares rarely
 * reach this; it only caps an odd transport.
 */
const SPARE_FRAMES = 16;

/**
 * How many frames a ReadIntoSource upload has out at once: being read, read
 * and waiting, and in the transport. The transport's own buffer could hold
 * more (ssh2's channel takes 2 MiB while the SSH window is shut), but a
 * frame in the transport is sent within the turn it is written over SSH;
 * more frames only cost memory (six measured ~0.5 MB more peak, no faster).
 */
const FRAMES_AHEAD = 4;

/**
 * Frames one read fills (one readv). Every read is a trip through libuv's
 * thread pool, which cost more CPU than the copy itself at one 256 KiB read
 * per frame (about a fifth of the uploading process's CPU on Node 22).
 */
const FRAMES_PER_READ = 2;

/**
 * Uploads a source into a stream. The source is read only when the
 * transport can take more (a Readable in paused mode + `read()`; a
 * ReadIntoSource one read at a time, into the next frame while the previous
 * one is sent), so memory stays at a few frames plus the transport's buffer,
 * whatever the source's size. Frames come back for reuse once written.
 */
export class UploadMachine extends StreamMachine<UploadPhase> {
  phase: UploadPhase = "awaiting-reply";
  private readonly chunkBytes: number;
  private readonly abortGraceMs: number;
  private readonly readable: Readable | undefined;
  private readonly readInto: ReadIntoSource | undefined;
  private stopWaitingForDrain: (() => void) | undefined;
  private abortGraceTimer: NodeJS.Timeout | undefined;
  /** Why we are aborting; reported once the daemon confirms (or the grace period ends). */
  private abortReason: Error | undefined;
  /** The body being filled, with room for its header (see allocateFramedBody), and how full it is. */
  private frame: Buffer | undefined;
  private frameFilled = 0;
  /** ReadIntoSource: the frames the current or next read fills, and how many bytes they hold (from the first on). */
  private filling: Buffer[] = [];
  private fillingBytes = 0;
  /** ReadIntoSource: full frames not sent yet (read while the transport was backed up), oldest first. */
  private ready: Buffer[] = [];
  /** Written frames, waiting to be filled again. */
  private readonly spareFrames: Buffer[] = [];
  /** Full frames handed to the transport and not yet written by it. */
  private framesOut = 0;
  /** A ReadIntoSource read is under way (into `frame`). */
  private reading = false;
  /** The rest of a source chunk read before the transport backed up; sent before reading more. */
  private unsent: Buffer | undefined;
  /** The source has ended; once everything held back is out, the upload finishes. */
  private sourceDone = false;
  /** Bytes handed to the transport. */
  bytesSent = 0;

  private readonly onReadable = (): void => this.pump();
  private readonly onEnd = (): void => {
    this.sourceDone = true;
    this.pump();
  };
  private readonly onError = (error: unknown): void => this.sourceFailed(error);
  private readonly onClose = (): void => {
    if (this.sourceDone) return;
    if (this.phase === "sending" || this.phase === "awaiting-reply") {
      this.sourceFailed(new Error("the source closed before its end"));
    }
  };
  private readonly onDrained = (): void => {
    this.stopWaitingForDrain = undefined;
    this.pump();
  };

  constructor(
    port: StreamPort,
    procedure: string,
    source: Readable | ReadIntoSource,
    options: StreamMachineOptions = {},
  ) {
    super(port, procedure);
    this.chunkBytes = Math.min(options.chunkBytes ?? UPLOAD_FRAME_BODY_BYTES, Limits.streamChunk);
    this.abortGraceMs = options.abortGraceMs ?? 5000;
    if (isReadIntoSource(source)) {
      this.readInto = source;
      return;
    }
    this.readable = source;
    // 'readable' puts the source in paused mode: nothing is read until we call read().
    source.on("readable", this.onReadable);
    source.on("end", this.onEnd);
    source.on("error", this.onError);
    source.on("close", this.onClose);
  }

  onReply(packet: Packet): void {
    if (this.handleLateReply(packet)) return;
    if (this.phase !== "awaiting-reply") return;
    if (packet.header.status !== MessageStatus.OK) {
      this.fail(this.abortReason ?? decodeLibvirtError(this.procedure, packet.body));
      return;
    }
    if (this.abortReason) {
      // The source failed while the call was on its way: the daemon has just opened the
      // stream, so abort it and wait for the confirmation like any other source failure.
      this.startAbort(this.abortReason);
      return;
    }
    this.phase = "sending";
    if (this.readable?.readableEnded) this.sourceDone = true;
    this.pump();
  }

  onStream(packet: Packet): void {
    if (this.finished) return;
    const { status, type } = packet.header;
    if (status === MessageStatus.ERROR) {
      // The daemon failed (disk full, volume gone...) or confirms our abort: stop sending at once.
      this.fail(this.abortReason ?? decodeLibvirtError(this.procedure, packet.body));
    } else if (status === MessageStatus.OK) {
      if (this.phase === "finishing") this.succeed();
      else if (this.phase === "aborting") this.fail(this.abortReason!);
      else
        this.failAndAbort(
          new LibvirtTransportError(
            "protocol",
            `libvirt ended ${this.procedure} before we finished`,
          ),
        );
    } else if (type === MessageType.STREAM_HOLE || packet.body.length > 0) {
      this.failAndAbort(
        new LibvirtTransportError("protocol", `libvirt sent data during ${this.procedure}`),
      );
    }
  }

  cancel(error: Error): void {
    if (this.finished) return;
    if (this.phase === "awaiting-reply") {
      this.abortOnLateReply = true;
      this.fail(this.abortReason ?? error);
    } else if (this.phase === "aborting") {
      this.fail(this.abortReason ?? error);
    } else {
      this.failAndAbort(error);
    }
  }

  private failAndAbort(error: Error): void {
    this.port.send(MessageStatus.ERROR);
    this.fail(error);
  }

  private pump(): void {
    if (this.readInto) this.pumpReadInto(this.readInto);
    else this.pumpReadable();
  }

  private pumpReadable(): void {
    while (this.phase === "sending" && this.stopWaitingForDrain === undefined) {
      const bytes = this.unsent ?? (this.sourceDone ? null : this.readSource());
      this.unsent = undefined;
      if (bytes === null) {
        if (this.sourceDone) this.finishSending();
        return;
      }
      const consumed = this.fillFrames(bytes);
      if (consumed < bytes.length) this.unsent = bytes.subarray(consumed);
    }
  }

  /**
   * One read at a time, straight into the frames being filled (up to
   * FRAMES_PER_READ). Full frames are sent as they come, and the next read
   * starts before they are, so reading the file overlaps sending (and
   * encrypting) what was read.
   */
  private pumpReadInto(source: ReadIntoSource): void {
    while (this.phase === "sending") {
      while (this.filling.length > 0 && this.fillingBytes >= this.chunkBytes) {
        this.ready.push(this.filling.shift()!);
        this.fillingBytes -= this.chunkBytes;
      }
      if (!this.reading && !this.sourceDone) {
        let room = FRAMES_AHEAD - this.framesOut - this.ready.length - this.filling.length;
        while (room-- > 0 && this.filling.length < FRAMES_PER_READ) {
          this.filling.push(this.takeFrame());
        }
        if (this.filling.length > 0) this.startRead(source);
      }
      if (this.stopWaitingForDrain !== undefined) return;
      const full = this.ready.shift();
      if (full) {
        if (!this.sendBody(full)) this.waitForDrain();
        continue;
      }
      if (this.sourceDone && !this.reading) {
        // The last, partial frame (if any) goes out as the Readable path sends its own.
        this.frame = this.filling[0];
        this.frameFilled = this.fillingBytes;
        this.filling = [];
        this.fillingBytes = 0;
        this.finishSending();
      }
      return;
    }
  }

  private startRead(source: ReadIntoSource): void {
    const [first, ...rest] = this.filling;
    const targets = [first!.subarray(this.fillingBytes), ...rest];
    this.reading = true;
    source.readInto(targets).then(
      (bytes) => {
        this.reading = false;
        if (this.finished) return;
        if (bytes === 0) this.sourceDone = true;
        else this.fillingBytes += bytes;
        this.pump();
      },
      (error: unknown) => {
        this.reading = false;
        this.sourceFailed(error);
      },
    );
  }

  private readSource(): Buffer | null {
    const chunk: unknown = this.readable!.read();
    if (chunk === null) return null;
    // Strings and typed arrays other than Buffer are converted; Buffers are only read.
    return Buffer.isBuffer(chunk)
      ? chunk
      : typeof chunk === "string"
        ? Buffer.from(chunk)
        : Buffer.from(chunk as Uint8Array);
  }

  private takeFrame(): Buffer {
    return this.spareFrames.pop() ?? allocateFramedBody(this.chunkBytes);
  }

  private waitForDrain(): void {
    this.stopWaitingForDrain = this.port.onceDrained(this.onDrained);
  }

  /**
   * Copies `bytes` into frames and sends each frame once it is full; stops
   * after the first send the transport refuses and waits for its drain.
   * Returns how many bytes it took.
   */
  private fillFrames(bytes: Buffer): number {
    let offset = 0;
    while (offset < bytes.length) {
      this.frame ??= this.takeFrame();
      const copied = bytes.copy(this.frame, this.frameFilled, offset);
      offset += copied;
      this.frameFilled += copied;
      if (this.frameFilled < this.chunkBytes) continue;
      if (!this.sendFrame()) {
        this.waitForDrain();
        break;
      }
    }
    return offset;
  }

  /** Sends the frame being filled (also a partial one); false when the transport is backed up. */
  private sendFrame(): boolean {
    const frame = this.frame!.subarray(0, this.frameFilled);
    this.frame = undefined;
    this.frameFilled = 0;
    return this.sendBody(frame);
  }

  /** Sends a frame's body; the frame returns to the spares once the transport wrote it. */
  private sendBody(body: Buffer): boolean {
    this.bytesSent += body.length;
    const whole = body.length === this.chunkBytes ? body : undefined;
    return this.port.send(MessageStatus.CONTINUE, body, whole && this.frameWritten(whole));
  }

  private frameWritten(frame: Buffer): (error?: Error | null) => void {
    this.framesOut++;
    return (error) => {
      this.framesOut--;
      if (error || this.finished) return;
      if (this.spareFrames.length < SPARE_FRAMES) {
        reuseFramedBody(frame);
        this.spareFrames.push(frame);
      }
      // A ReadIntoSource may have stopped reading ahead until this frame came back.
      if (this.readInto && !this.reading) this.pump();
    };
  }

  /** Everything is read and all but the last frame sent: send it, then the finish packet. */
  private finishSending(): void {
    if (this.frameFilled > 0) this.sendFrame();
    // The finish packet queues behind the data already written, so it needs no drain.
    this.phase = "finishing";
    this.port.send(MessageStatus.OK);
  }

  private sourceFailed(cause: unknown): void {
    if (this.finished || this.phase === "aborting" || this.phase === "finishing") return;
    if (this.abortReason) return;
    const error = new LibvirtStreamEndpointError(this.procedure, "source", { cause });
    // Before the reply there is no stream to abort yet: remember why, and abort once it exists.
    if (this.phase === "awaiting-reply") this.abortReason = error;
    else this.startAbort(error);
  }

  /**
   * Tells the daemon to discard the stream and waits (briefly) for it to confirm, so the
   * volume is no longer being written when the caller goes on to delete or rebuild it.
   */
  private startAbort(error: Error): void {
    this.phase = "aborting";
    this.abortReason = error;
    this.port.send(MessageStatus.ERROR);
    this.abortGraceTimer = setTimeout(() => this.fail(error), this.abortGraceMs);
    this.abortGraceTimer.unref();
  }

  protected cleanup(): void {
    this.stopWaitingForDrain?.();
    this.stopWaitingForDrain = undefined;
    if (this.abortGraceTimer) clearTimeout(this.abortGraceTimer);
    this.frame = undefined;
    this.ready = [];
    this.filling = [];
    this.spareFrames.length = 0;
    this.unsent = undefined;
    if (this.readInto) {
      this.readInto.close?.();
      return;
    }
    const source = this.readable!;
    source.off("readable", this.onReadable);
    source.off("end", this.onEnd);
    source.off("error", this.onError);
    source.off("close", this.onClose);
    if (this.phase === "failed" && !source.destroyed) {
      // A failed upload will never read the rest: release the source (file descriptor, HTTP body).
      source.on("error", () => undefined);
      source.destroy();
    }
  }
}
