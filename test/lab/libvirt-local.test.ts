import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LibvirtTransportError, Procedures } from "../../provider/libvirt-rpc-xdr";
import { openLocalLibvirt } from "../../provider/ssh/local";
import { useLab } from "./fixture";
import { rejectionOf } from "./helpers";
import { describeLibvirtAgainstLab } from "./libvirt-suite";

describeLibvirtAgainstLab("local unix socket", (lab) =>
  openLocalLibvirt({ socketPath: lab.libvirtSocket, uri: lab.uri }),
);

describe("libvirt keepalive with the real daemon", function () {
  this.timeout(60_000);

  it("answers the daemon's pings while idle, so the daemon keeps the connection", async () => {
    const lab = await useLab();
    // Our own pings off: the daemon must be the one asking (it pings an idle client every 5 s).
    const conn = await openLocalLibvirt({
      socketPath: lab.libvirtSocket,
      uri: lab.uri,
      keepalive: false,
    });
    try {
      assert.equal(conn.info.keepalive, true, "the daemon supports the keepalive program");
      const started = Date.now();
      while (conn.stats.pingsAnswered === 0 && Date.now() - started < 20_000) {
        await new Promise((resolve) => setTimeout(resolve, 250));
      }
      assert.ok(conn.stats.pingsAnswered >= 1, "the daemon pinged and we answered");
      assert.ok((await conn.call(Procedures.connectGetHostname, undefined)).length > 0);
    } finally {
      await conn.close();
    }
  });
});

describe("local socket transport when the daemon is wedged or absent", () => {
  it("fails the handshake at its deadline when the socket accepts but never answers", async () => {
    const directory = mkdtempSync(join(tmpdir(), "egress-silent-"));
    const path = join(directory, "libvirt-sock");
    const accepted: Socket[] = [];
    const server = createServer((socket) => {
      accepted.push(socket);
      socket.on("data", () => undefined); // read everything, say nothing
    });
    await new Promise<void>((resolve) => server.listen(path, resolve));
    try {
      const started = Date.now();
      const error = await rejectionOf(
        openLocalLibvirt({ socketPath: path, handshakeTimeoutMs: 500 }),
      );
      assert.ok(error instanceof LibvirtTransportError, error.message);
      assert.equal(error.failure, "handshake");
      assert.ok(Date.now() - started < 2000);
      const missing = await rejectionOf(openLocalLibvirt({ socketPath: join(directory, "nope") }));
      assert.match(
        missing.message,
        /cannot connect to libvirt socket .*nope.*libvirtd is not running or listens elsewhere/,
      );
    } finally {
      for (const socket of accepted) socket.destroy();
      await new Promise((resolve) => server.close(resolve));
      rmSync(directory, { recursive: true, force: true });
    }
  });
});
