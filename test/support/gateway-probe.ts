/**
 * A client of the gateway, run inside the test's network namespace (the
 * gateway, its members and the echo service live there): reads one JSON
 * request from stdin, sends the requests it lists through a proxy, `concurrency`
 * at a time, plain HTTP or CONNECT, and prints one JSON result on stdout:
 * per request its user, status, the exit address the echo service saw, and
 * when it started and how long it took.
 */
import * as http from "node:http";

export interface ProbeCall {
  user: string;
  password: string;
  /** "http": an absolute-URI GET through the proxy; "connect": a CONNECT tunnel with a GET inside. */
  mode: "http" | "connect";
}

export interface GatewayProbeRequest {
  proxy: { host: string; port: number };
  /** The echo service, host:port (it answers with the caller's address). */
  target: string;
  calls: ProbeCall[];
  concurrency: number;
  /** Spread the calls over about this many milliseconds (0: as fast as they go). */
  spreadMs?: number;
  timeoutMs?: number;
}

export interface ProbeOutcome {
  user: string;
  status: number;
  /** What the echo service saw; "" when no answer came through. */
  exit: string;
  startedAt: number;
  ms: number;
  error?: string;
}

const basic = (user: string, password: string) =>
  "Basic " + Buffer.from(`${user}:${password}`).toString("base64");

function viaHttp(
  request: GatewayProbeRequest,
  call: ProbeCall,
  agent: http.Agent,
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const outgoing = http.request(
      {
        host: request.proxy.host,
        port: request.proxy.port,
        path: `http://${request.target}/`,
        agent,
        headers: { "proxy-authorization": basic(call.user, call.password), host: request.target },
        timeout: request.timeoutMs ?? 10_000,
      },
      (response) => {
        let body = "";
        response.setEncoding("utf8");
        response.on("data", (chunk: string) => (body += chunk));
        response.on("end", () => resolve({ status: response.statusCode ?? 0, body }));
        response.on("error", reject);
      },
    );
    outgoing.on("timeout", () => outgoing.destroy(new Error("timed out")));
    outgoing.on("error", reject);
    outgoing.end();
  });
}

function viaConnect(
  request: GatewayProbeRequest,
  call: ProbeCall,
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const outgoing = http.request({
      host: request.proxy.host,
      port: request.proxy.port,
      method: "CONNECT",
      path: request.target,
      headers: { "proxy-authorization": basic(call.user, call.password), host: request.target },
      timeout: request.timeoutMs ?? 10_000,
    });
    outgoing.on("timeout", () => outgoing.destroy(new Error("timed out")));
    outgoing.on("error", reject);
    outgoing.on("connect", (response, socket) => {
      if (response.statusCode !== 200) {
        socket.destroy();
        resolve({ status: response.statusCode ?? 0, body: "" });
        return;
      }
      let raw = "";
      socket.setEncoding("utf8");
      socket.on("data", (chunk: string) => (raw += chunk));
      socket.on("error", reject);
      socket.on("end", () => {
        const [head = "", body = ""] = raw.split("\r\n\r\n");
        resolve({ status: Number(/^HTTP\/1\.[01] (\d{3})/.exec(head)?.[1] ?? 0), body });
      });
      socket.write(`GET / HTTP/1.1\r\nHost: ${request.target}\r\nConnection: close\r\n\r\n`);
    });
    outgoing.end();
  });
}

export async function runProbe(request: GatewayProbeRequest): Promise<ProbeOutcome[]> {
  const agent = new http.Agent({ keepAlive: true, maxSockets: request.concurrency });
  const outcomes: ProbeOutcome[] = new Array(request.calls.length);
  const began = Date.now();
  const gapMs = request.spreadMs ? request.spreadMs / request.calls.length : 0;
  let next = 0;
  const worker = async () => {
    while (next < request.calls.length) {
      const index = next++;
      const call = request.calls[index]!;
      const due = began + index * gapMs;
      if (due > Date.now()) await new Promise((wake) => setTimeout(wake, due - Date.now()));
      const startedAt = Date.now();
      const started = process.hrtime.bigint();
      try {
        const { status, body } =
          call.mode === "http"
            ? await viaHttp(request, call, agent)
            : await viaConnect(request, call);
        const ms = Number(process.hrtime.bigint() - started) / 1e6;
        outcomes[index] = {
          user: call.user,
          status,
          exit: status === 200 ? body.trim() : "",
          startedAt,
          ms,
        };
      } catch (error) {
        const ms = Number(process.hrtime.bigint() - started) / 1e6;
        outcomes[index] = {
          user: call.user,
          status: 0,
          exit: "",
          startedAt,
          ms,
          error: String(error),
        };
      }
    }
  };
  await Promise.all(Array.from({ length: request.concurrency }, worker));
  agent.destroy();
  return outcomes;
}

async function readStdin(): Promise<string> {
  let text = "";
  for await (const chunk of process.stdin) text += String(chunk);
  return text;
}

if (require.main === module)
  readStdin()
    .then((text) => runProbe(JSON.parse(text) as GatewayProbeRequest))
    .then(
      (outcomes) => process.stdout.write(JSON.stringify(outcomes)),
      (error: unknown) => {
        process.stderr.write(`gateway probe: ${String(error)}\n`);
        process.exit(1);
      },
    );
