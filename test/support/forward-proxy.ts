/**
 * Small squid-like servers for tests and benchmarks, on loopback only:
 * - a forward proxy: absolute-form GET forwarded to the target, CONNECT
 *   tunnels, optional basic auth (407 + Proxy-Authenticate like squid), and an
 *   outgoing source address of its choice, so several proxies can leave from
 *   one "NAT" address or from their own (127.0.0.x);
 * - an echo service answering with the caller's address (plain text at /,
 *   JSON at /json);
 * - a silent server that accepts and never answers (a paused VM's squid).
 */
import { createServer, request, type IncomingMessage, type Server } from "node:http";
import {
  connect,
  createServer as createTcpServer,
  type Server as TcpServer,
  type Socket,
} from "node:net";

export interface RunningServer {
  host: string;
  port: number;
  close(): Promise<void>;
}

function listen(
  server: Server | TcpServer,
  host: string,
  sockets: Set<Socket>,
  port = 0,
): Promise<RunningServer> {
  server.on("connection", (socket: Socket) => {
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      const address = server.address();
      if (address === null || typeof address === "string") throw new Error("no port");
      resolve({
        host,
        port: address.port,
        close: () =>
          new Promise<void>((done) => {
            for (const socket of sockets) socket.destroy();
            server.close(() => done());
          }),
      });
    });
  });
}

export interface ForwardProxyOptions {
  host: string;
  /** Require these credentials (squid's basic_ncsa_auth). */
  auth?: { user: string; password: string };
  /**
   * Source address of outgoing connections (the "egress"); default: the
   * kernel's choice. A function is asked once per request, each then on a
   * connection of its own (a prefix dialer's spread).
   */
  egressAddress?: string | (() => string);
  /** Listen on this port (a proxy started again where another one was); default: any free port. */
  port?: number;
}

export interface ForwardProxy extends RunningServer {
  /** Requests and tunnels served (auth failures included). */
  served: number;
}

/** Where one upstream connection leaves from; a source per request needs a connection per request. */
function upstreamSource(options: ForwardProxyOptions): { localAddress?: string; agent?: false } {
  const source = options.egressAddress;
  if (typeof source === "function") return { localAddress: source(), agent: false };
  return source === undefined ? {} : { localAddress: source };
}

export async function startForwardProxy(options: ForwardProxyOptions): Promise<ForwardProxy> {
  const expected =
    options.auth === undefined
      ? undefined
      : `Basic ${Buffer.from(`${options.auth.user}:${options.auth.password}`).toString("base64")}`;
  const authorized = (req: IncomingMessage) =>
    expected === undefined || req.headers["proxy-authorization"] === expected;
  const sockets = new Set<Socket>();
  const stats = { served: 0 };
  const server = createServer((req, res) => {
    stats.served++;
    if (!authorized(req)) {
      res.writeHead(407, {
        "proxy-authenticate": 'Basic realm="egress"',
        "content-type": "text/plain",
      });
      res.end("Cache Access Denied.\n");
      return;
    }
    let target: URL;
    try {
      target = new URL(req.url ?? "");
    } catch {
      res.writeHead(400).end("Invalid URL\n");
      return;
    }
    const headers = { ...req.headers };
    delete headers["proxy-authorization"];
    const upstream = request(
      {
        host: target.hostname.replace(/^\[|\]$/g, ""),
        port: target.port === "" ? 80 : Number(target.port),
        path: `${target.pathname}${target.search}`,
        method: req.method,
        headers,
        ...upstreamSource(options),
        timeout: 10_000,
      },
      (answer) => {
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    upstream.on("timeout", () => upstream.destroy(new Error("upstream timeout")));
    upstream.on("error", (error) => {
      if (!res.headersSent) res.writeHead(502, { "content-type": "text/plain" });
      res.end(`upstream: ${error.message}\n`);
    });
    req.pipe(upstream);
  });
  server.on("connect", (req: IncomingMessage, client: Socket, head: Buffer) => {
    stats.served++;
    if (!authorized(req)) {
      client.end(
        'HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm="egress"\r\n\r\n',
      );
      return;
    }
    const [host, port] = splitAuthority(req.url ?? "");
    const upstream = connect({ host, port, localAddress: upstreamSource(options).localAddress });
    upstream.once("connect", () => {
      client.write("HTTP/1.1 200 Connection established\r\n\r\n");
      if (head.length > 0) upstream.write(head);
      upstream.pipe(client);
      client.pipe(upstream);
    });
    upstream.on("error", () => client.end("HTTP/1.1 503 Service Unavailable\r\n\r\n"));
    client.on("error", () => upstream.destroy());
  });
  const running = await listen(server, options.host, sockets, options.port);
  return Object.defineProperty(running, "served", { get: () => stats.served }) as ForwardProxy;
}

function splitAuthority(authority: string): [string, number] {
  const at = authority.lastIndexOf(":");
  return [authority.slice(0, at).replace(/^\[(.*)\]$/, "$1"), Number(authority.slice(at + 1))];
}

/**
 * Answers with the caller's address: plain text at /, `{"ip": ...}` at /json;
 * after `delayMs` when given (an echo service across the internet).
 */
export function startEchoServer(host: string, delayMs = 0): Promise<RunningServer> {
  const server = createServer(async (req, res) => {
    if (delayMs > 0) await new Promise((resolve) => setTimeout(resolve, delayMs));
    const caller = (req.socket.remoteAddress ?? "").replace(/^::ffff:/, "");
    // No reuse: a proxy that kept its connection would keep the source address NAT gave it first.
    res.setHeader("connection", "close");
    if (req.url?.startsWith("/json")) {
      res.writeHead(200, { "content-type": "application/json" });
      res.end(JSON.stringify({ ip: caller }));
    } else {
      res.writeHead(200, { "content-type": "text/plain" });
      res.end(`${caller}\n`);
    }
  });
  return listen(server, host, new Set());
}

/** Accepts connections and never answers: what a paused VM's proxy looks like from outside. */
export function startSilentServer(host: string): Promise<RunningServer> {
  return listen(
    createTcpServer(() => undefined),
    host,
    new Set(),
  );
}

/** A TCP server that accepts every connection and echoes bytes (a CONNECT target). */
export function startTcpEchoServer(host: string): Promise<RunningServer> {
  return listen(
    createTcpServer((socket) => socket.pipe(socket)),
    host,
    new Set(),
  );
}

/** An absolute-form GET through the proxy, with Proxy-Authorization when credentials are given. */
export function getThroughProxy(
  proxy: { host: string; port: number },
  targetUrl: string,
  credentials?: { user: string; password: string },
): Promise<{ status: number; body: string }> {
  const headers: Record<string, string> = { host: new URL(targetUrl).host };
  if (credentials !== undefined)
    headers["proxy-authorization"] =
      "Basic " + Buffer.from(`${credentials.user}:${credentials.password}`).toString("base64");
  return new Promise((resolveResponse, reject) => {
    const req = request(
      {
        host: proxy.host,
        port: proxy.port,
        method: "GET",
        path: targetUrl,
        headers,
        timeout: 10_000,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (chunk: Buffer) => chunks.push(chunk));
        res.on("end", () =>
          resolveResponse({
            status: res.statusCode ?? 0,
            body: Buffer.concat(chunks).toString("utf8"),
          }),
        );
        res.on("error", reject);
      },
    );
    req.on("timeout", () => req.destroy(new Error("no answer from the proxy within 10 s")));
    req.on("error", reject);
    req.end();
  });
}
