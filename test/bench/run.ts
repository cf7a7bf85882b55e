/**
 * `npm run bench`: every benchmark of the project, measured side by side with
 * the standard tools in the same run. Select some with
 * `npm run bench -- seed libvirt`; run them under another Node.js major (the
 * floor) with `npm run bench -- --node 22 [suites]` (other-node.ts).
 *
 * The run tells the truth about itself: its first line is
 * `bench node_version=<version>`, then every figure as `bench <key>=<number>`
 * (printBench, measure.ts), and at the end a table of each figure against its
 * goal (goals.ts) with ✔, ✘ or "not run". The same goes to bench-results.json
 * at the repository root (ignored by git): the Node.js version, the date, the
 * machine, every figure and every goal's verdict. A missed goal does not fail
 * the run (benchmarks are noisy); a suite that fails does.
 *
 * Each lab suite brings the lab up itself and stops what it started, so every
 * suite runs from a cold lab as well as a warm one (useLab re-validates the
 * lab between suites). A failing suite does not hide the others' figures: all
 * run, the failures are listed at the end and the exit status is 1.
 */
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { arch, cpus, loadavg, release, totalmem, type } from "node:os";
import { join } from "node:path";
import { runCheckBenchmarks } from "./check";
import { runGatewayBenchmarks } from "./gateway";
import { evaluateGoals, formatGoalTable } from "./goals";
import { runKvmBenchmarks } from "./kvm";
import { runLibvirtBenchmarks } from "./libvirt";
import { printBenchFact, recordedFacts, recordedFigures } from "./measure";
import { currentNodeMajor, parseBenchArgs, runUnderNode } from "./other-node";
import { runPrefixBenchmarks } from "./prefix";
import { runProxmoxBenchmarks } from "./pve";
import { runReaperBenchmarks } from "./reaper";
import { runScaleBenchmarks } from "./scale";
import { runSeedBenchmarks } from "./seed";

const suites: Record<string, () => Promise<void>> = {
  seed: runSeedBenchmarks,
  pve: runProxmoxBenchmarks,
  libvirt: runLibvirtBenchmarks,
  kvm: runKvmBenchmarks,
  reaper: runReaperBenchmarks,
  check: runCheckBenchmarks,
  prefix: runPrefixBenchmarks,
  gateway: runGatewayBenchmarks,
  scale: runScaleBenchmarks,
};

/** dist/test/bench/run.js → the repository root. */
const RESULTS = join(__dirname, "..", "..", "..", "bench-results.json");

/** The checkout measured (`abc1234`, `+dirty` with uncommitted changes); absent outside a git work tree. */
function measuredCommit(): string | undefined {
  const git = (...args: string[]): string =>
    execFileSync("git", args, {
      cwd: join(__dirname, "..", "..", ".."),
      timeout: 5000,
      encoding: "utf8",
    }).trim();
  try {
    const commit = git("rev-parse", "--short", "HEAD");
    return git("status", "--porcelain", "--untracked-files=no") === "" ? commit : `${commit}+dirty`;
  } catch {
    return undefined;
  }
}

async function main(): Promise<void> {
  const { nodeMajor, suites: wanted } = parseBenchArgs(process.argv.slice(2));
  const unknown = wanted.filter((name) => !(name in suites));
  if (unknown.length > 0)
    throw new Error(
      `unknown benchmark ${unknown.join(", ")}; known: ${Object.keys(suites).join(", ")}`,
    );
  if (nodeMajor !== undefined && nodeMajor !== currentNodeMajor()) {
    process.exitCode = await runUnderNode(nodeMajor, __filename, wanted);
    return;
  }
  printBenchFact("node_version", process.versions.node);
  const ran: string[] = [];
  const failed: string[] = [];
  for (const [name, run] of Object.entries(suites)) {
    if (wanted.length > 0 && !wanted.includes(name)) continue;
    ran.push(name);
    console.log(`# ${name}`);
    const started = Date.now();
    try {
      await run();
    } catch (error) {
      failed.push(name);
      console.error(`# ${name} FAILED:`, error);
    }
    console.log(`# ${name} took ${((Date.now() - started) / 1000).toFixed(1)} s`);
  }
  const figures = recordedFigures();
  const goals = evaluateGoals(figures);
  console.log(formatGoalTable(goals));
  const results = {
    node: process.versions.node,
    date: new Date().toISOString(),
    commit: measuredCommit(),
    machine: {
      os: `${type()} ${release()} ${arch()}`,
      cpus: cpus().length,
      cpuModel: cpus()[0]?.model ?? "unknown",
      memoryGiB: Number((totalmem() / 1024 ** 3).toFixed(1)),
      loadAverageAtEnd: loadavg().map((load) => Number(load.toFixed(2))),
    },
    suites: ran,
    failedSuites: failed,
    facts: Object.fromEntries(recordedFacts()),
    figures: Object.fromEntries(figures),
    goals,
  };
  writeFileSync(RESULTS, `${JSON.stringify(results, null, 2)}\n`);
  console.log(`# results in ${RESULTS}`);
  if (failed.length > 0) throw new Error(`benchmark suites failed: ${failed.join(", ")}`);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
