/**
 * The pure parts of the egress work: reading an echo service's answer,
 * grouping proxies by egress address, what the published endpoints say, the
 * check command's inputs, its table / JSON / Prometheus text and exit status.
 */
import assert from "node:assert/strict";
import { describeAnswer, parseEgressAnswer } from "../../../provider/common/egress";
import {
  groupByEgress,
  sharedEgress,
  sharedEgressMessage,
} from "../../../components/egress-diversity";
import {
  proxiesJson,
  publishedReadiness,
  sliceEndpoint,
  checksAnnotation,
} from "../../../components/published-checks";
import { poolArgsFromStackConfig } from "../../../components/stack-config";
import { poolArgsProblems } from "../../../components/pool";
import {
  CHECK_EXIT,
  exitStatus,
  labelSet,
  renderJson,
  renderPrometheus,
  renderTable,
  summaryLine,
  summarize,
} from "../../../cli/check/report";
import { InputError, targetsFromDocument } from "../../../cli/check/targets";
import { mapWithConcurrency } from "../../../cli/check/command";
import type { ProbeResult } from "../../../cli/check/probe";

describe("egress answer parsing", () => {
  it("reads a bare address, IPv4 or IPv6, with surrounding whitespace", () => {
    assert.deepEqual(parseEgressAnswer("203.0.113.7\n"), { ok: true, address: "203.0.113.7" });
    assert.deepEqual(parseEgressAnswer("  2001:DB8::1 "), { ok: true, address: "2001:db8::1" });
  });

  it("reads JSON: the named field (nested with dots) or a conventional one", () => {
    assert.deepEqual(parseEgressAnswer('{"ip":"198.51.100.4"}'), {
      ok: true,
      address: "198.51.100.4",
    });
    // httpbin lists the X-Forwarded-For chain: the first is what the service saw first.
    assert.deepEqual(parseEgressAnswer('{"origin":"192.0.2.1, 10.0.0.5"}'), {
      ok: true,
      address: "192.0.2.1",
    });
    assert.deepEqual(parseEgressAnswer('{"client":{"addr":"192.0.2.9"}}', "client.addr"), {
      ok: true,
      address: "192.0.2.9",
    });
  });

  it("explains an answer that holds no address, quoting it", () => {
    const html = parseEgressAnswer("<html><title>ERROR: Access Denied</title></html>");
    assert.equal(html.ok, false);
    assert.match(
      !html.ok ? html.reason : "",
      /not an IP address: "<html><title>ERROR: Access Denied/,
    );
    const wrongField = parseEgressAnswer('{"ip":"192.0.2.1"}', "address");
    assert.match(!wrongField.ok ? wrongField.reason : "", /looked at address/);
    const notAddress = parseEgressAnswer('{"ip":"unknown"}');
    assert.match(!notAddress.ok ? notAddress.reason : "", /field ip is not an IP address/);
    assert.match((parseEgressAnswer("") as { reason: string }).reason, /empty/);
    assert.match((parseEgressAnswer("{broken") as { reason: string }).reason, /does not parse/);
    assert.match((parseEgressAnswer("192.0.2.1", "ip") as { reason: string }).reason, /not JSON/);
  });

  it("describes a squid error page by its code and title, not its boilerplate", () => {
    const page =
      '<!DOCTYPE html PUBLIC "-//W3C//DTD HTML 4.01//EN" "http://www.w3.org/TR/html4/strict.dtd">\n' +
      '<html><head>\n<meta type="copyright" content="Copyright (C) 1996-2022 The Squid Software Foundation and contributors">\n' +
      '<meta http-equiv="Content-Type" CONTENT="text/html; charset=utf-8">\n' +
      "<title>ERROR: The requested URL could not be retrieved</title>\n</head><body>...</body></html>";
    assert.equal(
      describeAnswer({ status: 503, body: page, squidError: "ERR_CONNECT_FAIL 111" }),
      'HTTP 503 (squid: ERR_CONNECT_FAIL 111) "ERROR: The requested URL could not be retrieved"',
    );
    assert.equal(
      describeAnswer({ status: 502, body: "upstream down\n" }),
      'HTTP 502 "upstream down"',
    );
  });

  it("shortens a long answer in the reason", () => {
    const reason = (parseEgressAnswer("x".repeat(5000)) as { reason: string }).reason;
    assert.ok(reason.length < 300, `reason is ${reason.length} characters`);
  });
});

describe("egress diversity", () => {
  const proxies = [
    { name: "home-0", egressIp: "192.0.2.10" },
    { name: "office-1", egressIp: "198.51.100.20" },
    { name: "home-1", egressIp: "192.0.2.10" },
    { name: "office-0", egressIp: null },
  ];

  it("groups proxies by address, most shared first, leaving unchecked ones out", () => {
    assert.deepEqual(groupByEgress(proxies), [
      { address: "192.0.2.10", proxies: ["home-0", "home-1"] },
      { address: "198.51.100.20", proxies: ["office-1"] },
    ]);
    assert.deepEqual(sharedEgress(groupByEgress(proxies)), [
      { address: "192.0.2.10", proxies: ["home-0", "home-1"] },
    ]);
  });

  it("warns only when an address is shared, naming it and its proxies", () => {
    const message = sharedEgressMessage("crawl", groupByEgress(proxies));
    assert.match(message ?? "", /3 proxies leave from 2 distinct egress addresses/);
    assert.match(message ?? "", /192\.0\.2\.10 \(home-0, home-1\)/);
    assert.equal(sharedEgressMessage("crawl", groupByEgress(proxies.slice(1, 3))), undefined);
  });

  it("validates the pool's egress arguments and the stack config keys", () => {
    const backends = [{ name: "kvm1", count: 1, kvm: {} }] as never;
    assert.deepEqual(poolArgsProblems({ backends, egressCheck: { url: "http://echo.lab/" } }), []);
    assert.match(
      poolArgsProblems({ backends, egressCheck: { url: "https://echo.lab/" } }).join(),
      /egressCheck\.url must be an http:\/\/ URL/,
    );
    assert.match(
      poolArgsProblems({ backends, requireDistinctEgress: true }).join(),
      /requireDistinctEgress needs egressCheck/,
    );
    const parsed = poolArgsFromStackConfig({
      pool: {
        count: 1,
        backends: [{ name: "local", kvm: {} }],
        egressCheck: { url: "http://echo.lab/json", field: "ip" },
        requireDistinctEgress: true,
      },
    });
    assert.ok(parsed.ok);
    assert.deepEqual(parsed.ok && parsed.args.egressCheck, {
      url: "http://echo.lab/json",
      field: "ip",
    });
    assert.equal(parsed.ok && parsed.args.requireDistinctEgress, true);
    const bad = poolArgsFromStackConfig({
      pool: { count: 1, backends: [{ name: "local", kvm: {} }], requireDistinctEgress: "yes" },
    });
    assert.match(!bad.ok ? bad.problems.join() : "", /egress-proxies:pool.requireDistinctEgress/);
  });
});

describe("published endpoints say what was checked", () => {
  const checks = [
    {
      address: "10.0.0.1",
      ready: true,
      egressIp: "192.0.2.1",
      checkedAt: "2026-11-30T10:00:00.000Z",
    },
    { address: "10.0.0.2", ready: null, egressIp: null, checkedAt: null },
  ];

  it("proxies.json: one object per URL with ready and egressIp; no check time (it would change the Secret at every resync)", () => {
    const urls = ["http://a@10.0.0.1:3128", "http://10.0.0.2:3128"];
    assert.deepEqual(JSON.parse(proxiesJson(urls, checks)), [
      { url: "http://a@10.0.0.1:3128", ready: true, egressIp: "192.0.2.1", checkedAt: null },
      { url: "http://10.0.0.2:3128", ready: null, egressIp: null, checkedAt: null },
    ]);
    // The next refresh's check moved the time only: the same document, so the Secret plans nothing.
    const later = checks.map((check) => ({ ...check, checkedAt: "2026-11-30T10:05:00.000Z" }));
    assert.equal(proxiesJson(urls, later), proxiesJson(urls, checks));
    // With the exporter keeping readiness, none here at all.
    assert.deepEqual(
      JSON.parse(proxiesJson(urls, checks, { readiness: false })).map(
        (entry: { ready: unknown }) => entry.ready,
      ),
      [null, null],
    );
  });

  it("EndpointSlice: ready only when readiness checked it; unknown is left out", () => {
    assert.deepEqual(sliceEndpoint("10.0.0.1", checks[0]), {
      addresses: ["10.0.0.1"],
      conditions: { ready: true },
    });
    assert.deepEqual(sliceEndpoint("10.0.0.2", checks[1]), {
      addresses: ["10.0.0.2"],
      conditions: {},
    });
    assert.deepEqual(sliceEndpoint("10.0.0.3", { ...checks[1], ready: false }).conditions, {
      ready: false,
    });
    assert.deepEqual(JSON.parse(checksAnnotation(checks))[0], {
      address: "10.0.0.1",
      egressIp: "192.0.2.1",
    });
  });
});

describe("egress-proxies check: inputs", () => {
  it("reads stack outputs: URLs with credentials, names from proxies", () => {
    const targets = targetsFromDocument(
      {
        endpoints: ["http://10.0.0.1:3128", "http://[fd00::2]:3128"],
        endpointsWithCredentials: [
          "http://crawler:p%40ss@10.0.0.1:3128",
          "http://crawler:p%40ss@[fd00::2]:3128",
        ],
        proxies: [{ name: "kvm1-0", endpoint: "http://10.0.0.1:3128" }],
      },
      "outputs.json",
    );
    assert.deepEqual(targets, [
      {
        name: "kvm1-0",
        host: "10.0.0.1",
        port: 3128,
        endpoint: "10.0.0.1:3128",
        credentials: { user: "crawler", password: "p@ss" },
        family: "ipv4",
      },
      {
        name: "[fd00::2]:3128",
        host: "fd00::2",
        port: 3128,
        endpoint: "[fd00::2]:3128",
        credentials: { user: "crawler", password: "p@ss" },
        family: "ipv6",
      },
    ]);
  });

  it("names both URLs of a dual-stack member after it (proxies[].endpointIpv6), one family each", () => {
    const targets = targetsFromDocument(
      {
        endpoints: ["http://10.0.0.1:3128", "http://[fd00::1]:3128", "http://10.0.0.2:3128"],
        proxies: [
          {
            name: "kvm1-0",
            endpoint: "http://10.0.0.1:3128",
            endpointIpv6: "http://[fd00::1]:3128",
          },
          { name: "kvm1-1", endpoint: "http://10.0.0.2:3128" },
        ],
      },
      "outputs.json",
    );
    assert.deepEqual(
      targets.map((target) => [target.name, target.endpoint, target.family]),
      [
        ["kvm1-0", "10.0.0.1:3128", "ipv4"],
        ["kvm1-0", "[fd00::1]:3128", "ipv6"],
        ["kvm1-1", "10.0.0.2:3128", "ipv4"],
      ],
    );
  });

  it("reads proxies.json in both shapes, and uses fallback credentials for bare URLs", () => {
    const fallback = { user: "u", password: "p" };
    const objects = targetsFromDocument(
      [{ url: "http://10.0.0.1:3128", ready: true }],
      "proxies.json",
      fallback,
    );
    const strings = targetsFromDocument(
      ["http://10.0.0.1:3128", "http://10.0.0.1:3128"],
      "proxies.json",
      fallback,
    );
    assert.deepEqual(objects, strings, "duplicates dropped, same targets");
    assert.deepEqual(objects[0]!.credentials, fallback);
  });

  it("names the problem with unusable input", () => {
    assert.throws(
      () => targetsFromDocument({ endpointsWithCredentials: "[secret]" }, "stdin"),
      (error: Error) => error instanceof InputError && /--show-secrets/.test(error.message),
    );
    assert.throws(() => targetsFromDocument([], "proxies.json"), /lists no proxies/);
    assert.throws(
      () => targetsFromDocument(["https://10.0.0.1:3128"], "x"),
      /only http:\/\/ proxies/,
    );
    assert.throws(() => targetsFromDocument([42], "x"), /proxy URL or an object with a url/);
    assert.throws(() => targetsFromDocument("text", "x"), /neither stack outputs/);
  });

  it("runs work with bounded concurrency, keeping input order", async () => {
    let running = 0;
    let peak = 0;
    const results = await mapWithConcurrency([5, 1, 4, 2, 3, 0], 2, async (value) => {
      running++;
      peak = Math.max(peak, running);
      await new Promise((resolve) => setTimeout(resolve, value));
      running--;
      return value * 10;
    });
    assert.deepEqual(results, [50, 10, 40, 20, 30, 0]);
    assert.equal(peak, 2);
  });
});

describe("egress-proxies check: reports", () => {
  const up = (name: string, egressIp?: string): ProbeResult => ({
    name,
    endpoint: `${name}.lan:3128`,
    family: "ipv4",
    up: true,
    httpStatus: 200,
    httpSeconds: 0.012,
    connectSeconds: 0.004,
    ...(egressIp === undefined ? {} : { egressIp, egressSeconds: 0.01 }),
  });
  const down = (name: string): ProbeResult => ({
    name,
    endpoint: `${name}.lan:3128`,
    family: "ipv4",
    up: false,
    error: "http: connect ECONNREFUSED",
  });
  const report = (results: ProbeResult[]) => ({ checkedAt: "2026-11-30T12:00:00.000Z", results });

  it("exit status: 0 when every proxy is up, 1 when one is down", () => {
    assert.equal(exitStatus([up("a"), up("b")]), CHECK_EXIT.healthy);
    assert.equal(exitStatus([up("a"), down("b")]), CHECK_EXIT.someDown);
    assert.equal(CHECK_EXIT.usage, 2);
  });

  it("one proxy: a summary line and its row", () => {
    const text = renderTable(report([up("kvm1-0", "192.0.2.1")]));
    const lines = text.split("\n");
    assert.equal(lines[0], "1 proxy: up; 1 egress address");
    assert.match(lines[2]!, /^PROXY\s+ENDPOINT\s+STATUS\s+HTTP\s+CONNECT\s+EGRESS\s+PROBLEM$/);
    assert.match(lines[3]!, /^kvm1-0\s+kvm1-0\.lan:3128\s+up\s+200 12 ms\s+4 ms\s+192\.0\.2\.1$/);
    assert.equal(lines.length, 4);
  });

  it("200 proxies: the down ones listed first, the up ones counted, shared egress summarised", () => {
    const results = Array.from({ length: 200 }, (_, index) =>
      index % 67 === 5 ? down(`p${index}`) : up(`p${index}`, `192.0.2.${Math.floor(index / 2)}`),
    );
    const text = renderTable(report(results));
    const lines = text.split("\n");
    assert.equal(
      lines[0],
      "200 proxies: 197 up, 3 down; 100 egress addresses, 97 shared by several proxies",
    );
    const rows = lines.filter((line) => /\bDOWN\b/.test(line));
    assert.deepEqual(
      rows.map((line) => line.split(/\s+/)[0]),
      ["p139", "p5", "p72"],
    );
    assert.ok(text.includes("197 up proxies not listed (--all lists every proxy"));
    assert.ok(text.includes("… and 87 more (--json lists them)"));
    assert.ok(lines.length < 40, `${lines.length} lines for 200 proxies`);
    const all = renderTable(report(results), { all: true }).split("\n");
    assert.equal(all.filter((line) => / up /.test(line)).length, 197);
  });

  it("each down pool member gets the exact rotate change and config command; up ones and non-members none", () => {
    const text = renderTable(
      report([up("kvm1-0", "192.0.2.1"), down("kvm1-1"), down("pve-a-0"), down("192.0.2.9:3128")]),
    );
    const lines = text.split("\n");
    assert.ok(
      lines.includes(
        `  pool arguments: rotate: { "kvm1-1": "2026-11-30T12:00Z", "pve-a-0": "2026-11-30T12:00Z" }`,
      ),
      text,
    );
    assert.ok(
      lines.includes(
        `  stack config:   pulumi config set --path 'egress-proxies:pool.rotate["kvm1-1"]' 2026-11-30T12:00Z`,
      ),
      text,
    );
    assert.equal(lines.filter((line) => line.includes("pulumi config set")).length, 2);
    assert.doesNotMatch(text, /kvm1-0"/);
    assert.doesNotMatch(renderTable(report([up("kvm1-0")])), /rotate/);
  });

  it("pool members sharing an exit address: the rotate change that leaves each address to one", () => {
    const text = renderTable(
      report([up("kvm1-0", "192.0.2.1"), up("kvm1-1", "192.0.2.1"), up("pve1-0", "192.0.2.1")]),
    );
    assert.match(
      text,
      /rotate: \{ "kvm1-1": "2026-11-30T12:00Z", "pve1-0": "2026-11-30T12:00Z" \}/,
    );
    assert.doesNotMatch(
      renderTable(report([up("a:1", "192.0.2.1"), up("b:1", "192.0.2.1")])),
      /rotate/,
    );
  });

  it("members past their rotateAfter (the pool's rotateAfterDays) get the rotate change too", () => {
    const aged = { ...up("kvm1-0", "192.0.2.1"), rotateAfter: "2026-11-29T00:00:00.000Z" };
    const young = { ...up("kvm1-1", "192.0.2.2"), rotateAfter: "2026-12-29T00:00:00.000Z" };
    const text = renderTable(report([aged, young]));
    assert.match(
      text,
      /due for rotation by age \(rotateAfterDays\): kvm1-0 \(since 2026-11-29T00:00:00\.000Z\)/,
    );
    assert.ok(
      text.split("\n").includes(`  pool arguments: rotate: { "kvm1-0": "2026-11-30T12:00Z" }`),
      text,
    );
    assert.doesNotMatch(text, /kvm1-1"/);
    // The pool's stack output names them: the check reads rotateAfter with the member's name.
    const [target] = targetsFromDocument(
      {
        endpoints: ["http://10.0.0.5:3128"],
        proxies: [
          { name: "kvm1-0", endpoint: "http://10.0.0.5:3128", rotateAfter: aged.rotateAfter },
        ],
      },
      "outputs",
    );
    assert.deepEqual([target!.name, target!.rotateAfter], ["kvm1-0", aged.rotateAfter]);
  });

  it("down members the last refresh found listening in their guests (path unknown) get no rotate change, and are named with what to look at", () => {
    const pathUnknown = {
      kind: "path-unknown" as const,
      reason: "no answer within 10000 ms; the guest agent reports port 3128 listening",
    };
    const text = renderTable(
      report([
        { ...down("kvm1-0"), recordedProblem: pathUnknown },
        { ...down("kvm1-1"), recordedProblem: { ...pathUnknown, kind: "unanswered" as const } },
      ]),
    );
    assert.ok(
      text.split("\n").includes(`  pool arguments: rotate: { "kvm1-1": "2026-11-30T12:00Z" }`),
      text,
    );
    assert.doesNotMatch(text, /rotate: \{[^}]*kvm1-0/);
    assert.match(
      text,
      /not suggested for replacement: kvm1-0: the last refresh found them silent from its runner but listening in their guests \(path unknown\)/,
    );
    // Every down member listening: no rotate change at all.
    assert.doesNotMatch(
      renderTable(report([{ ...down("kvm1-0"), recordedProblem: pathUnknown }])),
      /rotate:/,
    );
    // The pool's stack output carries it: the check reads egressProblemKind with the member's name.
    const [target] = targetsFromDocument(
      {
        endpoints: ["http://10.0.0.5:3128"],
        proxies: [
          {
            name: "kvm1-0",
            endpoint: "http://10.0.0.5:3128",
            egressProblem: pathUnknown.reason,
            egressProblemKind: "path-unknown",
          },
        ],
      },
      "outputs",
    );
    assert.deepEqual(target!.recordedProblem, pathUnknown);
  });

  it("summary wording", () => {
    assert.equal(summaryLine(summarize([up("a"), up("b")])), "2 proxies: all up");
    assert.equal(summaryLine(summarize([down("a")])), "1 proxy: 0 up, 1 down");
  });

  it("JSON: summary, every proxy's details, and the egress groups", () => {
    const parsed = JSON.parse(
      renderJson(report([up("a", "192.0.2.1"), up("b", "192.0.2.1"), down("c")])),
    );
    assert.deepEqual(parsed.summary, { total: 3, up: 2, down: 1, egressAddresses: 1 });
    assert.equal(parsed.checkedAt, "2026-11-30T12:00:00.000Z");
    assert.deepEqual(parsed.egress, [{ address: "192.0.2.1", proxies: ["a", "b"] }]);
    assert.equal(parsed.proxies[2].error, "http: connect ECONNREFUSED");
  });

  it("a dual-stack member's two URLs on one exit address are one member, not a shared address", () => {
    const v6 = { ...up("a", "192.0.2.1"), endpoint: "[fd00::a]:3128", family: "ipv6" as const };
    const summary = summarize([up("a", "192.0.2.1"), v6, up("b", "192.0.2.2")]);
    assert.deepEqual([summary.total, summary.egressAddresses, summary.sharedEgress], [3, 2, []]);
    const shared = summarize([up("a", "192.0.2.1"), v6, up("b", "192.0.2.1")]);
    assert.deepEqual(shared.sharedEgress, [{ address: "192.0.2.1", proxies: ["a", "b"] }]);
  });

  it("Prometheus text: families with HELP and TYPE, one sample per proxy and probe", () => {
    const text = renderPrometheus(report([up("a", "192.0.2.1"), down("c")]));
    assert.ok(text.endsWith("\n"));
    const samples = text.split("\n").filter((line) => line !== "" && !line.startsWith("#"));
    assert.deepEqual(samples, [
      'egress_proxy_up{proxy="a",endpoint="a.lan:3128",family="ipv4"} 1',
      'egress_proxy_up{proxy="c",endpoint="c.lan:3128",family="ipv4"} 0',
      'egress_proxy_probe_duration_seconds{proxy="a",endpoint="a.lan:3128",family="ipv4",probe="http"} 0.012',
      'egress_proxy_probe_duration_seconds{proxy="a",endpoint="a.lan:3128",family="ipv4",probe="connect"} 0.004',
      'egress_proxy_probe_duration_seconds{proxy="a",endpoint="a.lan:3128",family="ipv4",probe="egress"} 0.01',
      'egress_proxy_egress_info{proxy="a",endpoint="a.lan:3128",family="ipv4",egress_ip="192.0.2.1"} 1',
      "egress_proxies_probed 2",
      "egress_proxies_up 1",
      "egress_proxies_egress_addresses 1",
      "egress_proxies_last_check_timestamp_seconds 1796040000",
    ]);
    assert.equal(text.match(/^# TYPE /gm)?.length, 7);
    assert.equal(labelSet({ a: 'x"y\\z\nw' }), '{a="x\\"y\\\\z\\nw"}');
  });
});

describe("published readiness after a refresh", () => {
  it("a proxy found not running is not ready, whatever was checked at create", () => {
    for (const state of ["stopped", "paused", "suspended", "crashed", "unreachable", "unknown"])
      assert.equal(publishedReadiness(state, "2026-12-01T00:00:00Z", true), false, state);
  });

  it("a running or reachable proxy is ready when readiness checked it, unknown when nothing did", () => {
    assert.equal(publishedReadiness("running", "2026-12-01T00:00:00Z", true), true);
    assert.equal(publishedReadiness("reachable", "2026-12-01T00:00:00Z", true), true);
    assert.equal(publishedReadiness("running", "2026-12-01T00:00:00Z", false), null);
    assert.equal(publishedReadiness("running", null, true), null);
  });

  it("state written before `state` was reported is judged as before", () => {
    assert.equal(publishedReadiness(undefined, "2026-12-01T00:00:00Z", true), true);
    assert.equal(publishedReadiness(null, null, true), null);
  });
});
