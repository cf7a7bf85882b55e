/**
 * Image downloads against a real HTTP server on loopback that behaves like
 * the image mirrors users meet: no HEAD, chunked bodies, redirects, stalls.
 */
import { strict as assert } from "node:assert";
import { createHash, randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { errorClassOf } from "../../provider/common/errors";
import { openImageDownload, type ImageDownloadProgress } from "../../provider/kvm/image-source";

const image = randomBytes(3 * 1024 * 1024 + 17);
const imageSha256 = createHash("sha256").update(image).digest("hex");

async function drain(body: NodeJS.ReadableStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of body) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

describe("image download over HTTP", function () {
  this.timeout(20_000);
  let server: Server;
  let base: string;
  const methods: string[] = [];

  before(async () => {
    server = createServer((req: IncomingMessage, res: ServerResponse) => {
      methods.push(req.method ?? "");
      if (req.method === "HEAD") return void res.writeHead(405).end();
      switch (req.url) {
        case "/sized.qcow2":
          res.writeHead(200, { "content-length": image.length });
          return void res.end(image);
        case "/chunked.qcow2":
          res.writeHead(200, { "transfer-encoding": "chunked" });
          for (let offset = 0; offset < image.length; offset += 65536)
            res.write(image.subarray(offset, offset + 65536));
          return void res.end();
        case "/moved":
          return void res.writeHead(302, { location: "/sized.qcow2" }).end();
        case "/missing":
          return void res.writeHead(404).end("no");
        case "/busy":
          return void res.writeHead(503).end("later");
        case "/stalls":
          res.writeHead(200, { "content-length": image.length });
          res.write(image.subarray(0, 1024)); // then silence
          return;
        case "/truncated":
          res.writeHead(200, { "content-length": image.length });
          res.write(image.subarray(0, 4096), () => res.socket?.destroy());
          return;
        default:
          res.writeHead(500).end();
      }
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });

  after(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });

  it("streams a sized image with its digest, never asking HEAD", async () => {
    const progress: ImageDownloadProgress[] = [];
    const download = await openImageDownload(`${base}/sized.qcow2`, {
      idleTimeoutMs: 5000,
      onProgress: (p) => progress.push(p),
      progressIntervalMs: 0,
    });
    assert.equal(download.contentLength, image.length);
    assert.ok((await drain(download.body)).equals(image));
    assert.deepEqual(await download.digest(), { sha256: imageSha256, bytes: image.length });
    assert.ok(!methods.includes("HEAD"));
    assert.equal(progress.at(-1)!.bytes, image.length);
    assert.equal(progress.at(-1)!.totalBytes, image.length);
  });

  it("handles a chunked body without Content-Length, and follows a redirect", async () => {
    const chunked = await openImageDownload(`${base}/chunked.qcow2`, { idleTimeoutMs: 5000 });
    assert.equal(chunked.contentLength, undefined);
    await drain(chunked.body);
    assert.equal((await chunked.digest()).sha256, imageSha256);
    const moved = await openImageDownload(`${base}/moved`, { idleTimeoutMs: 5000 });
    await drain(moved.body);
    assert.equal((await moved.digest()).sha256, imageSha256);
  });

  it("classifies 404 as NotFound and 503 as Transient, naming the field", async () => {
    await assert.rejects(
      openImageDownload(`${base}/missing`, { idleTimeoutMs: 5000 }),
      (error: Error) =>
        errorClassOf(error) === "NotFound" && /image\.url .* 404/.test(error.message),
    );
    await assert.rejects(
      openImageDownload(`${base}/busy`, { idleTimeoutMs: 5000 }),
      (error: Error) => errorClassOf(error) === "Transient",
    );
  });

  it("ends a stalled body within the idle timeout as Transient", async () => {
    const started = Date.now();
    const download = await openImageDownload(`${base}/stalls`, { idleTimeoutMs: 500 });
    await assert.rejects(
      drain(download.body),
      (error: Error) => errorClassOf(error) === "Transient",
    );
    assert.ok(Date.now() - started < 5000);
  });

  it("fails a body cut short of its Content-Length", async () => {
    const download = await openImageDownload(`${base}/truncated`, { idleTimeoutMs: 2000 });
    await assert.rejects(
      (async () => {
        await drain(download.body);
        await download.digest();
      })(),
      (error: Error) => errorClassOf(error) === "Transient",
    );
  });

  it("stops at once when the caller aborts", async () => {
    const controller = new AbortController();
    const download = await openImageDownload(`${base}/stalls`, {
      idleTimeoutMs: 60_000,
      signal: controller.signal,
    });
    setTimeout(() => controller.abort(new Error("cancelled by test")), 100);
    const started = Date.now();
    await assert.rejects(drain(download.body));
    assert.ok(Date.now() - started < 3000);
  });

  it("never shows URL credentials in an error", async () => {
    await assert.rejects(
      openImageDownload(`http://user:s3cret-pw@127.0.0.1:1/x`, { idleTimeoutMs: 1000 }),
      (error: Error) => !error.message.includes("s3cret-pw"),
    );
  });
});
