/**
 * `egress-proxies gateway-metrics`: per-member and per-user counts of the
 * pool's gateway, for Prometheus. It runs beside squid (a sidecar in the
 * gateway's pod, components/gateway-kubernetes.ts), takes squid's access-log
 * lines over UDP (intake.ts) and serves the counters on /metrics (server.ts).
 * Counters live in this process: they start at zero with it, which
 * Prometheus' rate() reads as a counter reset.
 * Exit status: 0 stopped by SIGTERM or SIGINT, 2 usage (a flag, an address
 * that cannot be bound).
 */
import { isIP } from "node:net";
import { parseArgs } from "node:util";
import {
  GatewayCounters,
  GatewayMetricsUsageError,
  startIntake,
  type RunningIntake,
  type UdpAddress,
} from "./intake";
import { parseListenAddress as parseHostPort, type ListenAddress } from "../metrics-endpoint";
import { startServer, type RunningServer } from "./server";

export const GATEWAY_METRICS_USAGE = `usage: egress-proxies gateway-metrics --udp <ip:port> --listen <host:port>
  Counts the requests of the pool's gateway from squid's access log and serves them for Prometheus.
  --udp      where squid sends its log lines (squid.conf: access_log udp://<ip:port> egress_gateway),
             an IP address of this host and a port, e.g. 127.0.0.1:5140 or [::1]:5140
  --listen   where /metrics and /healthz are served: host:port, [v6]:port, or :port for every
             interface, e.g. 0.0.0.0:9102
  Metrics: egress_gateway_requests_total{member,user,result}, egress_gateway_response_bytes_total
  {member,user}, egress_gateway_refused_total{user}, egress_gateway_session_requests_total{member},
  egress_gateway_log_lines_unreadable_total; user is the base user (no session id, no pin).
  SIGTERM or SIGINT ends it with status 0.`;

const EXIT = { stopped: 0, usage: 2 } as const;

export interface GatewayMetricsIo {
  out(text: string): void;
  err(text: string): void;
  /** Fires on SIGTERM/SIGINT (installed only when called). */
  stopSignal(): AbortSignal;
}

/** `--udp`: squid sends to an address, so an IP literal and a port, both given. */
export function parseUdpAddress(text: string): UdpAddress {
  const address = parseHostPort(text);
  const host = address?.host ?? "";
  const port = address?.port ?? 0;
  if (isIP(host) === 0 || !(port >= 1 && port <= 65535))
    throw new GatewayMetricsUsageError(
      `--udp must be an IP address of this host and a port, the one squid's access_log udp:// sends to (127.0.0.1:5140, [::1]:5140), not ${JSON.stringify(text)}`,
    );
  return { host, port };
}

/** `--listen`: as `check --serve` takes it; port 0 asks the system for a free one. */
export function parseListenAddress(text: string): ListenAddress {
  const address = parseHostPort(text);
  if (address === undefined)
    throw new GatewayMetricsUsageError(
      `--listen must be host:port (0.0.0.0:9102, [::1]:9102, or :9102 for every interface), not ${JSON.stringify(text)}`,
    );
  return address;
}

function parseCommandArgs(argv: string[]): { udp: UdpAddress; listen: ListenAddress } | "help" {
  let values: { udp?: string; listen?: string; help?: boolean };
  try {
    values = parseArgs({
      args: argv,
      options: {
        udp: { type: "string" },
        listen: { type: "string" },
        help: { type: "boolean", short: "h", default: false },
      },
      strict: true,
      allowPositionals: false,
    }).values;
  } catch (error) {
    throw new GatewayMetricsUsageError((error as Error).message);
  }
  if (values.help) return "help";
  if (values.udp === undefined)
    throw new GatewayMetricsUsageError(
      "--udp is required: the ip:port squid sends its access log to, e.g. 127.0.0.1:5140",
    );
  if (values.listen === undefined)
    throw new GatewayMetricsUsageError(
      "--listen is required: the host:port to serve /metrics on, e.g. 0.0.0.0:9102",
    );
  return { udp: parseUdpAddress(values.udp), listen: parseListenAddress(values.listen) };
}

export async function gatewayMetrics(argv: string[], io: GatewayMetricsIo): Promise<number> {
  const log = (line: string) => io.err(`egress-proxies gateway-metrics: ${line}`);
  let intake: RunningIntake | undefined;
  let server: RunningServer | undefined;
  try {
    const args = parseCommandArgs(argv);
    if (args === "help") {
      io.out(GATEWAY_METRICS_USAGE);
      return EXIT.stopped;
    }
    const stop = io.stopSignal();
    const counters = new GatewayCounters();
    intake = await startIntake(args.udp, counters, log);
    const running = intake;
    server = await startServer(args.listen, counters, () => running.open());
    log(
      `counting squid's log lines from udp://${args.udp.host.includes(":") ? `[${args.udp.host}]` : args.udp.host}:${intake.port}; serving /metrics and /healthz on ${server.url}`,
    );
    await new Promise<void>((resolve) =>
      stop.aborted ? resolve() : stop.addEventListener("abort", () => resolve(), { once: true }),
    );
    log("stopped");
    return EXIT.stopped;
  } catch (error) {
    if (!(error instanceof GatewayMetricsUsageError)) throw error;
    io.err(`egress-proxies gateway-metrics: ${error.message}\n${GATEWAY_METRICS_USAGE}`);
    return EXIT.usage;
  } finally {
    await server?.close();
    await intake?.close();
  }
}
