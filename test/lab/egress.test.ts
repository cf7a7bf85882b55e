/**
 * Egress in the lab, with two real squid VMs booted once (TCG is slow and the
 * lab is shared): squid from the pool's own cloud-init with basic auth, an
 * echo service inside the lab network that answers with the caller's address,
 * and a SNAT rule in front of one of its ports so both proxies look like one
 * site behind one NAT address. Checks:
 * - create's egress check records the address the target saw (the NAT one);
 * - the pool, given these real outputs, reports the shared address, and with
 *   requireDistinctEgress fails before declaring any Kubernetes object;
 * - `egress-proxies check` (the built bin) sees each proxy's own address on
 *   the direct port, the shared one behind NAT, and finds a paused VM and a
 *   stopped squid with exit status 1; promtool reads its Prometheus file;
 * - refresh with the egress re-check: quiet when nothing changed, a new NAT
 *   address accepted; this machine's path to both proxies cut (prohibit
 *   routes, taken back after): the one whose squid the guest agent sees
 *   listening is "path unknown" and not restarted, the stopped squid's VM
 *   (nothing listening, says its agent) restarted in place by update.
 * Every guest, the echo process, its address and its NAT rule are removed
 * in `after`, also when a test fails.
 */
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { appendFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { poolUserData, squidCloudConfig } from "../../components/squid-cloud-init";
import { tryTcpConnect } from "../../provider/common/readiness";
import { closeAllHosts } from "../../provider/kvm/connect";
import * as kvm from "../../provider/kvm/provider";
import { openLocalLibvirt } from "../../provider/ssh/local";
import { packIntoConsumerProject, type ConsumerProject } from "../engine/harness";
import { proxyUp, sample, startExporter } from "../support/check-exporter";
import { useLab, type LabEnv } from "./fixture";
import { dhcpAddressPattern, escapedAddress } from "./lab";
import {
  ensureProxyImage,
  labConnection,
  linkHostToLab,
  refreshWithRecheck,
  removeCachedBaseImage,
  serveImage,
  type ProxyImage,
  type RunningServer,
} from "./kvm-support";

/** Inside the lab's subnet: the echo service's address (on the lab netns) and the NAT source. */
const labAddress = (lab: LabEnv, host: number) => lab.subnet.replace(/\.0\/24$/, `.${host}`);
const AUTH = { user: "crawler", password: "egress lab secret" };
const owner = { project: "egress-lab", stack: "egress-test", resource: "proxy" };
const BIN = join(__dirname, "..", "..", "cli", "main.js");

interface Run {
  status: number;
  stdout: string;
  stderr: string;
}

function runProcess(command: string, args: string[], stdin: string, cwd?: string): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, stdio: ["pipe", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    child.on("error", reject);
    child.on("close", (status) => resolve({ status: status ?? -1, stdout, stderr }));
    child.stdin.end(stdin);
  });
}

/** The pool under Pulumi mocks, its KvmProxy children answering with the VMs' real outputs. */
const POOL_RUNNER = `
const fs = require("node:fs");
const pulumi = require("@pulumi/pulumi");
const [outsFile, requireDistinct] = process.argv.slice(2);
const real = JSON.parse(fs.readFileSync(outsFile, "utf8"));
const declared = [];
const rejections = [];
process.on("unhandledRejection", (error) => rejections.push(String(error && error.message)));
let next = 0;
pulumi.runtime
  .setMocks(
    {
      newResource(args) {
        declared.push(args.type);
        if (args.type.includes("KvmProxy")) {
          const outs = real[next++];
          return { id: outs.id, state: outs.props };
        }
        return { id: args.name + "-id", state: args.inputs };
      },
      call: (args) => args.inputs,
    },
    "egress-lab",
    "egress",
    false,
  )
  .then(async () => {
    const { EgressProxyPool } = require("egress-proxies");
    const pool = new EgressProxyPool("lab", {
      backends: [{ name: "lab", count: 2, kvm: { connection: { host: "lab" }, network: { bridge: "br-lab" } } }],
      egressCheck: { url: "http://echo.lab/" },
      requireDistinctEgress: requireDistinct === "true",
      kubernetes: { namespace: "crawlers", name: "egress" },
    });
    const verdict = await pool.egress.promise().then(
      (groups) => ({ groups }),
      (error) => ({ error: error.message }),
    );
    await new Promise((resolve) => setTimeout(resolve, 500));
    process.stdout.write(JSON.stringify({ ...verdict, declared }));
  });
`;

describe("egress in the lab (two squid VMs, an echo service, one NAT address)", function () {
  this.timeout(900_000);
  let lab: LabEnv;
  let echoAddress: string;
  let natAddress: string;
  let image: ProxyImage;
  let imageServer: RunningServer;
  let ports: { direct: number; nat: number };
  let dir: string;
  let project: ConsumerProject | undefined;
  const created: Array<{ id: string; outs: Record<string, unknown> }> = [];
  const cleanups: Array<() => unknown> = [];

  const labNs = (...args: string[]) =>
    execFileSync("ip", ["netns", "exec", lab.netns, ...args], { encoding: "utf8" });
  const virsh = (...args: string[]) =>
    execFileSync("virsh", ["-q", "-c", lab.uri, ...args], { encoding: "utf8" });
  /** Connections to the echo's NAT port get one source address, like a site behind one NAT. */
  const iptables = (action: "-A" | "-D") =>
    labNs(
      "iptables",
      "-t",
      "nat",
      action,
      "INPUT",
      "-p",
      "tcp",
      "-d",
      echoAddress,
      "--dport",
      String(ports.nat),
      "-j",
      "SNAT",
      "--to-source",
      natAddress,
    );

  before(async () => {
    lab = await useLab();
    echoAddress = labAddress(lab, 247);
    natAddress = labAddress(lab, 246);
    await linkHostToLab(lab);
    image = await ensureProxyImage();
    imageServer = await serveImage(image);
    cleanups.push(() => removeBaseImage());
    dir = mkdtempSync(join(tmpdir(), "egress-lab-"));
    await startEcho();
    await bootProxies();
  });

  after(async function () {
    this.timeout(300_000);
    // Safety net when a test failed before the delete test: a failure here must be seen.
    for (const { id, outs } of created)
      await kvm.remove(id, outs).catch((error: Error) => {
        process.stderr.write(`egress lab: could not remove ${id}: ${error.message}\n`);
      });
    for (const cleanup of cleanups.reverse()) {
      try {
        await cleanup();
      } catch {
        // Best effort: one failed cleanup must not keep the others from running.
      }
    }
    await closeAllHosts();
    project?.remove();
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  });

  /** The echo process inside the lab netns, its address on the netns's loopback, the SNAT rule. */
  async function startEcho(): Promise<void> {
    try {
      labNs("ip", "addr", "add", `${echoAddress}/32`, "dev", "lo");
    } catch (error) {
      if (!/File exists/.test(String((error as { stderr?: string }).stderr))) throw error;
    }
    cleanups.push(() => labNs("ip", "addr", "del", `${echoAddress}/32`, "dev", "lo"));
    const child = spawn(
      "ip",
      [
        "netns",
        "exec",
        lab.netns,
        process.execPath,
        join(__dirname, "egress-echo.js"),
        echoAddress,
      ],
      { stdio: ["ignore", "pipe", "inherit"] },
    );
    // `ip netns exec` execs node in place: this PID is the echo service's own.
    cleanups.push(() => child.kill("SIGTERM"));
    const firstLine = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stdout! }).once("line", resolve);
      child.once("exit", (code) => reject(new Error(`the echo service exited (${code})`)));
    });
    ports = JSON.parse(firstLine) as { direct: number; nat: number };
    iptables("-A");
    cleanups.push(() => iptables("-D"));
  }

  async function bootProxies(): Promise<void> {
    const userData = poolUserData(
      squidCloudConfig({
        port: 3128,
        allowedClientCidrs: [lab.subnet],
        basicAuth: AUTH,
        extraConfigLines: [],
      }),
    );
    // One plain-text answer, one JSON answer: both parsers, on real squid.
    const egressChecks = [
      { url: `http://${echoAddress}:${ports.nat}/`, proxyAuth: AUTH },
      { url: `http://${echoAddress}:${ports.nat}/json`, field: "ip", proxyAuth: AUTH },
    ];
    const inputs = await Promise.all(
      egressChecks.map(async (egressCheck, index) => {
        const { inputs: checked, failures } = await kvm.check(
          {},
          {
            owner: { ...owner, resource: `proxy-${index}` },
            connection: labConnection(lab),
            pool: lab.pool,
            network: { bridge: lab.bridge },
            domainType: "qemu",
            memoryMiB: 512,
            image: { url: imageServer.url, sha256: image.sha256 },
            userData,
            readiness: { mode: "port", port: 3128 },
            egressCheck,
            timeouts: { createSeconds: 720, readySeconds: 660, deleteSeconds: 120 },
          },
        );
        assert.deepEqual(failures, []);
        // Registered before create, so a failed create still gets its VM removed in `after`.
        const id = `hosts/${lab.sshHost}:${lab.sshPort}/domains/${String(checked.vmName)}`;
        created.push({ id, outs: checked });
        return checked;
      }),
    );
    const results = await Promise.all(inputs.map((checked) => kvm.create(checked)));
    results.forEach((result, index) => (created[index] = result));
  }

  async function removeBaseImage(): Promise<void> {
    const inspector = await openLocalLibvirt({ socketPath: lab.libvirtSocket });
    try {
      await removeCachedBaseImage(inspector, lab.pool, imageServer.url, image.sha256);
    } finally {
      await inspector.close();
      await imageServer.close();
    }
  }

  const ipOf = (index: number) => String(created[index]!.outs.ip);
  const vmNameOf = (index: number) => String(created[index]!.outs.vmName);
  const stackOutputs = () =>
    JSON.stringify({
      endpointsWithCredentials: [0, 1].map(
        (index) => `http://${AUTH.user}:${encodeURIComponent(AUTH.password)}@${ipOf(index)}:3128`,
      ),
      proxies: [0, 1].map((index) => ({
        name: `lab-${index}`,
        endpoint: `http://${ipOf(index)}:3128`,
      })),
    });
  const check = (...args: string[]) =>
    runProcess(
      process.execPath,
      [
        BIN,
        "check",
        "--target",
        `http://${echoAddress}:${ports.direct}/`,
        "--connect",
        `${echoAddress}:${ports.direct}`,
        ...args,
      ],
      stackOutputs(),
    );
  const promtool = (file: string) =>
    runProcess("promtool", ["check", "metrics"], readFileSync(file, "utf8"));

  it("create checks egress through squid with basic auth: both proxies report the NAT address", () => {
    for (const [index, { outs }] of created.entries()) {
      assert.match(ipOf(index), dhcpAddressPattern(lab.subnet));
      assert.equal(outs.egressIp, natAddress, `proxy ${index}`);
      assert.ok(!Number.isNaN(Date.parse(String(outs.checkedAt))), String(outs.checkedAt));
    }
    assert.notEqual(ipOf(0), ipOf(1));
  });

  it("check: the echo service sees each proxy's own address; HTTP, CONNECT and egress pass; exit 0", async () => {
    const prom = join(dir, "direct.prom");
    const run = await check(
      "--egress-url",
      `http://${echoAddress}:${ports.direct}/json`,
      "--json",
      "--prometheus",
      prom,
    );
    assert.equal(run.status, 0, run.stdout + run.stderr);
    const report = JSON.parse(run.stdout) as {
      proxies: Array<{ name: string; up: boolean; egressIp: string; connectSeconds?: number }>;
      egress: Array<{ address: string; proxies: string[] }>;
    };
    assert.deepEqual(
      report.proxies.map((proxy) => [proxy.name, proxy.up, proxy.egressIp]),
      [
        ["lab-0", true, ipOf(0)],
        ["lab-1", true, ipOf(1)],
      ],
    );
    assert.ok(report.proxies.every((proxy) => typeof proxy.connectSeconds === "number"));
    assert.equal(report.egress.length, 2, "two proxies, two egress addresses");
    const parsed = await promtool(prom);
    assert.equal(parsed.status, 0, parsed.stdout + parsed.stderr);
    assert.ok(!run.stdout.includes(AUTH.password));
  });

  it("two proxies behind one NAT address: check reports the shared egress", async () => {
    const run = await check("--egress-url", `http://${echoAddress}:${ports.nat}/`);
    assert.equal(run.status, 0, run.stdout + run.stderr);
    const lines = run.stdout.split("\n");
    assert.equal(lines[0], "2 proxies: all up; 1 egress address, 1 shared by several proxies");
    assert.ok(lines.includes(`  ${natAddress}: lab-0, lab-1`), run.stdout);
  });

  it("the pool with these outputs: shared egress reported; requireDistinctEgress fails before publishing", async () => {
    project = packIntoConsumerProject();
    writeFileSync(join(project.dir, "pool-runner.js"), POOL_RUNNER);
    const outsFile = join(dir, "outs.json");
    writeFileSync(outsFile, JSON.stringify(created.map(({ id, outs }) => ({ id, props: outs }))));
    const lenient = await runProcess(
      process.execPath,
      ["pool-runner.js", outsFile, "false"],
      "",
      project.dir,
    );
    const allowed = JSON.parse(lenient.stdout) as { groups: unknown; declared: string[] };
    assert.deepEqual(allowed.groups, [{ address: natAddress, proxies: ["lab-0", "lab-1"] }]);
    assert.match(
      lenient.stderr,
      new RegExp(
        `warning: .*2 proxies leave from 1 distinct egress address; shared: ${escapedAddress(natAddress)} \\(lab-0, lab-1\\)`,
      ),
    );
    assert.ok(allowed.declared.includes("kubernetes:discovery.k8s.io/v1:EndpointSlice"));

    const strict = await runProcess(
      process.execPath,
      ["pool-runner.js", outsFile, "true"],
      "",
      project.dir,
    );
    const refused = JSON.parse(strict.stdout) as { error: string; declared: string[] };
    assert.match(
      refused.error,
      new RegExp(
        `shared: ${escapedAddress(natAddress)} \\(lab-0, lab-1\\).*requireDistinctEgress is true, so nothing is published`,
      ),
    );
    assert.deepEqual(
      refused.declared.filter((type) => type.startsWith("kubernetes:")),
      [],
      "no Kubernetes object declared",
    );
  });

  it("check --serve watches the VMs: a VM paused between scrapes shows down, resumed shows up; SIGTERM exits 0", async () => {
    const exporter = await startExporter(
      [
        "--interval",
        "2",
        "--timeout",
        "5",
        "--target",
        `http://${echoAddress}:${ports.direct}/`,
        "--egress-url",
        `http://${echoAddress}:${ports.direct}/json`,
      ],
      stackOutputs(),
    );
    try {
      const first = await exporter.scrapeAfter(0, 60_000);
      assert.equal(proxyUp(first, "lab-0"), 1, first);
      assert.equal(proxyUp(first, "lab-1"), 1, first);
      assert.match(first, new RegExp(`egress_ip="${escapedAddress(ipOf(0))}"`));
      virsh("suspend", vmNameOf(0));
      let paused: string;
      try {
        paused = await exporter.scrapeAfter(
          sample(first, "egress_proxies_exporter_checks_total")! + 1,
          60_000,
        );
      } finally {
        virsh("resume", vmNameOf(0));
      }
      assert.equal(proxyUp(paused, "lab-0"), 0, paused);
      assert.equal(proxyUp(paused, "lab-1"), 1, paused);
      const resumed = await exporter.scrapeAfter(
        sample(paused, "egress_proxies_exporter_checks_total")! + 1,
        60_000,
      );
      assert.equal(proxyUp(resumed, "lab-0"), 1, resumed);
      assert.ok(!(first + paused + resumed + exporter.stderr()).includes(AUTH.password));
    } finally {
      const status = await exporter.terminate();
      assert.equal(status, 0, `exit after SIGTERM: ${String(status)}\n${exporter.stderr()}`);
    }
  });

  it("check finds a paused VM and a stopped squid: exit 1, each proxy's state right, promtool reads the file", async () => {
    virsh("suspend", vmNameOf(0));
    try {
      const prom = join(dir, "paused.prom");
      const run = await check("--timeout", "5", "--prometheus", prom);
      assert.equal(run.status, 1, run.stdout + run.stderr);
      assert.match(run.stdout, /^2 proxies: 1 up, 1 down$/m);
      assert.match(run.stdout, /^lab-0 .* DOWN .*http: no answer within 5 s/m);
      assert.match(run.stdout, /^lab-1 .* up /m);
      const parsed = await promtool(prom);
      assert.equal(parsed.status, 0, parsed.stdout + parsed.stderr);
      assert.match(
        readFileSync(prom, "utf8"),
        /^egress_proxy_up\{proxy="lab-0",endpoint="[\d.]+:3128",family="ipv4"\} 0$/m,
      );
    } finally {
      virsh("resume", vmNameOf(0));
    }

    // squid stopped inside the guest (through the guest agent): the port refuses.
    virsh(
      "qemu-agent-command",
      vmNameOf(1),
      JSON.stringify({
        execute: "guest-exec",
        arguments: { path: "/usr/bin/systemctl", arg: ["stop", "squid"] },
      }),
    );
    const stopped = Date.now() + 60_000;
    while (
      await tryTcpConnect(ipOf(1), 3128, 2000).then(
        () => true,
        () => false,
      )
    ) {
      assert.ok(Date.now() < stopped, "squid did not stop within 60 s");
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
    const run = await check("--timeout", "10", "--json");
    assert.equal(run.status, 1, run.stdout + run.stderr);
    const report = JSON.parse(run.stdout) as {
      summary: { up: number; down: number };
      proxies: Array<{ name: string; up: boolean; error?: string }>;
    };
    assert.deepEqual(report.summary, { total: 2, up: 1, down: 1, egressAddresses: 0 });
    assert.equal(report.proxies[0]!.up, true, "the resumed VM answers again");
    assert.match(String(report.proxies[1]!.error), /^http: .*ECONNREFUSED/);
  });

  it("refresh re-checks egress: confirmed quietly, a new NAT address accepted; with this machine's path to both cut, the listening one not restarted and the dead one planned for a restart", async () => {
    // The program with the pool's default: every refresh re-checks each running proxy.
    const refresh = (index: number, olds = created[index]!.outs) =>
      refreshWithRecheck(created[index]!.id, olds);

    // Proxy 0 answers as at create: only the time of the last check moves, no plan.
    const quiet = await refresh(0);
    assert.equal(quiet.props.egressIp, natAddress);
    assert.ok(String(quiet.props.checkedAt) > String(created[0]!.outs.checkedAt));
    assert.equal(quiet.props.egressProblem, null);
    assert.equal(quiet.changes, false);

    // The site's NAT now hands out another address: refresh shows it, the plan accepts it.
    const movedNat = labAddress(lab, 245);
    const snat = (action: "-A" | "-D", to: string) =>
      labNs(
        "iptables",
        "-t",
        "nat",
        action,
        "INPUT",
        "-p",
        "tcp",
        "-d",
        echoAddress,
        "--dport",
        String(ports.nat),
        "-j",
        "SNAT",
        "--to-source",
        to,
      );
    iptables("-D");
    snat("-A", movedNat);
    try {
      const moved = await refresh(0);
      assert.equal(moved.props.egressIp, movedNat);
      assert.notEqual(moved.props.checkedAt, created[0]!.outs.checkedAt);
      assert.equal(moved.changes, false, "a new exit address is accepted, nothing replaced");
    } finally {
      snat("-D", movedNat);
      iptables("-A");
    }

    // This machine loses its path to both proxies (routes that refuse, as a broken route or firewall
    // would). Proxy 0's squid still listens: its guest agent's socket tables say so, and nothing is
    // restarted. Proxy 1's squid was stopped by the test before: its agent finds nothing listening,
    // so it is the one, and the only one, that `up` restarts (the same VM).
    const cutRoutes = (action: "add" | "del") => {
      for (const index of [0, 1])
        execFileSync("ip", ["route", action, "prohibit", `${ipOf(index)}/32`], {
          stdio: "inherit",
        });
    };
    // Should this process die before the finally: the lab's teardown (lab-down.sh --purge) takes them back.
    for (const index of [0, 1])
      appendFileSync(
        `${lab.labDir}.undo`,
        `if [ -n "$(ip route show type prohibit ${ipOf(index)}/32)" ]; then ip route del prohibit ${ipOf(index)}/32; fi\n`,
      );
    cutRoutes("add");
    let silent: Awaited<ReturnType<typeof refresh>>;
    try {
      const [cut, dead] = await Promise.all([refresh(0), refresh(1)]);
      const problem = cut.props.egressProblem as { kind: string; reason: string };
      assert.equal(problem.kind, "path-unknown", problem.reason);
      assert.match(problem.reason, /the guest agent reports port 3128 listening$/);
      assert.equal(cut.changes, false, "a restart cannot mend a path");
      silent = dead;
    } finally {
      cutRoutes("del");
    }
    const silentProblem = silent.props.egressProblem as { kind: string; reason: string };
    assert.equal(silentProblem.kind, "unanswered");
    assert.match(
      silentProblem.reason,
      /3128.*the guest agent reports nothing listening on port 3128$/,
    );
    assert.equal(silent.props.state, "running");
    assert.equal(silent.changes, true);
    assert.deepEqual(silent.replaces, [], "a restart in place, not a replacement");
    // What `up` does with that plan (a graceful restart of the same VM) is engine/kvm-egress-rotate's
    // last step, on a member of a pool; a guest boot less here.
    assert.equal(
      silent.props.libvirtUuid,
      created[1]!.outs.libvirtUuid,
      "the same VM, not replaced",
    );
  });

  it("deletes both proxies from their outputs (egressIp and checkedAt included), and read finds nothing", async () => {
    for (const { id, outs } of created) {
      await kvm.remove(id, outs);
      assert.deepEqual(await kvm.read(id, outs), {}, `${id} is gone`);
    }
    const left = virsh("list", "--all", "--name");
    for (const index of [0, 1]) assert.ok(!left.includes(vmNameOf(index)), left);
  });
});
