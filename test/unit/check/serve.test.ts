/**
 * The exporter's pure parts: the --serve address, what each path answers,
 * when /healthz turns unhealthy, and that /metrics keeps the one-shot
 * check's metric names beside the exporter's own.
 */
import assert from "node:assert/strict";
import { renderPrometheus, type CheckReport } from "../../../cli/check/report";
import {
  answer,
  ExporterState,
  parseListenAddress,
  ServeAddressError,
} from "../../../cli/check/serve";

const report: CheckReport = {
  checkedAt: "2026-12-02T10:00:00.000Z",
  results: [
    {
      name: "kvm1-0",
      endpoint: "192.0.2.10:3128",
      family: "ipv4",
      up: true,
      egressIp: "203.0.113.7",
    },
    {
      name: "kvm1-1",
      endpoint: "192.0.2.11:3128",
      family: "ipv4",
      up: false,
      error: "CONNECT: 502",
    },
  ],
};

describe("check --serve: the listening address", () => {
  it("reads host:port, [v6]:port and :port (every interface)", () => {
    assert.deepEqual(parseListenAddress("127.0.0.1:9464"), { host: "127.0.0.1", port: 9464 });
    assert.deepEqual(parseListenAddress("[::1]:9464"), { host: "::1", port: 9464 });
    assert.deepEqual(parseListenAddress(":9464"), { port: 9464 });
    assert.deepEqual(parseListenAddress("exporter.local:0"), { host: "exporter.local", port: 0 });
  });

  for (const bad of ["9464", "localhost", "127.0.0.1:", "127.0.0.1:70000", "::1:9464", "a b:1"])
    it(`refuses ${JSON.stringify(bad)}, naming the flag and the forms it takes`, () => {
      assert.throws(
        () => parseListenAddress(bad),
        (error: unknown) =>
          error instanceof ServeAddressError &&
          /--serve must be host:port \(127\.0\.0\.1:9464, \[::1\]:9464, or :9464/.test(
            error.message,
          ),
      );
    });
});

describe("check --serve: answers", () => {
  const started = Date.parse("2026-12-02T10:00:00Z");

  it("serves the one-shot check's metrics unchanged, then the exporter's own", () => {
    const state = new ExporterState(60_000, started);
    state.recordCheck(report, 1500, started + 2000);
    const reply = answer(state, "GET", "/metrics", started + 3000);
    assert.equal(reply.status, 200);
    assert.equal(reply.contentType, "text/plain; version=0.0.4; charset=utf-8");
    assert.ok(reply.body.startsWith(renderPrometheus(report)), reply.body);
    assert.match(reply.body, /^egress_proxies_exporter_checks_total 1$/m);
    assert.match(reply.body, /^egress_proxies_exporter_last_check_duration_seconds 1\.5$/m);
    assert.match(reply.body, /^# TYPE egress_proxies_exporter_checks_total counter$/m);
  });

  it("before the first check, /metrics has only the exporter's own families", () => {
    const body = answer(new ExporterState(60_000, started), "GET", "/metrics", started).body;
    assert.doesNotMatch(body, /egress_proxy_up/);
    assert.match(body, /^egress_proxies_exporter_checks_total 0$/m);
  });

  it("/healthz is 200 while checks finish on schedule and 503 after three missed intervals", () => {
    const state = new ExporterState(60_000, started);
    assert.equal(answer(state, "GET", "/healthz", started + 170_000).status, 200);
    assert.equal(answer(state, "GET", "/healthz", started + 181_000).status, 503);
    state.recordCheck(report, 100, started + 181_000);
    assert.equal(answer(state, "GET", "/healthz", started + 182_000).status, 200);
    // A check that failed to run (the list was unreadable) still shows the loop is alive; the
    // error counter says what went wrong.
    state.recordFailure(started + 400_000);
    assert.equal(answer(state, "GET", "/healthz", started + 401_000).status, 200);
    assert.match(state.metrics(), /^egress_proxies_exporter_check_errors_total 1$/m);
  });

  it("other paths are 404 and other methods 405", () => {
    const state = new ExporterState(60_000, started);
    assert.equal(answer(state, "GET", "/metric", started).status, 404);
    assert.equal(answer(state, "POST", "/metrics", started).status, 405);
    assert.equal(answer(state, "HEAD", "/healthz", started).status, 200);
  });
});
