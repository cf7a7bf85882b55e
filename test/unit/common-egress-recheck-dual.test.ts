/**
 * The refresh re-check of a dual-stack proxy (common/egress-recheck.ts): each
 * family at once, within one deadline, on loopback (a "proxy" on 127.0.0.2
 * and one on ::1 at the same port, an echo service on each family).
 */
import assert from "node:assert/strict";
import { Deadline } from "../../provider/common/deadline";
import {
  isUnanswered,
  needsEgressRestart,
  recheckEgress,
} from "../../provider/common/egress-recheck";
import { recheckOnRead } from "../../provider/common/recheck-on-read";
import { publishedReadiness } from "../../components/published-checks";
import { endpointChecks, type ProxyDetails } from "../../components/proxy-details";
import {
  startEchoServer,
  startForwardProxy,
  type ForwardProxy,
  type RunningServer,
} from "../support/forward-proxy";

const AUTH = { user: "crawler", password: "dual secret" };

describe("egress re-check of a dual-stack proxy (both families, concurrently)", function () {
  this.timeout(120_000);
  let echo4: RunningServer;
  let echo6: RunningServer;
  let proxy4: ForwardProxy;
  let proxy6: ForwardProxy;

  before(async () => {
    echo4 = await startEchoServer("127.0.0.1");
    echo6 = await startEchoServer("::1");
    proxy4 = await startForwardProxy({ host: "127.0.0.2", auth: AUTH, egressAddress: "127.0.0.3" });
    // The same squid on its IPv6 address: one port for both families.
    proxy6 = await startForwardProxy({ host: "::1", auth: AUTH, port: proxy4.port });
  });
  after(async () => {
    await proxy6?.close();
    await proxy4?.close();
    await echo6?.close();
    await echo4?.close();
  });

  const check = () => ({
    url: `http://127.0.0.1:${echo4.port}/`,
    ipv6Url: `http://[::1]:${echo6.port}/`,
    proxyAuth: AUTH,
  });
  const target = () => ({ host: "127.0.0.2", port: proxy4.port });
  const within = () => Deadline.afterSeconds(20, "test");
  const known = {
    egressIp: "127.0.0.3",
    egressIpv6: "::1",
    checkedAt: "2026-12-01T00:00:00.000Z",
  };

  /** A check that answered: the finding's time is now (the last check that ran), the rest as given. */
  const answeredNow = (finding: object, expected: Record<string, unknown>) => {
    const { checkedAt, ...rest } = finding as Record<string, unknown>;
    assert.ok(Date.parse(String(checkedAt)) > Date.parse(known.checkedAt), String(checkedAt));
    const { checkedAt: _given, ...wanted } = expected;
    assert.deepEqual(rest, wanted);
  };

  it("both families confirmed: only checkedAt moves (the time of the last check that answered)", async () => {
    const finding = await recheckEgress(target(), check(), known, within(), { address: "::1" });
    answeredNow(finding, { ...known, egressProblem: null });
  });

  it("a changed IPv6 exit address is accepted with a new checkedAt, as for IPv4", async () => {
    const previous = { ...known, egressIpv6: "2001:db8::9" };
    const finding = await recheckEgress(target(), check(), previous, within(), { address: "::1" });
    assert.equal(finding.egressIpv6, "::1");
    assert.equal(finding.egressIp, "127.0.0.3");
    assert.notEqual(finding.checkedAt, known.checkedAt);
    assert.equal(finding.egressProblem, null);
  });

  it("a proxy spreading a prefix: a new exit address inside it is the same finding, one outside is a change", async () => {
    // The echo service sees ::1, which lies in ::/64: state's ::5 (also inside) stands.
    const spread = { ...check(), ipv6Prefix: { prefix: "::/64" } };
    const inside = { ...known, egressIpv6: "::5" };
    const same = await recheckEgress(target(), spread, inside, within(), { address: "::1" });
    answeredNow(same, { ...inside, egressProblem: null });
    // The dialer fell back to an address outside the prefix: that shows, with a new checkedAt.
    const elsewhere = { ...check(), ipv6Prefix: { prefix: "2001:db8:7::/64" } };
    const previous = { ...known, egressIpv6: "2001:db8:7::9" };
    const changed = await recheckEgress(target(), elsewhere, previous, within(), {
      address: "::1",
    });
    assert.equal(changed.egressIpv6, "::1");
    assert.notEqual(changed.checkedAt, known.checkedAt);
  });

  it("a silent IPv6 side is a problem of that family only; IPv4 stays published", async () => {
    const closed = await startForwardProxy({ host: "::1" });
    const silentPort = closed.port;
    await closed.close();
    // IPv4 answers on 127.0.0.2 at proxy4's port; nothing listens on ::1 at that port from here.
    const v4 = await startForwardProxy({
      host: "127.0.0.2",
      auth: AUTH,
      egressAddress: "127.0.0.3",
      port: silentPort,
    });
    try {
      const finding = await recheckEgress(
        { host: "127.0.0.2", port: silentPort },
        check(),
        known,
        within(),
        { address: "::1" },
      );
      const problem = finding.egressProblem!;
      assert.equal(problem.kind, "unanswered");
      assert.deepEqual(problem.families, ["ipv6"]);
      assert.match(problem.reason, /^IPv6: /);
      assert.equal(finding.egressIp, "127.0.0.3", "the IPv4 side answered");
      assert.equal(finding.egressIpv6, "::1", "the IPv6 exit address last seen stays");
      assert.equal(finding.checkedAt, known.checkedAt);
      assert.equal(isUnanswered(problem, "ipv4"), false);
      assert.equal(isUnanswered(problem, "ipv6"), true);
      assert.equal(isUnanswered(problem), true, "the member as a whole did not answer");
      const at = "2026-12-02T00:00:00Z";
      assert.equal(publishedReadiness("running", at, true, problem, "ipv4"), true);
      assert.equal(publishedReadiness("running", at, true, problem, "ipv6"), false);
      // The same rule as for IPv4: the next up restarts the VM in place.
      assert.equal(
        needsEgressRestart(
          { state: "running", egressProblem: problem },
          { egressRecheck: true, running: true },
        ),
        true,
      );
    } finally {
      await v4.close();
    }
  });

  it("both sides silent: checked at once, so in the time of one (not two) rounds of tries", async () => {
    const closed = await startForwardProxy({ host: "127.0.0.2" });
    const port = closed.port;
    await closed.close();
    const started = Date.now();
    const finding = await recheckEgress({ host: "127.0.0.2", port }, check(), known, within(), {
      address: "::1",
    });
    const elapsed = Date.now() - started;
    assert.ok(elapsed >= 4000, `three tries, two pauses (${elapsed} ms)`);
    assert.ok(elapsed < 7500, `concurrently, not one family after the other (${elapsed} ms)`);
    assert.deepEqual(finding.egressProblem!.families, ["ipv4", "ipv6"]);
    assert.match(finding.egressProblem!.reason, /IPv4: .*; IPv6: /);
  });

  it("read: an IPv6 address the guest no longer reports is a silent IPv6 side", async () => {
    const inputs = {
      egressRecheck: true,
      egressCheck: check(),
      readiness: { mode: "port", port: proxy4.port },
    };
    const lost = await recheckOnRead(
      inputs,
      { serving: true, address: "127.0.0.2", ipv6: null },
      known,
      within(),
    );
    assert.deepEqual(lost.finding!.egressProblem!.families, ["ipv6"]);
    assert.match(lost.finding!.egressProblem!.reason, /no IPv6 address/);
    const fine = await recheckOnRead(
      inputs,
      { serving: true, address: "127.0.0.2", ipv6: "::1" },
      known,
      within(),
    );
    answeredNow(fine.outputs!, { ...known, egressProblem: null });
    // An IPv4-only proxy's outputs stay as they were: no egressIpv6 at all.
    const single = await recheckOnRead(
      inputs,
      { serving: true, address: "127.0.0.2" },
      { egressIp: "127.0.0.3", checkedAt: known.checkedAt },
      within(),
    );
    answeredNow(single.outputs!, { egressIp: "127.0.0.3", egressProblem: null });
  });

  it("without ipv6Url the IPv6 side's port is re-checked (what create's readiness checked)", async () => {
    const { ipv6Url: _unused, ...v4Only } = check();
    const finding = await recheckEgress(target(), v4Only, known, within(), { address: "::1" });
    assert.equal(finding.egressProblem, null);
    assert.equal(finding.egressIpv6, "::1", "nothing measured over IPv6: the known value stays");
  });
});

describe("the pool publishes a dual-stack member per family (components/proxy-details.ts)", () => {
  it("the IPv6 URL's check carries readyIpv6, the IPv4 URL's ready", () => {
    const member: ProxyDetails = {
      name: "kvm1-0",
      backend: "kvm1",
      kind: "kvm",
      vmName: "egress-kvm1-0",
      host: "lab",
      ip: "10.0.0.5",
      id: "hosts/lab/domains/egress-kvm1-0",
      endpoint: "http://10.0.0.5:3128",
      egressIp: "198.51.100.5",
      checkedAt: "2026-12-02T00:00:00.000Z",
      egressProblem: "IPv6: no answer",
      egressProblemKind: "unanswered",
      createdAt: "2026-12-01T00:00:00.000Z",
      rotateAfter: null,
      ready: true,
      state: "running",
      ipv6Address: "fd00::5",
      endpointIpv6: "http://[fd00::5]:3128",
      egressIpv6: "2001:db8::5",
      readyIpv6: false,
    };
    assert.deepEqual(
      endpointChecks([member]).map((each) => [each.address, each.ready]),
      [
        ["10.0.0.5", true],
        ["fd00::5", false],
      ],
    );
  });
});
