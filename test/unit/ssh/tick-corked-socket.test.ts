/**
 * The socket under ssh2 hands the kernel everything written in one tick as
 * one writev, in order, and writes again in the next tick without waiting.
 */
import assert from "node:assert/strict";
import { createServer, type AddressInfo, type Server, type Socket } from "node:net";
import { connectTickCorked } from "../../../provider/ssh/tick-corked-socket";

describe("ssh: the TCP socket batches each tick's writes", () => {
  let server: Server;
  let received: Buffer[];
  let serverSide: Promise<Socket>;

  beforeEach(async () => {
    received = [];
    serverSide = new Promise((resolve) => {
      server = createServer((socket) => {
        socket.on("data", (chunk: Buffer) => received.push(chunk));
        resolve(socket);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  });
  afterEach(() => new Promise<void>((resolve) => server.close(() => resolve())));

  function countSystemWrites(socket: Socket): { single: number; vectored: number } {
    const counts = { single: 0, vectored: 0 };
    const internals = socket as unknown as Record<
      "_write" | "_writev",
      (...args: unknown[]) => void
    >;
    const write = internals._write.bind(socket);
    const writev = internals._writev.bind(socket);
    internals._write = (...args) => {
      counts.single++;
      write(...args);
    };
    internals._writev = (...args) => {
      counts.vectored++;
      writev(...args);
    };
    return counts;
  }

  it("writes the pieces of one tick as one writev, in order; the next tick writes again", async () => {
    const socket = connectTickCorked("127.0.0.1", (server.address() as AddressInfo).port);
    await new Promise<void>((resolve) => socket.once("connect", () => resolve()));
    const counts = countSystemWrites(socket);
    const pieces = Array.from({ length: 30 }, (_, i) => Buffer.alloc(100 + i, i));
    for (const piece of pieces) socket.write(piece);
    assert.deepEqual(counts, { single: 0, vectored: 0 }, "nothing is written inside the tick");
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(counts, { single: 0, vectored: 1 });

    socket.write(Buffer.from("next tick"));
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(counts.single + counts.vectored, 2, "a later tick is not held back");

    const expected = Buffer.concat([...pieces, Buffer.from("next tick")]);
    const peer = await serverSide;
    socket.end();
    await new Promise<void>((resolve) => peer.once("end", () => resolve()));
    assert.deepEqual(Buffer.concat(received), expected);
  });

  it("keeps write's callback and return value", async () => {
    const socket = connectTickCorked("127.0.0.1", (server.address() as AddressInfo).port);
    await new Promise<void>((resolve) => socket.once("connect", () => resolve()));
    const written = new Promise<void>((resolve, reject) =>
      socket.write(Buffer.from("x"), (error) => (error ? reject(error) : resolve())),
    );
    assert.equal(socket.write("y", "utf8"), true);
    await written;
    socket.destroy();
  });
});
