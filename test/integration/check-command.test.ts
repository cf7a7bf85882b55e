/**
 * `egress-proxies check` as users run it (the built bin, a child process)
 * against small squid-like proxies on 127.0.0.x: basic auth, CONNECT, egress
 * addresses (two proxies share one "NAT" source address), a proxy that is
 * gone, one that accepts and never answers (a paused VM), wrong credentials.
 * The Prometheus file is read by promtool, Prometheus's own parser and linter.
 * Also the readiness egress check (provider/common/egress.ts) against them.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Deadline } from "../../provider/common/deadline";
import { egressAtReadiness } from "../../provider/common/egress";
import { PermanentError, TransientError } from "../../provider/common/errors";
import {
  startEchoServer,
  startForwardProxy,
  startSilentServer,
  startTcpEchoServer,
  type RunningServer,
} from "../support/forward-proxy";
import { assertPromtoolInstalled, promtool } from "../support/promtool";

const BIN = join(__dirname, "..", "..", "cli", "main.js");
const AUTH = { user: "crawler", password: "s3cret horse" };

interface Run {
  status: number;
  stdout: string;
  stderr: string;
}

function runCheck(args: string[], stdin?: string, env: Record<string, string> = {}): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, "check", ...args], {
      env: { ...process.env, ...env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    child.on("error", reject);
    child.on("close", (status) => resolve({ status: status ?? -1, stdout, stderr }));
    child.stdin.end(stdin ?? "");
  });
}

describe("egress-proxies check against loopback proxies", function () {
  this.timeout(120_000);
  const servers: RunningServer[] = [];
  let echo: RunningServer;
  let tunnelTarget: RunningServer;
  let dir: string;
  const healthy: Record<string, RunningServer> = {};
  let silent: RunningServer;
  let closedPort: number;

  const url = (server: RunningServer, auth = AUTH) =>
    `http://${encodeURIComponent(auth.user)}:${encodeURIComponent(auth.password)}@${server.host}:${server.port}`;
  const outputsFor = (entries: Record<string, string>) =>
    JSON.stringify({
      endpoints: Object.values(entries).map((u) => u.replace(/\/\/[^@]*@/, "//")),
      endpointsWithCredentials: Object.values(entries),
      proxies: Object.entries(entries).map(([name, u]) => ({
        name,
        endpoint: u.replace(/\/\/[^@]*@/, "//"),
      })),
      count: Object.keys(entries).length,
    });

  before(async () => {
    await assertPromtoolInstalled();
    dir = mkdtempSync(join(tmpdir(), "egress-check-"));
    echo = await startEchoServer("127.0.0.1");
    tunnelTarget = await startTcpEchoServer("127.0.0.1");
    servers.push(echo, tunnelTarget);
    // Own egress addresses for a and b; c and d leave from one shared address, like two VMs behind one NAT.
    const layout = {
      a: ["127.0.0.2", "127.0.0.2"],
      b: ["127.0.0.3", "127.0.0.3"],
      c: ["127.0.0.4", "127.0.0.9"],
      d: ["127.0.0.5", "127.0.0.9"],
    };
    for (const [name, [host, egressAddress]] of Object.entries(layout)) {
      healthy[name] = await startForwardProxy({ host: host!, auth: AUTH, egressAddress });
      servers.push(healthy[name]!);
    }
    silent = await startSilentServer("127.0.0.6");
    servers.push(silent);
    const gone = await startSilentServer("127.0.0.7");
    closedPort = gone.port;
    await gone.close();
  });

  after(async () => {
    await Promise.all(servers.map((server) => server.close()));
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  });

  const probeFlags = () => [
    "--target",
    `http://127.0.0.1:${echo.port}/`,
    "--connect",
    `127.0.0.1:${tunnelTarget.port}`,
    "--egress-url",
    `http://127.0.0.1:${echo.port}/json`,
    "--egress-field",
    "ip",
  ];

  it("all proxies up: exit 0, egress per proxy, the shared address reported, a Prometheus file promtool accepts", async () => {
    const prom = join(dir, "egress.prom");
    const outputs = outputsFor(
      Object.fromEntries(
        Object.entries(healthy).map(([name, server]) => [`kvm1-${name}`, url(server)]),
      ),
    );
    const run = await runCheck([...probeFlags(), "--json", "--prometheus", prom], outputs);
    assert.equal(run.status, 0, run.stderr + run.stdout);
    const report = JSON.parse(run.stdout) as {
      summary: { total: number; up: number };
      proxies: Array<{
        name: string;
        up: boolean;
        egressIp: string;
        httpStatus: number;
        connectSeconds: number;
      }>;
      egress: Array<{ address: string; proxies: string[] }>;
    };
    assert.deepEqual(report.summary, { total: 4, up: 4, down: 0, egressAddresses: 3 });
    assert.deepEqual(
      Object.fromEntries(report.proxies.map((proxy) => [proxy.name, proxy.egressIp])),
      {
        "kvm1-a": "127.0.0.2",
        "kvm1-b": "127.0.0.3",
        "kvm1-c": "127.0.0.9",
        "kvm1-d": "127.0.0.9",
      },
    );
    assert.ok(
      report.proxies.every((proxy) => proxy.httpStatus === 200 && proxy.connectSeconds >= 0),
    );
    assert.deepEqual(report.egress[0], { address: "127.0.0.9", proxies: ["kvm1-c", "kvm1-d"] });
    assert.ok(!run.stdout.includes("s3cret"), "no password in the report");

    const text = readFileSync(prom, "utf8");
    const checked = await promtool(text);
    assert.equal(checked.status, 0, checked.output);
    assert.equal(checked.output.trim(), "", "promtool's linter is silent");
    assert.match(
      text,
      /^egress_proxy_up\{proxy="kvm1-c",endpoint="127\.0\.0\.4:\d+",family="ipv4"\} 1$/m,
    );
    assert.match(
      text,
      /^egress_proxy_egress_info\{proxy="kvm1-d",endpoint="127\.0\.0\.5:\d+",family="ipv4",egress_ip="127\.0\.0\.9"\} 1$/m,
    );
    assert.deepEqual(readdirSync(dir), ["egress.prom"], "the temporary file was renamed, not left");
    // The parser is not a rubber stamp: a mangled copy fails.
    const broken = await promtool(
      text.replace(
        "# TYPE egress_proxy_up gauge",
        "# TYPE egress_proxy_up gauge\n# TYPE egress_proxy_up counter",
      ),
    );
    assert.notEqual(broken.status, 0);
  });

  it("a dual-stack member: both URLs probed under its name, each family's exit address, labelled by family", async () => {
    const echo6 = await startEchoServer("::1");
    const v4 = await startForwardProxy({
      host: "127.0.0.1",
      auth: AUTH,
      egressAddress: "127.0.0.8",
    });
    // The member's squid on its IPv6 address: the same port, as on a dual-stack VM.
    const v6 = await startForwardProxy({ host: "::1", auth: AUTH, port: v4.port });
    servers.push(echo6, v4, v6);
    const creds = `${encodeURIComponent(AUTH.user)}:${encodeURIComponent(AUTH.password)}@`;
    const urls = [`http://127.0.0.1:${v4.port}`, `http://[::1]:${v4.port}`];
    const outputs = JSON.stringify({
      endpoints: urls,
      endpointsWithCredentials: urls.map((u) => u.replace("//", `//${creds}`)),
      proxies: [{ name: "kvm1-dual", endpoint: urls[0], endpointIpv6: urls[1] }],
    });
    const flags = [...probeFlags(), "--egress-url-ipv6", `http://[::1]:${echo6.port}/json`];
    const prom = join(dir, "dual.prom");
    const both = await runCheck([...flags, "--json", "--prometheus", prom], outputs);
    assert.equal(both.status, 0, both.stderr + both.stdout);
    const report = JSON.parse(both.stdout) as {
      proxies: Array<{ name: string; family: string; up: boolean; egressIp: string }>;
    };
    assert.deepEqual(
      report.proxies.map((proxy) => [proxy.name, proxy.family, proxy.up, proxy.egressIp]),
      [
        ["kvm1-dual", "ipv4", true, "127.0.0.8"],
        ["kvm1-dual", "ipv6", true, "::1"],
      ],
    );
    const text = readFileSync(prom, "utf8");
    const checked = await promtool(text);
    assert.equal(checked.status, 0, checked.output);
    assert.match(
      text,
      /^egress_proxy_egress_info\{proxy="kvm1-dual",endpoint="\[::1\]:\d+",family="ipv6",egress_ip="::1"\} 1$/m,
    );
    await v6.close();
    const half = await runCheck([...flags, "--timeout", "2", "--prometheus", prom], outputs);
    assert.equal(half.status, 1, half.stderr + half.stdout);
    const metrics = readFileSync(prom, "utf8");
    assert.match(
      metrics,
      /^egress_proxy_up\{proxy="kvm1-dual",endpoint="127\.0\.0\.1:\d+",family="ipv4"\} 1$/m,
    );
    assert.match(
      metrics,
      /^egress_proxy_up\{proxy="kvm1-dual",endpoint="\[::1\]:\d+",family="ipv6"\} 0$/m,
    );
  });

  it("a gone proxy, a silent one and wrong credentials: exit 1, each with its reason, within the deadline", async () => {
    const entries = {
      "kvm1-a": url(healthy.a!),
      "kvm1-gone": `http://127.0.0.7:${closedPort}`,
      "kvm1-paused": `http://127.0.0.6:${silent.port}`,
      "kvm1-badauth": url(healthy.b!, { user: AUTH.user, password: "wrong" }),
    };
    const prom = join(dir, "down.prom");
    const run = await runCheck(
      [...probeFlags(), "--timeout", "2", "--prometheus", prom],
      outputsFor(entries),
    );
    assert.equal(run.status, 1, run.stderr + run.stdout);
    const lines = run.stdout.split("\n");
    assert.equal(lines[0], "4 proxies: 1 up, 3 down; 1 egress address");
    const row = (name: string) => lines.find((line) => line.startsWith(`${name} `)) ?? "";
    assert.match(row("kvm1-gone"), /DOWN .*http: .*ECONNREFUSED/);
    assert.match(row("kvm1-paused"), /DOWN .*http: no answer within 2 s/);
    assert.match(row("kvm1-badauth"), /DOWN .*http: HTTP 407 "Cache Access Denied\."/);
    assert.match(row("kvm1-a"), / up .*127\.0\.0\.2$/);
    assert.ok(!run.stdout.includes("wrong"), "no password in the report");
    const checked = await promtool(readFileSync(prom, "utf8"));
    assert.equal(checked.status, 0, checked.output);
    assert.match(
      readFileSync(prom, "utf8"),
      /^egress_proxy_up\{proxy="kvm1-paused",endpoint="127\.0\.0\.6:\d+",family="ipv4"\} 0$/m,
    );
    assert.match(readFileSync(prom, "utf8"), /^egress_proxies_up 1$/m);
  });

  it("reads a published proxies.json with --from and credentials from --user and $EGRESS_PROXY_PASSWORD", async () => {
    const file = join(dir, "proxies.json");
    writeFileSync(
      file,
      JSON.stringify([
        {
          url: `http://${healthy.a!.host}:${healthy.a!.port}`,
          ready: true,
          egressIp: null,
          checkedAt: null,
        },
      ]),
    );
    const run = await runCheck(
      ["--target", `http://127.0.0.1:${echo.port}/`, "--from", file, "--user", AUTH.user],
      undefined,
      {
        EGRESS_PROXY_PASSWORD: AUTH.password,
      },
    );
    assert.equal(run.status, 0, run.stderr + run.stdout);
    assert.match(run.stdout, /^1 proxy: up$/m);
  });

  it("usage problems: exit 2 with the fix named", async () => {
    const cases: Array<[string[], string | undefined, RegExp]> = [
      [[], "[]", /--target is required/],
      [["--target", "https://example.com/"], "[]", /--target must be an http:\/\/ URL/],
      [["--target", "http://x/", "--connect", "nope"], "[]", /--connect must be host:port/],
      [
        ["--target", "http://x/", "--timeout", "0"],
        "[]",
        /--timeout must be a whole number from 1 to 600/,
      ],
      [
        ["--target", "http://x/", "--from", join(dir, "missing.json")],
        undefined,
        /--from .*missing\.json: ENOENT/,
      ],
      [["--target", "http://x/"], "not json", /stdin is not JSON/],
      [
        ["--target", "http://x/"],
        "",
        /stdin is empty: pipe `pulumi stack output --json --show-secrets` in/,
      ],
      [["--target", "http://x/", "--user", "u"], "[]", /EGRESS_PROXY_PASSWORD/],
      [["--target", "http://x/", "--bogus"], "[]", /Unknown option '--bogus'/],
    ];
    for (const [args, stdin, message] of cases) {
      const run = await runCheck(args, stdin);
      assert.equal(run.status, 2, `${args.join(" ")}: ${run.stderr}`);
      assert.match(run.stderr, message);
    }
  });

  describe("the readiness egress check through a proxy", () => {
    const inputs = (extra: object) => ({
      readiness: { mode: "port", port: healthy.a!.port },
      ...extra,
    });

    it("records the address the echo service saw", async () => {
      const found = await egressAtReadiness(
        "127.0.0.2",
        inputs({ egressCheck: { url: `http://127.0.0.1:${echo.port}/`, proxyAuth: AUTH } }),
        new Deadline(10_000, "timeouts.readySeconds"),
      );
      assert.equal(found.egressIp, "127.0.0.2");
      assert.ok(!Number.isNaN(Date.parse(found.checkedAt ?? "")));
    });

    it("fails at once, quoting the proxy, on missing credentials or an answer without an address", async () => {
      await assert.rejects(
        egressAtReadiness(
          "127.0.0.2",
          inputs({ egressCheck: { url: `http://127.0.0.1:${echo.port}/` } }),
          new Deadline(10_000, "x"),
        ),
        (error: Error) =>
          error instanceof PermanentError &&
          /HTTP 407.*set egressCheck\.proxyAuth/.test(error.message),
      );
      await assert.rejects(
        egressAtReadiness(
          "127.0.0.2",
          inputs({
            egressCheck: {
              url: `http://127.0.0.1:${echo.port}/json`,
              field: "address",
              proxyAuth: AUTH,
            },
          }),
          new Deadline(10_000, "x"),
        ),
        (error: Error) =>
          error instanceof PermanentError &&
          /looked at address\): "\{\\"ip\\":\\"127\.0\.0\.2\\"\}"/.test(error.message),
      );
    });

    it("keeps trying while the proxy cannot reach the service, then fails with its last answer", async () => {
      const deadService = `http://127.0.0.1:${closedPort}/`;
      await assert.rejects(
        egressAtReadiness(
          "127.0.0.2",
          inputs({ egressCheck: { url: deadService, proxyAuth: AUTH } }),
          new Deadline(3000, "timeouts.readySeconds"),
        ),
        (error: Error) =>
          error instanceof TransientError &&
          /the egress check \(last answer: .*HTTP 502 "upstream: connect ECONNREFUSED/.test(
            error.message,
          ) &&
          /raise timeouts\.readySeconds/.test(error.message),
      );
    });

    it("checks nothing without an address or with readiness none", async () => {
      assert.deepEqual(await egressAtReadiness(null, inputs({}), new Deadline(1000, "x")), {
        egressIp: null,
        checkedAt: null,
      });
      assert.deepEqual(
        await egressAtReadiness(
          "127.0.0.2",
          { readiness: { mode: "none", port: 1 } },
          new Deadline(1000, "x"),
        ),
        { egressIp: null, checkedAt: null },
      );
    });
  });
});
