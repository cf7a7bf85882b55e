/**
 * `egress-proxies gateway-metrics`' pure parts (cli/gateway-metrics/): its
 * flags, what a datagram of squid's log lines adds to which counter, the
 * bounded user labels, the exposition text, and what each path answers.
 * The command on real squid is test/integration/gateway-metrics.test.ts.
 */
import assert from "node:assert/strict";
import { parseListenAddress, parseUdpAddress } from "../../../cli/gateway-metrics/command";
import { GatewayCounters, MAX_USERS, OTHER_USERS } from "../../../cli/gateway-metrics/intake";
import { renderGatewayMetrics } from "../../../cli/gateway-metrics/render";
import { answer } from "../../../cli/gateway-metrics/server";

/** One datagram as squid's UDP log module sends it: several lines, each ending in a line break. */
const DATAGRAM = [
  "1796512543.514 124 127.0.0.1 crawler TCP_MISS/200 224 GET ROUNDROBIN_PARENT/m2-0",
  "1796512543.519 135 127.0.0.1 crawler-session-3 TCP_MISS/200 224 GET USERHASH_PARENT/m2-0.sticky",
  "1796512543.521 131 127.0.0.1 crawler-session-6 TCP_TUNNEL/200 142 CONNECT USERHASH_PARENT/m1-0.sticky",
  "1796512543.525 136 127.0.0.1 crawler TCP_TUNNEL/200 142 CONNECT ROUNDROBIN_PARENT/m2-0",
  "1796512238.569 11 127.0.0.1 crawler TCP_DENIED/407 3475 GET HIER_NONE/-",
  "1796512238.583 5 127.0.0.1 crawler-session-9 TCP_DENIED/407 3475 GET HIER_NONE/-",
  "1796512398.948 1 127.0.0.1 - TCP_DENIED/407 3475 GET HIER_NONE/-",
  "1796512238.803 0 127.0.0.1 crawler TCP_MISS/503 3406 GET ANY_OLD_PARENT/m3-0",
  "1796512543.654 0 127.0.0.1 - NONE_NONE/000 0 - HIER_NONE/-",
  "",
].join("\n");

/** The sample line of `name` with exactly these labels, or undefined. */
function sample(text: string, name: string, labels: string): number | undefined {
  const line = text.split("\n").find((l) => l.startsWith(`${name}${labels} `));
  return line === undefined ? undefined : Number(line.slice(`${name}${labels} `.length));
}

describe("gateway-metrics: flags", () => {
  it("--udp takes an IP literal and a port", () => {
    assert.deepEqual(parseUdpAddress("127.0.0.1:5140"), { host: "127.0.0.1", port: 5140 });
    assert.deepEqual(parseUdpAddress("[::1]:5140"), { host: "::1", port: 5140 });
  });

  for (const bad of ["localhost:5140", ":5140", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000"])
    it(`--udp refuses ${JSON.stringify(bad)}, naming the flag and the form`, () =>
      assert.throws(
        () => parseUdpAddress(bad),
        /^Error: --udp must be an IP address of this host and a port, the one squid's access_log udp:\/\/ sends to \(127\.0\.0\.1:5140/,
      ));

  it("--listen takes host:port, [v6]:port and :port", () => {
    assert.deepEqual(parseListenAddress("0.0.0.0:9102"), { host: "0.0.0.0", port: 9102 });
    assert.deepEqual(parseListenAddress("[::]:9102"), { host: "::", port: 9102 });
    assert.deepEqual(parseListenAddress(":9102"), { port: 9102 });
    assert.throws(() => parseListenAddress("9102"), /^Error: --listen must be host:port/);
    assert.throws(() => parseListenAddress("a:99999"), /^Error: --listen must be host:port/);
  });
});

describe("gateway-metrics: counting squid's lines", () => {
  it("adds a datagram's requests per member, base user and result; a probe without a request is no request", () => {
    const counters = new GatewayCounters();
    assert.deepEqual(counters.recordDatagram(DATAGRAM), []);
    const text = renderGatewayMetrics(counters);
    const requests = (labels: string) => sample(text, "egress_gateway_requests_total", labels);
    assert.equal(requests('{member="m2-0",user="crawler",result="routed"}'), 3);
    assert.equal(requests('{member="m1-0",user="crawler",result="routed"}'), 1);
    assert.equal(requests('{member="",user="crawler",result="refused"}'), 2);
    assert.equal(requests('{member="",user="",result="refused"}'), 1);
    assert.equal(requests('{member="m3-0",user="crawler",result="failed"}'), 1);
    // Eight requests: the probe's line (method -, status 000) is in none of them.
    const all = text
      .split("\n")
      .filter((line) => line.startsWith("egress_gateway_requests_total{"))
      .reduce((sum, line) => sum + Number(line.split(" ").at(-1)), 0);
    assert.equal(all, 8);
    assert.deepEqual(
      text.split("\n").filter((line) => !line.startsWith("#") && /session-|"\d+"/.test(line)),
      [],
      "no session id in any label",
    );
    assert.equal(
      sample(text, "egress_gateway_response_bytes_total", '{member="m2-0",user="crawler"}'),
      224 + 224 + 142,
    );
    assert.equal(sample(text, "egress_gateway_refused_total", '{user="crawler"}'), 2);
    assert.equal(sample(text, "egress_gateway_refused_total", '{user=""}'), 1);
    assert.equal(sample(text, "egress_gateway_session_requests_total", '{member="m2-0"}'), 1);
    assert.equal(sample(text, "egress_gateway_session_requests_total", '{member="m1-0"}'), 1);
    assert.equal(sample(text, "egress_gateway_session_requests_total", '{member=""}'), 1);
    assert.equal(sample(text, "egress_gateway_log_lines_unreadable_total", ""), 0);
  });

  it("counts across datagrams, and counts and returns the lines it cannot read", () => {
    const counters = new GatewayCounters();
    counters.recordDatagram(DATAGRAM);
    const unreadable = counters.recordDatagram(DATAGRAM + "not a log line\n");
    assert.deepEqual(unreadable, ["not a log line"]);
    const text = renderGatewayMetrics(counters);
    assert.equal(
      sample(
        text,
        "egress_gateway_requests_total",
        '{member="m2-0",user="crawler",result="routed"}',
      ),
      6,
    );
    assert.equal(sample(text, "egress_gateway_log_lines_unreadable_total", ""), 1);
  });

  it(`keeps at most ${MAX_USERS} user labels; later names share ${OTHER_USERS}`, () => {
    const counters = new GatewayCounters();
    const refusedAs = (name: string) =>
      `1796512238.569 11 127.0.0.1 ${name} TCP_DENIED/407 3475 GET HIER_NONE/-\n`;
    for (let index = 0; index < MAX_USERS + 50; index++)
      counters.recordDatagram(refusedAs(`invented${index}`));
    counters.recordDatagram(refusedAs("invented0-session-1"));
    const text = renderGatewayMetrics(counters);
    const refusedLines = text
      .split("\n")
      .filter((line) => line.startsWith("egress_gateway_refused_total{"));
    assert.equal(refusedLines.length, MAX_USERS + 1);
    assert.equal(sample(text, "egress_gateway_refused_total", `{user="${OTHER_USERS}"}`), 50);
    assert.equal(sample(text, "egress_gateway_refused_total", '{user="invented0"}'), 2);
  });
});

describe("gateway-metrics: the exposition text", () => {
  it("every family has HELP and TYPE counter, samples or not", () => {
    const text = renderGatewayMetrics(new GatewayCounters());
    for (const name of [
      "egress_gateway_requests_total",
      "egress_gateway_response_bytes_total",
      "egress_gateway_refused_total",
      "egress_gateway_session_requests_total",
      "egress_gateway_log_lines_unreadable_total",
    ]) {
      assert.match(text, new RegExp(`^# HELP ${name} \\S`, "m"));
      assert.match(text, new RegExp(`^# TYPE ${name} counter$`, "m"));
    }
    assert.match(text, /^egress_gateway_log_lines_unreadable_total 0$/m);
    assert.ok(text.endsWith("\n"));
  });

  it("escapes label values as the format requires (a name squid logged with a quote and a backslash)", () => {
    const counters = new GatewayCounters();
    counters.recordDatagram(
      '1796512399.010 0 127.0.0.1 we"ird\\name TCP_DENIED/407 3475 GET HIER_NONE/-\n',
    );
    assert.match(
      renderGatewayMetrics(counters),
      /^egress_gateway_refused_total\{user="we\\"ird\\\\name"\} 1$/m,
    );
  });

  it("lists samples in the same order on every scrape", () => {
    const one = new GatewayCounters();
    const other = new GatewayCounters();
    const lines = DATAGRAM.split("\n").filter(Boolean);
    one.recordDatagram(lines.join("\n"));
    other.recordDatagram([...lines].reverse().join("\n"));
    assert.equal(renderGatewayMetrics(one), renderGatewayMetrics(other));
  });
});

describe("gateway-metrics: answers", () => {
  const counters = new GatewayCounters();
  counters.recordDatagram(DATAGRAM);

  it("/metrics in the text format 0.0.4", () => {
    const reply = answer(counters, true, "GET", "/metrics");
    assert.equal(reply.status, 200);
    assert.equal(reply.contentType, "text/plain; version=0.0.4; charset=utf-8");
    assert.equal(reply.body, renderGatewayMetrics(counters));
  });

  it("/healthz: 200 while the intake is open, 503 once it closed", () => {
    assert.equal(answer(counters, true, "GET", "/healthz").status, 200);
    assert.equal(answer(counters, false, "GET", "/healthz").status, 503);
  });

  it("only GET and HEAD; other paths are 404", () => {
    assert.equal(answer(counters, true, "POST", "/metrics").status, 405);
    assert.equal(answer(counters, true, "HEAD", "/metrics").status, 200);
    assert.equal(answer(counters, true, "GET", "/other").status, 404);
  });
});
