/**
 * The gateway's metrics on the real engine: the pool's gateway configuration
 * with `metricsUdp` on Debian's squid, in front of three member squids, in a
 * network namespace this test makes and removes (test/support/gateway-netns.ts),
 * and the built `egress-proxies gateway-metrics` started inside it as the
 * pod's sidecar runs it. Crawler traffic goes through the gateway (plain
 * requests, sessions, wrong passwords); /metrics is then fetched inside the
 * namespace and must add up: each member's routed count is what that member's
 * own squid logged, refusals are the wrong passwords, users are base users
 * (no session id anywhere), promtool reads the text, and SIGTERM ends the
 * command with status 0.
 * test-needs: root (ip netns)
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { GATEWAY_POD_METRICS_UDP, gatewayPodFiles } from "../../workloads/gateway/pod";
import { gatewayUserName } from "../../workloads/gateway/user-names";
import {
  calls,
  GATEWAY_USER,
  GatewayNetns,
  MEMBER_LOGIN,
  memberName,
} from "../support/gateway-netns";
import type { ProbeCall } from "../support/gateway-probe";
import { assertPromtoolInstalled, promtool } from "../support/promtool";

const CLI = join(__dirname, "..", "..", "cli", "main.js");
const MEMBERS = [1, 2, 3];
const METRICS_UDP = "127.0.0.1:5140";
const METRICS_URL = "http://127.0.0.1:9102";
const PLAIN = 90;
const SESSIONS = 20;
const PER_SESSION = 3;
const WRONG = 7;

/** Every sample of a family: its labels (as written) and value. */
function samples(
  text: string,
  name: string,
): Array<{ labels: Record<string, string>; value: number }> {
  return text
    .split("\n")
    .filter((line) => line.startsWith(`${name}{`))
    .map((line) => {
      const close = line.lastIndexOf("}");
      const labels = Object.fromEntries(
        [...line.slice(name.length + 1, close).matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map(
          (match) => [match[1]!, match[2]!],
        ),
      );
      return { labels, value: Number(line.slice(close + 2)) };
    });
}

const total = (list: Array<{ value: number }>): number =>
  list.reduce((sum, sample) => sum + sample.value, 0);

describe("gateway metrics from squid's own log lines (network namespace)", function () {
  this.timeout(120_000);
  let lab: GatewayNetns | undefined;
  let metrics: ReturnType<GatewayNetns["startIn"]> | undefined;

  const scrape = (path = "/metrics"): string =>
    lab!.runIn("curl", ["-s", "--max-time", "5", "--fail", `${METRICS_URL}${path}`]);

  before(async () => {
    await assertPromtoolInstalled();
    lab = new GatewayNetns();
    for (const index of MEMBERS) lab.startMember(index);
    metrics = lab.startIn(process.execPath, [
      CLI,
      "gateway-metrics",
      "--udp",
      METRICS_UDP,
      "--listen",
      "127.0.0.1:9102",
    ]);
    lab.writeGateway(
      MEMBERS.map((index) => GatewayNetns.member(index, ["kvm-a"])),
      { metricsUdp: METRICS_UDP },
    );
    await lab.waitForListeners([
      ...MEMBERS.map((index) => `127.0.1.${index}:3128`),
      "127.0.3.1:8080",
      "*:3130",
      "127.0.0.1:9102",
    ]);
  });

  after(() => {
    if (metrics !== undefined && metrics.process.exitCode === null) metrics.process.kill("SIGKILL");
    lab?.close();
  });

  it("counts per member and per base user what squid routed and refused; promtool reads it", async () => {
    const plain = calls(PLAIN, GATEWAY_USER.name).map((call, index): ProbeCall => ({
      ...call,
      mode: index % 2 === 0 ? "http" : "connect",
    }));
    const sessions: ProbeCall[] = Array.from({ length: SESSIONS * PER_SESSION }, (_, index) => ({
      user: gatewayUserName(GATEWAY_USER.name, { session: `s${index % SESSIONS}` }),
      password: GATEWAY_USER.password,
      mode: index % 2 === 0 ? "connect" : "http",
    }));
    const wrong: ProbeCall[] = Array.from({ length: WRONG }, (_, index) => ({
      user:
        index % 2 === 0
          ? GATEWAY_USER.name
          : gatewayUserName(GATEWAY_USER.name, { session: `w${index}` }),
      password: "not-the-password",
      mode: index % 3 === 0 ? "connect" : "http",
    }));
    const outcomes = await lab!.probe([...plain, ...sessions, ...wrong]);
    assert.deepEqual(
      outcomes.map((outcome) => outcome.status),
      [...plain, ...sessions].map(() => 200).concat(wrong.map(() => 407)),
    );
    const routed = PLAIN + SESSIONS * PER_SESSION;

    // squid's UDP log module sends when its 1400-byte buffer fills, and when it reopens its logs:
    // a reload (what a member change does) sends the last lines, as it would in a pod.
    process.kill(lab!.gatewayPid(), "SIGHUP");
    let text = "";
    const deadline = Date.now() + 15_000;
    while (Date.now() < deadline) {
      text = scrape();
      if (total(samples(text, "egress_gateway_requests_total")) >= routed + WRONG) break;
      await new Promise((wake) => setTimeout(wake, 200));
    }

    const lint = await promtool(text);
    assert.equal(lint.status, 0, `${lint.output}\n${text}`);
    const requests = samples(text, "egress_gateway_requests_total");
    assert.equal(total(requests), routed + WRONG, text);

    // Per member: routed through it, exactly what its own squid logged.
    const ownCounts = await lab!.settledMemberRequests(MEMBERS);
    const perMember = MEMBERS.map((index) =>
      total(
        requests.filter(
          ({ labels }) => labels.member === memberName(index) && labels.result === "routed",
        ),
      ),
    );
    console.log(
      `      routed per member: ${JSON.stringify(perMember)}, own logs ${JSON.stringify(ownCounts)}`,
    );
    assert.equal(total(perMember.map((value) => ({ value }))), routed);
    assert.deepEqual(perMember, ownCounts);
    assert.ok(
      perMember.every((count) => count > 0),
      "every member served",
    );

    // Refused: the wrong passwords, before any member, under the base user.
    assert.deepEqual(samples(text, "egress_gateway_refused_total"), [
      { labels: { user: GATEWAY_USER.name }, value: WRONG },
    ]);
    assert.equal(
      total(requests.filter(({ labels }) => labels.result === "refused" && labels.member === "")),
      WRONG,
    );
    assert.equal(total(requests.filter(({ labels }) => labels.result === "failed")), 0);

    // Base users only: no label carries a session id.
    const users = new Set(
      [
        "egress_gateway_requests_total",
        "egress_gateway_response_bytes_total",
        "egress_gateway_refused_total",
      ]
        .flatMap((name) => samples(text, name))
        .map(({ labels }) => labels.user),
    );
    assert.deepEqual([...users], [GATEWAY_USER.name]);
    const sampleLines = text.split("\n").filter((line) => !line.startsWith("#"));
    assert.deepEqual(
      sampleLines.filter((line) => /session-|"s\d+"|"w\d+"/.test(line)),
      [],
    );

    // Sessions: the routed ones and the refused ones that named a session.
    const sessionSamples = samples(text, "egress_gateway_session_requests_total");
    assert.equal(
      total(sessionSamples.filter(({ labels }) => labels.member !== "")),
      SESSIONS * PER_SESSION,
    );
    assert.equal(
      total(sessionSamples.filter(({ labels }) => labels.member === "")),
      Math.floor(WRONG / 2),
    );

    const bytes = samples(text, "egress_gateway_response_bytes_total");
    for (const index of MEMBERS) {
      const served = bytes.find(({ labels }) => labels.member === memberName(index));
      assert.ok(served !== undefined && served.value > 0, `bytes through ${memberName(index)}`);
    }
    assert.match(text, /^egress_gateway_log_lines_unreadable_total 0$/m);
  });

  it("answers /healthz, and SIGTERM ends it with status 0", async () => {
    assert.equal(scrape("/healthz"), "ok\n");
    const running = metrics!;
    const exited = new Promise<number | null>((resolve) =>
      running.process.exitCode !== null
        ? resolve(running.process.exitCode)
        : running.process.once("exit", (code) => resolve(code)),
    );
    running.process.kill("SIGTERM");
    const status = await Promise.race([
      exited,
      new Promise<string>((resolve) => setTimeout(() => resolve("hung"), 5000)),
    ]);
    assert.equal(status, 0, running.output());
    assert.match(running.output(), /gateway-metrics: stopped/);
  });
});

describe("the pod's gateway configuration with metricsUdp, parsed by the real engine", () => {
  it("squid -k parse accepts both access_log lines: the container's stdout and the sidecar's UDP", () => {
    const dir = mkdtempSync(join(tmpdir(), "gateway-metrics-parse-"));
    try {
      const settings = {
        port: 3128,
        allowedClientCidrs: ["10.0.0.0/8"],
        users: [GATEWAY_USER],
        members: [
          {
            name: "kvm1-0",
            address: "10.1.0.5",
            port: 3128,
            labels: ["kvm1"],
            login: MEMBER_LOGIN,
          },
        ],
      };
      const files = gatewayPodFiles(settings, { metricsUdp: GATEWAY_POD_METRICS_UDP });
      const lines = files.config.content
        .split("\n")
        .filter((line) => line.startsWith("access_log"));
      assert.deepEqual(lines, [
        "access_log stdio:/dev/stdout egress_gateway",
        "access_log udp://127.0.0.1:5140 egress_gateway",
      ]);
      // Without the option the file is the one it was: the sidecar's line is all that is added.
      assert.equal(
        files.config.content.replace("access_log udp://127.0.0.1:5140 egress_gateway\n", ""),
        gatewayPodFiles(settings).config.content,
      );
      const config = join(dir, "squid.conf");
      writeFileSync(
        config,
        files.config.content.replace(/^access_log stdio:.*$/m, "access_log none"),
      );
      const parsed = spawnSync("squid", ["-k", "parse", "-f", config], { encoding: "utf8" });
      const complaints = parsed.stderr
        .split("\n")
        .filter(
          (line) => /FATAL|ERROR|WARNING/.test(line) && !/HTTP requires the use of Via/.test(line),
        );
      assert.equal(parsed.status, 0, complaints.join("\n"));
      assert.deepEqual(complaints, []);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
