import assert from "node:assert/strict";
import {
  HEADER_BYTES,
  KEEPALIVE_PROGRAM,
  LibvirtError,
  LibvirtTransportError,
  MessageType,
  PacketDecoder,
  REMOTE_PROGRAM,
  RpcCore,
  XdrReader,
  encodePacket,
  readRemoteError,
  type Packet,
  type SerialHandler,
} from "../../../provider/libvirt-rpc-xdr";
import { remoteErrorBody } from "./fake-daemon";

const header = (serial: number, type: number = MessageType.REPLY, status = 0) => ({
  program: REMOTE_PROGRAM,
  version: 1,
  procedure: 59,
  type,
  serial,
  status,
});

class Recorder implements SerialHandler {
  replies: Packet[] = [];
  streams: Packet[] = [];
  lost: LibvirtTransportError | undefined;
  onReply(p: Packet) {
    this.replies.push(p);
  }
  onStream(p: Packet) {
    this.streams.push(p);
  }
  onConnectionLost(e: LibvirtTransportError) {
    this.lost = e;
  }
}

describe("libvirt RPC core (sans-IO)", () => {
  it("frames packets whatever way the bytes are split", () => {
    const packets = [
      encodePacket(header(1), Buffer.from("hello!!!")),
      encodePacket(header(2)),
      encodePacket(header(3), Buffer.alloc(1000, 9)),
    ];
    const all = Buffer.concat(packets);
    for (let split = 0; split <= all.length; split += 7) {
      const decoder = new PacketDecoder();
      const out = [...decoder.push(all.subarray(0, split)), ...decoder.push(all.subarray(split))];
      assert.deepEqual(
        out.map((p) => [p.header.serial, p.body.length]),
        [
          [1, 8],
          [2, 0],
          [3, 1000],
        ],
      );
      assert.equal(decoder.bufferedBytes, 0);
    }
    // one byte at a time
    const decoder = new PacketDecoder();
    const out: Packet[] = [];
    for (const byte of all) out.push(...decoder.push(Buffer.from([byte])));
    assert.equal(out.length, 3);
    assert.equal(out[0]!.body.toString(), "hello!!!");
  });

  it("rejects packets shorter than a header or larger than the limit", () => {
    const tooShort = Buffer.from("0000001b", "hex");
    assert.throws(() => new PacketDecoder().push(tooShort), /27 bytes/);
    const tooLong = Buffer.alloc(4);
    tooLong.writeUInt32BE(1024 + 1);
    assert.throws(() => new PacketDecoder(1024).push(tooLong), LibvirtTransportError);
    assert.equal(HEADER_BYTES, 28);
  });

  it("routes replies to their serial in any order, drops replies nobody waits for, ignores events", () => {
    const sent: Buffer[] = [];
    const core = new RpcCore((p) => sent.push(p));
    const a = new Recorder();
    const b = new Recorder();
    const serialA = core.allocateSerial();
    const serialB = core.allocateSerial();
    assert.notEqual(serialA, serialB);
    core.register(serialA, a);
    core.register(serialB, b);
    core.receive(
      Buffer.concat([
        encodePacket(header(serialB), Buffer.from("bbbb")),
        encodePacket(header(0, MessageType.MESSAGE), Buffer.alloc(8)),
        encodePacket(header(999)),
        encodePacket(header(serialA, MessageType.STREAM, 2), Buffer.from("data")),
        encodePacket(header(serialA), Buffer.from("aaaa")),
      ]),
    );
    assert.equal(b.replies[0]!.body.toString(), "bbbb");
    assert.equal(a.streams[0]!.body.toString(), "data");
    assert.equal(a.replies[0]!.body.toString(), "aaaa");
    assert.equal(core.stats.ignoredEvents, 1);
    assert.equal(core.stats.droppedPackets, 1);
    core.release(serialA);
    core.receive(encodePacket(header(serialA)));
    assert.equal(a.replies.length, 1);
    assert.equal(core.stats.droppedPackets, 2);
    assert.equal(sent.length, 0);
  });

  it("answers a keepalive ping with a pong on serial 0", () => {
    const sent: Buffer[] = [];
    const core = new RpcCore((p) => sent.push(p));
    core.receive(
      encodePacket({
        program: KEEPALIVE_PROGRAM,
        version: 1,
        procedure: 1,
        type: MessageType.MESSAGE,
        serial: 0,
        status: 0,
      }),
    );
    assert.equal(sent.length, 1);
    const pong = new PacketDecoder().push(sent[0]!)[0]!;
    assert.deepEqual(pong.header, {
      program: KEEPALIVE_PROGRAM,
      version: 1,
      procedure: 2,
      type: MessageType.MESSAGE,
      serial: 0,
      status: 0,
    });
    assert.equal(core.stats.pingsAnswered, 1);
  });

  it("fails every waiting call once when the peer speaks another protocol", () => {
    const core = new RpcCore(() => undefined);
    const a = new Recorder();
    const b = new Recorder();
    core.register(1, a);
    core.register(2, b);
    core.receive(encodePacket({ ...header(1), program: 0x12345678 }));
    assert.equal(a.lost?.failure, "protocol");
    assert.equal(b.lost, a.lost);
    assert.equal(core.inFlight, 0);
    const late = new Recorder();
    core.register(3, late);
    assert.equal(late.lost, a.lost, "a call made after the loss fails at once");
  });

  it("never reuses a serial still in flight when the counter wraps", () => {
    const core = new RpcCore(() => undefined);
    (core as unknown as { lastSerial: number }).lastSerial = 0xfffffffe;
    core.register(1, new Recorder());
    assert.equal(core.allocateSerial(), 0xffffffff);
    assert.equal(core.allocateSerial(), 2, "skips 0 and the 1 still in flight");
  });

  it("maps 'unknown procedure' to NO_SUPPORT while keeping the daemon's message", () => {
    const remote = readRemoteError(
      new XdrReader(remoteErrorBody({ code: 39, domain: 7, message: "unknown procedure: 9999" })),
    );
    const error = new LibvirtError("bogus", remote);
    assert.equal(error.code, 3);
    assert.equal(error.remote.code, 39);
    assert.match(error.message, /unknown procedure: 9999/);
  });
});
