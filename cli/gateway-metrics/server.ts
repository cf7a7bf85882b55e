/**
 * The HTTP side of `egress-proxies gateway-metrics`:
 *
 *   GET /metrics   the gateway's counters (render.ts)
 *   GET /healthz   200 while the UDP intake is open, else 503
 *
 * on the endpoint both exporters share (cli/metrics-endpoint.ts).
 */
import {
  startMetricsEndpoint,
  type ListenAddress,
  type MetricsEndpoint,
  type Reply,
} from "../metrics-endpoint";
import { bindProblem, GatewayMetricsUsageError, type GatewayCounters } from "./intake";
import { renderGatewayMetrics } from "./render";

export type { ListenAddress, Reply } from "../metrics-endpoint";
export type RunningServer = MetricsEndpoint;

/** The answer to one request; nothing changes. */
export function answer(
  counters: GatewayCounters,
  intakeOpen: boolean,
  method: string,
  path: string,
): Reply {
  const text = "text/plain; charset=utf-8";
  if (method !== "GET" && method !== "HEAD")
    return { status: 405, contentType: text, body: "only GET and HEAD\n" };
  if (path === "/metrics")
    return {
      status: 200,
      contentType: "text/plain; version=0.0.4; charset=utf-8",
      body: renderGatewayMetrics(counters),
    };
  if (path === "/healthz")
    return intakeOpen
      ? { status: 200, contentType: text, body: "ok\n" }
      : { status: 503, contentType: text, body: "the UDP intake is closed\n" };
  if (path === "/")
    return {
      status: 200,
      contentType: text,
      body: "egress-proxies gateway metrics: /metrics, /healthz\n",
    };
  return { status: 404, contentType: text, body: "not found: /metrics or /healthz\n" };
}

export function startServer(
  listen: ListenAddress,
  counters: GatewayCounters,
  intakeOpen: () => boolean,
): Promise<RunningServer> {
  const shown = `${listen.host?.includes(":") ? `[${listen.host}]` : (listen.host ?? "")}:${listen.port}`;
  return startMetricsEndpoint(
    listen,
    (method, path) => answer(counters, intakeOpen(), method, path),
    (error) => new GatewayMetricsUsageError(bindProblem("--listen", shown, error)),
  );
}
