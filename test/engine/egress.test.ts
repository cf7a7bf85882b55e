/**
 * The egress check through the real dynamic-provider gRPC server: a user's
 * ProxmoxProxy with `egressCheck` (the check's password is a secret input),
 * created against the simulator whose guest "reports" 127.0.0.2, where a
 * squid-like proxy with basic auth listens and leaves from 127.0.0.3.
 */
import assert from "node:assert/strict";
import type { PveSimulator } from "../pve-sim/simulator";
import {
  startEchoServer,
  startForwardProxy,
  type ForwardProxy,
  type RunningServer,
} from "../support/forward-proxy";
import { simulatorProxyArgs, useEngineFixture } from "./engine-fixture";
import { captureResourceInputs } from "./harness";

const AUTH = { user: "crawler", password: "engine egress secret" };

describe("engine: the egress check through the dynamic-provider gRPC server", function () {
  this.timeout(120_000);
  const fixture = useEngineFixture();
  let sim: PveSimulator;
  let echo: RunningServer;
  let proxy: ForwardProxy;

  before(async () => {
    sim = await fixture.startSimulator({ guestAddress: () => "127.0.0.2" });
    echo = await startEchoServer("127.0.0.1");
    proxy = await startForwardProxy({ host: "127.0.0.2", auth: AUTH, egressAddress: "127.0.0.3" });
  });

  after(async () => {
    await proxy?.close();
    await echo?.close();
  });

  it("keeps the check's settings secret, records egressIp, and deletes from the outputs", async () => {
    const captured = await captureResourceInputs(
      fixture.project,
      "ProxmoxProxy",
      "edge-egress",
      simulatorProxyArgs(sim, {
        readiness: { mode: "port", port: proxy.port },
        egressCheck: { url: `http://127.0.0.1:${echo.port}/json`, proxyAuth: AUTH },
      }),
    );
    assert.ok(captured.secretInputs.includes("egressCheck"), captured.secretInputs.join());
    assert.doesNotMatch(String(captured.inputs.__provider), /engine egress secret/);

    const server = await fixture.startServer({
      config: { "egress-proxies:proxmoxApiToken": sim.tokenFor() },
    });
    const checked = await server.check(captured.urn, {}, captured.inputs);
    assert.deepEqual(checked.failures, []);
    const created = await server.create(captured.urn, checked.inputs);
    assert.equal(created.properties.ip, "127.0.0.2");
    assert.equal(created.properties.egressIp, "127.0.0.3");
    assert.ok(!Number.isNaN(Date.parse(String(created.properties.checkedAt))));

    // A new URL for the check is an in-place update, never a new VM.
    const changed = await server.check(captured.urn, checked.inputs, {
      ...captured.inputs,
      egressCheck: { url: `http://127.0.0.1:${echo.port}/`, proxyAuth: AUTH },
    });
    const diff = await server.diff(captured.urn, created.id, created.properties, changed.inputs);
    assert.deepEqual([diff.changes, diff.replaces], ["some", []]);

    await server.delete(captured.urn, created.id, created.properties);
    assert.equal(sim.vms.has(Number(created.properties.vmid)), false);
  });
});
