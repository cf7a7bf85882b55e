/**
 * "No path may wedge": random interleavings of every event a stream can see
 * (the call's reply, daemon data/OK/ERROR, the source's data/end/error, the
 * transport draining, the link dying) followed by the caller's deadline. The
 * call must always settle by then, exactly once, and must never send data
 * after it has failed.
 */
import assert from "node:assert/strict";
import { Readable, Writable } from "node:stream";
import fc from "fast-check";
import {
  DownloadMachine,
  LibvirtTimeoutError,
  LibvirtTransportError,
  MessageStatus,
  MessageType,
  UploadMachine,
  type Packet,
  type ReadIntoSource,
  type StreamPort,
} from "../../../provider/libvirt-rpc-xdr";
import { remoteErrorBody } from "./fake-daemon";

type Event =
  | "reply-ok"
  | "reply-error"
  | "daemon-ok"
  | "daemon-error"
  | "daemon-data"
  | "daemon-eof"
  | "local-data"
  | "local-end"
  | "local-error"
  | "drain"
  | "link-lost";

const events: Event[] = [
  "reply-ok",
  "reply-error",
  "daemon-ok",
  "daemon-error",
  "daemon-data",
  "daemon-eof",
  "local-data",
  "local-end",
  "local-error",
  "drain",
  "link-lost",
];

function packet(type: number, status: number, body: Uint8Array = Buffer.alloc(0)): Packet {
  return {
    header: { program: 0x20008086, version: 1, procedure: 208, type, serial: 7, status },
    body: Buffer.from(body),
  };
}

class RecordingPort implements StreamPort {
  sent: { status: number; bytes: number; afterSettle: boolean }[] = [];
  released = 0;
  paused = 0;
  settled = false;
  writable = true;
  private drainListeners: (() => void)[] = [];
  send(status: MessageStatus, body?: Buffer): boolean {
    this.sent.push({ status, bytes: body?.length ?? 0, afterSettle: this.settled });
    return this.writable;
  }
  onceDrained(listener: () => void): () => void {
    this.drainListeners.push(listener);
    return () => (this.drainListeners = this.drainListeners.filter((l) => l !== listener));
  }
  drain(): void {
    for (const listener of this.drainListeners.splice(0)) listener();
  }
  pauseInbound(): void {
    this.paused++;
  }
  resumeInbound(): void {
    this.paused--;
  }
  release(): void {
    this.released++;
  }
}

const settle = () => new Promise((resolve) => setImmediate(resolve));

async function drive(
  kind: "upload" | "upload-file" | "download",
  sequence: Event[],
  writable: boolean,
): Promise<void> {
  const port = new RecordingPort();
  port.writable = writable;
  const source = new Readable({ read() {} });
  let sourceEnded = false;
  const sink = new Writable({
    highWaterMark: 1,
    write(_chunk, _encoding, callback) {
      setImmediate(callback);
    },
  });
  sink.on("error", () => undefined);
  const file = new ScriptedReadInto();
  const machine =
    kind === "upload"
      ? new UploadMachine(port, "storageVolUpload", source, { abortGraceMs: 5 })
      : kind === "upload-file"
        ? new UploadMachine(port, "storageVolUpload", file, { abortGraceMs: 5, chunkBytes: 24 })
        : new DownloadMachine(port, "storageVolDownload", sink);
  let outcomes = 0;
  machine.done.then(
    () => {
      outcomes++;
      port.settled = true;
    },
    () => {
      outcomes++;
      port.settled = true;
    },
  );
  for (const event of sequence) {
    switch (event) {
      case "reply-ok":
        machine.onReply(packet(MessageType.REPLY, MessageStatus.OK));
        break;
      case "reply-error":
        machine.onReply(packet(MessageType.REPLY, MessageStatus.ERROR, remoteErrorBody()));
        break;
      case "daemon-ok":
        machine.onStream(packet(MessageType.STREAM, MessageStatus.OK));
        break;
      case "daemon-error":
        machine.onStream(packet(MessageType.STREAM, MessageStatus.ERROR, remoteErrorBody()));
        break;
      case "daemon-data":
        machine.onStream(packet(MessageType.STREAM, MessageStatus.CONTINUE, Buffer.alloc(8, 1)));
        break;
      case "daemon-eof":
        machine.onStream(packet(MessageType.STREAM, MessageStatus.CONTINUE));
        break;
      case "local-data":
        if (kind === "upload-file") file.next(16);
        else if (!source.destroyed && !sourceEnded) source.push(Buffer.alloc(16, 2));
        break;
      case "local-end":
        if (kind === "upload-file") file.next(0);
        else if (!source.destroyed && !sourceEnded) source.push(null);
        sourceEnded = true;
        break;
      case "local-error":
        if (kind === "upload") source.destroy(new Error("source broke"));
        else if (kind === "upload-file") file.next(new Error("read failed"));
        else sink.destroy(new Error("sink broke"));
        break;
      case "drain":
        port.drain();
        break;
      case "link-lost":
        machine.onConnectionLost(new LibvirtTransportError("closed", "gone"));
        break;
    }
    await settle();
  }
  // The deadline always comes.
  machine.cancel(new LibvirtTimeoutError(kind, 1));
  await settle();
  await new Promise((resolve) => setTimeout(resolve, 10)); // longer than abortGraceMs
  assert.equal(outcomes, 1, `settled ${outcomes} times after ${sequence.join(", ")}`);
  assert.ok(
    !port.sent.some((s) => s.afterSettle && s.status === MessageStatus.CONTINUE),
    `sent data after settling: ${sequence.join(", ")}`,
  );
  assert.equal(port.paused, 0, "left the connection paused");
  assert.ok(port.released <= 1);
  assert.ok(machine.phase === "done" || machine.phase === "failed");
  if (kind === "upload-file") assert.equal(file.closed, 1, "the file is closed once");
}

/**
 * A ReadIntoSource whose reads finish only when the script says: with 16
 * bytes, at the end (0) or failed. Outcomes told before a read is asked for
 * wait for it, as a file's data would.
 */
class ScriptedReadInto implements ReadIntoSource {
  private pending: ((outcome: number | Error) => void) | undefined;
  private queued: (number | Error)[] = [];
  closed = 0;
  readInto(targets: Buffer[]): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      const finish = (outcome: number | Error): void => {
        if (outcome instanceof Error) return reject(outcome);
        let left = outcome;
        for (const target of targets) {
          const n = Math.min(left, target.length);
          target.fill(2, 0, n);
          left -= n;
        }
        resolve(outcome - left);
      };
      const queued = this.queued.shift();
      if (queued !== undefined) finish(queued);
      else this.pending = finish;
    });
  }
  next(outcome: number | Error): void {
    const pending = this.pending;
    this.pending = undefined;
    if (pending) pending(outcome);
    else this.queued.push(outcome);
  }
  close(): void {
    this.closed++;
  }
}

describe("stream state machines under random event orders (property)", function () {
  this.timeout(120_000);
  for (const kind of ["upload", "upload-file", "download"] as const) {
    it(`${kind}: always settles exactly once by the deadline, never sends data after failing`, async () => {
      await fc.assert(
        fc.asyncProperty(
          fc.array(fc.constantFrom(...events), { maxLength: 12 }),
          fc.boolean(),
          (sequence, writable) => drive(kind, sequence, writable),
        ),
        { numRuns: 120 },
      );
    });
  }
});
