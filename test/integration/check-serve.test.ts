/**
 * `egress-proxies check --serve` as users run it: the built bin as a
 * long-lived child process against small squid-like proxies on 127.0.0.x.
 * /metrics is scraped twice with a proxy broken between the scrapes, each
 * scrape is read by promtool (Prometheus's own parser and linter), /healthz
 * answers, and SIGTERM ends the process with status 0. The proxy list comes
 * from a --from file that is read again before each check (a proxy added
 * to it between the scrapes shows in the second).
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  CHECK_BIN,
  httpGet,
  proxyUp,
  sample,
  startExporter,
  type RunningExporter,
} from "../support/check-exporter";
import {
  startEchoServer,
  startForwardProxy,
  startTcpEchoServer,
  type RunningServer,
} from "../support/forward-proxy";
import { assertPromtoolInstalled, promtool } from "../support/promtool";

const AUTH = { user: "crawler", password: "s3cret horse" };

describe("egress-proxies check --serve as a long-lived exporter", function () {
  this.timeout(120_000);
  const servers: RunningServer[] = [];
  let exporter: RunningExporter | undefined;
  let dir: string;
  let echo: RunningServer;
  let tunnelTarget: RunningServer;

  before(async () => {
    await assertPromtoolInstalled();
    dir = mkdtempSync(join(tmpdir(), "egress-serve-"));
    echo = await startEchoServer("127.0.0.1");
    tunnelTarget = await startTcpEchoServer("127.0.0.1");
    servers.push(echo, tunnelTarget);
  });

  after(async () => {
    if (exporter !== undefined && exporter.child.exitCode === null) exporter.child.kill("SIGKILL");
    await Promise.all(servers.map((server) => server.close()));
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  });

  it("checks on its interval, shows a proxy broken between two scrapes, and exits 0 on SIGTERM", async () => {
    const steady = await startForwardProxy({
      host: "127.0.0.2",
      auth: AUTH,
      egressAddress: "127.0.0.2",
    });
    const doomed = await startForwardProxy({
      host: "127.0.0.3",
      auth: AUTH,
      egressAddress: "127.0.0.3",
    });
    servers.push(steady, doomed);
    const url = (server: RunningServer) =>
      `http://${AUTH.user}:${encodeURIComponent(AUTH.password)}@${server.host}:${server.port}`;
    const list = join(dir, "proxies.json");
    writeFileSync(
      list,
      JSON.stringify([
        { url: url(steady), ready: true },
        { url: url(doomed), ready: true },
      ]),
    );

    exporter = await startExporter([
      "--interval",
      "1",
      "--timeout",
      "3",
      "--from",
      list,
      "--target",
      `http://127.0.0.1:${echo.port}/`,
      "--connect",
      `127.0.0.1:${tunnelTarget.port}`,
      "--egress-url",
      `http://127.0.0.1:${echo.port}/json`,
      "--egress-field",
      "ip",
    ]);
    const { base } = exporter;

    const first = await exporter.scrapeAfter(0);
    const lint = await promtool(first);
    assert.equal(lint.status, 0, lint.output);
    assert.equal(proxyUp(first, `${steady.host}:${steady.port}`), 1, first);
    assert.equal(proxyUp(first, `${doomed.host}:${doomed.port}`), 1, first);
    assert.equal(sample(first, "egress_proxies_up"), 2, first);
    assert.match(first, /egress_proxy_egress_info\{[^}]*egress_ip="127\.0\.0\.3"[^}]*\} 1/);
    assert.equal((await httpGet(`${base}/healthz`)).status, 200);

    // Break one proxy and add a new one to the list file, then wait for a check that started after both.
    const checksBefore = sample(first, "egress_proxies_exporter_checks_total")!;
    await doomed.close();
    const added = await startForwardProxy({
      host: "127.0.0.4",
      auth: AUTH,
      egressAddress: "127.0.0.4",
    });
    servers.push(added);
    writeFileSync(
      list,
      JSON.stringify([steady, doomed, added].map((server) => ({ url: url(server), ready: true }))),
    );
    const second = await exporter.scrapeAfter(checksBefore + 1);
    const lintSecond = await promtool(second);
    assert.equal(lintSecond.status, 0, lintSecond.output);
    assert.equal(proxyUp(second, `${steady.host}:${steady.port}`), 1, second);
    assert.equal(proxyUp(second, `${doomed.host}:${doomed.port}`), 0, second);
    assert.equal(proxyUp(second, `${added.host}:${added.port}`), 1, second);
    assert.equal(sample(second, "egress_proxies_up"), 2, second);
    assert.equal(sample(second, "egress_proxies_probed"), 3, second);
    assert.equal((await httpGet(`${base}/nope`)).status, 404);
    // No credentials anywhere in what the exporter serves or logs.
    assert.doesNotMatch(second + exporter.stderr(), /s3cret/);

    const status = await exporter.terminate();
    assert.equal(status, 0, `exit after SIGTERM: ${String(status)}\n${exporter.stderr()}`);
    assert.match(exporter.stderr(), /stopped/);
  });

  it("refuses a bad --serve address or --interval without --serve, naming the flag (status 2)", async () => {
    const run = (args: string[]) =>
      new Promise<{ status: number | null; stderr: string }>((resolve, reject) => {
        const c = spawn(process.execPath, [CHECK_BIN, "check", "--target", "http://x/", ...args]);
        let err = "";
        c.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
        c.on("error", reject);
        c.on("close", (code) => resolve({ status: code, stderr: err }));
        c.stdin.end("[]");
      });
    const badAddress = await run(["--serve", "localhost", "--proxy", "http://127.0.0.1:1"]);
    assert.equal(badAddress.status, 2);
    assert.match(badAddress.stderr, /--serve must be host:port/);
    const lonely = await run(["--interval", "5", "--proxy", "http://127.0.0.1:1"]);
    assert.equal(lonely.status, 2);
    assert.match(lonely.stderr, /--interval needs --serve/);
  });
});
