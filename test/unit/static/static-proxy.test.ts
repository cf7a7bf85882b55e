/**
 * StaticProxy against a real forward proxy on loopback (test/support/forward-proxy.ts,
 * squid's 407 behaviour) and a real echo service: URL checking, readiness,
 * the egress check with the URL's own credentials, refresh, update, delete.
 */
import assert from "node:assert/strict";
import { createServer, type Server } from "node:net";
import { errorClassOf } from "../../../provider/common/errors";
import { UNKNOWN } from "../../../provider/common/inputs";
import * as provider from "../../../provider/static/provider";
import { proxyAddressOf, proxyUrlProblem } from "../../../provider/static/schema";
import {
  startEchoServer,
  startForwardProxy,
  type ForwardProxy,
  type RunningServer,
} from "../../support/forward-proxy";

const AUTH = { user: "shop", password: "p@ss word/secret" };
const owner = { project: "p", stack: "s", resource: "static-0" };
const userinfo = `${encodeURIComponent(AUTH.user)}:${encodeURIComponent(AUTH.password)}`;

async function checked(news: Record<string, unknown>): Promise<Record<string, unknown>> {
  const { inputs, failures } = await provider.check({}, { owner, ...news });
  assert.deepEqual(failures, []);
  return inputs;
}

describe("StaticProxy URLs", () => {
  it("accepts http://[user:password@]host:port and splits it, credentials decoded", () => {
    assert.equal(proxyUrlProblem(`http://${userinfo}@127.0.0.1:3128`), undefined);
    assert.deepEqual(proxyAddressOf(`http://${userinfo}@127.0.0.1:3128`), {
      host: "127.0.0.1",
      port: 3128,
      endpoint: "http://127.0.0.1:3128",
      credentials: AUTH,
    });
    assert.deepEqual(proxyAddressOf("http://[2001:db8::1]:8080"), {
      host: "2001:db8::1",
      port: 8080,
      endpoint: "http://[2001:db8::1]:8080",
    });
  });

  it("refuses what is not a proxy URL, naming the fix and never quoting the URL", () => {
    const cases: Array<[string, RegExp]> = [
      ["a proxy", /must be a URL like/],
      ["proxy.example:3128", /must start with http:\/\//],
      ["https://u:hunter2@proxy.example:3128", /must start with http:\/\//],
      ["http://u:hunter2@proxy.example", /must give the proxy's port/],
      ["http://u:hunter2@proxy.example:3128/path", /without a path/],
      ["http://:hunter2@proxy.example:3128", /password but no user/],
    ];
    for (const [url, expected] of cases) {
      const problem = proxyUrlProblem(url);
      assert.match(problem ?? "", expected, url);
      assert.ok(!problem!.includes("hunter2"), `the password leaked: ${problem}`);
    }
  });

  it("check reports a bad url as a failure of the url field, without the password", async () => {
    const { failures } = await provider.check({}, { owner, url: "ftp://u:hunter2@h:1" });
    assert.equal(failures.length, 1);
    assert.equal(failures[0]!.property, "url");
    assert.ok(!failures[0]!.reason.includes("hunter2"));
  });

  it("check fills defaults, and keeps an unknown url for preview", async () => {
    const inputs = await checked({ url: "http://127.0.0.1:3128" });
    assert.deepEqual(inputs.readiness, { mode: "port" });
    assert.deepEqual(inputs.timeouts, {
      createSeconds: 900,
      readySeconds: 600,
      deleteSeconds: 300,
    });
    const preview = await provider.check({}, { owner, url: UNKNOWN });
    assert.deepEqual(preview.failures, []);
    assert.equal(preview.inputs.url, UNKNOWN);
  });

  it("diff: another url replaces; readiness, egress check and timeouts update in place", async () => {
    const olds = await checked({ url: "http://127.0.0.1:3128" });
    const moved = await checked({ url: "http://127.0.0.1:3129" });
    assert.deepEqual((await provider.diff("id", olds, moved)).replaces, ["url"]);
    const retimed = await checked({ url: "http://127.0.0.1:3128", timeouts: { readySeconds: 5 } });
    const decision = await provider.diff("id", olds, retimed);
    assert.deepEqual([decision.changes, decision.replaces], [true, []]);
    assert.equal((await provider.diff("id", olds, { ...olds })).changes, false);
  });
});

describe("StaticProxy lifecycle (loopback forward proxy with basic auth)", () => {
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

  const url = () => `http://${userinfo}@127.0.0.2:${proxy.port}`;

  it("create probes the proxy and records what the egress check saw, with the URL's credentials", async () => {
    const inputs = await checked({
      url: url(),
      readiness: { probeUrl: `http://127.0.0.1:${echo.port}/` },
      egressCheck: { url: `http://127.0.0.1:${echo.port}/json`, field: "ip" },
    });
    const before = Date.now();
    const { id, outs } = await provider.create(inputs);
    assert.equal(id, `proxies/127.0.0.2:${proxy.port}`);
    assert.equal(outs.endpoint, `http://127.0.0.2:${proxy.port}`);
    assert.equal(outs.ip, "127.0.0.2");
    assert.equal(outs.state, "reachable");
    assert.equal(outs.egressIp, "127.0.0.3");
    assert.ok(Date.parse(String(outs.checkedAt)) >= before - 1000);
    for (const [key, value] of Object.entries(outs))
      if (key !== "url")
        assert.ok(!JSON.stringify(value).includes("secret"), `${key} holds the password`);

    // Update carries what create saw; refresh keeps it and reports the proxy reachable.
    const { outs: updated } = await provider.update(id, outs, {
      ...inputs,
      timeouts: {
        createSeconds: 900,
        readySeconds: 30,
        deleteSeconds: 300,
      },
    });
    assert.equal(updated.egressIp, "127.0.0.3");
    assert.equal(updated.checkedAt, outs.checkedAt);
    const refreshed = await provider.read(id, outs);
    assert.equal(refreshed.id, id);
    assert.equal(refreshed.props?.state, "reachable");
    assert.equal(refreshed.props?.egressIp, "127.0.0.3");
    assert.equal(await provider.remove(id, outs), "already gone");
  });

  it("wrong credentials fail readiness at once as Permanent, quoting the proxy's 407 but no password", async () => {
    const inputs = await checked({
      url: `http://shop:wrong-secret@127.0.0.2:${proxy.port}`,
      readiness: { probeUrl: `http://127.0.0.1:${echo.port}/` },
      timeouts: { createSeconds: 60, readySeconds: 30, deleteSeconds: 60 },
    });
    const error = await provider.create(inputs).then(
      () => assert.fail("create succeeded"),
      (caught: Error) => caught,
    );
    assert.equal(errorClassOf(error), "Permanent");
    assert.match(error.message, /refused the url's credentials/);
    assert.match(error.message, /407/);
    assert.ok(!error.message.includes("wrong-secret"));
  });

  it("a proxy that does not answer: create times out within readySeconds; refresh keeps it as unreachable", async () => {
    const closed = await unusedPort();
    const inputs = await checked({
      url: `http://127.0.0.1:${closed}`,
      timeouts: { createSeconds: 60, readySeconds: 2, deleteSeconds: 60 },
    });
    const error = await provider.create(inputs).then(
      () => assert.fail("create succeeded"),
      (caught: Error) => caught,
    );
    assert.equal(errorClassOf(error), "Transient");
    assert.match(error.message, /timeouts\.readySeconds/);
    const refreshed = await provider.read(`proxies/127.0.0.1:${closed}`, {
      ...inputs,
      state: "reachable",
    });
    assert.equal(refreshed.props?.state, "unreachable");
  });

  it(".get without a url says how to give one", async () => {
    await assert.rejects(
      provider.read("proxies/127.0.0.1:3128", { owner }),
      /give the proxy's url/,
    );
  });
});

/** A port nothing listens on: bound, then released. */
async function unusedPort(): Promise<number> {
  const server: Server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}
