/**
 * `egress-proxies check` against 200 loopback proxies (squid-like servers in
 * a child process, test/bench/check-proxies-child.ts): the whole command as
 * users run it (the built bin, with node's start-up), beside the same
 * command for one proxy and the time one probe takes in-process (HTTP,
 * CONNECT and egress through one proxy). Printed as
 * `bench check_200_proxies_seconds=<x>`, `bench check_1_proxy_seconds=<x>`,
 * `bench check_one_probe_ms=<x>`.
 *
 * The same farm measures a refresh with the egress re-check: StaticProxy's
 * read (egressRecheck on, an egress check through each proxy) for all 200
 * at once, as the engine runs every resource's read in parallel, beside the
 * read of one (`refresh_200_proxies_seconds`, `refresh_1_proxy_seconds`).
 * Their echo service answers after DISTANT_ECHO_MS, as a real one across the
 * internet does: that wait is what a refresh of one proxy costs, and what
 * 200 concurrent reads must share rather than add up. The same 200 against
 * the instant loopback echo (`refresh_200_proxies_loopback_seconds`) is the
 * CPU the re-checks cost on their own.
 */
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { probeProxy } from "../../cli/check/probe";
import { targetFromUrl } from "../../cli/check/targets";
import * as staticProvider from "../../provider/static/provider";
import { median, printBench, timeMsAsync } from "./measure";

const PROXIES = 200;
const BIN = join(__dirname, "..", "..", "cli", "main.js");

interface Farm {
  echo: number;
  distantEcho: number;
  tunnel: number;
  urls: string[];
}

function runCheck(args: string[]): Promise<number> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, "check", ...args], { stdio: "ignore" });
    child.on("error", reject);
    child.on("close", (status) => resolve(status ?? -1));
  });
}

export async function runCheckBenchmarks(): Promise<void> {
  const farm = spawn(
    process.execPath,
    [join(__dirname, "check-proxies-child.js"), String(PROXIES)],
    {
      stdio: ["ignore", "pipe", "inherit"],
    },
  );
  const dir = mkdtempSync(join(tmpdir(), "egress-check-bench-"));
  try {
    const line = await new Promise<string>((resolve, reject) => {
      createInterface({ input: farm.stdout! }).once("line", resolve);
      farm.once("exit", (code) => reject(new Error(`the proxy farm exited (${code})`)));
    });
    const { echo, distantEcho, tunnel, urls } = JSON.parse(line) as Farm;
    const flags = [
      "--target",
      `http://127.0.0.1:${echo}/`,
      "--connect",
      `127.0.0.1:${tunnel}`,
      "--egress-url",
      `http://127.0.0.1:${echo}/json`,
    ];
    const all = join(dir, "all.json");
    const one = join(dir, "one.json");
    writeFileSync(all, JSON.stringify(urls));
    writeFileSync(one, JSON.stringify(urls.slice(0, 1)));

    const probe = targetFromUrl(urls[0]!, "bench");
    const plan = {
      target: `http://127.0.0.1:${echo}/`,
      connect: `127.0.0.1:${tunnel}`,
      egress: { url: `http://127.0.0.1:${echo}/json` },
      timeoutMs: 10_000,
    };
    await probeProxy(probe, plan); // warm-up
    const probes: number[] = [];
    for (let run = 0; run < 20; run++) {
      probes.push(
        await timeMsAsync(async () => {
          const result = await probeProxy(probe, plan);
          if (!result.up) throw new Error(`the probe failed: ${result.error}`);
        }),
      );
    }

    const times = async (file: string) => {
      const runs: number[] = [];
      for (let run = 0; run < 3; run++)
        runs.push(
          await timeMsAsync(async () => {
            const status = await runCheck([...flags, "--from", file, "--json"]);
            if (status !== 0) throw new Error(`check exited ${status}`);
          }),
        );
      return median(runs);
    };
    printBench("check_200_proxies_seconds", (await times(all)) / 1000);
    printBench("check_1_proxy_seconds", (await times(one)) / 1000);
    printBench("check_one_probe_ms", median(probes));
    await refreshBenchmarks(
      urls,
      `http://127.0.0.1:${distantEcho}/json`,
      `http://127.0.0.1:${echo}/json`,
    );
  } finally {
    farm.kill("SIGTERM");
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Each read must re-check and find its proxy answering, or the figure would time a failure. */
async function refreshAll(proxies: { id: string; outs: Record<string, unknown> }[]): Promise<void> {
  const reads = await Promise.all(proxies.map(({ id, outs }) => staticProvider.read(id, outs)));
  for (const read of reads)
    if (read.props?.egressProblem !== null)
      throw new Error(`the re-check failed: ${JSON.stringify(read.props?.egressProblem)}`);
}

async function refreshBenchmarks(
  urls: string[],
  distantEgressUrl: string,
  loopbackEgressUrl: string,
): Promise<void> {
  const owner = { project: "bench", stack: "bench", resource: "static" };
  const created = (egressUrl: string) =>
    Promise.all(
      urls.map((url) =>
        staticProvider.create({ url, egressCheck: { url: egressUrl }, egressRecheck: true, owner }),
      ),
    );
  const proxies = await created(distantEgressUrl);
  const times = async (subset: typeof proxies) => {
    await refreshAll(subset); // warm-up
    const runs: number[] = [];
    for (let run = 0; run < 5; run++) runs.push(await timeMsAsync(() => refreshAll(subset)));
    return median(runs);
  };
  printBench("refresh_200_proxies_seconds", (await times(proxies)) / 1000);
  printBench("refresh_1_proxy_seconds", (await times(proxies.slice(0, 1))) / 1000);
  printBench(
    "refresh_200_proxies_loopback_seconds",
    (await times(await created(loopbackEgressUrl))) / 1000,
  );
}
