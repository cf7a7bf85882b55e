/**
 * The base image download meets the pool's free space in the lab: KvmProxy's
 * create on the lab's 8 MiB pool refuses an image that cannot fit before a
 * byte of it moves (its Content-Length, or image.maxMiB when it sends none),
 * and one that fits at that check but not after (the pool fills during the
 * upload, for real) leaves nothing behind. No guest boots: every create
 * fails at the base image.
 */
import { strict as assert } from "node:assert";
import { execFile, execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { errorClassOf } from "../../provider/common/errors";
import { callsInFlight, closeAllHosts } from "../../provider/kvm/connect";
import { baseImageVolumeName } from "../../provider/kvm/naming";
import * as kvm from "../../provider/kvm/provider";
import { useLab, type LabEnv } from "./fixture";
import { fillPoolOnceVolumeAppears, serveImage, type ProxyImage } from "./kvm-support";

const run = promisify(execFile);
const owner = { project: "egress-lab", stack: "kvm-image-limits", resource: "proxy" };
const MIB = 1024 * 1024;

/**
 * An image server that announces `announcedBytes` (or nothing: chunked),
 * then holds the body back for `holdMs`: a client that decides from the
 * headers alone has closed the connection by then, and no body byte was sent.
 */
async function heldBackImage(
  announcedBytes: number | undefined,
  holdMs: number,
): Promise<{ url: string; bodyBytesSent: () => number; close: () => Promise<void> }> {
  let sent = 0;
  const server: Server = createServer((req, res) => {
    if (req.method !== "GET") return void res.writeHead(405).end();
    res.writeHead(200, announcedBytes === undefined ? {} : { "content-length": announcedBytes });
    res.flushHeaders();
    const timer = setTimeout(() => {
      const chunk = Buffer.alloc(MIB);
      for (let left = announcedBytes ?? 64 * MIB; left > 0; left -= chunk.length) {
        const part = chunk.subarray(0, Math.min(left, chunk.length));
        sent += part.length;
        res.write(part);
      }
      res.end();
    }, holdMs);
    res.on("close", () => clearTimeout(timer));
  });
  await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/big.qcow2`,
    bodyBytesSent: () => sent,
    close: () =>
      new Promise((done) => {
        server.closeAllConnections();
        server.close(() => done());
      }),
  };
}

describe("KvmProxy image downloads and the pool's free space (lab)", function () {
  this.timeout(180_000);
  let lab: LabEnv;
  let scratch: string;

  before(async () => {
    lab = await useLab();
    scratch = mkdtempSync(join(tmpdir(), "egress-image-limits-"));
  });

  after(async () => {
    await closeAllHosts();
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  });

  const virsh = (...args: string[]): string =>
    execFileSync("virsh", ["-q", "-c", lab.uri, ...args], {
      stdio: ["ignore", "pipe", "pipe"],
    }).toString();

  /**
   * The volumes of the tiny pool this suite could have made: bases (egress-base-*), and the
   * VMs' own (limits-*). The runner runs the suites that fill the tiny pool one at a time.
   */
  const oursIn = (pool: string): string[] =>
    volumeNames(pool).filter(
      (name) => name.startsWith("egress-base-") || name.startsWith("limits-"),
    );

  const volumeNames = (pool: string): string[] =>
    virsh("vol-list", pool)
      .split("\n")
      .map((line) => line.trim().split(/\s+/)[0])
      .filter((name): name is string => Boolean(name));

  async function sixMiBImage(): Promise<ProxyImage> {
    const path = join(scratch, "six.qcow2");
    await run("qemu-img", ["create", "-q", "-f", "qcow2", "-o", "preallocation=full", path, "6M"]);
    return {
      path,
      sha256: createHash("sha256").update(readFileSync(path)).digest("hex"),
      bytes: statSync(path).size,
    };
  }

  async function failedCreate(
    vmName: string,
    image: Record<string, unknown>,
    pool = lab.tinyPool,
  ): Promise<Error> {
    const raw = {
      owner,
      vmName,
      pool,
      network: { bridge: lab.bridge },
      domainType: "qemu",
      memoryMiB: 256,
      firmware: "bios",
      image,
      readiness: { mode: "none" },
      timeouts: { createSeconds: 120, readySeconds: 5, deleteSeconds: 60 },
    };
    const { inputs, failures } = await kvm.check({}, raw);
    assert.deepEqual(failures, []);
    try {
      const { id, outs } = await kvm.create(inputs);
      await kvm.remove(id, outs);
    } catch (error) {
      return error as Error;
    }
    throw new Error("create succeeded on a pool the image cannot fit in");
  }

  it("refuses an image whose Content-Length exceeds the pool's free space before a byte of it moves", async () => {
    const server = await heldBackImage(2 * lab.tinyPoolMiB * MIB, 3000);
    const before = oursIn(lab.tinyPool);
    try {
      const sha256 = "0".repeat(64);
      const error = await failedCreate("limits-too-big", { url: server.url, sha256 });
      console.log(`      error: ${error.message}`);
      assert.equal(errorClassOf(error), "Permanent", error.message);
      assert.match(
        error.message,
        /is 16\.0 MiB, but pool lab-tiny on .* has [\d.]+ (MiB|bytes) free/,
      );
      assert.match(error.message, /nothing was uploaded\. Fix: free space in pool lab-tiny/);
      assert.equal(server.bodyBytesSent(), 0, "the server never sent a body byte");
      assert.deepEqual(oursIn(lab.tinyPool), before, "no volume was created");
      assert.equal(callsInFlight(), 0);
    } finally {
      await server.close();
    }
  });

  it("measures an image of unknown length by image.maxMiB: refused when the cap does not fit, with that fix", async () => {
    const server = await heldBackImage(undefined, 3000);
    const before = oursIn(lab.tinyPool);
    try {
      const sha256 = "0".repeat(64);
      const error = await failedCreate("limits-unknown", { url: server.url, sha256 });
      assert.equal(errorClassOf(error), "Permanent", error.message);
      assert.match(
        error.message,
        /sends no Content-Length, so it may be up to image\.maxMiB \(8\.0 GiB\)/,
      );
      assert.match(error.message, /or set image\.maxMiB to the image's size/);
      assert.equal(server.bodyBytesSent(), 0);
      assert.deepEqual(oursIn(lab.tinyPool), before);
    } finally {
      await server.close();
    }
  });

  it("a body without Content-Length that goes past image.maxMiB is stopped at the cap, and nothing is kept", async () => {
    const image = await sixMiBImage();
    const server = await serveImage(image, { chunked: true });
    const url = `${server.url}?over-the-cap`;
    const base = baseImageVolumeName({ url, sha256: image.sha256, format: "qcow2" });
    try {
      const error = await failedCreate(
        "limits-cap",
        { url, sha256: image.sha256, maxMiB: 4 },
        lab.pool,
      );
      console.log(`      error: ${error.message}`);
      assert.equal(errorClassOf(error), "Permanent", error.message);
      assert.match(error.message, /sent more than image\.maxMiB allows \(4\.0 MiB\)/);
      assert.match(error.message, /raise image\.maxMiB \(now 4\)/);
      // The shared pool: other suites' volumes come and go; this one's base must not be there.
      const left = volumeNames(lab.pool).filter((name) => name.startsWith(base));
      assert.deepEqual(left, [], "no base, not even a partial one");
      assert.equal(callsInFlight(), 0);
    } finally {
      await server.close();
    }
  });

  it("an image that fits at the check but not after (the pool fills during the upload) leaves nothing behind", async () => {
    // About 6 MiB of qcow2 for the 8 MiB pool: it fits, until the filler takes the room.
    const image = await sixMiBImage();
    let url = "";
    const base = () => baseImageVolumeName({ url, sha256: image.sha256, format: "qcow2" });
    const filler = fillPoolOnceVolumeAppears(lab, lab.tinyPool, base, 256 * 1024);
    const server = await serveImage(image, { beforeBody: filler.fill });
    url = `${server.url}?fills-after-check`;
    const before = oursIn(lab.tinyPool);
    try {
      const error = await failedCreate("limits-fills", { url, sha256: image.sha256 });
      console.log(`      error: ${error.message.split("\n")[0]}`);
      assert.doesNotMatch(error.message, /nothing was uploaded/, "the check let it through");
      await filler.release();
      assert.deepEqual(oursIn(lab.tinyPool), before, "not even a half-uploaded base");
      assert.equal(callsInFlight(), 0);
    } finally {
      await filler.release();
      await server.close();
    }
  });
});
