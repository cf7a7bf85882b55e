/**
 * The pool's gateway on the real engine: the configuration the pool
 * generates (workloads/gateway/), run by the pod's own entrypoint on Debian's
 * squid, in front of four members that are squids with the pool's own member
 * configuration, in a network namespace this test makes and removes
 * (test/support/gateway-netns.ts). Each member leaves from its own address,
 * and an echo service says which one a request came from.
 *
 * What a crawler team relies on, measured: per-request rotation (1000
 * requests, every member within 1.2x of its share), sessions (200 x 20
 * requests, one exit address each), a member removed (only its sessions
 * move), a member killed in traffic (at most 1 % fail, avoided within 5 s,
 * back when it answers), a wrong password (407, no member sees it), pins to
 * a backend or a declared label (100 %), IPv6 clients, and a configuration
 * squid refuses (the running one stays; no secret in the log).
 * test-needs: root (ip netns)
 */
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gatewayPodFiles } from "../../workloads/gateway/pod";
import { gatewayUserName } from "../../workloads/gateway/user-names";
import {
  alternatingModes,
  calls,
  exitOf,
  failuresOf,
  GATEWAY_USER,
  GatewayNetns,
  MEMBER_LOGIN,
  memberName,
} from "../support/gateway-netns";
import type { ProbeCall, ProbeOutcome } from "../support/gateway-probe";

const MEMBERS = [1, 2, 3, 4];
/** m1, m2 on backend kvm-a; m3, m4 on kvm-b, which declares the label country-de. */
const labelsOf = (index: number): string[] => (index <= 2 ? ["kvm-a"] : ["kvm-b", "country-de"]);
const membersOf = (indices: number[]) =>
  indices.map((index) => GatewayNetns.member(index, labelsOf(index)));

function countBy(outcomes: readonly ProbeOutcome[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const outcome of outcomes) counts.set(outcome.exit, (counts.get(outcome.exit) ?? 0) + 1);
  return counts;
}

/** 200 sessions of `perSession` requests each, interleaved, both modes. */
function sessionCalls(perSession: number): ProbeCall[] {
  const list: ProbeCall[] = [];
  for (let round = 0; round < perSession; round++)
    for (let session = 0; session < 200; session++)
      list.push({
        user: gatewayUserName(GATEWAY_USER.name, { session: `s${session}` }),
        password: GATEWAY_USER.password,
        mode: (session + round) % 2 === 0 ? "http" : "connect",
      });
  return list;
}

/** Each session's one exit address; fails when a session left through two. */
function exitPerSession(lab: GatewayNetns, outcomes: readonly ProbeOutcome[]): Map<string, string> {
  const exits = new Map<string, Set<string>>();
  for (const outcome of outcomes) {
    if (!exits.has(outcome.user)) exits.set(outcome.user, new Set());
    exits.get(outcome.user)!.add(outcome.exit);
  }
  const split = [...exits].filter(([, seen]) => seen.size !== 1);
  assert.deepEqual(
    split,
    [],
    `every request of a session leaves through one exit address; the gateway routed them:\n${split
      .flatMap(([user]) => lab.gatewayAccessLines(user))
      .join("\n")}`,
  );
  return new Map([...exits].map(([user, seen]) => [user, [...seen][0]!]));
}

describe("gateway on real squid, in front of four members (network namespace)", function () {
  this.timeout(240_000);
  let lab: GatewayNetns;

  before(async () => {
    lab = new GatewayNetns();
    for (const index of MEMBERS) lab.startMember(index);
    lab.writeGateway(membersOf(MEMBERS));
    await lab.waitForListeners([
      ...MEMBERS.map((index) => `127.0.1.${index}:3128`),
      "127.0.3.1:8080",
      "*:3130",
    ]);
  });
  after(() => lab?.close());

  it("rotates per request: 1000 requests (HTTP and CONNECT), every member within 1.2x of its share", async () => {
    const outcomes = await lab.probe(alternatingModes(calls(1000, GATEWAY_USER.name)));
    assert.deepEqual(failuresOf(outcomes), []);
    const counts = countBy(outcomes);
    console.log(`      per member: ${JSON.stringify(Object.fromEntries(counts))}`);
    assert.deepEqual([...counts.keys()].sort(), MEMBERS.map(exitOf));
    for (const [exit, count] of counts)
      assert.ok(count <= 1.2 * (1000 / MEMBERS.length), `${exit} served ${count} of 1000`);
  });

  let sessionsBefore: Map<string, string>;
  it("keeps a session on one exit address: 200 sessions x 20 requests, 100 %", async () => {
    const outcomes = await lab.probe(sessionCalls(20), { concurrency: 16 });
    assert.deepEqual(failuresOf(outcomes), []);
    sessionsBefore = exitPerSession(lab, outcomes);
    assert.equal(sessionsBefore.size, 200);
    const spread = countBy([...sessionsBefore.values()].map((exit) => ({ exit }) as ProbeOutcome));
    console.log(`      sessions per member: ${JSON.stringify(Object.fromEntries(spread))}`);
    assert.equal(spread.size, MEMBERS.length, "sessions are spread over every member");
  });

  it("moves only the removed member's sessions, reloading in place (same squid process)", async () => {
    const pid = lab.gatewayPid();
    lab.writeGateway(membersOf([1, 2, 3]));
    await lab.waitForReloads(1);
    const after = exitPerSession(lab, await lab.probe(sessionCalls(2), { concurrency: 16 }));
    const moved = [...after].filter(([user, exit]) => sessionsBefore.get(user) !== exit);
    const onRemoved = [...sessionsBefore].filter(([, exit]) => exit === exitOf(4));
    console.log(
      `      moved ${moved.length} of 200 sessions (${(moved.length / 2).toFixed(1)} %); ${onRemoved.length} were on the removed member`,
    );
    assert.deepEqual(
      moved.map(([user]) => user).sort(),
      onRemoved.map(([user]) => user).sort(),
      "exactly the removed member's sessions move",
    );
    assert.ok(
      ![...after.values()].includes(exitOf(4)),
      "nothing leaves through the removed member",
    );
    assert.equal(lab.gatewayPid(), pid, "squid reloaded, not restarted");
    // Back in: the same sessions return to it (highest random weight, not a reshuffle).
    lab.writeGateway(membersOf(MEMBERS));
    await lab.waitForReloads(2);
    assert.deepEqual(
      exitPerSession(lab, await lab.probe(sessionCalls(1), { concurrency: 16 })),
      sessionsBefore,
    );
  });

  it("routes around a member killed during 1000 requests: at most 1 % fail, avoided within 5 s, back when it answers", async () => {
    // Plain and session requests alternate, both modes: both of a member's peer sets meet the kill.
    const interleaved: ProbeCall[] = Array.from({ length: 1000 }, (_, index) => ({
      user:
        index % 2 === 0
          ? GATEWAY_USER.name
          : gatewayUserName(GATEWAY_USER.name, { session: `k${index % 100}` }),
      password: GATEWAY_USER.password,
      mode: index % 4 < 2 ? "http" : "connect",
    }));
    const running = lab.probe(interleaved, { concurrency: 8, spreadMs: 8000 });
    await new Promise((wake) => setTimeout(wake, 2000));
    const killedAt = Date.now();
    lab.killMember(2);
    const outcomes = await running;
    const failed = failuresOf(outcomes);
    console.log(`      ${failed.length} of 1000 failed; ${JSON.stringify(failed.slice(0, 3))}`);
    assert.ok(failed.length <= 10, `${failed.length} of 1000 requests failed`);
    assert.ok(!outcomes.some((o) => o.startedAt > killedAt + 200 && o.exit === exitOf(2)));
    // squid's own account: the connects it tried to the dead member, all within 5 s of the kill.
    const attempts = lab
      .gatewayCacheLog()
      .split("\n")
      .filter((line) => line.includes("TCP connection to 127.0.1.2/3128 failed"))
      .map((line) => Date.parse(line.slice(0, 19).replace(/\//g, "-").replace(" ", "T") + "Z"));
    assert.ok(attempts.length > 0, "the gateway noticed the dead member");
    const lastAttempt = Math.max(...attempts);
    // The log has whole seconds: one more second of slack for that.
    assert.ok(
      lastAttempt <= killedAt + 6000,
      `last connect to the dead member ${lastAttempt - killedAt} ms after the kill`,
    );
    assert.match(lab.gatewayCacheLog(), new RegExp(`Detected DEAD Parent: ${memberName(2)}\\b`));
    // Back: the same member answers again and is routed to within seconds.
    lab.startMember(2);
    await lab.waitForListeners(["127.0.1.2:3128"]);
    const deadline = Date.now() + 60_000;
    let back = false;
    while (!back && Date.now() < deadline) {
      const again = await lab.probe(calls(40, GATEWAY_USER.name));
      assert.deepEqual(failuresOf(again), []);
      back = again.some((o) => o.exit === exitOf(2));
    }
    assert.ok(back, "the member serves again once it answers");
  });

  it("answers a wrong password with 407, and no member sees the request", async () => {
    const before = await lab.settledMemberRequests(MEMBERS);
    const wrong: ProbeCall[] = [
      { user: GATEWAY_USER.name, password: "not-the-password", mode: "http" },
      { user: GATEWAY_USER.name, password: "not-the-password", mode: "connect" },
      {
        user: gatewayUserName(GATEWAY_USER.name, { session: "x" }),
        password: "nope-nope-nope",
        mode: "http",
      },
      { user: "somebody-else", password: GATEWAY_USER.password, mode: "connect" },
      // The member's own credentials are not the gateway's.
      { user: MEMBER_LOGIN.user, password: MEMBER_LOGIN.password, mode: "http" },
    ];
    const outcomes = await lab.probe(wrong);
    assert.deepEqual(
      outcomes.map((o) => o.status),
      [407, 407, 407, 407, 407],
    );
    assert.deepEqual(await lab.settledMemberRequests(MEMBERS), before);
  });

  it("honours pins: -host-<backend> and a declared label, alone and with a session, 100 %", async () => {
    const pinned = await lab.probe(
      alternatingModes(calls(200, gatewayUserName(GATEWAY_USER.name, { host: "kvm-b" }))),
    );
    assert.deepEqual(failuresOf(pinned), []);
    assert.deepEqual(
      [...countBy(pinned).keys()].sort(),
      [exitOf(3), exitOf(4)],
      "both kvm-b members, only they",
    );
    const labelled = await lab.probe(
      alternatingModes(calls(100, gatewayUserName(GATEWAY_USER.name, { host: "kvm-a" }))),
    );
    assert.deepEqual([...countBy(labelled).keys()].sort(), [exitOf(1), exitOf(2)]);
    const both = await lab.probe(
      alternatingModes(
        calls(100, gatewayUserName(GATEWAY_USER.name, { host: "country-de", session: "p1" })),
      ),
    );
    const exits = [...countBy(both).keys()];
    assert.equal(exits.length, 1, "a pinned session keeps one exit");
    assert.ok([exitOf(3), exitOf(4)].includes(exits[0]!));
    const before = await lab.settledMemberRequests(MEMBERS);
    const nowhere = await lab.probe(
      calls(2, gatewayUserName(GATEWAY_USER.name, { host: "kvm-z" })),
    );
    // squid answers that it cannot forward (5.7: 502), and forwards nowhere.
    assert.ok(
      nowhere.every((o) => o.status === 502 || o.status === 503),
      `a label no member has: ${nowhere.map((o) => o.status)}`,
    );
    assert.deepEqual(await lab.settledMemberRequests(MEMBERS), before);
  });

  it("takes IPv6 clients on the same port", async () => {
    const outcomes = await lab.probe(alternatingModes(calls(40, GATEWAY_USER.name)), {
      proxy: { host: "::1", port: 3130 },
    });
    assert.deepEqual(failuresOf(outcomes), []);
    assert.equal(countBy(outcomes).size, MEMBERS.length);
  });

  it("keeps the running configuration when squid refuses a new one, and logs no secret", async () => {
    const pid = lab.gatewayPid();
    const configPath = join(lab.dir, "gateway", "squid.conf");
    lab.writeGateway(membersOf(MEMBERS));
    writeFileSync(
      configPath,
      `cache_peer 127.0.1.9 parent notaport 0 login=${MEMBER_LOGIN.user}:secret%20value\n`,
      { flag: "a" },
    );
    const deadline = Date.now() + 60_000;
    while (!/does not parse/.test(lab.gatewayLog) && Date.now() < deadline)
      await new Promise((wake) => setTimeout(wake, 200));
    assert.match(lab.gatewayLog, /does not parse; squid keeps the one it runs/);
    assert.doesNotMatch(lab.gatewayLog, /secret%20value|m3mber/);
    const outcomes = await lab.probe(calls(20, GATEWAY_USER.name));
    assert.deepEqual(failuresOf(outcomes), []);
    assert.equal(lab.gatewayPid(), pid);
  });
});

describe("the pod's gateway configuration, parsed by the real engine", () => {
  it("squid -k parse accepts it (members over IPv4 and IPv6, labels, several users)", () => {
    const dir = mkdtempSync(join(tmpdir(), "gateway-parse-"));
    try {
      const files = gatewayPodFiles({
        port: 3128,
        allowedClientCidrs: ["10.0.0.0/8", "fc00::/7"],
        users: [GATEWAY_USER, { name: "team-b", password: "another-password-2" }],
        members: [
          {
            name: "kvm1-0",
            address: "10.1.0.5",
            port: 3128,
            labels: ["kvm1", "country-de"],
            login: MEMBER_LOGIN,
          },
          { name: "pve-0", address: "fd00:1::5", port: 3128, labels: ["pve"], login: MEMBER_LOGIN },
        ],
      });
      const config = join(dir, "squid.conf");
      // The pod's paths are absolute; the parse reads only squid.conf itself.
      writeFileSync(config, files.config.content.replace(/^access_log .*$/m, "access_log none"));
      const parsed = spawnSync("squid", ["-k", "parse", "-f", config], { encoding: "utf8" });
      // The one warning expected: `via off`, which hides the gateway from the sites (as on members).
      const fatal = parsed.stderr
        .split("\n")
        .filter(
          (line) => /FATAL|ERROR|WARNING/.test(line) && !/HTTP requires the use of Via/.test(line),
        );
      assert.equal(parsed.status, 0, fatal.join("\n"));
      assert.deepEqual(fatal, []);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("the auth helper checks a name with suffixes as its user (real basic_ncsa_auth)", () => {
    const dir = mkdtempSync(join(tmpdir(), "gateway-helper-"));
    try {
      const files = gatewayPodFiles({
        port: 3128,
        allowedClientCidrs: ["10.0.0.0/8"],
        users: [GATEWAY_USER],
        members: [],
      });
      writeFileSync(join(dir, "users"), files.users.content);
      const script = files.authHelper.content.replace(/\/etc\/egress-gateway/g, dir);
      const input = [
        `${GATEWAY_USER.name} ${GATEWAY_USER.password}`,
        `${GATEWAY_USER.name}-session-a1-host-kvm-b ${GATEWAY_USER.password}`,
        `${GATEWAY_USER.name}-host-country-de ${GATEWAY_USER.password}`,
        `${GATEWAY_USER.name}-session-a1 wrong-password`,
        `other-session-1 ${GATEWAY_USER.password}`,
      ].join("\n");
      const answers = execFileSync("sh", ["-c", script], { input: input + "\n", encoding: "utf8" });
      assert.deepEqual(
        answers
          .trim()
          .split("\n")
          .map((line) => line.split(" ")[0]),
        ["OK", "OK", "OK", "ERR", "ERR"],
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
