/**
 * `egress-proxies check --serve <host:port>`: the check as a long-lived
 * exporter, the way Prometheus' blackbox exporter watches endpoints. It
 * checks every proxy on an interval and serves the last result:
 *
 *   GET /metrics   the one-shot check's metric families (same names), plus the
 *                  exporter's own: checks run, the last check's duration
 *   GET /healthz   200 while checks keep finishing on schedule, else 503
 *
 * Memory is bounded by design: only the last report is kept, the endpoint
 * (cli/metrics-endpoint.ts) takes a fixed number of connections with short
 * deadlines, and nothing grows with uptime. SIGTERM or SIGINT stops the loop,
 * closes the listener and every open connection, and ends with status 0.
 */
import {
  exporterReply,
  parseListenAddress as parseHostPort,
  startMetricsEndpoint,
  type ListenAddress,
  type Reply,
} from "../metrics-endpoint";
import { renderPrometheus, summarize, summaryLine, type CheckReport } from "./report";

export type { ListenAddress } from "../metrics-endpoint";

export class ServeAddressError extends Error {}

export function parseListenAddress(text: string): ListenAddress {
  const address = parseHostPort(text);
  if (address === undefined)
    throw new ServeAddressError(
      `--serve must be host:port (127.0.0.1:9464, [::1]:9464, or :9464 for every interface), not ${JSON.stringify(text)}`,
    );
  return address;
}

export interface ExporterOptions {
  listen: ListenAddress;
  intervalMs: number;
  /** One full check of every proxy; bounded by the per-proxy --timeout and --concurrency. */
  runCheck(): Promise<CheckReport>;
  /** After each check (the textfile, the EndpointSlice); its failure is logged, never fatal. */
  afterCheck?(report: CheckReport): void | Promise<void>;
  /**
   * Why the exporter is not doing its job yet, if it is not (the slices it
   * owns were never written): /healthz answers 503 with it, so a rollout
   * waits for the new exporter to have written them.
   */
  notReady?(): string | undefined;
  log(line: string): void;
}

/** /healthz turns 503 when no check has finished for this many intervals (the loop is stuck). */
const STALE_INTERVALS = 3;

/**
 * The exporter's state: the last report, counters, and when the next check
 * is due. Pure of I/O so the HTTP answers can be tested alone.
 */
export class ExporterState {
  last: CheckReport | undefined;
  lastDurationSeconds = 0;
  checksCompleted = 0;
  checksFailed = 0;
  lastFinishedMs: number;

  constructor(
    private readonly intervalMs: number,
    private readonly startedMs: number,
    readonly notReady: () => string | undefined = () => undefined,
  ) {
    this.lastFinishedMs = startedMs;
  }

  recordCheck(report: CheckReport, durationMs: number, nowMs: number): void {
    this.last = report;
    this.lastDurationSeconds = durationMs / 1000;
    this.checksCompleted += 1;
    this.lastFinishedMs = nowMs;
  }

  recordFailure(nowMs: number): void {
    this.checksFailed += 1;
    this.lastFinishedMs = nowMs;
  }

  /** Healthy while a check has finished (or the first is still within its grace) recently. */
  healthy(nowMs: number): boolean {
    return nowMs - this.lastFinishedMs <= STALE_INTERVALS * this.intervalMs;
  }

  metrics(): string {
    const own = [
      family(
        "egress_proxies_exporter_checks_total",
        "counter",
        "Checks the exporter ran to the end since it started.",
        this.checksCompleted,
      ),
      family(
        "egress_proxies_exporter_check_errors_total",
        "counter",
        "Checks that could not run (the proxy list could not be read).",
        this.checksFailed,
      ),
      family(
        "egress_proxies_exporter_last_check_duration_seconds",
        "gauge",
        "How long the last check of every proxy took.",
        this.lastDurationSeconds,
      ),
      family(
        "egress_proxies_exporter_start_timestamp_seconds",
        "gauge",
        "When the exporter started, as a Unix time.",
        this.startedMs / 1000,
      ),
    ].join("");
    return (this.last === undefined ? "" : renderPrometheus(this.last)) + own;
  }
}

function family(name: string, type: "counter" | "gauge", help: string, value: number): string {
  return `# HELP ${name} ${help}\n# TYPE ${name} ${type}\n${name} ${value}\n`;
}

/** The answer to one request; no state changes. */
export function answer(state: ExporterState, method: string, path: string, nowMs: number): Reply {
  return exporterReply(
    {
      title: "egress-proxies check exporter",
      metrics: () => state.metrics(),
      unhealthy: () =>
        state.healthy(nowMs)
          ? state.notReady()
          : `no check finished in the last ${STALE_INTERVALS} intervals`,
    },
    method,
    path,
  );
}

/**
 * Runs the exporter until `stop` fires (the command wires SIGTERM and SIGINT
 * to it). Resolves once the listener and every connection are closed; a check
 * still in flight is left to its own per-proxy deadlines.
 */
export async function runExporter(options: ExporterOptions, stop: AbortSignal): Promise<void> {
  const state = new ExporterState(options.intervalMs, Date.now(), options.notReady);
  const address = options.listen;
  const endpoint = await startMetricsEndpoint(
    address,
    (method, path) => answer(state, method, path, Date.now()),
    (error) =>
      new ServeAddressError(
        `--serve ${address.host ?? ""}:${address.port}: cannot listen (${error.code ?? error.message})`,
      ),
  );
  options.log(`serving /metrics and /healthz on ${endpoint.url}`);

  try {
    while (!stop.aborted) {
      const started = Date.now();
      try {
        const report = await options.runCheck();
        state.recordCheck(report, Date.now() - started, Date.now());
        options.log(`${report.checkedAt} ${summaryLine(summarize(report.results))}`);
        try {
          await options.afterCheck?.(report);
        } catch (error) {
          options.log(`after the check: ${(error as Error).message}`);
        }
      } catch (error) {
        state.recordFailure(Date.now());
        options.log(`check failed: ${(error as Error).message}`);
      }
      // Start to start: a check longer than the interval is followed at once by the next.
      await sleep(Math.max(0, options.intervalMs - (Date.now() - started)), stop);
    }
  } finally {
    await endpoint.close();
    options.log("stopped");
  }
}

function sleep(ms: number, stop: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (stop.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      stop.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    stop.addEventListener("abort", done, { once: true });
  });
}
