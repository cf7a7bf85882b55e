/**
 * ProxmoxProxy's create path with an egress check, against the simulator:
 * the guest "reports" 127.0.0.2 on its NIC, where a squid-like proxy with
 * basic auth listens, so readiness and the egress check go through a real
 * proxy to a real echo service on loopback.
 */
import assert from "node:assert/strict";
import { PartialCreateError } from "../../provider/common/partial-create";
import * as provider from "../../provider/proxmox/provider";
import {
  startEchoServer,
  startForwardProxy,
  type ForwardProxy,
  type RunningServer,
} from "../support/forward-proxy";
import { checked, userInputs } from "./fixtures";
import { useSimulator } from "./harness";

const AUTH = { user: "crawler", password: "proxmox secret" };

describe("ProxmoxProxy create with an egress check (simulator + loopback proxy)", () => {
  const env = useSimulator({ agentDelayMs: 20, guestAddress: () => "127.0.0.2" });
  let echo: RunningServer;
  let proxy: ForwardProxy;

  before(async () => {
    echo = await startEchoServer("127.0.0.1");
    proxy = await startForwardProxy({ host: "127.0.0.2", auth: AUTH, egressAddress: "127.0.0.3" });
  });
  after(async () => {
    await proxy?.close();
    await echo?.close();
  });

  const inputsWith = (egressCheck: Record<string, unknown>) =>
    checked(
      userInputs(env.sim, {
        readiness: { mode: "port", port: proxy.port },
        egressCheck,
      }),
    );

  it("records the address the echo service saw through the proxy, and when", async () => {
    const inputs = await inputsWith({
      url: `http://127.0.0.1:${echo.port}/json`,
      field: "ip",
      proxyAuth: AUTH,
    });
    const before = Date.now();
    const { outs } = await provider.create(inputs);
    assert.equal(outs.ip, "127.0.0.2");
    assert.equal(outs.egressIp, "127.0.0.3");
    assert.ok(Date.parse(String(outs.checkedAt)) >= before - 1000);
    // Update carries what create found; the check's settings change in place.
    const { outs: updated } = await provider.update(
      `nodes/${env.sim.node}/qemu/${outs.vmid}`,
      outs as never,
      { ...inputs, egressCheck: { url: `http://127.0.0.1:${echo.port}/` } },
    );
    assert.equal(updated.egressIp, "127.0.0.3");
    assert.equal(updated.checkedAt, outs.checkedAt);
  });

  it("fails readiness, VM recorded, quoting squid's 407 when the credentials are wrong", async () => {
    const inputs = await inputsWith({
      url: `http://127.0.0.1:${echo.port}/`,
      proxyAuth: { user: AUTH.user, password: "wrong password" },
    });
    const error = await provider.create(inputs).then(
      () => assert.fail("create succeeded"),
      (failure: Error) => failure,
    );
    assert.ok(error instanceof PartialCreateError, String(error));
    assert.match(error.message, /HTTP 407.*check egressCheck\.proxyAuth/);
    assert.ok(!error.message.includes("wrong password"), "no password in the message");
    assert.equal(
      ((error as PartialCreateError).properties as { ip?: string }).ip,
      "127.0.0.2",
      "the address is kept",
    );
  });
});
