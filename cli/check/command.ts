/**
 * `egress-proxies check`: are the proxies up, and which address does a
 * target see through each? Reads the endpoints from stack outputs or a
 * published proxies.json, probes every proxy in parallel (bounded) within a
 * deadline each, and reports a table, JSON and/or a Prometheus textfile.
 * Exit 0: all up; 1: some down; 2: usage. See docs/egress.md.
 */
import { randomBytes } from "node:crypto";
import { readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { basename, dirname, join } from "node:path";
import { parseArgs } from "node:util";
import { egressCheckProblems, egressCheckSchema } from "../../provider/common/egress";
import { HOST_PORT, PROXIED_HTTP_URL } from "../../provider/common/inputs";
import type { ProxyCredentials } from "../../provider/common/proxy-probe";
import { probeProxy, type ProbePlan, type ProbeResult } from "./probe";
import {
  CHECK_EXIT,
  exitStatus,
  renderJson,
  renderPrometheus,
  renderTable,
  type CheckReport,
} from "./report";
import { parseServiceRef, ServiceRefError, type ServiceRef } from "./endpointslice";
import { InClusterError, inClusterApi, type KubernetesApi } from "./kube-api";
import { describeSliceRound, writeSlices } from "./slice-owner";
import { parseListenAddress, runExporter, ServeAddressError, type ListenAddress } from "./serve";
import { InputError, targetFromUrl, targetsFromDocument, type ProxyTarget } from "./targets";

export const CHECK_USAGE = `usage: egress-proxies check --target <http://url> [--connect <host:port>]
         [--egress-url <http://url> [--egress-url-ipv6 <http://[v6]/url>] [--egress-field <name>]]
         [--from <file>|- | --proxy <http://[user:pass@]host:port> ...]
         [--user <name>] [--timeout 10] [--concurrency 32] [--json] [--all] [--prometheus <file>]
         [--serve <host:port> [--interval 60] [--endpointslices <namespace>/<service>]]
  Input: \`pulumi stack output --json --show-secrets\` (a file, or stdin) or a published proxies.json;
  without --from or --proxy, stdin is read. Proxies without credentials in their URL use --user and
  the password in $EGRESS_PROXY_PASSWORD.
  Each proxy must: GET --target with a 2xx/3xx answer, open a CONNECT tunnel to --connect, and answer
  with an address from --egress-url (an echo service) — within --timeout seconds. A dual-stack
  member's IPv6 URL is probed as well (metrics carry family="ipv4"|"ipv6"); its egress address comes
  from --egress-url-ipv6 (the echo service by its IPv6 literal) when given, else --egress-url.
  Exit status: 0 all proxies up, 1 some down, 2 usage.
  --serve keeps running as an exporter: checks every --interval seconds and serves /metrics (the same
  metrics as --prometheus) and /healthz on host:port (:port listens on every interface); a --from file
  is read again before each check; SIGTERM or SIGINT ends it with status 0. --endpointslices (in the
  cluster, as the pod's service account) makes the exporter the writer of the Service's EndpointSlices
  <service>-checked (and -checked-ipv6): the members the Secret <service> lists (endpoints.json, read
  every 5 s), each ready as the last check found it.`;

export interface CheckIo {
  out(text: string): void;
  err(text: string): void;
  /** Reads all of stdin (injected so tests need no process). */
  readStdin(): Promise<string>;
  stdinIsTerminal: boolean;
  env: Record<string, string | undefined>;
  /** For --serve: a signal that fires on SIGTERM/SIGINT (installed only when called). */
  stopSignal(): AbortSignal;
}

interface CheckOptions {
  plan: ProbePlan;
  concurrency: number;
  json: boolean;
  all: boolean;
  prometheus?: string;
  /** endpointSlicesOf: the pool's Service whose slices the exporter writes. */
  serve?: { listen: ListenAddress; intervalMs: number; endpointSlicesOf?: ServiceRef };
}

export async function check(argv: string[], io: CheckIo): Promise<number> {
  let parsed: ParsedArgs;
  let targets: ProxyTarget[];
  try {
    const args = parseCheckArgs(argv);
    if (args === "help") {
      io.out(CHECK_USAGE);
      return CHECK_EXIT.healthy;
    }
    parsed = args;
    targets = await readTargets(parsed.sources, parsed.user, io);
  } catch (error) {
    if (!isUsageError(error)) throw error;
    io.err(`egress-proxies check: ${(error as Error).message}\n${CHECK_USAGE}`);
    return CHECK_EXIT.usage;
  }
  const { options } = parsed;
  if (options.serve !== undefined) return serve(parsed, options.serve, targets, io);
  const report = await checkAll(targets, options);
  if (options.prometheus !== undefined)
    writeAtomically(options.prometheus, renderPrometheus(report));
  io.out(options.json ? renderJson(report) : renderTable(report, { all: options.all }));
  return exitStatus(report.results);
}

const isUsageError = (error: unknown): boolean =>
  error instanceof InputError ||
  error instanceof ServeAddressError ||
  error instanceof ServiceRefError ||
  ((error as { code?: string }).code?.startsWith("ERR_PARSE_ARGS") ?? false);

async function checkAll(
  targets: readonly ProxyTarget[],
  options: CheckOptions,
): Promise<CheckReport> {
  const checkedAt = new Date().toISOString();
  const results = await mapWithConcurrency(targets, options.concurrency, (target) =>
    probeProxy(target, options.plan),
  );
  return { checkedAt, results };
}

/**
 * The exporter: the proxy list read from stdin once, from a --from file again
 * before each check (a timer refreshing the stack's outputs into that file
 * is how the list follows the pool).
 */
async function serve(
  parsed: ParsedArgs,
  settings: NonNullable<CheckOptions["serve"]>,
  firstTargets: ProxyTarget[],
  io: CheckIo,
): Promise<number> {
  const { options } = parsed;
  const rereads = parsed.sources.from !== undefined && parsed.sources.from !== "-";
  let targets = firstTargets;
  let slices: SliceWriter | undefined;
  if (settings.endpointSlicesOf !== undefined) {
    let api: KubernetesApi;
    try {
      api = inClusterApi(io.env);
    } catch (error) {
      if (!(error instanceof InClusterError)) throw error;
      io.err(`egress-proxies check: ${error.message}`);
      return CHECK_EXIT.usage;
    }
    slices = new SliceWriter(api, settings.endpointSlicesOf, (line) =>
      io.err(`egress-proxies check: ${line}`),
    );
  }
  const stop = io.stopSignal();
  slices?.start(stop);
  try {
    await runExporter(
      {
        listen: settings.listen,
        intervalMs: settings.intervalMs,
        runCheck: async () => {
          if (rereads) targets = await readTargets(parsed.sources, parsed.user, io);
          return checkAll(targets, options);
        },
        afterCheck: async (report) => {
          if (options.prometheus !== undefined)
            writeAtomically(options.prometheus, renderPrometheus(report));
          await slices?.afterCheck(report);
        },
        ...(slices === undefined ? {} : { notReady: () => slices.notReady() }),
        log: (line) => io.err(`egress-proxies check: ${line}`),
      },
      stop,
    );
  } catch (error) {
    if (!(error instanceof ServeAddressError)) throw error;
    io.err(`egress-proxies check: ${error.message}`);
    return CHECK_EXIT.usage;
  } finally {
    await slices?.stopped();
  }
  return CHECK_EXIT.healthy;
}

/** How often the exporter reads the member list: well inside a drain (30 s by default). */
const SLICE_MEMBERS_POLL_MS = 5_000;

/**
 * The exporter's slice writing: a round after every check (readiness) and
 * every few seconds between them (members the pool added or removed), one
 * round at a time.
 */
class SliceWriter {
  private report: CheckReport | undefined;
  private written = false;
  private lastFailure: string | undefined;
  private queue: Promise<void> = Promise.resolve();
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly api: KubernetesApi,
    private readonly service: ServiceRef,
    private readonly log: (line: string) => void,
  ) {}

  start(stop: AbortSignal): void {
    void this.round();
    this.timer = setInterval(() => void this.round(), SLICE_MEMBERS_POLL_MS);
    stop.addEventListener("abort", () => clearInterval(this.timer), { once: true });
  }

  afterCheck(report: CheckReport): Promise<void> {
    this.report = report;
    return this.round();
  }

  notReady(): string | undefined {
    return this.written
      ? undefined
      : `the EndpointSlices of Service ${this.service.namespace}/${this.service.name} were not written yet`;
  }

  /** Lets a round in flight end (each call has its deadline) before the process exits. */
  async stopped(): Promise<void> {
    clearInterval(this.timer);
    await this.queue;
  }

  private round(): Promise<void> {
    this.queue = this.queue.then(async () => {
      const round = await writeSlices(this.api, this.service, this.report);
      if (round.kind !== "failed") this.written = true;
      // A failure that lasts is said once (rounds come every few seconds), and its end is said too.
      const failure = round.kind === "failed" ? round.reason : undefined;
      if (failure !== undefined && failure === this.lastFailure) return;
      if (failure === undefined && this.lastFailure !== undefined)
        this.log(
          `EndpointSlices of Service ${this.service.namespace}/${this.service.name}: kept current again`,
        );
      this.lastFailure = failure;
      for (const line of describeSliceRound(this.service, round)) this.log(line);
    });
    return this.queue;
  }
}

interface ParsedArgs {
  options: CheckOptions;
  sources: { from?: string; proxies: string[] };
  user?: string;
}

/** --egress-url-ipv6: the same echo service by its IPv6 literal, for proxies reached over IPv6. */
function egressIpv6Of(
  url: string | undefined,
  egress: ProbePlan["egress"],
): ProbePlan["egressIpv6"] {
  if (url === undefined) return undefined;
  if (egress === undefined) throw new InputError("--egress-url-ipv6 needs --egress-url");
  const parsed = egressCheckSchema.shape.ipv6Url.safeParse(url);
  if (!parsed.success)
    throw new InputError(
      parsed.error.issues
        .map((issue) => issue.message.replace("egressCheck.ipv6Url", "--egress-url-ipv6"))
        .join("; "),
    );
  return { ...egress, url };
}

function parseCheckArgs(argv: string[]): ParsedArgs | "help" {
  const { values } = parseArgs({
    args: argv,
    options: {
      target: { type: "string" },
      connect: { type: "string" },
      "egress-url": { type: "string" },
      "egress-field": { type: "string" },
      "egress-url-ipv6": { type: "string" },
      from: { type: "string" },
      proxy: { type: "string", multiple: true, default: [] },
      user: { type: "string" },
      timeout: { type: "string", default: "10" },
      concurrency: { type: "string", default: "32" },
      json: { type: "boolean", default: false },
      all: { type: "boolean", default: false },
      prometheus: { type: "string" },
      serve: { type: "string" },
      interval: { type: "string" },
      endpointslices: { type: "string" },
      // Replaced by --endpointslices; kept to say so.
      endpointslice: { type: "string", multiple: true, default: [] },
      help: { type: "boolean", short: "h", default: false },
    },
    strict: true,
    allowPositionals: false,
  });
  if (values.help) return "help";
  if (values.target === undefined)
    throw new InputError("--target is required: an http:// URL every proxy must fetch");
  if (!PROXIED_HTTP_URL.test(values.target))
    throw new InputError(
      `--target must be an http:// URL without credentials, e.g. http://example.com/`,
    );
  if (values.connect !== undefined && !HOST_PORT.test(values.connect))
    throw new InputError(`--connect must be host:port, e.g. example.com:443`);
  let egress: ProbePlan["egress"];
  if (values["egress-url"] !== undefined) {
    const problems = egressCheckProblems(
      { url: values["egress-url"], field: values["egress-field"] },
      { url: "--egress-url", field: "--egress-field" },
    );
    if (problems.length > 0) throw new InputError(problems.join("; "));
    egress = { url: values["egress-url"], field: values["egress-field"] };
  } else if (values["egress-field"] !== undefined)
    throw new InputError("--egress-field needs --egress-url");
  const egressIpv6 = egressIpv6Of(values["egress-url-ipv6"], egress);
  const timeout = wholeNumber(values.timeout, "--timeout", 1, 600);
  const concurrency = wholeNumber(values.concurrency, "--concurrency", 1, 1024);
  if (values.from !== undefined && values.proxy.length > 0)
    throw new InputError("give --from or --proxy, not both");
  if (values.endpointslice.length > 0)
    throw new InputError(
      "--endpointslice is gone: the exporter now writes the pool's EndpointSlices itself; give --endpointslices <namespace>/<service> (the pool's Service, e.g. crawlers/egress)",
    );
  let serve: CheckOptions["serve"];
  if (values.serve !== undefined) {
    if (values.json)
      throw new InputError("--json prints one check; --serve serves /metrics instead");
    const interval = wholeNumber(values.interval ?? "60", "--interval", 1, 86_400);
    serve = {
      listen: parseListenAddress(values.serve),
      intervalMs: interval * 1000,
      ...(values.endpointslices === undefined
        ? {}
        : { endpointSlicesOf: parseServiceRef(values.endpointslices) }),
    };
  } else if (values.interval !== undefined)
    throw new InputError("--interval needs --serve (a one-shot check runs once)");
  else if (values.endpointslices !== undefined)
    throw new InputError("--endpointslices needs --serve (the exporter keeps the slices current)");
  return {
    options: {
      plan: {
        target: values.target,
        connect: values.connect,
        egress,
        ...(egressIpv6 === undefined ? {} : { egressIpv6 }),
        timeoutMs: timeout * 1000,
      },
      concurrency,
      json: values.json,
      all: values.all,
      prometheus: values.prometheus,
      serve,
    },
    sources: { from: values.from, proxies: values.proxy },
    user: values.user,
  };
}

function wholeNumber(text: string, flag: string, min: number, max: number): number {
  const value = Number(text);
  if (!Number.isInteger(value) || value < min || value > max)
    throw new InputError(`${flag} must be a whole number from ${min} to ${max}`);
  return value;
}

async function readTargets(
  sources: ParsedArgs["sources"],
  user: string | undefined,
  io: CheckIo,
): Promise<ProxyTarget[]> {
  const password = io.env.EGRESS_PROXY_PASSWORD;
  if (user !== undefined && password === undefined)
    throw new InputError(
      "--user needs the password in $EGRESS_PROXY_PASSWORD (never on the command line)",
    );
  const fallback: ProxyCredentials | undefined =
    user === undefined ? undefined : { user, password: password ?? "" };
  if (sources.proxies.length > 0)
    return sources.proxies.map((url, index) =>
      targetFromUrl(url, `--proxy #${index + 1}`, fallback),
    );
  let text: string;
  let source: string;
  if (sources.from === undefined || sources.from === "-") {
    if (sources.from === undefined && io.stdinIsTerminal)
      throw new InputError(
        "no proxies: pipe `pulumi stack output --json --show-secrets` in, or give --from or --proxy",
      );
    text = await io.readStdin();
    source = "stdin";
  } else {
    source = sources.from;
    try {
      text = readFileSync(sources.from, "utf8");
    } catch (error) {
      throw new InputError(`--from ${sources.from}: ${(error as Error).message}`);
    }
  }
  if (text.trim() === "")
    throw new InputError(
      `${source} is empty: pipe \`pulumi stack output --json --show-secrets\` in, or give --from or --proxy`,
    );
  let document: unknown;
  try {
    document = JSON.parse(text);
  } catch (error) {
    throw new InputError(`${source} is not JSON: ${(error as Error).message}`);
  }
  return targetsFromDocument(document, source, fallback);
}

/** Runs `work` over `items` with at most `limit` at a time; results in input order. */
export async function mapWithConcurrency<T, R>(
  items: readonly T[],
  limit: number,
  work: (item: T) => Promise<R>,
): Promise<R[]> {
  const results = new Array<R>(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const index = next++;
      results[index] = await work(items[index]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return results;
}

/**
 * node-exporter's textfile collector may read the file at any moment: write
 * a hidden temporary file in the same directory (same filesystem), then
 * rename it over the target, so a reader sees the old file or the new one.
 */
function writeAtomically(path: string, text: string): void {
  const temporary = join(dirname(path), `.${basename(path)}.${randomBytes(4).toString("hex")}.tmp`);
  try {
    writeFileSync(temporary, text, { mode: 0o644 });
    renameSync(temporary, path);
  } catch (error) {
    rmSync(temporary, { force: true });
    throw error;
  }
}

export type { ProbeResult };
