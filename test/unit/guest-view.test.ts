/**
 * The guest's view of the proxy's port (provider/common/guest-view.ts),
 * judged on this machine's own kernel socket tables: the same files a
 * guest's agent reads, with a listener of this test's own on and off.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { GUEST_SOCKET_TABLES, guestViewOf, listensOn } from "../../provider/common/guest-view";

const tables = (): string[] => GUEST_SOCKET_TABLES.map((path) => readFileSync(path, "latin1"));

async function listening(host: string): Promise<{ server: Server; port: number }> {
  const server = createServer();
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, host, resolve);
  });
  return { server, port: (server.address() as { port: number }).port };
}
const closed = (server: Server) => new Promise<void>((resolve) => server.close(() => resolve()));

describe("guest view: a port listening, from the kernel's socket tables", () => {
  for (const host of ["0.0.0.0", "::"])
    it(`a listener on ${host} is seen, and is gone once it closes`, async () => {
      const { server, port } = await listening(host);
      try {
        assert.equal(listensOn(tables(), port), true);
        assert.equal(guestViewOf(tables(), port), "listening");
      } finally {
        await closed(server);
      }
      assert.equal(listensOn(tables(), port), false);
      assert.equal(guestViewOf(tables(), port), "not-listening");
    });

  it("a listener on loopback only serves no client: not counted", async () => {
    const { server, port } = await listening("127.0.0.1");
    try {
      assert.match(
        tables()[0]!,
        new RegExp(`0100007F:${port.toString(16).toUpperCase().padStart(4, "0")} `),
      );
      assert.equal(listensOn(tables(), port), false);
    } finally {
      await closed(server);
    }
  });

  it("a connected socket on the port is no listener", () => {
    const row =
      "   0: 0200000A:0C38 0300000A:D431 01 00000000:00000000 00:00000000 00000000     0        0 1 1";
    assert.equal(listensOn([`header\n${row}\n`], 3128), false);
    assert.equal(listensOn([`header\n${row.replace(" 01 ", " 0A ")}\n`], 3128), true);
  });

  it("tables that could not be read say nothing; one of two read cannot say 'not listening'", () => {
    assert.equal(guestViewOf([undefined, undefined], 3128), "unknown");
    assert.equal(guestViewOf(["header\n", undefined], 3128), "unknown");
    assert.equal(guestViewOf(["header\n", "header\n"], 3128), "not-listening");
  });
});
