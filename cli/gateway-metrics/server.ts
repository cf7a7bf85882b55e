/**
 * The HTTP side of `egress-proxies gateway-metrics`:
 *
 *   GET /metrics   the gateway's counters (render.ts)
 *   GET /healthz   200 while the UDP intake is open, else 503
 *
 * Scrapers are few: the server takes a bounded number of connections, each
 * with short header, request and keep-alive deadlines, so a stuck or flooding
 * client cannot hold memory or the process's exit.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { bindProblem, GatewayMetricsUsageError, type GatewayCounters } from "./intake";
import { renderGatewayMetrics } from "./render";

/** `host:port`, `[v6]:port`, or `:port` for every interface. */
export interface ListenAddress {
  host?: string;
  port: number;
}

const MAX_CONNECTIONS = 64;

export interface Reply {
  status: number;
  contentType: string;
  body: string;
}

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

export interface RunningServer {
  /** `http://host:port` as bound (the real port for port 0). */
  url: string;
  close(): Promise<void>;
}

export function startServer(
  listen: ListenAddress,
  counters: GatewayCounters,
  intakeOpen: () => boolean,
): Promise<RunningServer> {
  const server = createServer(
    { requestTimeout: 10_000, headersTimeout: 5_000, keepAliveTimeout: 5_000 },
    (request: IncomingMessage, response: ServerResponse) => {
      const path = (request.url ?? "/").split("?")[0]!;
      const reply = answer(counters, intakeOpen(), request.method ?? "GET", path);
      response.writeHead(reply.status, {
        "content-type": reply.contentType,
        "content-length": Buffer.byteLength(reply.body),
      });
      response.end(request.method === "HEAD" ? undefined : reply.body);
    },
  );
  server.maxConnections = MAX_CONNECTIONS;
  const shown = `${listen.host?.includes(":") ? `[${listen.host}]` : (listen.host ?? "")}:${listen.port}`;
  return new Promise((resolve, reject) => {
    const failed = (error: NodeJS.ErrnoException) =>
      reject(new GatewayMetricsUsageError(bindProblem("--listen", shown, error)));
    server.once("error", failed);
    server.listen({ port: listen.port, host: listen.host }, () => {
      server.off("error", failed);
      const bound = server.address() as AddressInfo;
      const host = bound.family === "IPv6" ? `[${bound.address}]` : bound.address;
      resolve({ url: `http://${host}:${bound.port}`, close: () => close(server) });
    });
  });
}

function close(server: Server): Promise<void> {
  return new Promise((resolve) => {
    server.close(() => resolve());
    // A scraper's keep-alive connection must not hold the exit.
    server.closeAllConnections();
  });
}
