/**
 * Drives `egress-proxies check --serve` as users run it: the built bin as a
 * child process (stopped by the test that started it), its listening address
 * read from its log, /metrics scraped until a check newer than a given one.
 */
import { spawn, type ChildProcessWithoutNullStreams } from "node:child_process";
import { join } from "node:path";

export const CHECK_BIN = join(__dirname, "..", "..", "cli", "main.js");

export interface RunningExporter {
  base: string;
  child: ChildProcessWithoutNullStreams;
  stderr(): string;
  /** Resolves with the exit status (null when a signal ended it). */
  exited: Promise<number | null>;
  /** /metrics once at least `checks + 1` checks have finished. */
  scrapeAfter(checks: number, deadlineMs?: number): Promise<string>;
  /** SIGTERM, then the exit status, or "hung" after `graceMs`; SIGKILL if it hung. */
  terminate(graceMs?: number): Promise<number | null | "hung">;
}

export async function httpGet(url: string): Promise<{ status: number; body: string }> {
  const response = await fetch(url, { signal: AbortSignal.timeout(5000) });
  return { status: response.status, body: await response.text() };
}

/** The value of an unlabelled sample, e.g. `egress_proxies_up`. */
export const sample = (metrics: string, name: string): number | undefined => {
  const line = metrics.split("\n").find((l) => l.startsWith(`${name} `));
  return line === undefined ? undefined : Number(line.slice(name.length + 1));
};

/** `egress_proxy_up` of the proxy named `proxy`. */
export const proxyUp = (metrics: string, proxy: string): number | undefined => {
  const line = metrics
    .split("\n")
    .find((l) => l.startsWith("egress_proxy_up{") && l.includes(`proxy="${proxy}"`));
  return line === undefined ? undefined : Number(line.split(" ").at(-1));
};

export async function until<T>(
  what: string,
  deadlineMs: number,
  probe: () => Promise<T | undefined>,
): Promise<T> {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > end) throw new Error(`${what} did not happen within ${deadlineMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

/** Starts `egress-proxies check --serve 127.0.0.1:0 <args>` with `stdin` and waits until it listens. */
export async function startExporter(
  args: string[],
  stdin = "",
  env: Record<string, string> = {},
): Promise<RunningExporter> {
  const child = spawn(process.execPath, [CHECK_BIN, "check", "--serve", "127.0.0.1:0", ...args], {
    stdio: ["pipe", "pipe", "pipe"],
    env: { ...process.env, ...env },
  });
  let log = "";
  child.stderr.on("data", (chunk: Buffer) => (log += chunk.toString()));
  child.stdout.resume();
  const exited = new Promise<number | null>((resolve) => child.on("close", resolve));
  child.stdin.end(stdin);
  try {
    const base = await until("the exporter's listening line", 15_000, async () => {
      if (child.exitCode !== null) throw new Error(`the exporter exited: ${log}`);
      return /serving \/metrics and \/healthz on (http:\/\/127\.0\.0\.1:\d+)/.exec(log)?.[1];
    });
    return {
      base,
      child,
      stderr: () => log,
      exited,
      scrapeAfter: (checks, deadlineMs = 30_000) =>
        until(`check #${checks + 1}`, deadlineMs, async () => {
          const { status, body } = await httpGet(`${base}/metrics`);
          if (status !== 200) throw new Error(`/metrics answered ${status}`);
          const done = sample(body, "egress_proxies_exporter_checks_total") ?? 0;
          return done > checks ? body : undefined;
        }),
      terminate: async (graceMs = 10_000) => {
        child.kill("SIGTERM");
        const status = await Promise.race([
          exited,
          new Promise<"hung">((resolve) => setTimeout(() => resolve("hung"), graceMs)),
        ]);
        if (status === "hung") child.kill("SIGKILL");
        return status;
      },
    };
  } catch (error) {
    child.kill("SIGKILL");
    throw error;
  }
}
