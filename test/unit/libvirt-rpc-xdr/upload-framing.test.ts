/**
 * How an upload turns its source into packets: full frames of one size
 * whatever sizes the source's chunks have, framed in place (no second copy),
 * the last one partial, every byte once and in order, and nothing written
 * past a send the transport refused until it drains.
 */
import assert from "node:assert/strict";
import { Readable } from "node:stream";
import fc from "fast-check";
import {
  HEADER_BYTES,
  Limits,
  MessageStatus,
  MessageType,
  PacketDecoder,
  REMOTE_PROGRAM,
  UPLOAD_FRAME_BODY_BYTES,
  UploadMachine,
  allocateFramedBody,
  encodePacket,
  type Packet,
  type StreamPort,
} from "../../../provider/libvirt-rpc-xdr";

const header = {
  program: REMOTE_PROGRAM,
  version: 1,
  procedure: 208,
  type: MessageType.STREAM,
  serial: 7,
  status: MessageStatus.CONTINUE,
};

function decodeOne(bytes: Buffer): Packet {
  const packets = new PacketDecoder().push(bytes);
  assert.equal(packets.length, 1);
  return packets[0]!;
}

describe("libvirt upload framing", () => {
  it("frames a body allocated with header room in place, with the same bytes a copy would have", () => {
    const body = allocateFramedBody(1000);
    body.fill(7);
    const copied = encodePacket(header, Buffer.from(body));
    const framed = encodePacket(header, body);
    assert.equal(framed.buffer, body.buffer, "no copy: the packet is the body's own buffer");
    assert.equal(framed.byteOffset, body.byteOffset - HEADER_BYTES);
    assert.deepEqual(framed, copied);
    assert.equal(decodeOne(framed).body.length, 1000);
  });

  it("frames a prefix of such a body in place (the last, partial frame)", () => {
    const body = allocateFramedBody(1000);
    body.fill(3, 0, 10);
    const framed = encodePacket(header, body.subarray(0, 10));
    assert.equal(framed.buffer, body.buffer);
    assert.equal(framed.length, HEADER_BYTES + 10);
    assert.deepEqual(decodeOne(framed).body, Buffer.alloc(10, 3));
  });

  it("frames a body in place only once, and copies every other body", () => {
    const body = allocateFramedBody(16).fill(1);
    const first = encodePacket(header, body);
    const second = encodePacket({ ...header, serial: 8 }, body);
    assert.notEqual(second.buffer, body.buffer, "a second framing must not rewrite the first");
    assert.equal(decodeOne(first).header.serial, 7);
    assert.equal(decodeOne(second).header.serial, 8);
    const plain = Buffer.alloc(HEADER_BYTES + 16).subarray(HEADER_BYTES);
    assert.notEqual(encodePacket(header, plain).buffer, plain.buffer);
  });

  it("makes a whole packet of exactly 256 KiB by default: eight 32 KiB SSH packets, within libvirt's legacy limit", () => {
    assert.equal(HEADER_BYTES + UPLOAD_FRAME_BODY_BYTES, 8 * 32 * 1024);
    assert.ok(UPLOAD_FRAME_BODY_BYTES <= Limits.streamChunk);
  });
});

/** A port that records what is sent and refuses (returns false) every `acceptBeforeBackup`-th data packet until drained. */
class FramingPort implements StreamPort {
  data: Buffer[] = [];
  statuses: number[] = [];
  private drainListener: (() => void) | undefined;
  backedUp = false;
  sentWhileBackedUp = 0;
  constructor(private readonly acceptBeforeBackup = Infinity) {}
  send(status: MessageStatus, body?: Buffer): boolean {
    // Only data must wait: the finish packet may queue behind the last frame.
    if (this.backedUp && status === MessageStatus.CONTINUE) this.sentWhileBackedUp++;
    this.statuses.push(status);
    if (status === MessageStatus.CONTINUE) this.data.push(Buffer.from(body!));
    if (this.data.length % this.acceptBeforeBackup === 0 && status === MessageStatus.CONTINUE) {
      this.backedUp = true;
      return false;
    }
    return true;
  }
  onceDrained(listener: () => void): () => void {
    this.drainListener = listener;
    return () => (this.drainListener = undefined);
  }
  drain(): void {
    this.backedUp = false;
    const listener = this.drainListener;
    this.drainListener = undefined;
    listener?.();
  }
  get waitingForDrain(): boolean {
    return this.drainListener !== undefined;
  }
  pauseInbound(): void {}
  resumeInbound(): void {}
  release(): void {}
}

const reply = (status: number): Packet => ({
  header: { ...header, type: MessageType.REPLY, status },
  body: Buffer.alloc(0),
});

async function upload(
  chunks: Buffer[],
  chunkBytes: number,
  acceptBeforeBackup = Infinity,
): Promise<FramingPort> {
  const port = new FramingPort(acceptBeforeBackup);
  const source = Readable.from(chunks, { objectMode: false });
  const machine = new UploadMachine(port, "storageVolUpload", source, { chunkBytes });
  machine.onReply(reply(MessageStatus.OK));
  for (let turns = 0; machine.phase === "sending" && turns < 10_000; turns++) {
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(port.sentWhileBackedUp, 0, "no data is sent after a refused send until the drain");
    if (port.waitingForDrain) port.drain();
  }
  assert.equal(machine.phase, "finishing");
  machine.onStream({ header: { ...header, status: MessageStatus.OK }, body: Buffer.alloc(0) });
  await machine.done;
  assert.equal(machine.bytesSent, Buffer.concat(chunks).length);
  return port;
}

describe("libvirt upload machine: frames", () => {
  it("sends full frames whatever the source's chunk sizes, the rest in one last frame, then OK", async () => {
    const source = Buffer.from(Array.from({ length: 1000 }, (_, i) => i % 251));
    const chunks = [10, 90, 300, 1, 599].reduce<Buffer[]>((list, size) => {
      const start = list.reduce((n, b) => n + b.length, 0);
      return [...list, source.subarray(start, start + size)];
    }, []);
    const port = await upload(chunks, 128);
    assert.deepEqual(
      port.data.map((d) => d.length),
      [128, 128, 128, 128, 128, 128, 128, 104],
    );
    assert.deepEqual(Buffer.concat(port.data), source);
    assert.equal(port.statuses.at(-1), MessageStatus.OK);
  });

  it("keeps every byte once and in order under any chunking and backpressure (property)", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(fc.uint8Array({ minLength: 1, maxLength: 700 }), { minLength: 0, maxLength: 12 }),
        fc.integer({ min: 1, max: 300 }),
        fc.integer({ min: 1, max: 4 }),
        async (arrays, chunkBytes, acceptBeforeBackup) => {
          const chunks = arrays.map((a) => Buffer.from(a));
          const port = await upload(chunks, chunkBytes, acceptBeforeBackup);
          assert.deepEqual(Buffer.concat(port.data), Buffer.concat(chunks));
          assert.ok(port.data.slice(0, -1).every((frame) => frame.length === chunkBytes));
          assert.ok(
            port.data.every((frame) => frame.length > 0),
            "no empty data packet",
          );
        },
      ),
      { numRuns: 60 },
    );
  });
});

/** A FramingPort whose transport finishes each write a turn later, as a socket does, and says so. */
class WritingPort extends FramingPort {
  frameBuffers = new Set<ArrayBufferLike>();
  override send(
    status: MessageStatus,
    body?: Buffer,
    onWritten?: (error?: Error | null) => void,
  ): boolean {
    if (body) this.frameBuffers.add(body.buffer);
    const accepted = super.send(status, body);
    if (onWritten) setImmediate(() => onWritten());
    return accepted;
  }
}

/** A file-like ReadIntoSource over `bytes` whose reads return `sizes` in turn (fewer bytes than asked, as reads may), across frames. */
function readIntoSource(bytes: Buffer, sizes: number[], failAt?: number) {
  let position = 0;
  let reads = 0;
  const source = {
    closed: 0,
    async readInto(targets: Buffer[]): Promise<number> {
      await new Promise((resolve) => setImmediate(resolve));
      if (failAt !== undefined && position >= failAt) throw new Error("disk read failed");
      const room = targets.reduce((sum, target) => sum + target.length, 0);
      const size = Math.min(room, sizes[reads++ % sizes.length]!, bytes.length - position);
      let copied = 0;
      for (const target of targets) {
        if (copied === size) break;
        copied += bytes.copy(target, 0, position + copied, position + size);
      }
      position += size;
      return size;
    },
    close() {
      source.closed++;
    },
  };
  return source;
}

async function uploadReadInto(
  bytes: Buffer,
  sizes: number[],
  chunkBytes: number,
  acceptBeforeBackup = Infinity,
) {
  const port = new WritingPort(acceptBeforeBackup);
  const source = readIntoSource(bytes, sizes);
  const machine = new UploadMachine(port, "storageVolUpload", source, { chunkBytes });
  machine.onReply(reply(MessageStatus.OK));
  for (let turns = 0; machine.phase === "sending" && turns < 100_000; turns++) {
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(port.sentWhileBackedUp, 0, "no data is sent after a refused send until the drain");
    if (port.waitingForDrain) port.drain();
  }
  assert.equal(machine.phase, "finishing");
  machine.onStream({ header: { ...header, status: MessageStatus.OK }, body: Buffer.alloc(0) });
  await machine.done;
  return { port, source, machine };
}

describe("libvirt upload machine: a source that reads into the frames (a file)", () => {
  it("keeps every byte once and in order, in full frames, under any read sizes and backpressure (property)", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 0, max: 3000 }),
        fc.array(fc.integer({ min: 1, max: 1200 }), { minLength: 1, maxLength: 5 }),
        fc.integer({ min: 1, max: 300 }),
        fc.integer({ min: 1, max: 5 }),
        async (length, sizes, chunkBytes, acceptBeforeBackup) => {
          const bytes = Buffer.from(Array.from({ length }, (_, i) => (i * 7) % 256));
          const { port, source, machine } = await uploadReadInto(
            bytes,
            sizes,
            chunkBytes,
            acceptBeforeBackup,
          );
          assert.deepEqual(Buffer.concat(port.data), bytes);
          assert.ok(port.data.slice(0, -1).every((frame) => frame.length === chunkBytes));
          assert.ok(
            port.data.every((frame) => frame.length > 0),
            "no empty data packet",
          );
          assert.equal(machine.bytesSent, length);
          assert.equal(source.closed, 1, "the source is closed once");
        },
      ),
      { numRuns: 60 },
    );
  });

  it("sends 64 frames from a handful of reused buffers", async () => {
    const bytes = Buffer.from(Array.from({ length: 64 * 100 }, (_, i) => i % 256));
    const { port } = await uploadReadInto(bytes, [100], 100, 3);
    assert.equal(port.data.length, 64);
    assert.ok(port.frameBuffers.size <= 6, `${port.frameBuffers.size} buffers for 64 frames`);
  });

  it("aborts the stream when a read fails, and closes the source", async () => {
    const port = new WritingPort();
    const source = readIntoSource(Buffer.alloc(1000, 1), [100], 300);
    const machine = new UploadMachine(port, "storageVolUpload", source, {
      chunkBytes: 100,
      abortGraceMs: 50,
    });
    machine.onReply(reply(MessageStatus.OK));
    const error = await machine.done.then(
      () => assert.fail("the upload should fail"),
      (e: unknown) => e as Error,
    );
    assert.match(String(error.cause), /disk read failed/);
    assert.equal(port.statuses.at(-1), MessageStatus.ERROR, "the daemon was told to abort");
    assert.equal(Buffer.concat(port.data).length, 300);
    assert.equal(source.closed, 1);
  });
});
