/**
 * `check --serve --endpointslices`: the exporter as a real process is the
 * only writer of the pool's EndpointSlices, against a stand-in for the
 * Kubernetes API server that applies as Kubernetes does (field managers,
 * atomic lists, conflicts, create authorized as create, RBAC as the pool's
 * Role grants it: test/support/kube-api-stand-in.ts). No cluster runs here.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FIELD_MANAGER, MANAGED_BY } from "../../cli/check/endpointslice";
import { simulatorTls } from "../pve-sim/ca";
import {
  CHECK_BIN,
  httpGet,
  startExporter,
  until,
  type RunningExporter,
} from "../support/check-exporter";
import { startEchoServer, startForwardProxy, type RunningServer } from "../support/forward-proxy";
import { startApiStandIn, type ApiStandIn } from "../support/kube-api-stand-in";

const TOKEN = "sentinel-service-account-token-7731";
const SERVICE = {
  name: "egress",
  uid: "6f1c2d3e-aaaa-4bbb-8ccc-123456789abc",
  labels: { "app.kubernetes.io/instance": "egress", "app.kubernetes.io/part-of": "egress-proxies" },
};
/** What the pool's Role grants the exporter (components/kubernetes-exporter.ts; the pool test checks the Role). */
const ROLE = [
  { verb: "get", resource: "endpointslices", name: "egress-checked" },
  { verb: "patch", resource: "endpointslices", name: "egress-checked" },
  { verb: "get", resource: "endpointslices", name: "egress-checked-ipv6" },
  { verb: "patch", resource: "endpointslices", name: "egress-checked-ipv6" },
  { verb: "create", resource: "endpointslices" },
  { verb: "get", resource: "secrets", name: "egress" },
  { verb: "get", resource: "services", name: "egress" },
];

const conditionsOf = (api: ApiStandIn, slice: string) =>
  api.slices.get(slice)?.endpoints?.map((endpoint) => [endpoint.addresses[0], endpoint.conditions]);
const same = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

describe("egress-proxies check --serve --endpointslices: the exporter writes the pool's slices, alone", function () {
  this.timeout(120_000);
  const servers: RunningServer[] = [];
  const apis: ApiStandIn[] = [];
  let exporter: RunningExporter | undefined;
  let dir: string;

  /**
   * An echo service, a forward proxy per member address (each its own exit), the stand-in API
   * server with the pool's member list and `grants`, the exporter's list of those proxies, and
   * the exporter itself checking every `interval` seconds.
   */
  const startPool = async (
    hosts: string[],
    members: { port: number; ipv4: string[]; ipv6?: string[] },
    options: { interval: number; grants?: typeof ROLE },
  ) => {
    const echo = await startEchoServer("127.0.0.1");
    servers.push(echo);
    const proxies = [];
    for (const host of hosts) {
      const proxy = await startForwardProxy({ host, egressAddress: host });
      servers.push(proxy);
      proxies.push(proxy);
    }
    const api = await startApiStandIn({
      token: TOKEN,
      service: SERVICE,
      members,
      grants: options.grants ?? ROLE,
    });
    apis.push(api);
    const list = join(dir, `proxies-${apis.length}.json`);
    writeFileSync(
      list,
      JSON.stringify(proxies.map((p) => ({ url: `http://${p.host}:${p.port}`, ready: null }))),
    );
    exporter = await startExporter(
      [
        ...["--interval", String(options.interval), "--timeout", "3", "--from", list],
        ...["--target", `http://127.0.0.1:${echo.port}/`, "--endpointslices", "crawlers/egress"],
      ],
      "",
      {
        KUBERNETES_SERVICE_HOST: "127.0.0.1",
        KUBERNETES_SERVICE_PORT: String(api.port),
        EGRESS_KUBE_SERVICEACCOUNT_DIR: dir,
      },
    );
    return { api, proxies, running: exporter };
  };

  before(() => {
    dir = mkdtempSync(join(tmpdir(), "egress-slice-"));
    writeFileSync(join(dir, "token"), `${TOKEN}\n`);
    writeFileSync(join(dir, "ca.crt"), simulatorTls().caCertPem);
  });
  afterEach(async () => {
    if (exporter !== undefined && exporter.child.exitCode === null) exporter.child.kill("SIGKILL");
    exporter = undefined;
    await Promise.all(servers.splice(0).map((server) => server.close()));
    await Promise.all(apis.splice(0).map((api) => api.close()));
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  it("creates the slice owned by the Service, as the only field manager; writes nothing while it agrees; flips a broken member", async () => {
    const {
      api,
      proxies: [, doomed],
      running,
    } = await startPool(
      ["127.0.0.2", "127.0.0.3"],
      { port: 3128, ipv4: ["127.0.0.2", "127.0.0.3"] },
      { interval: 1 },
    );

    await until("the slice written with both members checked ready", 20_000, async () =>
      same(conditionsOf(api, "egress-checked"), [
        ["127.0.0.2", { ready: true }],
        ["127.0.0.3", { ready: true }],
      ])
        ? true
        : undefined,
    );
    const slice = api.slices.get("egress-checked")!;
    assert.deepEqual(slice.metadata.ownerReferences, [
      { apiVersion: "v1", kind: "Service", name: "egress", uid: SERVICE.uid },
    ]);
    assert.deepEqual(slice.metadata.labels, {
      ...SERVICE.labels,
      "kubernetes.io/service-name": "egress",
      "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
    });
    assert.equal(slice.addressType, "IPv4");
    assert.deepEqual(slice.ports, [{ name: "http-proxy", port: 3128, protocol: "TCP" }]);
    for (const [field, managers] of Object.entries(api.owners("egress-checked")))
      assert.deepEqual(managers, [FIELD_MANAGER], `${field} has one manager`);
    assert.equal(
      api.slices.has("egress-checked-ipv6"),
      false,
      "a pool without IPv6 gets no IPv6 slice",
    );
    assert.equal((await httpGet(`${running.base}/healthz`)).status, 200);

    // A healthy, unchanged pool: reads, no writes.
    const writes = () => api.requests.filter((r) => r.method === "PATCH").length;
    const reads = () =>
      api.requests.filter((r) => r.method === "GET" && r.path.endsWith("/egress-checked")).length;
    const [writesBefore, readsBefore] = [writes(), reads()];
    await until("three more rounds", 30_000, async () =>
      reads() >= readsBefore + 3 ? true : undefined,
    );
    assert.equal(writes(), writesBefore, "no write while the slice agrees");

    await doomed.close();
    await until(
      "the broken member written not ready, and the exporter saying so",
      20_000,
      async () =>
        same(conditionsOf(api, "egress-checked"), [
          ["127.0.0.2", { ready: true }],
          ["127.0.0.3", { ready: false }],
        ]) &&
        running
          .stderr()
          .includes(
            "EndpointSlice crawlers/egress-checked written: 1 ready, 1 not ready, 0 not checked yet",
          )
          ? true
          : undefined,
    );
    assert.ok(
      api.requests
        .filter((r) => r.method === "PATCH")
        .every((r) => r.contentType === "application/apply-patch+yaml"),
    );
    assert.doesNotMatch(running.stderr(), new RegExp(TOKEN));
    assert.equal(await running.terminate(), 0, running.stderr());
  });

  it("follows the Secret's member list within seconds (no check needed), restores a stray write, keeps a bad list out", async () => {
    // One check at the start, the next in ten minutes: whatever changes after the first comes from the member list.
    const { api, running } = await startPool(
      ["127.0.0.2"],
      { port: 3128, ipv4: ["127.0.0.2"], ipv6: ["2001:db8::8"] },
      { interval: 600 },
    );
    await until("both families' slices written, the IPv4 member checked", 20_000, async () =>
      same(conditionsOf(api, "egress-checked"), [["127.0.0.2", { ready: true }]]) &&
      same(conditionsOf(api, "egress-checked-ipv6"), [["2001:db8::8", {}]])
        ? true
        : undefined,
    );

    // `pulumi up` replaced a member and dropped IPv6: the exporter's slices follow well inside a drain (30 s).
    api.setMembers({ port: 3128, ipv4: ["127.0.0.2", "127.0.0.9"] });
    await until(
      "the new member listed (not checked yet), the IPv6 slice emptied",
      25_000,
      async () =>
        same(conditionsOf(api, "egress-checked"), [
          ["127.0.0.2", { ready: true }],
          ["127.0.0.9", {}],
        ]) && same(conditionsOf(api, "egress-checked-ipv6"), [])
          ? true
          : undefined,
    );

    // Someone edits the slice (kubectl, an older exporter's JSON patch): the next round puts it back, and owns it again.
    api.strayUpdate("egress-checked", "kubectl-edit", {
      endpoints: [{ addresses: ["127.0.0.2"], conditions: { ready: false } }],
    });
    assert.deepEqual(api.owners("egress-checked").endpoints, ["kubectl-edit"]);
    await until("the stray write undone", 15_000, async () =>
      same(conditionsOf(api, "egress-checked"), [
        ["127.0.0.2", { ready: true }],
        ["127.0.0.9", {}],
      ])
        ? true
        : undefined,
    );
    assert.deepEqual(api.owners("egress-checked").endpoints, [FIELD_MANAGER]);

    // A member list it cannot trust: said, and the slices stay as they are.
    const before = JSON.stringify(api.slices.get("egress-checked"));
    api.setMembers({ port: 3128, ipv4: ["not-an-address"] });
    await until("the bad list reported", 15_000, async () =>
      running
        .stderr()
        .includes("Secret crawlers/egress endpoints.json: ipv4 must be a list of IPv4 addresses")
        ? true
        : undefined,
    );
    assert.equal(JSON.stringify(api.slices.get("egress-checked")), before);
    // A failure that lasts is said once, not every round.
    const secretReads = () => api.requests.filter((r) => r.path.endsWith("/secrets/egress")).length;
    const readsNow = secretReads();
    await until("two more rounds", 15_000, async () =>
      secretReads() >= readsNow + 2 ? true : undefined,
    );
    assert.equal(running.stderr().split("ipv4 must be a list of IPv4 addresses").length - 1, 1);
    assert.equal(await running.terminate(), 0, running.stderr());
  });

  it("without the Role's create, says so and is not ready (a rollout waits for it)", async () => {
    const { running } = await startPool(
      ["127.0.0.2"],
      { port: 3128, ipv4: ["127.0.0.2"] },
      { interval: 1, grants: ROLE.filter((grant) => grant.verb !== "create") },
    );
    await until("the refusal logged", 20_000, async () =>
      /applying EndpointSlice crawlers\/egress-checked: 403 .*cannot create resource "endpointslices"/.test(
        running.stderr(),
      )
        ? true
        : undefined,
    );
    const health = await httpGet(`${running.base}/healthz`);
    assert.equal(health.status, 503);
    assert.match(
      health.body,
      /the EndpointSlices of Service crawlers\/egress were not written yet/,
    );
    assert.equal(await running.terminate(), 0, running.stderr());
  });

  it("outside a cluster, with a malformed Service, or the old flag, refuses to start (status 2) and says why", async () => {
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
      ["--serve", "127.0.0.1:0", "--endpointslices", "crawlers/egress"],
      {},
    );
    assert.equal(outside.status, 2);
    assert.match(
      outside.stderr,
      /--endpointslices runs inside the cluster \(KUBERNETES_SERVICE_HOST is not set\)/,
    );
    const noToken = await run(["--serve", "127.0.0.1:0", "--endpointslices", "crawlers/egress"], {
      KUBERNETES_SERVICE_HOST: "127.0.0.1",
      EGRESS_KUBE_SERVICEACCOUNT_DIR: join(dir, "missing"),
    });
    assert.equal(noToken.status, 2);
    assert.match(
      noToken.stderr,
      /needs the pod's service account: .*ca\.crt cannot be read \(ENOENT\)/,
    );
    const malformed = await run(["--serve", "127.0.0.1:0", "--endpointslices", "Crawlers"], {});
    assert.equal(malformed.status, 2);
    assert.match(malformed.stderr, /--endpointslices must be <namespace>\/<service>/);
    const old = await run(["--serve", "127.0.0.1:0", "--endpointslice", "crawlers/egress-vms"], {});
    assert.equal(old.status, 2);
    assert.match(
      old.stderr,
      /--endpointslice is gone: .*give --endpointslices <namespace>\/<service>/,
    );
    const lonely = await run(["--endpointslices", "crawlers/egress"], {});
    assert.equal(lonely.status, 2);
    assert.match(lonely.stderr, /--endpointslices needs --serve/);
  });
});
