/**
 * The HTTP side of `egress-proxies gateway-metrics`:
 *
 *   GET /metrics   the gateway's counters (render.ts)
 *   GET /healthz   200 while the UDP intake is open, else 503
 *
 * on the endpoint both exporters share (cli/metrics-endpoint.ts).
 */
import {
  exporterReply,
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
  return exporterReply(
    {
      title: "egress-proxies gateway metrics",
      metrics: () => renderGatewayMetrics(counters),
      unhealthy: () => (intakeOpen ? undefined : "the UDP intake is closed"),
    },
    method,
    path,
  );
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
