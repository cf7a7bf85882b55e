/**
 * The base image cache against the real libvirtd, fed by an image server that
 * redirects where it must not. An https image.url may come without sha256,
 * so the one thing that keeps a hostile answer out of the cache is the
 * redirect policy refusing before any volume exists. The servers listen on
 * 127.0.0.x only; the refused targets are never connected to.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import { getCACertificates, setDefaultCACertificates } from "node:tls";
import { Deadline } from "../../provider/common/deadline";
import { errorClassOf } from "../../provider/common/errors";
import { LibvirtHost } from "../../provider/kvm/host";
import { ensureBaseImage, type ImageSpec } from "../../provider/kvm/image-cache";
import { baseImageMarkerName, baseImageVolumeName } from "../../provider/kvm/naming";
import {
  Procedures,
  type LibvirtConnection,
  type StoragePoolHandle,
} from "../../provider/libvirt-rpc-xdr";
import { openLocalLibvirt } from "../../provider/ssh/local";
import { simulatorTls } from "../pve-sim/ca";
import { useLab } from "./fixture";
import { deleteVolumeIfPresent } from "./helpers";

describe("base image cache behind a hostile redirect (lab)", function () {
  this.timeout(120_000);
  const image = randomBytes(1024 * 1024);
  const servers: Server[] = [];
  const requests: string[] = [];
  let conn: LibvirtConnection;
  let pool: StoragePoolHandle;
  let secure: string;
  let plain: string;
  let defaultCAs: string[];
  const cachedNames: string[] = [];

  function serve(req: IncomingMessage, res: ServerResponse): void {
    requests.push(`${req.headers.host}${req.url}`);
    const redirects: Record<string, string> = {
      "/moved": "/image.raw",
      "/to-metadata": "https://169.254.169.254/latest/meta-data/image.raw",
      "/to-plain": `${plain}/image.raw`,
    };
    const path = new URL(req.url ?? "/", "http://x").pathname;
    const location = redirects[path];
    if (location !== undefined) return void res.writeHead(302, { location }).end();
    if (path === "/image.raw")
      return void res.writeHead(200, { "content-length": image.length }).end(image);
    res.writeHead(404).end();
  }

  async function listen(server: Server, address: string): Promise<number> {
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, address, resolve));
    return (server.address() as AddressInfo).port;
  }

  before(async () => {
    const lab = await useLab();
    conn = await openLocalLibvirt({ socketPath: lab.libvirtSocket, uri: lab.uri });
    pool = await conn.call(Procedures.storagePoolLookupByName, { name: lab.pool });
    const tls = simulatorTls();
    defaultCAs = getCACertificates("default");
    setDefaultCACertificates([...defaultCAs, tls.caCertPem]);
    const securePort = await listen(
      createHttpsServer({ cert: tls.serverCertPem, key: tls.serverKeyPem }, serve),
      "127.0.0.1",
    );
    secure = `https://127.0.0.1:${securePort}`;
    plain = `http://127.0.0.2:${await listen(createServer(serve), "127.0.0.2")}`;
  });

  after(async () => {
    setDefaultCACertificates(defaultCAs);
    for (const server of servers) {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
    if (conn) {
      for (const name of cachedNames) await deleteVolumeIfPresent(conn, pool, name);
      await conn.close();
    }
  });

  beforeEach(() => (requests.length = 0));

  /**
   * The pool's volumes whose names this spec's download could make: the cache names both the
   * volume and its marker from the spec's URL alone, whatever a redirect says. Other lab suites
   * run beside this one and cache their own images in the same pool, so the whole pool is not
   * this test's to compare.
   */
  async function volumesOf(spec: ImageSpec): Promise<string[]> {
    const stem = baseImageVolumeName(spec).replace(/\.[a-z0-9]+$/, "");
    const { vols } = await conn.call(Procedures.storagePoolListAllVolumes, {
      pool,
      needResults: 1,
      flags: 0,
    });
    return vols
      .map((vol) => vol.name)
      .filter((name) => name.startsWith(stem))
      .sort();
  }

  function cache(url: string) {
    // https without sha256: exactly the case where the scheme is all that vouches for the image.
    const spec: ImageSpec = { url, format: "raw" };
    cachedNames.push(baseImageVolumeName(spec), baseImageMarkerName(baseImageVolumeName(spec)));
    const deadline = new Deadline(60_000, "timeouts.createSeconds");
    return {
      spec,
      run: () =>
        ensureBaseImage({
          host: new LibvirtHost(() => Promise.resolve(conn), "lab", deadline),
          hostKey: "lab-local",
          pool,
          image: spec,
          deadline,
          log: () => undefined,
          downloadIdleTimeoutMs: 10_000,
        }),
    };
  }

  it("caches an image behind an allowed redirect (the control: the pool shows what is cached)", async () => {
    const { spec, run } = cache(`${secure}/moved?run=${Date.now()}`);
    assert.deepEqual(await volumesOf(spec), [], "nothing cached for this URL yet");
    const base = await run();
    assert.equal(base.downloaded, true);
    assert.equal(base.virtualBytes, BigInt(image.length));
    const name = baseImageVolumeName(spec);
    assert.deepEqual(await volumesOf(spec), [name, baseImageMarkerName(name)].sort());
  });

  for (const [what, path, pattern] of [
    ["to the metadata service", "/to-metadata", /a cloud metadata address/],
    ["from https down to plain http", "/to-plain", /from https down to plain http/],
  ] as const)
    it(`caches nothing when the server redirects ${what}`, async () => {
      const { spec, run } = cache(`${secure}${path}?run=${Date.now()}`);
      await assert.rejects(
        run(),
        (error: Error) => errorClassOf(error) === "Permanent" && pattern.test(error.message),
      );
      assert.deepEqual(await volumesOf(spec), [], "no volume left behind");
      assert.deepEqual(
        requests.map((request) => request.replace(/\?.*$/, "")),
        [`${new URL(secure).host}${path}`],
        "the redirect target was never asked",
      );
    });
});
