import assert from "node:assert/strict";
import { Deadline } from "../../../provider/common/deadline";
import { waitForProxyProbe } from "../../../provider/kvm/ready";
import { startEchoServer, startForwardProxy } from "../../support/forward-proxy";

/**
 * readiness.probeUrl through a proxy that requires basic auth, as the pool's
 * members do: the probe sends the egress check's credentials, and without
 * them says which input is missing instead of waiting out its budget silently.
 */
describe("KvmProxy readiness.probeUrl through a proxy that asks for credentials", () => {
  const auth = { user: "crawler", password: "probe secret:1" };

  it("passes with egressCheck.proxyAuth, and without it names the input in its timeout", async () => {
    const target = await startEchoServer("127.0.0.1");
    const proxy = await startForwardProxy({ host: "127.0.0.1", auth });
    const port = proxy.port;
    const url = `http://${target.host}:${target.port}/`;
    try {
      await waitForProxyProbe(
        "127.0.0.1",
        port,
        url,
        new Deadline(5000, "timeouts.readySeconds"),
        auth,
      );
      const refused = waitForProxyProbe(
        "127.0.0.1",
        port,
        url,
        new Deadline(1500, "timeouts.readySeconds"),
        undefined,
      );
      await assert.rejects(refused, (error: Error) => {
        assert.match(
          error.message,
          /HTTP 407: the proxy asks for credentials; set egressCheck\.proxyAuth/,
        );
        assert.ok(!error.message.includes(auth.password));
        return true;
      });
    } finally {
      await proxy.close();
      await target.close();
    }
  });
});
