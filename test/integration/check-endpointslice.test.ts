/**
 * `check --serve --endpointslice`: the exporter as a real process keeps the
 * ready conditions of the pool's EndpointSlice current, against a stand-in
 * for the Kubernetes API server (HTTPS with a private CA, bearer token,
 * GET and JSON Patch of one EndpointSlice, resourceVersion checked as the
 * API server does). No cluster runs here; what the stand-in checks is what
 * the API server would: the path, the token, the patch's content type and
 * its "test" of the resourceVersion.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:https";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { simulatorTls } from "../pve-sim/ca";
import { CHECK_BIN, startExporter, until, type RunningExporter } from "../support/check-exporter";
import { startEchoServer, startForwardProxy, type RunningServer } from "../support/forward-proxy";

const TOKEN = "sentinel-service-account-token-7731";
const SLICES_PATH = "/apis/discovery.k8s.io/v1/namespaces/crawlers/endpointslices/";

interface Slice {
  metadata: { name: string; resourceVersion: string };
  endpoints: { addresses: string[]; conditions?: { ready?: boolean } }[];
}

/** The API server's part this needs: the pool's EndpointSlices (by name), read and JSON-patched. */
function startApiServer(...slices: Slice[]): Promise<{
  server: Server;
  port: number;
  requests: { method: string; path: string; body: string }[];
  /** Bumps the resourceVersion just before the next PATCH lands, as a concurrent `pulumi up` would. */
  raceNextPatch(): void;
}> {
  const tls = simulatorTls();
  const requests: { method: string; path: string; body: string }[] = [];
  let race = false;
  const server = createServer({ key: tls.serverKeyPem, cert: tls.serverCertPem }, (req, res) => {
    let body = "";
    req.on("data", (chunk: Buffer) => (body += chunk.toString()));
    req.on("end", () => {
      requests.push({ method: req.method ?? "", path: req.url ?? "", body });
      const reply = (status: number, document: unknown) => {
        res.writeHead(status, { "content-type": "application/json" });
        res.end(JSON.stringify(document));
      };
      if (req.headers.authorization !== `Bearer ${TOKEN}`)
        return reply(401, { kind: "Status", message: "Unauthorized" });
      const slice = slices.find((each) => req.url === `${SLICES_PATH}${each.metadata.name}`);
      if (slice === undefined) return reply(404, { kind: "Status", message: "not found" });
      if (req.method === "GET") return reply(200, slice);
      if (req.method !== "PATCH" || req.headers["content-type"] !== "application/json-patch+json")
        return reply(415, { kind: "Status", message: "unsupported" });
      if (race) {
        // Someone wrote the slice after the exporter read it.
        race = false;
        slice.metadata.resourceVersion = String(Number(slice.metadata.resourceVersion) + 1);
      }
      const operations = JSON.parse(body) as { op: string; path: string; value: unknown }[];
      for (const operation of operations) {
        if (operation.op === "test") {
          if (
            operation.path !== "/metadata/resourceVersion" ||
            operation.value !== slice.metadata.resourceVersion
          )
            return reply(422, {
              kind: "Status",
              message: "the server rejected our request due to an error in our request",
            });
          continue;
        }
        const match = /^\/endpoints\/(\d+)\/conditions(\/ready)?$/.exec(operation.path);
        const endpoint = match ? slice.endpoints[Number(match[1])] : undefined;
        if (operation.op !== "add" || endpoint === undefined)
          return reply(422, {
            kind: "Status",
            message: `unexpected ${operation.op} ${operation.path}`,
          });
        if (match![2] === undefined) endpoint.conditions = operation.value as { ready?: boolean };
        else endpoint.conditions = { ...endpoint.conditions, ready: operation.value as boolean };
      }
      slice.metadata.resourceVersion = String(Number(slice.metadata.resourceVersion) + 1);
      reply(200, slice);
    });
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({
        server,
        port: (server.address() as AddressInfo).port,
        requests,
        raceNextPatch: () => (race = true),
      }),
    ),
  );
}

/**
 * Waits until a member's ready condition changed in the slice and the
 * exporter said so. The fake API server is this process: it holds the patch
 * before the exporter has read the answer and printed its line, so waiting for
 * the slice alone fails the stderr check on a busy machine.
 */
async function untilPatchedAndReported(
  exporter: { stderr(): string },
  sliceName: string,
  patched: () => boolean,
): Promise<void> {
  const report = `EndpointSlice crawlers/${sliceName}: 1 ready condition(s) set from this check`;
  await until(
    `${sliceName}: the member's condition patched, and the exporter saying so`,
    20_000,
    async () => (patched() && exporter.stderr().includes(report) ? true : undefined),
  );
}

describe("egress-proxies check --serve --endpointslice keeps the slice's readiness current", function () {
  this.timeout(120_000);
  const servers: RunningServer[] = [];
  let exporter: RunningExporter | undefined;
  let api: Awaited<ReturnType<typeof startApiServer>> | undefined;
  let dir: string;

  before(() => {
    dir = mkdtempSync(join(tmpdir(), "egress-slice-"));
    writeFileSync(join(dir, "token"), `${TOKEN}\n`);
    writeFileSync(join(dir, "ca.crt"), simulatorTls().caCertPem);
  });
  after(async () => {
    if (exporter !== undefined && exporter.child.exitCode === null) exporter.child.kill("SIGKILL");
    await Promise.all(servers.map((server) => server.close()));
    await new Promise((resolve) => (api ? api.server.close(resolve) : resolve(undefined)));
    rmSync(dir, { recursive: true, force: true });
  });

  it("writes nothing while the slice agrees, flips a broken member, and starts over after a conflict", async () => {
    const echo = await startEchoServer("127.0.0.1");
    const steady = await startForwardProxy({ host: "127.0.0.2", egressAddress: "127.0.0.2" });
    const doomed = await startForwardProxy({ host: "127.0.0.3", egressAddress: "127.0.0.3" });
    servers.push(echo, steady, doomed);
    const slice: Slice = {
      metadata: { name: "egress-vms", resourceVersion: "100" },
      endpoints: [
        { addresses: ["127.0.0.2"], conditions: { ready: true } },
        { addresses: ["127.0.0.3"], conditions: { ready: true } },
        // A member the exporter's list does not have yet: left alone.
        { addresses: ["127.0.0.9"], conditions: { ready: false } },
      ],
    };
    api = await startApiServer(slice);
    const list = join(dir, "proxies.json");
    writeFileSync(
      list,
      JSON.stringify(
        [steady, doomed].map((s) => ({ url: `http://${s.host}:${s.port}`, ready: true })),
      ),
    );
    exporter = await startExporter(
      [
        ...["--interval", "1", "--timeout", "3", "--from", list],
        ...["--target", `http://127.0.0.1:${echo.port}/`, "--endpointslice", "crawlers/egress-vms"],
      ],
      "",
      {
        KUBERNETES_SERVICE_HOST: "127.0.0.1",
        KUBERNETES_SERVICE_PORT: String(api.port),
        EGRESS_KUBE_SERVICEACCOUNT_DIR: dir,
      },
    );
    const running = exporter;
    const gets = () => api!.requests.filter((r) => r.method === "GET").length;
    const patches = () => api!.requests.filter((r) => r.method === "PATCH");

    await until("two rounds that found the slice in agreement", 20_000, async () =>
      gets() >= 2 ? true : undefined,
    );
    assert.equal(patches().length, 0, "an unchanged pool sees no writes");

    // Pulumi rewrites the slice between the exporter's read and its patch: refused, redone next round.
    api.raceNextPatch();
    await doomed.close();
    await untilPatchedAndReported(
      running,
      "egress-vms",
      () => slice.endpoints[1]!.conditions?.ready === false,
    );
    const sent = patches().map(
      (p) => JSON.parse(p.body) as { op: string; path: string; value: unknown }[],
    );
    assert.ok(sent.length >= 2, "the first patch met the conflict, a later one landed");
    assert.deepEqual(sent.at(-1), [
      {
        op: "test",
        path: "/metadata/resourceVersion",
        value: String(Number(slice.metadata.resourceVersion) - 1),
      },
      { op: "add", path: "/endpoints/1/conditions/ready", value: false },
    ]);
    assert.equal(slice.endpoints[0]!.conditions?.ready, true);
    assert.equal(slice.endpoints[2]!.conditions?.ready, false);
    assert.match(
      running.stderr(),
      /EndpointSlice crawlers\/egress-vms changed while it was being patched/,
    );
    assert.doesNotMatch(running.stderr(), new RegExp(TOKEN));

    const status = await running.terminate();
    assert.equal(status, 0, running.stderr());
  });

  it("a dual-stack member: both slices kept, the IPv6 one flipped alone when only IPv6 fails", async () => {
    const echo = await startEchoServer("127.0.0.1");
    const v4 = await startForwardProxy({ host: "127.0.0.1" });
    // The member's squid on its IPv6 address: the same port, as on a dual-stack VM.
    const v6 = await startForwardProxy({ host: "::1", port: v4.port });
    servers.push(echo, v4, v6);
    const ipv4Slice: Slice = {
      metadata: { name: "egress-vms", resourceVersion: "10" },
      endpoints: [{ addresses: ["127.0.0.1"], conditions: { ready: true } }],
    };
    const ipv6Slice: Slice = {
      metadata: { name: "egress-vms-ipv6", resourceVersion: "20" },
      endpoints: [{ addresses: ["::1"], conditions: { ready: true } }],
    };
    const dualApi = await startApiServer(ipv4Slice, ipv6Slice);
    try {
      const list = join(dir, "dual-outputs.json");
      const urls = [`http://127.0.0.1:${v4.port}`, `http://[::1]:${v4.port}`];
      writeFileSync(
        list,
        JSON.stringify({
          endpoints: urls,
          proxies: [{ name: "kvm1-0", endpoint: urls[0], endpointIpv6: urls[1] }],
        }),
      );
      const running = await startExporter(
        [
          ...["--interval", "1", "--timeout", "3", "--from", list],
          ...["--target", `http://127.0.0.1:${echo.port}/`],
          ...["--endpointslice", "crawlers/egress-vms"],
          ...["--endpointslice", "crawlers/egress-vms-ipv6"],
        ],
        "",
        {
          KUBERNETES_SERVICE_HOST: "127.0.0.1",
          KUBERNETES_SERVICE_PORT: String(dualApi.port),
          EGRESS_KUBE_SERVICEACCOUNT_DIR: dir,
        },
      );
      exporter = running;
      const metrics = await running.scrapeAfter(0);
      assert.match(
        metrics,
        /egress_proxy_up\{proxy="kvm1-0",endpoint="127\.0\.0\.1:\d+",family="ipv4"\} 1/,
      );
      assert.match(
        metrics,
        /egress_proxy_up\{proxy="kvm1-0",endpoint="\[::1\]:\d+",family="ipv6"\} 1/,
      );
      await v6.close();
      await untilPatchedAndReported(
        running,
        "egress-vms-ipv6",
        () => ipv6Slice.endpoints[0]!.conditions?.ready === false,
      );
      assert.equal(ipv4Slice.endpoints[0]!.conditions?.ready, true, "IPv4 still works");
      const paths = dualApi.requests.filter((r) => r.method === "PATCH").map((r) => r.path);
      assert.deepEqual([...new Set(paths)], [`${SLICES_PATH}egress-vms-ipv6`]);
      assert.equal(await running.terminate(), 0, running.stderr());
    } finally {
      await new Promise((resolve) => dualApi.server.close(resolve));
    }
  });

  it("outside a cluster, or with a malformed slice name, refuses to start (status 2) and says why", async () => {
    const run = (args: string[], env: Record<string, string>) =>
      new Promise<{ status: number | null; stderr: string }>((resolve, reject) => {
        const child = spawn(
          process.execPath,
          [CHECK_BIN, "check", "--target", "http://x/", "--proxy", "http://127.0.0.1:1", ...args],
          { env: { PATH: process.env.PATH ?? "", ...env } },
        );
        let err = "";
        child.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
        child.on("error", reject);
        child.on("close", (code) => resolve({ status: code, stderr: err }));
      });
    const outside = await run(
      ["--serve", "127.0.0.1:0", "--endpointslice", "crawlers/egress-vms"],
      {},
    );
    assert.equal(outside.status, 2);
    assert.match(
      outside.stderr,
      /--endpointslice runs inside the cluster \(KUBERNETES_SERVICE_HOST is not set\)/,
    );
    const noToken = await run(
      ["--serve", "127.0.0.1:0", "--endpointslice", "crawlers/egress-vms"],
      {
        KUBERNETES_SERVICE_HOST: "127.0.0.1",
        EGRESS_KUBE_SERVICEACCOUNT_DIR: join(dir, "missing"),
      },
    );
    assert.equal(noToken.status, 2);
    assert.match(
      noToken.stderr,
      /needs the pod's service account: .*ca\.crt cannot be read \(ENOENT\)/,
    );
    const malformed = await run(["--serve", "127.0.0.1:0", "--endpointslice", "Crawlers"], {});
    assert.equal(malformed.status, 2);
    assert.match(malformed.stderr, /--endpointslice must be <namespace>\/<name>/);
    const lonely = await run(["--endpointslice", "crawlers/egress-vms"], {});
    assert.equal(lonely.status, 2);
    assert.match(lonely.stderr, /--endpointslice needs --serve/);
  });
});
