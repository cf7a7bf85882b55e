/**
 * The bench's proxy farm, in its own process so its work does not share the
 * checker's event loop: an echo service and N squid-like forward proxies on
 * loopback (127.0.1.x, then 127.0.2.x past 254, each leaving from its own
 * address), with basic auth. Prints `{"echo": <port>, "urls": [...]}` (and
 * the distant and slow echoes' ports) and runs until SIGTERM.
 */
import { startEchoServer, startForwardProxy, startTcpEchoServer } from "../support/forward-proxy";

export const BENCH_AUTH = { user: "bench", password: "bench password" };
/** An echo service's answer time from a data centre (ipify and the like: tens of milliseconds). */
export const DISTANT_ECHO_MS = 50;
/** The scale bench's slow echo: each request waits this long (test/bench/scale-static.ts). */
export const SLOW_ECHO_MS = 200;

/** Proxy `index`'s own loopback address: 127.0.1.1–254 for the first 254, then 127.0.2.x and on. */
export const farmHost = (index: number): string =>
  `127.0.${1 + Math.floor(index / 254)}.${(index % 254) + 1}`;

async function main(): Promise<void> {
  const count = Number(process.argv[2] ?? "200");
  const echo = await startEchoServer("127.0.0.1");
  // The refresh bench's echo answers as one across the internet would (test/bench/check.ts).
  const distantEcho = await startEchoServer("127.0.0.1", DISTANT_ECHO_MS);
  const slowEcho = await startEchoServer("127.0.0.1", SLOW_ECHO_MS);
  const tunnel = await startTcpEchoServer("127.0.0.1");
  const urls: string[] = [];
  for (let index = 0; index < count; index++) {
    const host = farmHost(index);
    const proxy = await startForwardProxy({ host, auth: BENCH_AUTH, egressAddress: host });
    urls.push(
      `http://${BENCH_AUTH.user}:${encodeURIComponent(BENCH_AUTH.password)}@${host}:${proxy.port}`,
    );
  }
  process.stdout.write(
    `${JSON.stringify({ echo: echo.port, distantEcho: distantEcho.port, slowEcho: slowEcho.port, tunnel: tunnel.port, urls })}\n`,
  );
  process.on("SIGTERM", () => process.exit(0));
}

if (require.main === module)
  main().catch((error: unknown) => {
    process.stderr.write(`check-proxies-child: ${(error as Error).message}\n`);
    process.exit(1);
  });
