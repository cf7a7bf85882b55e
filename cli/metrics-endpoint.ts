/**
 * The HTTP endpoint both of our exporters serve (`check --serve`,
 * `gateway-metrics`): their own `/metrics` and `/healthz` answers, on a
 * server whose scrapers are few. It takes a bounded number of connections,
 * each with short header, request and keep-alive deadlines, so a stuck or
 * flooding client can hold neither memory nor the process's exit.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

/** The listening address, as the user wrote it: `host:port`, `[v6]:port`, or `:port` for every interface. */
export interface ListenAddress {
  host?: string;
  port: number;
}

/** One answer of the endpoint. */
export interface Reply {
  status: number;
  contentType: string;
  body: string;
}

export interface MetricsEndpoint {
  /** `http://host:port` as bound (the real port for port 0). */
  url: string;
  close(): Promise<void>;
}

/** What an exporter serves: its metrics, its health, and its name for `GET /`. */
export interface Exporter {
  title: string;
  metrics(): string;
  /** Why it is not healthy now (the 503's body); undefined when it is. */
  unhealthy(): string | undefined;
}

/** The answer to one request: GET or HEAD of /metrics, /healthz or /; nothing changes. */
export function exporterReply(exporter: Exporter, method: string, path: string): Reply {
  const text = "text/plain; charset=utf-8";
  if (method !== "GET" && method !== "HEAD")
    return { status: 405, contentType: text, body: "only GET and HEAD\n" };
  if (path === "/metrics")
    return {
      status: 200,
      contentType: "text/plain; version=0.0.4; charset=utf-8",
      body: exporter.metrics(),
    };
  if (path === "/healthz") {
    const why = exporter.unhealthy();
    return why === undefined
      ? { status: 200, contentType: text, body: "ok\n" }
      : { status: 503, contentType: text, body: `${why}\n` };
  }
  if (path === "/")
    return { status: 200, contentType: text, body: `${exporter.title}: /metrics, /healthz\n` };
  return { status: 404, contentType: text, body: "not found: /metrics or /healthz\n" };
}

const HOST_PORT = /^(?:\[([0-9a-fA-F:.]+)\]|([^\s:/@[\]]*)):(\d{1,5})$/;
const MAX_CONNECTIONS = 64;

/** `text` as a listening address, or undefined when it is none (the caller names its flag and the fix). */
export function parseListenAddress(text: string): ListenAddress | undefined {
  const match = HOST_PORT.exec(text);
  const port = Number(match?.[3]);
  if (match === null || port > 65535) return undefined;
  const host = match[1] ?? match[2];
  return host === undefined || host === "" ? { port } : { host, port };
}

/** Serves `answer` on `listen`; `cannotListen` turns a bind failure into the command's own error. */
export function startMetricsEndpoint(
  listen: ListenAddress,
  answer: (method: string, path: string) => Reply,
  cannotListen: (error: NodeJS.ErrnoException) => Error,
): Promise<MetricsEndpoint> {
  const server = createServer(
    { requestTimeout: 10_000, headersTimeout: 5_000, keepAliveTimeout: 5_000 },
    (request: IncomingMessage, response: ServerResponse) => {
      const path = (request.url ?? "/").split("?")[0]!;
      const reply = answer(request.method ?? "GET", path);
      response.writeHead(reply.status, {
        "content-type": reply.contentType,
        "content-length": Buffer.byteLength(reply.body),
      });
      response.end(request.method === "HEAD" ? undefined : reply.body);
    },
  );
  server.maxConnections = MAX_CONNECTIONS;
  return new Promise((resolve, reject) => {
    const failed = (error: NodeJS.ErrnoException) => reject(cannotListen(error));
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
