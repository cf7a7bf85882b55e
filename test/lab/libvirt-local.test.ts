import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { LibvirtTransportError } from "../../provider/libvirt-rpc-xdr";
import { openLocalLibvirt } from "../../provider/ssh/local";
import { rejectionOf } from "./helpers";
import { describeLibvirtAgainstLab } from "./libvirt-suite";

describeLibvirtAgainstLab("local unix socket", (lab) =>
  openLocalLibvirt({ socketPath: lab.libvirtSocket, uri: lab.uri }),
);

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
      assert.match(missing.message, /cannot connect to libvirt socket .*nope.*is libvirtd running/);
    } finally {
      for (const socket of accepted) socket.destroy();
      await new Promise((resolve) => server.close(resolve));
      rmSync(directory, { recursive: true, force: true });
    }
  });
});
