/**
 * The cipher list we offer is ssh2's own defaults, reordered for what is
 * cheap without its native binding, and what a link negotiated is reported.
 * The hosts here are ssh2's own server on loopback, each allowing a
 * different cipher set (as sshd_config `Ciphers` would).
 */
import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import fc from "fast-check";
import { Server, type NegotiatedAlgorithms } from "ssh2";
import {
  cipherOffer,
  dialSsh,
  linkAlgorithms,
  releaseSshClient,
  ssh2CryptoFacts,
  type SshLinkAlgorithms,
} from "../../../provider/ssh";
import { publicLine } from "../../support/rejection";
import { sshKeyPair } from "../../support/ssh-keys";

const SSH2_DEFAULTS = [
  "aes128-gcm@openssh.com",
  "aes256-gcm@openssh.com",
  "aes128-ctr",
  "aes192-ctr",
  "aes256-ctr",
  "chacha20-poly1305@openssh.com",
];

describe("ssh: the ciphers we offer", () => {
  it("keeps ssh2's order when its native binding loaded", () => {
    const order = ["chacha20-poly1305@openssh.com", ...SSH2_DEFAULTS.slice(0, 5)];
    assert.deepEqual(cipherOffer({ defaultCiphers: order, nativeBinding: true }), order);
  });

  it("puts AES-GCM first and ChaCha20-Poly1305 last without the binding, each group in ssh2's order", () => {
    const offered = cipherOffer({
      defaultCiphers: [
        "chacha20-poly1305@openssh.com",
        "aes256-ctr",
        "aes256-gcm@openssh.com",
        "aes128-ctr",
        "aes128-gcm@openssh.com",
      ],
      nativeBinding: false,
    });
    assert.deepEqual(offered, [
      "aes256-gcm@openssh.com",
      "aes128-gcm@openssh.com",
      "aes256-ctr",
      "aes128-ctr",
      "chacha20-poly1305@openssh.com",
    ]);
  });

  it("only reorders: never adds a cipher ssh2 would not offer, never drops one (property)", () => {
    fc.assert(
      fc.property(
        fc.shuffledSubarray(SSH2_DEFAULTS, { minLength: 1 }),
        fc.boolean(),
        (defaults, nativeBinding) => {
          const offered = cipherOffer({ defaultCiphers: defaults, nativeBinding });
          assert.deepEqual([...offered].sort(), [...defaults].sort());
          if (!nativeBinding && defaults.some((name) => name.includes("gcm"))) {
            assert.match(offered[0]!, /gcm/);
          }
        },
      ),
    );
  });

  it("reads ssh2's defaults and whether its binding loaded from the installed ssh2", () => {
    const facts = ssh2CryptoFacts();
    assert.ok(facts, "this ssh2 exposes its default cipher list");
    assert.ok(facts.defaultCiphers.includes("aes128-gcm@openssh.com"), facts.defaultCiphers.join());
    assert.equal(typeof facts.nativeBinding, "boolean");
  });

  it("reports an AEAD cipher's MAC as implicit", () => {
    const negotiated = {
      kex: "curve25519-sha256",
      serverHostKey: "ssh-ed25519",
      cs: { cipher: "aes128-gcm@openssh.com", mac: "", compress: "none", lang: "" },
      sc: {
        cipher: "aes128-ctr",
        mac: "hmac-sha2-256-etm@openssh.com",
        compress: "none",
        lang: "",
      },
    } as NegotiatedAlgorithms;
    assert.deepEqual(linkAlgorithms(negotiated, false), {
      kex: "curve25519-sha256",
      hostKey: "ssh-ed25519",
      cipher: "aes128-gcm@openssh.com",
      mac: "implicit",
      serverCipher: "aes128-ctr",
      serverMac: "hmac-sha2-256-etm@openssh.com",
      nativeBinding: false,
    });
  });
});

describe("ssh: the cipher a host's policy lets us negotiate", function () {
  this.timeout(120_000);
  const hostKey = sshKeyPair();
  const clientKey = sshKeyPair();

  /** A host allowing only `ciphers` (all of ssh2's when undefined); resolves what our client negotiated. */
  async function negotiateWith(ciphers?: string[]): Promise<SshLinkAlgorithms> {
    const server = new Server(
      {
        hostKeys: [hostKey.private],
        ...(ciphers ? { algorithms: { cipher: ciphers as never } } : {}),
      },
      (connection) => {
        connection.on("error", () => undefined);
        connection.on("authentication", (context) => context.accept());
      },
    );
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const port = (server.address() as AddressInfo).port;
    try {
      let seen: SshLinkAlgorithms | undefined;
      const ssh = await dialSsh(
        {
          host: "127.0.0.1",
          port,
          username: "root",
          privateKey: clientKey.private,
          knownHosts: `[127.0.0.1]:${port} ${publicLine(hostKey)}\n`,
        },
        { handshakeTimeoutMs: 10_000, onHandshake: (algorithms) => (seen = algorithms) },
      );
      releaseSshClient(ssh);
      assert.ok(seen, "onHandshake was called before the dial resolved");
      return seen;
    } finally {
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  }

  it("is AES-GCM when the host allows everything and the binding is absent", async function () {
    if (ssh2CryptoFacts()?.nativeBinding !== false) this.skip();
    const link = await negotiateWith();
    assert.match(link.cipher, /^aes(128|256)-gcm@openssh\.com$/);
    assert.equal(link.mac, "implicit");
    assert.equal(link.nativeBinding, false);
  });

  it("still connects to a host that allows only AES-CTR, with an HMAC", async () => {
    const link = await negotiateWith(["aes256-ctr"]);
    assert.equal(link.cipher, "aes256-ctr");
    assert.match(link.mac, /^hmac-sha/);
  });

  it("still connects to a host that allows only ChaCha20-Poly1305", async () => {
    const link = await negotiateWith(["chacha20-poly1305@openssh.com"]);
    assert.equal(link.cipher, "chacha20-poly1305@openssh.com");
  });
});
