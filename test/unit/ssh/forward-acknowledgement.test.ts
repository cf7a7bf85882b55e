/**
 * While the libvirt socket's forward is being opened, data the host sends
 * gets an SSH packet back at once (OpenSSH's no-more-sessions), so the TCP
 * acknowledgement sshd's Nagle waits for is not delayed by up to 40 ms. Here
 * the host is ssh2's own server on loopback: before answering the forward it
 * sends something (a channel offer the client refuses) and looks whether the
 * packet came back. test/bench/libvirt.ts measures the effect on OpenSSH.
 */
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { Server, type Connection } from "ssh2";
import { openLibvirtOverSsh, SshConnectError } from "../../../provider/ssh";
import { publicLine, rejectionOf } from "../../support/rejection";
import { sshKeyPair } from "../../support/ssh-keys";

describe("ssh: the libvirt forward after login", function () {
  this.timeout(120_000);
  const hostKey = sshKeyPair();
  const clientKey = sshKeyPair();

  it("answers data that arrives before the forward is confirmed, without waiting for a reply", async () => {
    let sawPacketBeforeAnswer: boolean | undefined;
    // ssh2 sends OpenSSH's extensions to OpenSSH only.
    const server = new Server(
      { hostKeys: [hostKey.private], ident: "OpenSSH_9.6" },
      (connection: Connection) => {
        connection.on("error", () => undefined);
        connection.on("authentication", (context) => context.accept());
        // ssh2's server notes no-more-sessions (its noMoreSessions flag) only with a listener here.
        connection.on("request", () => undefined);
        connection.on("ready", () => {
          connection.on("openssh.streamlocal", (_accept, reject) => {
            // Data from the host while the forward is pending: a channel the client will refuse.
            connection.forwardOut("127.0.0.1", 1, "127.0.0.1", 2, () => undefined);
            setTimeout(() => {
              sawPacketBeforeAnswer = (connection as unknown as { noMoreSessions: boolean })
                .noMoreSessions;
              reject();
            }, 100);
          });
        });
      },
    );
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const port = (server.address() as AddressInfo).port;
    try {
      const error = await rejectionOf(
        openLibvirtOverSsh(
          {
            host: "127.0.0.1",
            port,
            username: "root",
            privateKey: clientKey.private,
            knownHosts: `[127.0.0.1]:${port} ${publicLine(hostKey)}\n`,
          },
          { handshakeTimeoutMs: 10_000, forwardTimeoutMs: 5_000 },
        ),
      );
      assert.ok(error instanceof SshConnectError, `${error.name}: ${error.message}`);
      assert.match(error.message, /cannot forward/);
      assert.equal(sawPacketBeforeAnswer, true, "no-more-sessions arrived before the answer");
    } finally {
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
});
