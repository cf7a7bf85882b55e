/**
 * A host whose host keys no longer include the type known_hosts pins: the
 * key exchange fails before any key is shown. That is a host-key problem
 * (Permanent), not a connect error that would be retried for ever. Here the
 * host is ssh2's own server on loopback; test/lab/ssh-known-hosts.test.ts
 * does the same against OpenSSH's sshd.
 */
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { Client, Server } from "ssh2";
import { classifyLibvirtError } from "../../../provider/kvm/classify";
import { SshHostKeyError, dialSsh, releaseSshClient } from "../../../provider/ssh";
import { publicLine, rejectionOf } from "../../support/rejection";
import { sshKeyPair } from "../../support/ssh-keys";

describe("ssh: a host that no longer offers the pinned host-key type", function () {
  this.timeout(120_000);
  const ecdsaHostKey = sshKeyPair("ecdsa");
  const client = sshKeyPair();
  let server: Server;
  let port: number;

  before(async () => {
    // The host's only key is ECDSA; it accepts any client that gets through the key exchange.
    server = new Server({ hostKeys: [ecdsaHostKey.private] }, (connection) => {
      connection.on("error", () => undefined);
      connection.on("authentication", (context) => context.accept());
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    port = (server.address() as AddressInfo).port;
  });
  after(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const dial = (knownHosts: string) =>
    dialSsh(
      { host: "127.0.0.1", port, username: "root", privateKey: client.private, knownHosts },
      { handshakeTimeoutMs: 10_000 },
    );

  it("is a Permanent host-key error naming the pinned type and how to see what the host offers", async () => {
    const oldKey = sshKeyPair();
    const error = await rejectionOf(dial(`[127.0.0.1]:${port} ${publicLine(oldKey)}\n`));
    assert.ok(error instanceof SshHostKeyError, `${error.name}: ${error.message}`);
    assert.equal(error.problem, "type-not-offered");
    assert.deepEqual(error.pinnedKeyTypes, ["ssh-ed25519"]);
    assert.match(
      error.message,
      new RegExp(
        `^ssh host \\[127\\.0\\.0\\.1\\]:${port} offers no host key of a type known_hosts pins`,
      ),
    );
    assert.ok(error.message.includes(`ssh-keyscan -p ${port} 127.0.0.1`), error.message);
    assert.equal(classifyLibvirtError(error).errorClass, "Permanent");
  });

  it("connects once known_hosts pins the key type the host does offer", async () => {
    const ssh = await dial(`[127.0.0.1]:${port} ${publicLine(ecdsaHostKey)}\n`);
    try {
      assert.ok(ssh instanceof Client);
    } finally {
      releaseSshClient(ssh);
    }
  });

  it("an unpinned host is still 'unknown', not this error", async () => {
    const error = await rejectionOf(dial(""));
    assert.ok(error instanceof SshHostKeyError);
    assert.equal(error.problem, "unknown");
  });
});
