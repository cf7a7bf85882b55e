/**
 * StaticProxy through the real dynamic-provider gRPC server, from the packed
 * package: a proxy URL with credentials registered as a secret (never in the
 * serialized provider), check/create/diff/update/read/delete over gRPC, and
 * `.get` by id with the URL. The proxy is a squid-like forward proxy with
 * basic auth on 127.0.0.2 that leaves from 127.0.0.3.
 */
import assert from "node:assert/strict";
import {
  startEchoServer,
  startForwardProxy,
  type ForwardProxy,
  type RunningServer,
} from "../support/forward-proxy";
import {
  captureResourceInputs,
  DynamicProviderServer,
  packIntoConsumerProject,
  type ConsumerProject,
} from "./harness";
import { planSummary, refreshThenPlan } from "./resync";

const AUTH = { user: "shop", password: "engine static secret" };

describe("engine: StaticProxy through the dynamic-provider gRPC server", function () {
  this.timeout(120_000);
  let project: ConsumerProject;
  let echo: RunningServer;
  let proxy: ForwardProxy;
  let server: DynamicProviderServer | undefined;

  before(async () => {
    project = packIntoConsumerProject();
    echo = await startEchoServer("127.0.0.1");
    proxy = await startForwardProxy({ host: "127.0.0.2", auth: AUTH, egressAddress: "127.0.0.3" });
  });

  after(async () => {
    await server?.stop();
    await proxy?.close();
    await echo?.close();
    project?.remove();
  });

  const url = () =>
    `http://${AUTH.user}:${encodeURIComponent(AUTH.password)}@127.0.0.2:${proxy.port}`;

  it("keeps the URL secret, probes the proxy at create, updates in place, reads and forgets it", async () => {
    const captured = await captureResourceInputs(project, "StaticProxy", "shop-0", {
      url: url(),
      readiness: { probeUrl: `http://127.0.0.1:${echo.port}/` },
      egressCheck: { url: `http://127.0.0.1:${echo.port}/json`, field: "ip" },
      egressRecheck: true,
      timeouts: { createSeconds: 60, readySeconds: 20, deleteSeconds: 60 },
    });
    assert.equal(captured.type, "pulumi-nodejs:dynamic/egress-proxies:StaticProxy");
    assert.ok(captured.secretInputs.includes("url"), captured.secretInputs.join());
    assert.doesNotMatch(String(captured.inputs.__provider), /engine static secret/);

    server = await DynamicProviderServer.start(project);
    const checked = await server.check(captured.urn, {}, captured.inputs);
    assert.deepEqual(checked.failures, []);
    const created = await server.create(captured.urn, checked.inputs);
    assert.equal(created.id, `proxies/127.0.0.2:${proxy.port}`);
    assert.equal(created.properties.endpoint, `http://127.0.0.2:${proxy.port}`);
    assert.equal(created.properties.egressIp, "127.0.0.3");
    assert.equal(created.properties.state, "reachable");

    // `pulumi up --refresh` of the unchanged program, three times over (a resync loop): no change.
    const resync = await refreshThenPlan(
      server,
      captured.urn,
      { id: created.id, outputs: created.properties, inputs: checked.inputs },
      captured.inputs,
    );
    assert.deepEqual(planSummary(resync), ["none", "none", "none"]);
    assert.equal(resync.at(-1)!.stored.outputs.state, "reachable");
    // With the egress re-check on, a confirming refresh moves only checkedAt (the last check's time).
    for (const round of resync) {
      assert.ok(String(round.stored.outputs.checkedAt) > String(created.properties.checkedAt));
      assert.equal(round.stored.outputs.egressProblem, null);
    }

    // Readiness settings change in place; another URL is another proxy.
    const retimed = await server.check(captured.urn, checked.inputs, {
      ...captured.inputs,
      timeouts: { createSeconds: 60, readySeconds: 10, deleteSeconds: 60 },
    });
    const inPlace = await server.diff(captured.urn, created.id, created.properties, retimed.inputs);
    assert.deepEqual([inPlace.changes, inPlace.replaces], ["some", []]);
    const updated = await server.update(
      captured.urn,
      created.id,
      created.properties,
      retimed.inputs,
    );
    assert.equal(updated.egressIp, "127.0.0.3");
    const moved = await server.check(captured.urn, checked.inputs, {
      ...captured.inputs,
      url: `http://127.0.0.2:${proxy.port + 1}`,
    });
    const replace = await server.diff(captured.urn, created.id, created.properties, moved.inputs);
    assert.deepEqual(replace.replaces, ["url"]);

    const read = await server.read(captured.urn, created.id, updated, retimed.inputs);
    assert.equal(read.id, created.id);
    assert.equal(read.properties.state, "reachable");
    await server.delete(captured.urn, created.id, updated);
    // Forgetting it leaves the proxy serving.
    assert.equal(
      (await server.read(captured.urn, created.id, updated, retimed.inputs)).properties.state,
      "reachable",
    );
  });

  it("with the egress re-check: a changed exit address and a silent proxy show on refresh", async () => {
    const captured = await captureResourceInputs(project, "StaticProxy", "shop-1", {
      url: url(),
      egressCheck: { url: `http://127.0.0.1:${echo.port}/json` },
      egressRecheck: true,
    });
    server ??= await DynamicProviderServer.start(project);
    const checked = await server.check(captured.urn, {}, captured.inputs);
    const created = await server.create(captured.urn, checked.inputs);
    const stored = { id: created.id, outputs: created.properties, inputs: checked.inputs };
    const again = async (egressAddress: string) => {
      const port = proxy.port;
      await proxy.close();
      proxy = await startForwardProxy({ host: "127.0.0.2", auth: AUTH, egressAddress, port });
    };
    const refreshAndPlan = async () => {
      const read = await server!.read(captured.urn, stored.id, stored.outputs, stored.inputs);
      const plan = await server!.check(captured.urn, read.inputs, captured.inputs);
      const diff = await server!.diff(captured.urn, stored.id, read.properties, plan.inputs);
      return { read, diff };
    };
    try {
      await again("127.0.0.4");
      const moved = await refreshAndPlan();
      assert.equal(moved.read.properties.egressIp, "127.0.0.4");
      assert.equal(moved.read.properties.state, "reachable");
      assert.equal(moved.diff.changes, "none", "a new exit address is accepted");

      await proxy.close();
      const silent = await refreshAndPlan();
      assert.equal(silent.read.properties.state, "unreachable");
      assert.match(
        String((silent.read.properties.egressProblem as { reason: string }).reason),
        /127\.0\.0\.2/,
      );
      assert.equal(silent.diff.changes, "none", "not ours to heal: reported only");
    } finally {
      await again("127.0.0.3");
    }
    const back = await refreshAndPlan();
    assert.equal(back.read.properties.state, "reachable");
    assert.equal(back.read.properties.egressProblem, null);
    assert.equal(back.read.properties.egressIp, "127.0.0.3");
  });

  it("StaticProxy.get takes an existing proxy by id and url", async () => {
    const id = `proxies/127.0.0.2:${proxy.port}`;
    const captured = await captureResourceInputs(
      project,
      "StaticProxy",
      "adopted",
      { url: url() },
      undefined,
      id,
    );
    assert.equal(captured.id, id);
    server ??= await DynamicProviderServer.start(project);
    const read = await server.read(captured.urn, id, captured.inputs, captured.inputs);
    assert.equal(read.id, id);
    assert.equal(read.properties.host, "127.0.0.2");
    assert.equal(read.properties.state, "reachable");
  });
});
