/**
 * Connection and stream behaviour that a real daemon will not show on demand:
 * silence, out-of-order replies, garbage, an error after the finish packet,
 * a stalled transport. The peer is a scripted fake on an in-memory duplex.
 */
import assert from "node:assert/strict";
import { Readable, Writable } from "node:stream";
import {
  CallCounter,
  KEEPALIVE_PROGRAM,
  KeepaliveProcedure,
  LibvirtError,
  LibvirtStreamEndpointError,
  LibvirtTimeoutError,
  LibvirtTransportError,
  Limits,
  MessageStatus,
  MessageType,
  Procedures,
  XdrWriter,
  type Procedure,
  type StorageVolHandle,
} from "../../../provider/libvirt-rpc-xdr";
import { FakeDaemon, tick } from "./fake-daemon";

const vol: StorageVolHandle = { pool: "lab", name: "v", key: "/pool/v" };
const hostnameBody = (name: string) => Buffer.from(new XdrWriter().string(name).finish());

async function rejectionOf(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected a rejection");
}

function chunkedSource(
  chunks: number,
  size = 64 * 1024,
  failAt?: number,
): Readable & { pulled: () => number } {
  let pulled = 0;
  const source = new Readable({
    highWaterMark: size,
    read() {
      if (failAt !== undefined && pulled === failAt) {
        this.destroy(new Error("disk read failed"));
        return;
      }
      if (pulled === chunks) {
        this.push(null);
        return;
      }
      pulled++;
      this.push(Buffer.alloc(size, pulled % 256));
    },
  });
  return Object.assign(source, { pulled: () => pulled });
}

describe("libvirt connection over a scripted peer", () => {
  it("does the handshake in libvirt's order, in one round trip: auth list, keepalive check, open with the URI", async () => {
    const daemon = new FakeDaemon();
    const conn = await daemon.open({ uri: "test:///default" });
    assert.deepEqual(conn.info, { authTypes: [0], keepalive: true });
    const order = daemon.received
      .filter((p) => p.header.type === MessageType.CALL)
      .map((p) => p.header.procedure);
    assert.deepEqual(order, [66, 60, 1]);
    const open = daemon.received.find((p) => p.header.procedure === 1)!;
    assert.ok(open.body.includes(Buffer.from("test:///default")));
    conn.destroy();
  });

  it("asks again what overtook AUTH_LIST and was refused for it (libvirtd runs a client's calls side by side)", async () => {
    const daemon = new FakeDaemon();
    daemon.refuseCallsThatOvertakeAuthList = true;
    const conn = await daemon.open();
    assert.deepEqual(conn.info, { authTypes: [0], keepalive: true });
    const calls = daemon.received
      .filter((p) => p.header.type === MessageType.CALL)
      .map((p) => p.header.procedure);
    assert.deepEqual(calls, [66, 60, 1, 60, 1]);
    conn.destroy();
  });

  it("sends the whole handshake before the first answer comes back", async () => {
    const daemon = new FakeDaemon();
    daemon.autoHandshake = false;
    const opening = daemon.open();
    const [authList, keepalive, open] = await Promise.all([
      daemon.nextCall(66),
      daemon.nextCall(60),
      daemon.nextCall(1),
    ]);
    daemon.reply(authList, new XdrWriter().array([0], 20, (w, t) => w.int(t)).finish());
    daemon.reply(keepalive, new XdrWriter().int(1).finish());
    daemon.reply(open);
    const conn = await opening;
    assert.deepEqual(conn.info, { authTypes: [0], keepalive: true });
    conn.destroy();
  });

  it("authenticates with polkit when that is all the daemon offers, and proceeds on an old daemon", async () => {
    const polkit = new FakeDaemon();
    polkit.authTypes = [2];
    const polkitConn = await polkit.open();
    assert.deepEqual(polkitConn.info, { authTypes: [2], keepalive: true });
    polkitConn.destroy();
    const calls = polkit.received
      .filter((p) => p.header.type === MessageType.CALL)
      .map((p) => p.header.procedure);
    // The early keepalive check and open are refused before polkit, and asked again after it.
    assert.deepEqual(calls, [66, 60, 1, 70, 60, 1]);

    const old = new FakeDaemon();
    old.authTypes = "unknown-procedure";
    const oldConn = await old.open();
    assert.deepEqual(oldConn.info.authTypes, []);
    oldConn.destroy();
  });

  it("refuses a daemon that only offers SASL, naming what it offered", async () => {
    const daemon = new FakeDaemon();
    daemon.authTypes = [1];
    const error = await rejectionOf(daemon.open());
    assert.ok(error instanceof LibvirtError, error.message);
    assert.equal(error.code, 94);
    assert.match(error.message, /only offers authentication types \[1\]/);
    assert.ok(daemon.clientSide.destroyed);
  });

  it("refuses, before sending, a call larger than the protocol's message limit", async () => {
    const daemon = new FakeDaemon();
    const conn = await daemon.open();
    const huge: Procedure<Buffer, void> = {
      ...Procedures.connectClose,
      name: "huge",
      encodeArgs: (w, bytes) => void w.opaque(bytes),
      decodeRet: () => undefined,
    };
    const sentBefore = daemon.received.length;
    const error = await rejectionOf(conn.call(huge, Buffer.alloc(Limits.messageMax)));
    assert.ok(error instanceof RangeError);
    assert.match(error.message, /huge: arguments of \d+ bytes exceed/);
    await tick(5);
    assert.equal(daemon.received.length, sentBefore);
    assert.equal(conn.isClosed, false);
    conn.destroy();
  });

  it("routes out-of-order replies to the right callers", async () => {
    const daemon = new FakeDaemon();
    const conn = await daemon.open();
    const first = conn.call(Procedures.connectGetHostname, undefined);
    const second = conn.call(Procedures.connectGetHostname, undefined);
    const [a, b] = [await daemon.nextCall(59), await daemon.nextCall(59)];
    daemon.reply(b, hostnameBody("second"));
    daemon.reply(a, hostnameBody("first"));
    assert.deepEqual(await Promise.all([first, second]), ["first", "second"]);
    conn.destroy();
  });

  it("counts calls by procedure while a counter is attached, and none before or after", async () => {
    const daemon = new FakeDaemon();
    const conn = await daemon.open();
    const counter = new CallCounter();
    const hostname = async () => {
      const call = conn.call(Procedures.connectGetHostname, undefined);
      daemon.reply(await daemon.nextCall(59), hostnameBody("h"));
      return call;
    };
    await hostname();
    conn.countCallsInto(counter);
    await hostname();
    await hostname();
    const version = conn.call(Procedures.connectGetLibVersion, undefined);
    daemon.reply(
      await daemon.nextCall(157),
      Buffer.from(new XdrWriter().uhyper(9_000_000).finish()),
    );
    await version;
    conn.countCallsInto(undefined);
    await hostname();
    assert.deepEqual(counter.byProcedure(), [
      ["connectGetHostname", 2],
      ["connectGetLibVersion", 1],
    ]);
    assert.equal(counter.total, 3);
    conn.destroy();
  });

  it("times out one call on a silent peer, keeps the others, and drops the late reply", async () => {
    const daemon = new FakeDaemon();
    const conn = await daemon.open();
    const slow = conn.call(Procedures.connectGetHostname, undefined, { timeoutMs: 50 });
    const other = conn.call(Procedures.connectGetHostname, undefined, { timeoutMs: 5000 });
    const slowCall = await daemon.nextCall(59);
    const otherCall = await daemon.nextCall(59);
    const error = await rejectionOf(slow);
    assert.ok(error instanceof LibvirtTimeoutError);
    daemon.reply(slowCall, hostnameBody("late"));
    daemon.reply(otherCall, hostnameBody("on time"));
    assert.equal(await other, "on time");
    assert.equal(conn.stats.droppedPackets, 1);
    assert.equal(conn.isClosed, false);
    conn.destroy();
  });

  it("closes within its bound when the peer never answers CONNECT_CLOSE", async () => {
    const daemon = new FakeDaemon();
    const conn = await daemon.open({ closeTimeoutMs: 100 });
    const started = Date.now();
    await conn.close();
    assert.ok(Date.now() - started < 1000);
    assert.ok(conn.isClosed);
    assert.ok(daemon.clientSide.destroyed);
  });

  it("fails every call in flight at once when the peer hangs up", async () => {
    const daemon = new FakeDaemon();
    const conn = await daemon.open();
    const calls = [1, 2, 3].map(() =>
      conn.call(Procedures.connectGetHostname, undefined, { timeoutMs: 10_000 }),
    );
    daemon.hangUp();
    for (const error of await Promise.all(calls.map(rejectionOf))) {
      assert.ok(error instanceof LibvirtTransportError);
      assert.equal(error.failure, "closed");
    }
    const after = await rejectionOf(conn.call(Procedures.connectGetHostname, undefined));
    assert.ok(after instanceof LibvirtTransportError);
  });

  it("fails the handshake with a transport error when the peer is silent", async () => {
    const daemon = new FakeDaemon();
    daemon.autoHandshake = false;
    const error = await rejectionOf(daemon.open({ handshakeTimeoutMs: 50 }));
    assert.ok(error instanceof LibvirtTransportError);
    assert.equal(error.failure, "handshake");
    assert.ok(daemon.clientSide.destroyed);
  });

  it("answers pings, ignores events, and ends the link on an absurd packet length", async () => {
    const daemon = new FakeDaemon();
    const conn = await daemon.open();
    daemon.ping();
    daemon.event();
    await tick(5);
    const pong = await daemon.next(
      (p) => p.header.procedure === 2 && p.header.type === MessageType.MESSAGE,
    );
    assert.equal(pong.header.serial, 0);
    assert.equal(conn.stats.ignoredEvents, 1);
    const pending = conn.call(Procedures.connectGetHostname, undefined);
    const garbage = Buffer.alloc(8);
    garbage.writeUInt32BE(0x7fffffff);
    daemon.send(garbage);
    const error = await rejectionOf(pending);
    assert.ok(
      error instanceof LibvirtTransportError && error.failure === "protocol",
      error.message,
    );
    assert.ok(conn.isClosed);
  });

  it("declares the link dead when keepalive pings go unanswered", async () => {
    const daemon = new FakeDaemon();
    const conn = await daemon.open({ keepalive: { intervalMs: 20, count: 2 } });
    const error = await rejectionOf(
      conn.call(Procedures.connectGetHostname, undefined, { timeoutMs: 5000 }),
    );
    assert.ok(
      error instanceof LibvirtTransportError && error.failure === "keepalive",
      error.message,
    );
    const pings = daemon.received.filter(
      (p) => p.header.procedure === 1 && p.header.type === MessageType.MESSAGE,
    );
    assert.ok(pings.length >= 1, "pinged before giving up");
  });

  describe("upload", () => {
    it("streams the source in chunks, finishes, and resolves only on the daemon's confirmation", async () => {
      const daemon = new FakeDaemon();
      const conn = await daemon.open();
      const upload = conn.upload({ vol }, chunkedSource(10));
      const call = await daemon.nextCall(208);
      daemon.reply(call);
      const finish = await daemon.nextStream(call.header.serial, MessageStatus.OK);
      assert.equal(finish.body.length, 0);
      const data = daemon.received.filter((p) => p.header.status === MessageStatus.CONTINUE);
      assert.equal(
        data.reduce((n, p) => n + p.body.length, 0),
        10 * 64 * 1024,
      );
      let settled = false;
      void upload.then(() => (settled = true));
      await tick(5);
      assert.equal(settled, false, "waits for the daemon's OK");
      daemon.stream(call, MessageStatus.OK);
      assert.deepEqual(await upload, { bytes: 10 * 64 * 1024 });
      conn.destroy();
    });

    it("acknowledges what arrives while it waits for the daemon to confirm its end", async () => {
      const daemon = new FakeDaemon();
      const conn = await daemon.open();
      const upload = conn.upload({ vol }, chunkedSource(2));
      const call = await daemon.nextCall(208);
      daemon.reply(call);
      await daemon.nextStream(call.header.serial, MessageStatus.OK);
      await tick(50); // the nudges after our last write have run out
      daemon.received.splice(0);
      // Something else arrives first (over SSH: a window adjustment), and sshd holds the answer.
      daemon.event();
      await new Promise((resolve) => setImmediate(resolve));
      await tick(1);
      assert.ok(
        daemon.received.some(
          (p) =>
            p.header.program === KEEPALIVE_PROGRAM &&
            p.header.procedure === KeepaliveProcedure.PONG,
        ),
        "a keepalive PONG carried the acknowledgement",
      );
      daemon.stream(call, MessageStatus.OK);
      await upload;
      daemon.received.splice(0);
      daemon.event();
      await tick(5);
      assert.equal(daemon.received.length, 0, "nothing owed once it is done: nothing sent");
      conn.destroy();
    });

    it("rejects with the daemon's error when it arrives after our finish packet", async () => {
      const daemon = new FakeDaemon();
      const conn = await daemon.open();
      const upload = conn.upload({ vol }, chunkedSource(2));
      const call = await daemon.nextCall(208);
      daemon.reply(call);
      await daemon.nextStream(call.header.serial, MessageStatus.OK);
      const body = new XdrWriter().int(9).int(18).uint(1).string("cannot write: disk full").int(2);
      body.uint(0).uint(0).uint(0).uint(0).int(0).int(0).uint(0);
      daemon.stream(call, MessageStatus.ERROR, Buffer.from(body.finish()));
      const error = await rejectionOf(upload);
      assert.ok(error instanceof LibvirtError);
      assert.equal(error.libvirtMessage, "cannot write: disk full");
      // A stream failure is the daemon's word about one call: the link stays up.
      assert.equal(conn.isClosed, false);
      conn.destroy();
    });

    it("stops at once on a daemon error while waiting for the transport to drain, and releases the source", async () => {
      const daemon = new FakeDaemon({ clientHighWaterMark: 1024 });
      const conn = await daemon.open();
      const source = chunkedSource(1000);
      daemon.holdWrites = true;
      const upload = conn.upload({ vol }, source);
      const call = await daemon.nextCall(208);
      daemon.reply(call);
      await tick(10);
      const pulledBefore = source.pulled();
      assert.ok(pulledBefore < 10, `backpressure held the source at ${pulledBefore} chunks`);
      daemon.stream(
        call,
        MessageStatus.ERROR,
        Buffer.from(
          new XdrWriter()
            .int(1)
            .int(18)
            .uint(0)
            .int(2)
            .uint(0)
            .uint(0)
            .uint(0)
            .uint(0)
            .int(0)
            .int(0)
            .uint(0)
            .finish(),
        ),
      );
      const error = await rejectionOf(upload);
      assert.ok(error instanceof LibvirtError);
      assert.ok(source.destroyed);
      daemon.releaseWrites();
      await tick(5);
      assert.equal(source.pulled(), pulledBefore, "nothing more was read after the error");
      conn.destroy();
    });

    it("aborts on a source error and reports it once the daemon confirms", async () => {
      const daemon = new FakeDaemon();
      const conn = await daemon.open();
      const upload = conn.upload({ vol }, chunkedSource(100, 1024, 3));
      const call = await daemon.nextCall(208);
      daemon.reply(call);
      const abort = await daemon.nextStream(call.header.serial, MessageStatus.ERROR);
      assert.equal(abort.body.length, 0);
      daemon.stream(
        call,
        MessageStatus.ERROR,
        Buffer.from(
          new XdrWriter()
            .int(1)
            .int(38)
            .uint(0)
            .int(2)
            .uint(0)
            .uint(0)
            .uint(0)
            .uint(0)
            .int(0)
            .int(0)
            .uint(0)
            .finish(),
        ),
      );
      const error = await rejectionOf(upload);
      assert.ok(error instanceof LibvirtStreamEndpointError, error.message);
      assert.match(error.message, /disk read failed/);
      conn.destroy();
    });

    it("when the source fails before the call's reply, aborts the stream once it exists and waits for the daemon", async () => {
      const daemon = new FakeDaemon();
      const conn = await daemon.open();
      const failing = new Readable({
        read() {
          this.destroy(new Error("image download failed"));
        },
      });
      let settled = false;
      const upload = conn.upload({ vol }, failing);
      void upload.catch(() => (settled = true));
      const call = await daemon.nextCall(208);
      await tick(5);
      assert.equal(settled, false, "still waiting: the daemon is about to open the stream");
      daemon.reply(call);
      const abort = await daemon.nextStream(call.header.serial, MessageStatus.ERROR);
      assert.equal(abort.body.length, 0);
      await tick(5);
      assert.equal(settled, false, "waits for the daemon to confirm the abort");
      daemon.stream(call, MessageStatus.OK);
      const error = await rejectionOf(upload);
      assert.ok(error instanceof LibvirtStreamEndpointError);
      assert.match(error.message, /image download failed/);
      conn.destroy();
    });

    it("gives up waiting for an abort confirmation after the grace period", async () => {
      const daemon = new FakeDaemon();
      const conn = await daemon.open({ stream: { abortGraceMs: 30 } });
      const started = Date.now();
      const upload = conn.upload({ vol }, chunkedSource(100, 1024, 2), { timeoutMs: 10_000 });
      daemon.reply(await daemon.nextCall(208));
      const error = await rejectionOf(upload);
      assert.ok(error instanceof LibvirtStreamEndpointError);
      assert.ok(Date.now() - started < 1000);
      conn.destroy();
    });

    it("answers a late OK with an abort when the call was cancelled before its reply", async () => {
      const daemon = new FakeDaemon();
      const conn = await daemon.open();
      const controller = new AbortController();
      const source = chunkedSource(5);
      const upload = conn.upload({ vol }, source, { signal: controller.signal });
      const call = await daemon.nextCall(208);
      controller.abort();
      await rejectionOf(upload);
      daemon.reply(call);
      const abort = await daemon.nextStream(call.header.serial, MessageStatus.ERROR);
      assert.equal(abort.body.length, 0);
      assert.ok(
        !daemon.received.some((p) => p.header.status === MessageStatus.CONTINUE),
        "no data was sent",
      );
      conn.destroy();
    });

    it("stops counting an upload as in flight once it timed out before the daemon answered its call", async () => {
      const daemon = new FakeDaemon();
      const conn = await daemon.open();
      const upload = conn.upload({ vol }, chunkedSource(5), { timeoutMs: 20 });
      const call = await daemon.nextCall(208);
      assert.equal(conn.inFlight, 1, "counted while the caller waits");
      assert.ok((await rejectionOf(upload)) instanceof LibvirtTimeoutError);
      assert.equal(conn.inFlight, 0, "nobody waits: the link may be closed when idle");
      // The serial still answers the late reply, so the daemon frees the stream it opened.
      daemon.reply(call);
      const abort = await daemon.nextStream(call.header.serial, MessageStatus.ERROR);
      assert.equal(abort.body.length, 0);
      assert.equal(conn.inFlight, 0);
      conn.destroy();
    });

    it("fails with the link when the peer hangs up mid-upload", async () => {
      const daemon = new FakeDaemon({ clientHighWaterMark: 1024 });
      const conn = await daemon.open();
      daemon.holdWrites = true;
      const source = chunkedSource(1000);
      const upload = conn.upload({ vol }, source);
      daemon.reply(await daemon.nextCall(208));
      await tick(5);
      daemon.hangUp();
      const error = await rejectionOf(upload);
      assert.ok(error instanceof LibvirtTransportError);
      assert.ok(source.destroyed);
    });
  });

  describe("download", () => {
    /** A scripted daemon, a connection to it, and a sink that keeps what it is given. */
    async function downloadInto() {
      const daemon = new FakeDaemon();
      const conn = await daemon.open();
      const chunks: Buffer[] = [];
      const sink = new Writable({
        write(chunk: Buffer, _e, cb) {
          chunks.push(chunk);
          cb();
        },
      });
      return { daemon, conn, chunks, sink };
    }

    it("writes data in order, confirms EOF and resolves on the daemon's OK", async () => {
      const { daemon, conn, chunks, sink } = await downloadInto();
      const download = conn.download({ vol }, sink);
      const call = await daemon.nextCall(209);
      daemon.reply(call);
      daemon.stream(call, MessageStatus.CONTINUE, Buffer.from("abc"));
      daemon.stream(call, MessageStatus.CONTINUE, Buffer.from("def"));
      daemon.ping();
      daemon.stream(call, MessageStatus.CONTINUE);
      await daemon.nextStream(call.header.serial, MessageStatus.OK);
      daemon.stream(call, MessageStatus.OK);
      assert.deepEqual(await download, { bytes: 6 });
      assert.equal(Buffer.concat(chunks).toString(), "abcdef");
      assert.ok(sink.writableFinished);
      conn.destroy();
    });

    it("keeps data that overtook the call's reply (libvirtd sends them from different threads), in order", async () => {
      const { daemon, conn, chunks, sink } = await downloadInto();
      const download = conn.download({ vol }, sink);
      const call = await daemon.nextCall(209);
      daemon.stream(call, MessageStatus.CONTINUE, Buffer.from("abc"));
      daemon.stream(call, MessageStatus.CONTINUE, Buffer.from("def"));
      await tick(5);
      assert.deepEqual(chunks, [], "nothing written before the reply says the call succeeded");
      daemon.reply(call);
      daemon.stream(call, MessageStatus.CONTINUE, Buffer.from("ghi"));
      daemon.stream(call, MessageStatus.CONTINUE);
      await daemon.nextStream(call.header.serial, MessageStatus.OK);
      daemon.stream(call, MessageStatus.OK);
      assert.deepEqual(await download, { bytes: 9 });
      assert.equal(Buffer.concat(chunks).toString(), "abcdefghi");
      conn.destroy();
    });

    it("drops data that overtook a reply saying the call failed, and fails with the daemon's error", async () => {
      const { daemon, conn, chunks, sink } = await downloadInto();
      const download = conn.download({ vol }, sink);
      const call = await daemon.nextCall(209);
      daemon.stream(call, MessageStatus.CONTINUE, Buffer.from("abc"));
      daemon.replyError(call, { message: "volume gone" });
      const error = await rejectionOf(download);
      assert.match(error.message, /volume gone/);
      assert.deepEqual(chunks, []);
      conn.destroy();
    });

    it("pauses the transport while the sink is backed up and resumes on drain", async () => {
      const daemon = new FakeDaemon();
      const conn = await daemon.open();
      let release: (() => void) | undefined;
      const sink = new Writable({
        highWaterMark: 4,
        write(_chunk, _e, cb) {
          release = cb;
        },
      });
      const download = conn.download({ vol }, sink);
      const call = await daemon.nextCall(209);
      daemon.reply(call);
      daemon.stream(call, MessageStatus.CONTINUE, Buffer.alloc(16));
      await tick(5);
      assert.equal(daemon.clientSide.isPaused(), true);
      release!();
      await tick(5);
      assert.equal(daemon.clientSide.isPaused(), false);
      daemon.stream(call, MessageStatus.CONTINUE);
      await daemon.nextStream(call.header.serial, MessageStatus.OK);
      daemon.stream(call, MessageStatus.OK);
      await download;
      conn.destroy();
    });

    it("aborts when the sink fails, and un-pauses the shared connection", async () => {
      const daemon = new FakeDaemon();
      const conn = await daemon.open();
      const sink = new Writable({
        highWaterMark: 1,
        write(_chunk, _e, cb) {
          setTimeout(() => cb(new Error("sink disk full")), 5);
        },
      });
      sink.on("error", () => undefined);
      const download = conn.download({ vol }, sink);
      const call = await daemon.nextCall(209);
      daemon.reply(call);
      daemon.stream(call, MessageStatus.CONTINUE, Buffer.alloc(16));
      const error = await rejectionOf(download);
      assert.ok(
        error instanceof LibvirtStreamEndpointError && error.endpoint === "sink",
        error.message,
      );
      await daemon.nextStream(call.header.serial, MessageStatus.ERROR);
      assert.equal(daemon.clientSide.isPaused(), false);
      const hostname = conn.call(Procedures.connectGetHostname, undefined);
      daemon.reply(await daemon.nextCall(59), hostnameBody("still here"));
      assert.equal(await hostname, "still here");
      conn.destroy();
    });

    it("fails, without aborting the finished stream, when the sink fails while ending", async () => {
      const daemon = new FakeDaemon();
      const conn = await daemon.open();
      const sink = new Writable({
        write: (_c, _e, cb) => cb(),
        final: (cb) => cb(new Error("flush failed")),
      });
      const download = conn.download({ vol }, sink);
      const call = await daemon.nextCall(209);
      daemon.reply(call);
      daemon.stream(call, MessageStatus.CONTINUE, Buffer.from("x"));
      daemon.stream(call, MessageStatus.CONTINUE);
      await daemon.nextStream(call.header.serial, MessageStatus.OK);
      daemon.stream(call, MessageStatus.OK);
      const error = await rejectionOf(download);
      assert.ok(
        error instanceof LibvirtStreamEndpointError && error.endpoint === "sink",
        error.message,
      );
      await tick(5);
      assert.ok(
        !daemon.received.some(
          (p) => p.header.type === MessageType.STREAM && p.header.status === MessageStatus.ERROR,
        ),
      );
      conn.destroy();
    });

    it("refuses a hole it never asked for", async () => {
      const daemon = new FakeDaemon();
      const conn = await daemon.open();
      const download = conn.download({ vol }, new Writable({ write: (_c, _e, cb) => cb() }));
      const call = await daemon.nextCall(209);
      daemon.reply(call);
      daemon.send(
        Buffer.from(
          (await import("../../../provider/libvirt-rpc-xdr")).encodePacket(
            { ...call.header, type: MessageType.STREAM_HOLE, status: MessageStatus.CONTINUE },
            Buffer.alloc(12),
          ),
        ),
      );
      const error = await rejectionOf(download);
      assert.ok(error instanceof LibvirtTransportError && error.failure === "protocol");
      conn.destroy();
    });
  });
});
