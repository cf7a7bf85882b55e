/**
 * Image downloads against a real HTTP server on loopback that behaves like
 * the image mirrors users meet: no HEAD, chunked bodies, redirects, stalls;
 * and like a hostile one: redirects to the metadata service, to file:, down
 * from https, in endless chains. Every server listens on 127.0.0.x; nothing
 * here ever connects anywhere else, and the tests check that it does not
 * even try.
 */
import { strict as assert } from "node:assert";
import { createHash, randomBytes } from "node:crypto";
import { subscribe, unsubscribe } from "node:diagnostics_channel";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo, Socket } from "node:net";
import { getCACertificates, setDefaultCACertificates } from "node:tls";
import { errorClassOf } from "../../provider/common/errors";
import { openImageDownload, type ImageDownloadProgress } from "../../provider/kvm/image-source";
import type { HostLookup } from "../../provider/kvm/image-source-policy";
import { simulatorTls } from "../pve-sim/ca";

const image = randomBytes(3 * 1024 * 1024 + 17);
const imageSha256 = createHash("sha256").update(image).digest("hex");

async function drain(body: NodeJS.ReadableStream): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of body) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks);
}

describe("image download over HTTP", function () {
  this.timeout(120_000);
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

  it("refuses an announced length over image.maxMiB before reading the body, naming the input", async () => {
    const error = await openImageDownload(`${base}/sized.qcow2`, {
      idleTimeoutMs: 5000,
      maxMiB: 3,
    }).then(
      () => assert.fail("expected a refusal"),
      (failure: Error) => failure,
    );
    assert.equal(errorClassOf(error), "Permanent");
    assert.match(
      error.message,
      /is 3\.0 MiB \(Content-Length\), more than image\.maxMiB allows \(3\.0 MiB\)/,
    );
    assert.match(error.message, /raise image\.maxMiB \(now 3\)/);
  });

  it("stops a chunked body at image.maxMiB: not one byte past the cap comes through", async () => {
    const download = await openImageDownload(`${base}/chunked.qcow2`, {
      idleTimeoutMs: 5000,
      maxMiB: 2,
    });
    let received = 0;
    const error = await (async () => {
      for await (const chunk of download.body) received += (chunk as Buffer).length;
    })().then(
      () => assert.fail("expected the body to fail"),
      (failure: Error) => failure,
    );
    assert.equal(errorClassOf(error), "Permanent");
    assert.match(error.message, /sent more than image\.maxMiB allows \(2\.0 MiB\)/);
    assert.ok(received <= 2 * 1024 * 1024, `${received} bytes came through`);
    await assert.rejects(
      download.digest(),
      (failure: Error) => errorClassOf(failure) === "Permanent",
    );
    // A cap the image fits under changes nothing.
    const fits = await openImageDownload(`${base}/chunked.qcow2`, {
      idleTimeoutMs: 5000,
      maxMiB: 4,
    });
    await drain(fits.body);
    assert.equal((await fits.digest()).sha256, imageSha256);
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
      (error: Error) =>
        errorClassOf(error) === "Transient" && // connection refused: the server may come back
        /ECONNREFUSED/.test(error.message) &&
        !error.message.includes("s3cret-pw"),
    );
  });
});

describe("image download redirects are untrusted", function () {
  this.timeout(120_000);
  const servers: Server[] = [];
  /** "host:port/path" of every request any of the servers saw. */
  const seen: string[] = [];
  /** Every connection undici set out to open, and where each one landed. */
  const attempts: string[] = [];
  const landed: string[] = [];
  const onBeforeConnect = (message: unknown) =>
    attempts.push((message as { connectParams: { hostname: string } }).connectParams.hostname);
  const onConnected = (message: unknown) =>
    landed.push((message as { socket: Socket }).socket.remoteAddress ?? "?");
  let plain: string; // http://127.0.0.1:port
  let second: string; // http://127.0.0.2:port
  let secure: string; // https://127.0.0.1:port
  let securePort: number;
  let plainPort: number;
  let defaultCAs: string[];

  function hostile(req: IncomingMessage, res: ServerResponse): void {
    const url = new URL(req.url ?? "/", "http://x");
    seen.push(`${req.headers.host}${req.url}`);
    const chain = /^\/(slow-)?chain\/(\d+)$/.exec(url.pathname);
    if (chain) {
      const left = Number(chain[2]);
      const answer = () =>
        left === 0
          ? res.writeHead(200, { "content-length": image.length }).end(image)
          : res.writeHead(302, { location: `/${chain[1] ?? ""}chain/${left - 1}` }).end();
      if (chain[1]) setTimeout(answer, 300);
      else answer();
      return;
    }
    switch (url.pathname) {
      case "/sized.qcow2":
        return void res.writeHead(200, { "content-length": image.length }).end(image);
      case "/to":
        return void res
          .writeHead(Number(url.searchParams.get("status") ?? 302), {
            location: url.searchParams.get("target") ?? "",
          })
          .end("moved");
      case "/a/b/rel":
        return void res.writeHead(301, { location: "../../sized.qcow2" }).end();
      case "/to-with-credentials":
        return void res.writeHead(302, { location: "http://admin:hunter22@127.0.0.2/x" }).end();
      case "/no-location":
        return void res.writeHead(302).end();
      default:
        res.writeHead(500).end();
    }
  }

  async function listen(server: Server, address: string): Promise<number> {
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, address, resolve));
    return (server.address() as AddressInfo).port;
  }

  before(async () => {
    const tls = simulatorTls();
    // The test CA joins the process's default trust store for this suite only (restored in after).
    defaultCAs = getCACertificates("default");
    setDefaultCACertificates([...defaultCAs, tls.caCertPem]);
    plainPort = await listen(createServer(hostile), "127.0.0.1");
    plain = `http://127.0.0.1:${plainPort}`;
    second = `http://127.0.0.2:${await listen(createServer(hostile), "127.0.0.2")}`;
    securePort = await listen(
      createHttpsServer({ cert: tls.serverCertPem, key: tls.serverKeyPem }, hostile),
      "127.0.0.1",
    );
    secure = `https://127.0.0.1:${securePort}`;
    subscribe("undici:client:beforeConnect", onBeforeConnect);
    subscribe("undici:client:connected", onConnected);
  });

  after(async () => {
    unsubscribe("undici:client:beforeConnect", onBeforeConnect);
    unsubscribe("undici:client:connected", onConnected);
    setDefaultCACertificates(defaultCAs);
    for (const server of servers) {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  beforeEach(() => {
    seen.length = 0;
    attempts.length = 0;
    landed.length = 0;
  });

  const redirectTo = (target: string, from = plain) =>
    `${from}/to?target=${encodeURIComponent(target)}`;

  async function downloadAll(url: string, lookup?: HostLookup): Promise<string> {
    const download = await openImageDownload(url, { idleTimeoutMs: 5000, lookup });
    await drain(download.body);
    return (await download.digest()).sha256;
  }

  /** Rejects Permanent, naming image.url as given and matching `pattern`. */
  async function refusedPermanently(url: string, pattern: RegExp, lookup?: HostLookup) {
    await assert.rejects(downloadAll(url, lookup), (error: Error) => {
      assert.equal(errorClassOf(error), "Permanent", error.message);
      assert.ok(error.message.includes(`image.url ${url} `), error.message);
      assert.match(error.message, pattern);
      return true;
    });
  }

  /** Only the loopback servers were ever approached. */
  function assertOnlyLoopbackApproached(): void {
    assert.ok(attempts.length > 0, "the first hop connects");
    for (const host of attempts) assert.match(host, /^127\.0\.0\.[12]$|^mirror\.test$|^localhost$/);
    for (const address of landed) assert.match(address, /^127\.0\.0\.[12]$/);
  }

  const guarded: [string, string, RegExp][] = [
    [
      "the metadata service",
      "http://169.254.169.254/latest/meta-data/iam/",
      /a cloud metadata address/,
    ],
    [
      "the metadata service, spelled as one number",
      "http://2852039166/latest/",
      /a cloud metadata address/,
    ],
    [
      "the metadata service, IPv4-mapped",
      "http://[::ffff:169.254.169.254]/latest/",
      /a cloud metadata address/,
    ],
    [
      "the metadata service over IPv6",
      "http://[fd00:ec2::254]/latest/",
      /a cloud metadata address/,
    ],
    [
      "the metadata service by name",
      "http://metadata.google.internal/computeMetadata/v1/",
      /a cloud metadata address/,
    ],
    [
      "Alibaba's metadata service",
      "http://100.100.100.200/latest/meta-data/",
      /a cloud metadata address/,
    ],
    ["a link-local address", "http://169.254.10.10/x", /a link-local address/],
    ["a link-local IPv6 address", "http://[fe80::1]/x", /a link-local address/],
    [
      "the metadata service, inside a 6to4 address",
      "http://[2002:a9fe:a9fe::1]/latest/",
      /a cloud metadata address/,
    ],
    [
      "a link-local address, inside a NAT64 address",
      "http://[64:ff9b::a9fe:101]/x",
      /a link-local address/,
    ],
    [
      "an IPv6 unique-local address",
      "http://[fd12:3456:789a::1]/x",
      /an IPv6 unique-local address/,
    ],
  ];
  for (const [what, target, pattern] of guarded)
    it(`refuses a redirect to ${what} before connecting there`, async () => {
      await refusedPermanently(
        redirectTo(target),
        new RegExp(
          `was redirected to ${new URL(target).origin.replace(/[.[\]]/g, "\\$&")}.*?, ${pattern.source}`,
        ),
      );
      assert.deepEqual(seen, [`127.0.0.1:${plainPort}/to?target=${encodeURIComponent(target)}`]);
      assertOnlyLoopbackApproached();
    });

  it("refuses a redirect to 0.0.0.0, which would reach this very machine", async () => {
    // On Linux this target reaches the test server itself: refusing it is the policy, not luck.
    await refusedPermanently(
      redirectTo(`http://0.0.0.0:${plainPort}/sized.qcow2`),
      /an unspecified address/,
    );
    assert.equal(seen.length, 1);
  });

  for (const target of ["file:///etc/passwd", "ftp://127.0.0.2/debian.qcow2", "data:,hello"])
    it(`refuses a redirect to ${target.split(":")[0]}: as Permanent`, async () => {
      await refusedPermanently(redirectTo(target), /only http and https redirects are followed/);
      assert.equal(seen.length, 1);
    });

  it("refuses https redirecting down to plain http, and follows http up to https", async () => {
    await refusedPermanently(
      redirectTo(`${second}/sized.qcow2`, secure),
      /a redirect from https down to plain http is never followed/,
    );
    assert.deepEqual(seen, [
      `127.0.0.1:${securePort}/to?target=${encodeURIComponent(`${second}/sized.qcow2`)}`,
    ]);
    assert.equal(await downloadAll(redirectTo(`${secure}/sized.qcow2`)), imageSha256);
    assert.equal(await downloadAll(redirectTo(`${secure}/sized.qcow2`, secure)), imageSha256);
  });

  it("follows five redirects and refuses the sixth", async () => {
    assert.equal(await downloadAll(`${plain}/chain/5`), imageSha256);
    seen.length = 0;
    await refusedPermanently(
      `${plain}/chain/6`,
      /redirected more than 5 times \(the last one to http:\/\/127\.0\.0\.1:\d+\/chain\/0\)/,
    );
    assert.equal(seen.length, 6);
    assert.ok(!seen.some((request) => request.endsWith("/chain/0")));
  });

  it("follows relative and scheme-relative Locations", async () => {
    assert.equal(await downloadAll(`${plain}/a/b/rel`), imageSha256);
    assert.deepEqual(
      seen.map((r) => r.replace(/^[^/]*/, "")),
      ["/a/b/rel", "/sized.qcow2"],
    );
    seen.length = 0;
    const port = new URL(second).port;
    assert.equal(await downloadAll(redirectTo(`//127.0.0.2:${port}/sized.qcow2`)), imageSha256);
    assert.equal(seen.at(-1), `127.0.0.2:${port}/sized.qcow2`);
  });

  it("lets a loopback image.url (a lab mirror) redirect to another loopback address", async () => {
    assert.equal(await downloadAll(redirectTo(`${second}/sized.qcow2`)), imageSha256);
    assert.deepEqual(landed.sort(), ["127.0.0.1", "127.0.0.2"]);
  });

  it("connects to the address it checked, never asking DNS again (no rebinding window)", async () => {
    const asked: string[] = [];
    // mirror.test answers 127.0.0.1 once and the metadata address ever after.
    const rebinding: HostLookup = (hostname) => {
      asked.push(hostname);
      const address = asked.length === 1 ? "127.0.0.1" : "169.254.169.254";
      return Promise.resolve([{ address, family: 4 }]);
    };
    const url = `http://mirror.test:${plainPort}/sized.qcow2`;
    const download = await openImageDownload(url, { idleTimeoutMs: 5000, lookup: rebinding });
    await drain(download.body);
    assert.equal((await download.digest()).sha256, imageSha256);
    assert.deepEqual(asked, ["mirror.test"], "one lookup, and the socket used its answer");
    assert.deepEqual(landed, ["127.0.0.1"]);
  });

  it("checks a name again on every hop: one that rebinds to the metadata address is refused there", async () => {
    let calls = 0;
    const rebinding: HostLookup = () =>
      Promise.resolve([{ address: calls++ === 0 ? "127.0.0.1" : "169.254.169.254", family: 4 }]);
    await refusedPermanently(
      `http://mirror.test:${plainPort}/a/b/rel`,
      /\(mirror\.test resolves to 169\.254\.169\.254\), a cloud metadata address/,
      rebinding,
    );
    assert.equal(seen.length, 1);
    assertOnlyLoopbackApproached();
  });

  it("verifies the certificate against the name, not the pinned address", async () => {
    const toLoopback: HostLookup = () => Promise.resolve([{ address: "127.0.0.1", family: 4 }]);
    // The test certificate names localhost and 127.0.0.1: through the pin, localhost verifies ...
    assert.equal(
      await downloadAll(`https://localhost:${securePort}/sized.qcow2`, toLoopback),
      imageSha256,
    );
    // ... and another name on the same address does not, which retrying cannot change.
    await refusedPermanently(
      `https://mirror.test:${securePort}/sized.qcow2`,
      /TLS certificate is not accepted/,
      toLoopback,
    );
  });

  it("classes https to a plain http port as Permanent", async () => {
    await refusedPermanently(
      `https://127.0.0.1:${plainPort}/sized.qcow2`,
      /does not speak TLS on that port: check image\.url's scheme and port/,
    );
  });

  it("refuses a redirect without a Location, and one carrying credentials without showing them", async () => {
    await refusedPermanently(`${plain}/no-location`, /without a Location header/);
    seen.length = 0;
    await assert.rejects(
      downloadAll(`${plain}/to-with-credentials`),
      (error: Error) =>
        errorClassOf(error) === "Permanent" &&
        /to http:\/\/\[redacted\]@127\.0\.0\.2\/x: a redirect carrying credentials/.test(
          error.message,
        ) &&
        !/hunter22|admin/.test(error.message),
    );
    assert.equal(seen.length, 1);
  });

  it("gives the whole chain one deadline, not one per hop", async () => {
    // Four hops of 300 ms each: every hop alone is well inside 700 ms, the chain is not.
    const started = Date.now();
    await assert.rejects(
      openImageDownload(`${plain}/slow-chain/4`, { idleTimeoutMs: 700 }),
      (error: Error) => errorClassOf(error) === "Transient",
    );
    assert.ok(Date.now() - started < 5000);
    assert.ok(seen.length < 5, `stopped before the last hop (${seen.length} requests)`);
  });
});
