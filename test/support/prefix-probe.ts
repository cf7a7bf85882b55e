/**
 * The client side of the prefix dialer's namespace test, run inside that
 * namespace (`ip netns exec … node prefix-probe.js '<spec>'`): starts an echo
 * service on the given address (it answers with the caller's address), sends
 * the listed requests — plain HTTP through the dialer, CONNECT through it, or
 * straight to the echo service — with bounded concurrency, and prints one JSON
 * line: the source address the echo service saw for each request, in order,
 * and each request's wall time.
 */
import { request } from "node:http";
import { startEchoServer } from "./forward-proxy";

export interface ProbeRequest {
  via: "http" | "connect" | "direct";
  /** Sent as Proxy-Authorization: Basic (what squid passes on with login=PASSTHRU). */
  user?: string;
  /** Sent as X-Egress-Prefix-Client (what squid adds from the client's address). */
  client?: string;
}

export interface ProbeSpec {
  dialerPort: number;
  echoHost: string;
  concurrency: number;
  requests: ProbeRequest[];
}

export interface ProbeResult {
  sources: string[];
  elapsedMs: number[];
}

const DEADLINE_MS = 10_000;

function headersOf(probe: ProbeRequest): Record<string, string> {
  const headers: Record<string, string> = {};
  if (probe.user !== undefined)
    headers["proxy-authorization"] =
      `Basic ${Buffer.from(`${probe.user}:probe-password`).toString("base64")}`;
  if (probe.client !== undefined) headers["x-egress-prefix-client"] = probe.client;
  return headers;
}

function once(spec: ProbeSpec, echoPort: number, probe: ProbeRequest): Promise<string> {
  const host = spec.echoHost.includes(":") ? `[${spec.echoHost}]` : spec.echoHost;
  const authority = `${host}:${echoPort}`;
  return new Promise((resolve, reject) => {
    const fail = (error: Error) => reject(error);
    if (probe.via === "connect") {
      const tunnel = request({
        host: "127.0.0.1",
        port: spec.dialerPort,
        method: "CONNECT",
        path: authority,
        agent: false,
        headers: headersOf(probe),
        timeout: DEADLINE_MS,
      });
      tunnel.on("connect", (response, socket) => {
        if (response.statusCode !== 200) {
          socket.destroy();
          return reject(new Error(`CONNECT answered ${response.statusCode}`));
        }
        let text = "";
        socket.setEncoding("utf8");
        socket.on("data", (chunk: string) => (text += chunk));
        socket.on("end", () => resolve(text.split("\r\n\r\n").slice(1).join("").trim()));
        socket.on("error", fail);
        // HTTP/1.0: the answer is not chunked, so its body is the address as written.
        socket.write(`GET / HTTP/1.0\r\nHost: ${authority}\r\n\r\n`);
      });
      tunnel.on("timeout", () => tunnel.destroy(new Error("CONNECT timed out")));
      tunnel.on("error", fail);
      tunnel.end();
      return;
    }
    const direct = probe.via === "direct";
    const req = request({
      host: direct ? spec.echoHost : "127.0.0.1",
      port: direct ? echoPort : spec.dialerPort,
      path: direct ? "/" : `http://${authority}/`,
      agent: false,
      headers: headersOf(probe),
      timeout: DEADLINE_MS,
    });
    req.on("response", (response) => {
      let text = "";
      response.setEncoding("utf8");
      response.on("data", (chunk: string) => (text += chunk));
      response.on("end", () =>
        response.statusCode === 200
          ? resolve(text.trim())
          : reject(new Error(`answered ${response.statusCode}: ${text.trim()}`)),
      );
    });
    req.on("timeout", () => req.destroy(new Error("request timed out")));
    req.on("error", fail);
    req.end();
  });
}

async function main(): Promise<void> {
  const spec = JSON.parse(process.argv[2] ?? "") as ProbeSpec;
  const echo = await startEchoServer(spec.echoHost);
  try {
    const result: ProbeResult = { sources: [], elapsedMs: [] };
    let next = 0;
    const worker = async () => {
      while (next < spec.requests.length) {
        const index = next++;
        const started = process.hrtime.bigint();
        result.sources[index] = await once(spec, echo.port, spec.requests[index]!);
        result.elapsedMs[index] = Number(process.hrtime.bigint() - started) / 1e6;
      }
    };
    await Promise.all(Array.from({ length: spec.concurrency }, worker));
    process.stdout.write(`${JSON.stringify(result)}\n`);
  } finally {
    await echo.close();
  }
}

main().catch((error: unknown) => {
  process.stderr.write(`prefix-probe: ${(error as Error).message}\n`);
  process.exit(1);
});
