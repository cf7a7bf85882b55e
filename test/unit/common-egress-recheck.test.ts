import assert from "node:assert/strict";
import { Deadline } from "../../provider/common/deadline";
import {
  EgressHealFailedError,
  needsEgressRestart,
  recheckEgress,
  rotationDue,
  withEgressHeal,
} from "../../provider/common/egress-recheck";
import { recheckOnRead } from "../../provider/common/recheck-on-read";
import { publishedReadiness } from "../../components/published-checks";
import { membersToRotate, rotateChange, groupByEgress } from "../../components/egress-diversity";
import {
  startEchoServer,
  startForwardProxy,
  type ForwardProxy,
  type RunningServer,
} from "../support/forward-proxy";

const AUTH = { user: "crawler", password: "recheck secret" };

describe("egress re-check on refresh (common/egress-recheck.ts)", function () {
  this.timeout(120_000);
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

  const check = () => ({ url: `http://127.0.0.1:${echo.port}/`, proxyAuth: AUTH });
  const target = () => ({ host: "127.0.0.2", port: proxy.port });
  const within = () => Deadline.afterSeconds(20, "test");

  it("a confirmed address: only checkedAt moves, to the time of this check", async () => {
    const previous = { egressIp: "127.0.0.3", checkedAt: "2026-12-01T00:00:00.000Z" };
    const before = Date.now();
    const { checkedAt, ...finding } = await recheckEgress(target(), check(), previous, within());
    assert.deepEqual(finding, { egressIp: "127.0.0.3", egressProblem: null });
    assert.ok(Date.parse(String(checkedAt)) >= before - 1000, String(checkedAt));
  });

  it("a new exit address is accepted with a new checkedAt", async () => {
    const previous = { egressIp: "198.51.100.7", checkedAt: "2026-12-01T00:00:00.000Z" };
    const finding = await recheckEgress(target(), check(), previous, within());
    assert.equal(finding.egressIp, "127.0.0.3");
    assert.notEqual(finding.checkedAt, previous.checkedAt);
    assert.equal(finding.egressProblem, null);
  });

  it("without an egress URL the port is what is re-checked", async () => {
    const finding = await recheckEgress(target(), undefined, {}, within());
    assert.equal(finding.egressProblem, null);
    assert.equal(finding.egressIp, null);
  });

  it("a proxy that does not answer is a problem after its tries; the first time found is kept", async () => {
    const closed = await startForwardProxy({ host: "127.0.0.2" });
    const port = closed.port;
    await closed.close();
    const previous = { egressIp: "127.0.0.3", checkedAt: "2026-12-01T00:00:00.000Z" };
    const started = Date.now();
    const first = await recheckEgress({ host: "127.0.0.2", port }, check(), previous, within());
    assert.ok(Date.now() - started >= 4000, "three tries, two pauses");
    assert.equal(first.egressIp, "127.0.0.3", "the last known address stays");
    assert.equal(first.checkedAt, previous.checkedAt);
    assert.match(first.egressProblem!.reason, /127\.0\.0\.2/);
    assert.equal(first.egressProblem!.kind, "unanswered");
    const again = await recheckEgress(
      { host: "127.0.0.2", port },
      check(),
      {
        ...previous,
        egressProblem: { ...first.egressProblem!, restartedAt: "2026-12-02T00:00:00Z" },
      },
      within(),
    );
    assert.equal(again.egressProblem!.since, first.egressProblem!.since);
    assert.equal(again.egressProblem!.restartedAt, "2026-12-02T00:00:00Z");
  });

  it("an answer without an address (the echo service down behind squid) is an egress problem, not silence", async () => {
    const gone = await startEchoServer("127.0.0.1");
    const url = `http://127.0.0.1:${gone.port}/`;
    await gone.close();
    const finding = await recheckEgress(
      target(),
      { url, proxyAuth: AUTH },
      { egressIp: "127.0.0.3", checkedAt: "2026-12-01T00:00:00.000Z" },
      within(),
    );
    assert.equal(finding.egressProblem!.kind, "egress");
    assert.match(finding.egressProblem!.reason, /HTTP 502/);
    assert.equal(finding.egressIp, "127.0.0.3");
  });

  it("refused credentials are a problem at once (asking again cannot help)", async () => {
    const started = Date.now();
    const finding = await recheckEgress(
      target(),
      { url: check().url, proxyAuth: { user: "crawler", password: "wrong" } },
      {},
      within(),
    );
    assert.ok(Date.now() - started < 2000);
    assert.match(finding.egressProblem!.reason, /asked for credentials/);
    assert.equal(finding.egressProblem!.kind, "egress", "the proxy answered");
    assert.doesNotMatch(finding.egressProblem!.reason, /wrong/);
  });

  it("no answer here is put to the guest: listening there is path-unknown (its own time, no restart mark), nothing there confirms it, no agent leaves it", async () => {
    const closed = await startForwardProxy({ host: "127.0.0.2" });
    const port = closed.port;
    await closed.close();
    const inputs = { egressRecheck: true, readiness: { mode: "port", port } };
    const found = { serving: true, address: "127.0.0.2" };
    const previous = {
      egressProblem: {
        ...{ kind: "unanswered", reason: "x", since: "2026-12-01T00:00:00.000Z" },
        restartedAt: "2026-12-01T00:01:00Z",
      },
    };
    const asked: number[] = [];
    const guest = (view: "listening" | "not-listening" | "unknown" | Error) => ({
      name: "vm-1",
      view: async (guestPort: number) => {
        asked.push(guestPort);
        if (view instanceof Error) throw view;
        return view;
      },
    });
    const [listening, dead, unknown, failing] = await Promise.all([
      recheckOnRead(inputs, found, previous, within(), guest("listening")),
      recheckOnRead(inputs, found, previous, within(), guest("not-listening")),
      recheckOnRead(inputs, found, previous, within(), guest("unknown")),
      recheckOnRead(inputs, found, previous, within(), guest(new Error("agent gone"))),
    ]);
    assert.deepEqual(asked, [port, port, port, port]);
    const pathUnknown = listening.finding!.egressProblem!;
    assert.equal(pathUnknown.kind, "path-unknown");
    assert.match(pathUnknown.reason, new RegExp(`the guest agent reports port ${port} listening$`));
    assert.notEqual(
      pathUnknown.since,
      previous.egressProblem.since,
      "a new kind starts its own time",
    );
    assert.equal(pathUnknown.restartedAt, undefined);
    assert.equal(
      needsEgressRestart({ state: "running", ...listening.outputs }, { egressRecheck: true }),
      false,
    );
    // Seen again: the time it was first seen is kept, so a second refresh changes nothing.
    const again = await recheckOnRead(
      inputs,
      found,
      listening.outputs,
      within(),
      guest("listening"),
    );
    assert.equal(again.finding!.egressProblem!.since, pathUnknown.since);
    assert.equal(dead.finding!.egressProblem!.kind, "unanswered");
    assert.match(
      dead.finding!.egressProblem!.reason,
      /the guest agent reports nothing listening on port \d+$/,
    );
    for (const left of [unknown, failing]) {
      assert.equal(left.finding!.egressProblem!.kind, "unanswered");
      assert.doesNotMatch(left.finding!.egressProblem!.reason, /guest agent/);
    }
    // A proxy that answers is never put to the guest.
    asked.length = 0;
    await recheckOnRead(
      { egressRecheck: true, readiness: { mode: "port", port: proxy.port } },
      found,
      {},
      within(),
      guest("not-listening"),
    );
    assert.deepEqual(asked, []);
  });

  it("read re-checks only when asked, and only a proxy found serving", async () => {
    const inputs = {
      egressRecheck: true,
      egressCheck: check(),
      readiness: { mode: "port", port: proxy.port },
    };
    const off = await recheckOnRead(
      { ...inputs, egressRecheck: false },
      { serving: true, address: "127.0.0.2" },
      {},
      within(),
    );
    assert.deepEqual(off, { finding: undefined, outputs: { egressProblem: null } });
    const stopped = await recheckOnRead(inputs, { serving: false, address: null }, {}, within());
    assert.equal(stopped.finding, undefined);
    const on = await recheckOnRead(inputs, { serving: true, address: "127.0.0.2" }, {}, within());
    assert.equal(on.outputs.egressIp, "127.0.0.3");
  });
});

describe("the rule the next up follows (common/egress-recheck.ts)", () => {
  const problem = {
    kind: "unanswered" as const,
    reason: "no answer",
    since: "2026-12-02T10:00:00.000Z",
  };
  const olds = { state: "running", running: true, egressProblem: problem };
  const news = { egressRecheck: true, running: true };
  const quiet = { changes: false, replaces: [], deleteBeforeReplace: false };

  it("a recorded problem on a running VM is an in-place update (the restart)", () => {
    assert.equal(needsEgressRestart(olds, news), true);
    assert.deepEqual(withEgressHeal(quiet, olds, news), { ...quiet, changes: true });
  });

  it("no restart without the re-check, for a VM not meant to run, or without a problem", () => {
    assert.equal(needsEgressRestart(olds, { ...news, egressRecheck: false }), false);
    assert.equal(needsEgressRestart(olds, { ...news, running: false }), false);
    assert.equal(needsEgressRestart({ ...olds, state: "stopped" }, news), false);
    assert.equal(needsEgressRestart({ ...olds, egressProblem: null }, news), false);
    // It answered, without an address (the echo service may be down for every proxy): reported only.
    const answered = { ...olds, egressProblem: { ...problem, kind: "egress" } };
    assert.equal(needsEgressRestart(answered, news), false);
    // Restarted once already: the next refresh reports it for replacement; no second restart.
    const restarted = {
      ...olds,
      egressProblem: { ...problem, restartedAt: "2026-12-02T10:05:00Z" },
    };
    assert.equal(needsEgressRestart(restarted, news), false);
    assert.deepEqual(withEgressHeal(quiet, { ...olds, egressProblem: null }, news), quiet);
  });

  it("still failing after a restart, or older than rotateAfterDays: a reported rotation, stable", () => {
    const restarted = {
      egressIp: null,
      checkedAt: null,
      egressProblem: { ...problem, restartedAt: "2026-12-02T10:05:00.000Z" },
    };
    assert.equal(
      rotationDue({}, "2026-01-01T00:00:00.000Z", restarted),
      "replace: no egress answer after the restart at 2026-12-02T10:05:00.000Z",
    );
    const now = Date.parse("2026-12-02T00:00:00.000Z");
    assert.equal(
      rotationDue({ rotateAfterDays: 30 }, "2026-11-20T00:00:00.000Z", undefined, now),
      undefined,
    );
    assert.equal(
      rotationDue({ rotateAfterDays: 30 }, "2026-10-01T00:00:00.000Z", undefined, now),
      "replace: older than 30 days (created 2026-10-01T00:00:00.000Z)",
    );
    assert.equal(rotationDue({}, "2026-10-01T00:00:00.000Z", undefined, now), undefined);
  });

  it("a failed restart is recorded (Pulumi's init-failed shape) with the restart time", () => {
    const error = new EgressHealFailedError(
      "pve/100",
      { ...olds, vmid: 100 },
      new Error("port 3128 on 10.0.0.5 accepting connections: timed out"),
      { __provider: "serialized" },
    );
    assert.equal(error.id, "pve/100");
    const recorded = error.properties.egressProblem as Record<string, string>;
    assert.equal(recorded.since, problem.since);
    assert.ok(!Number.isNaN(Date.parse(recorded.restartedAt!)));
    assert.equal(error.properties.__provider, "serialized");
    assert.match(error.message, /next `pulumi up --refresh` replaces it/);
  });

  it("the pool publishes a member whose last re-check failed as not ready", () => {
    assert.equal(publishedReadiness("running", "2026-12-02T00:00:00Z", true, problem), false);
    assert.equal(
      publishedReadiness("running", "2026-12-02T00:00:00Z", true, { ...problem, kind: "egress" }),
      true,
      "answered: still serving as far as anyone can tell",
    );
    assert.equal(publishedReadiness("running", "2026-12-02T00:00:00Z", true, null), true);
    assert.equal(
      publishedReadiness("running", "2026-12-02T00:00:00Z", true, {
        ...problem,
        kind: "path-unknown",
      }),
      null,
      "silent from the runner, listening in the guest: nobody knows",
    );
    const onIpv6 = { ...problem, kind: "path-unknown", families: ["ipv6"] };
    assert.equal(publishedReadiness("running", "2026-12-02T00:00:00Z", true, onIpv6, "ipv6"), null);
    assert.equal(publishedReadiness("running", "2026-12-02T00:00:00Z", true, onIpv6, "ipv4"), true);
    assert.equal(publishedReadiness("reachable", "2026-12-02T00:00:00Z", true, undefined), true);
  });

  it("a collision names the later members and the exact rotate change", () => {
    const groups = groupByEgress([
      { name: "kvm1-0", egressIp: "203.0.113.9" },
      { name: "kvm1-1", egressIp: "203.0.113.9" },
      { name: "pve1-0", egressIp: "203.0.113.9" },
      { name: "pve1-1", egressIp: "198.51.100.1" },
    ]);
    assert.deepEqual(membersToRotate(groups), ["kvm1-1", "pve1-0"]);
    const at = new Date("2026-12-02T12:34:56Z");
    assert.equal(rotateChange(["kvm1-1"], at), 'rotate: { "kvm1-1": "2026-12-02T12:34Z" }');
    // A member already rotated with that very text (the same finding answered twice) gets one that differs.
    assert.equal(
      rotateChange(["kvm1-1", "pve1-0"], at, {
        "kvm1-1": "2026-12-02T12:34Z",
        "pve1-0": "2026-12-02",
      }),
      'rotate: { "kvm1-1": "2026-12-02T12:34Z-2", "pve1-0": "2026-12-02T12:34Z" }',
    );
    assert.equal(
      rotateChange(["kvm1-1"], at, { "kvm1-1": "2026-12-02T12:34Z-2" }),
      'rotate: { "kvm1-1": "2026-12-02T12:34Z" }',
    );
  });
});
