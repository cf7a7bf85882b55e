/**
 * Channel data sealed by channel-data.ts instead of ssh2: the bytes must
 * arrive intact (ssh2's own server checks every packet's tag or MAC and
 * drops the link on one wrong bit), for each cipher we seal and for those
 * we leave to ssh2, across a shut window and across key exchanges started by
 * either side, and nothing is taken over when ssh2's internals look unlike
 * the ones this module knows.
 */
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import type { AddressInfo } from "node:net";
import { Server, type Client, type ClientChannel, type ServerChannel } from "ssh2";
import {
  dialSsh,
  installChannelDataWriter,
  recognizeCipher,
  releaseSshClient,
  sealChannelData,
  ssh2CryptoFacts,
  type ChannelDataWriter,
} from "../../../provider/ssh";
import { publicLine } from "../../support/rejection";
import { sshKeyPair } from "../../support/ssh-keys";

const MIB = 1024 * 1024;

interface Received {
  bytes: number;
  sha256: string;
}

interface HostBehaviour {
  ciphers?: string[];
  macs?: string[];
  /** Stop reading the channel for this long once data starts (the client's window runs out). */
  stallMs?: number;
  /** Start a key exchange from the server once this many bytes arrived. */
  rekeyAfterBytes?: number;
}

describe("ssh: channel data sealed by us", function () {
  this.timeout(120_000);
  const hostKey = sshKeyPair();
  const clientKey = sshKeyPair();

  before(function () {
    // With ssh2's native binding ssh2 seals every packet itself and we never take over.
    if (ssh2CryptoFacts()?.nativeBinding !== false) this.skip();
  });

  /** A host accepting one socket forward; resolves what arrived on it once the client ends it. */
  async function withHost(
    behaviour: HostBehaviour,
    run: (client: Client, channel: ClientChannel) => Promise<void>,
  ): Promise<Received> {
    let received!: Promise<Received>;
    const server = new Server(
      {
        hostKeys: [hostKey.private],
        ...(behaviour.ciphers || behaviour.macs
          ? {
              algorithms: {
                ...(behaviour.ciphers ? { cipher: behaviour.ciphers as never } : {}),
                ...(behaviour.macs ? { hmac: behaviour.macs as never } : {}),
              },
            }
          : {}),
      },
      (connection) => {
        connection.on("error", () => undefined);
        connection.on("authentication", (context) => context.accept());
        connection.on("ready", () => {
          connection.on(
            "openssh.streamlocal" as never,
            ((accept: () => ServerChannel) => {
              const channel = accept();
              received = new Promise<Received>((resolve, reject) => {
                const hash = createHash("sha256");
                let bytes = 0;
                let stalled = false;
                let rekeyed = false;
                channel.on("data", (chunk: Buffer) => {
                  hash.update(chunk);
                  bytes += chunk.length;
                  if (behaviour.stallMs !== undefined && !stalled) {
                    stalled = true;
                    channel.pause();
                    setTimeout(() => channel.resume(), behaviour.stallMs);
                  }
                  if (
                    behaviour.rekeyAfterBytes !== undefined &&
                    !rekeyed &&
                    bytes >= behaviour.rekeyAfterBytes
                  ) {
                    rekeyed = true;
                    connection.rekey();
                  }
                });
                channel.on("end", () => {
                  resolve({ bytes, sha256: hash.digest("hex") });
                  channel.end();
                });
                channel.on("error", reject);
                connection.on("close", () => reject(new Error("the link closed before the end")));
              });
            }) as never,
          );
        });
      },
    );
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const port = (server.address() as AddressInfo).port;
    try {
      const client = await dialSsh(
        {
          host: "127.0.0.1",
          port,
          username: "root",
          privateKey: clientKey.private,
          knownHosts: `[127.0.0.1]:${port} ${publicLine(hostKey)}\n`,
        },
        { handshakeTimeoutMs: 10_000 },
      );
      try {
        const channel = await new Promise<ClientChannel>((resolve, reject) =>
          client.openssh_forwardOutStreamLocal("/run/test.sock", (error, opened) =>
            error ? reject(error) : resolve(opened),
          ),
        );
        await run(client, channel);
        return await received;
      } finally {
        releaseSshClient(client);
      }
    } finally {
      server.close();
    }
  }

  /** Writes `data` in chunks of odd sizes (packets end anywhere in a window), honouring backpressure; then ends. */
  async function writeAll(
    channel: ClientChannel,
    data: Buffer,
    between?: (written: number) => void,
  ): Promise<void> {
    const sizes = [100_003, 32_768, 1, 262_144, 65_535, 7];
    let offset = 0;
    for (let i = 0; offset < data.length; i++) {
      const end = Math.min(data.length, offset + sizes[i % sizes.length]!);
      if (!channel.write(data.subarray(offset, end))) {
        await new Promise<void>((resolve) => channel.once("drain", () => resolve()));
      }
      offset = end;
      between?.(offset);
    }
    channel.end();
  }

  function digest(data: Buffer): Received {
    return { bytes: data.length, sha256: createHash("sha256").update(data).digest("hex") };
  }

  for (const [ciphers, macs] of [
    [["aes128-gcm@openssh.com"], undefined],
    [["aes256-gcm@openssh.com"], undefined],
    [["aes128-ctr"], ["hmac-sha2-256-etm@openssh.com"]],
    [["aes256-ctr"], ["hmac-sha2-512"]],
    [["aes192-ctr"], ["hmac-sha1"]],
  ] as const) {
    it(`delivers every byte sealed with ${ciphers[0]}${macs ? ` + ${macs[0]}` : ""}`, async () => {
      const data = randomBytes(6 * MIB + 12_345);
      let writer: ChannelDataWriter | null = null;
      const received = await withHost(
        { ciphers: [...ciphers], ...(macs ? { macs: [...macs] } : {}) },
        async (client, channel) => {
          writer = sealChannelData(client, channel);
          assert.ok(writer, "the writer took over the channel");
          await writeAll(channel, data);
        },
      );
      assert.deepEqual(received, digest(data));
      const counts = (writer as ChannelDataWriter | null)!.counts;
      assert.ok(counts.sealed >= data.length / (32 * 1024), JSON.stringify(counts));
      assert.equal(counts.handedToSsh2, 0);
    });
  }

  it("leaves ChaCha20-Poly1305 to ssh2, and the bytes still arrive", async () => {
    const data = randomBytes(MIB + 3);
    let writer: ChannelDataWriter | null = null;
    const received = await withHost(
      { ciphers: ["chacha20-poly1305@openssh.com"] },
      async (client, channel) => {
        writer = sealChannelData(client, channel);
        await writeAll(channel, data);
      },
    );
    assert.deepEqual(received, digest(data));
    const counts = (writer as ChannelDataWriter | null)!.counts;
    assert.equal(counts.sealed, 0);
    assert.ok(counts.handedToSsh2 > 0);
  });

  it("waits for the window when the host stops reading, then carries on", async () => {
    const data = randomBytes(8 * MIB);
    const received = await withHost({ stallMs: 300 }, async (client, channel) => {
      assert.ok(sealChannelData(client, channel));
      await writeAll(channel, data);
    });
    assert.deepEqual(received, digest(data));
  });

  it("hands packets to ssh2 while a key exchange it started is under way, and seals again after it", async () => {
    const data = randomBytes(8 * MIB);
    let writer: ChannelDataWriter | null = null;
    let sealedBefore = 0;
    let cipherBefore: unknown;
    let cipherAfter: unknown;
    const received = await withHost({}, async (client, channel) => {
      writer = sealChannelData(client, channel);
      const protocol = (client as unknown as { _protocol: { rekey(): void; _cipher: unknown } })
        ._protocol;
      let rekeyed = false;
      await writeAll(channel, data, (written) => {
        if (!rekeyed && written >= 2 * MIB) {
          rekeyed = true;
          sealedBefore = writer!.counts.sealed;
          cipherBefore = protocol._cipher;
          // Synchronously: the packets of the next writes must wait in ssh2's queue.
          protocol.rekey();
        }
      });
      await new Promise((resolve) => setTimeout(resolve, 50));
      cipherAfter = protocol._cipher;
    });
    assert.deepEqual(received, digest(data));
    const counts = (writer as ChannelDataWriter | null)!.counts;
    assert.ok(
      counts.handedToSsh2 > 0,
      `some packets went through ssh2's queue: ${JSON.stringify(counts)}`,
    );
    assert.ok(counts.sealed > sealedBefore, "sealing resumed with the new keys");
    assert.notEqual(cipherAfter, cipherBefore, "the keys did change");
  });

  it("follows a key exchange the host starts in the middle of the data", async () => {
    const data = randomBytes(12 * MIB);
    let writer: ChannelDataWriter | null = null;
    const received = await withHost({ rekeyAfterBytes: 3 * MIB }, async (client, channel) => {
      writer = sealChannelData(client, channel);
      await writeAll(channel, data);
    });
    assert.deepEqual(received, digest(data));
    assert.ok((writer as ChannelDataWriter | null)!.counts.sealed > 0);
  });

  it("takes over nothing when ssh2's internals are not the shape it knows", async () => {
    const data = randomBytes(MIB);
    const received = await withHost({}, async (client, channel) => {
      const socket = (client as unknown as { _sock: import("node:net").Socket })._sock;
      // A channel without ssh2's window bookkeeping, a socket that is not the client's.
      const shapeless = { ...channel, outgoing: undefined } as unknown as ClientChannel;
      assert.equal(
        installChannelDataWriter(client, socket, shapeless, () => "aes128-gcm@openssh.com"),
        null,
      );
      const otherSocket = new (await import("node:net")).Socket();
      assert.equal(
        installChannelDataWriter(client, otherSocket, channel, () => "aes128-gcm@openssh.com"),
        null,
      );
      otherSocket.destroy();
      await writeAll(channel, data);
    });
    assert.deepEqual(received, digest(data));
  });

  it("recognises only the cipher objects it can seal for", () => {
    const gcm = Object.assign(Object.create({ constructor: { name: "AESGCMCipherNative" } }), {
      outSeqno: 3,
      _dead: false,
      _encSSLName: "aes-128-gcm",
      _encKey: Buffer.alloc(16),
      _encIV: Buffer.alloc(12),
    }) as object;
    assert.equal(recognizeCipher(gcm, "aes128-gcm@openssh.com")?.kind, "gcm");
    // The native binding's class, a dead cipher, a key of the wrong size, a name that does not match.
    const binding = Object.assign(Object.create({ constructor: { name: "AESGCMCipherBinding" } }), {
      ...gcm,
    }) as object;
    assert.equal(recognizeCipher(binding, "aes128-gcm@openssh.com"), null);
    assert.equal(
      recognizeCipher(
        Object.assign(Object.create(Object.getPrototypeOf(gcm) as object), { ...gcm, _dead: true }),
        "aes128-gcm@openssh.com",
      ),
      null,
    );
    assert.equal(
      recognizeCipher(
        Object.assign(Object.create(Object.getPrototypeOf(gcm) as object), {
          ...gcm,
          _encKey: Buffer.alloc(15),
        }),
        "aes128-gcm@openssh.com",
      ),
      null,
    );
    assert.equal(recognizeCipher(gcm, "chacha20-poly1305@openssh.com"), null);
    const cbc = Object.assign(Object.create({ constructor: { name: "GenericCipherNative" } }), {
      outSeqno: 0,
      _dead: false,
      _cipherInstance: { update: () => Buffer.alloc(0) },
      _encBlockLen: 16,
      _macSSLName: "sha256",
      _macKey: Buffer.alloc(32),
      _macActualLen: 32,
      _macETM: true,
    }) as object;
    assert.equal(recognizeCipher(cbc, "aes128-ctr")?.kind, "stream");
    assert.equal(recognizeCipher(cbc, "aes128-cbc"), null);
    assert.equal(recognizeCipher(null, "aes128-ctr"), null);
  });
});
