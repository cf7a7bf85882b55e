/**
 * The test command (`npm test`, after `npm run build`) and its fast inner
 * loop (`npm run test:quick`).
 *
 * Full run (root): removes a lab left by a killed earlier run, snapshots the
 * machine (test/machine-state.sh), then runs two lanes side by side:
 *   - the lab lane: both lab profiles and the guest image are prepared once,
 *     then the lab suites run (they share the labs; each removes its guests);
 *   - the other lane: lint, the quick suites in parallel shards and the root
 *     suites at nice 10, then the floor run (test/floor/run.sh: the lowest
 *     claimed Node.js and SDKs).
 * Whatever happens (a failure, Ctrl-C, SIGTERM), it then tears both labs down
 * completely, snapshots the machine again and fails the run on any
 * difference it made and did not undo, printing it (what other programs did
 * meanwhile is printed as ignored). It ends with a timing table, a "N passed,
 * N failed" line and `tests wall_seconds=<n>`.
 *
 * Quick run (`--quick`): the suites that need no root and no lab, in
 * parallel shards; nothing on the machine is touched. With `--floor` (the
 * floor run): only those whose require closure reaches what differs between
 * versions (test/runner/floor.ts), the lists printed first.
 */
import { execFileSync } from "node:child_process";
import { cpus, tmpdir } from "node:os";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { packRepository } from "../engine/pack";
import { floorChoice } from "./floor";
import { findSpecs, guestsOf, takeNextUnit, workUnits, shard, unitName, type Spec } from "./suites";
import { runningSteps, runStep, stopAll, type StepOutcome, type StepSpec } from "./steps";

const REPO = resolve(__dirname, "..", "..", "..");
const WORK = join(REPO, ".tmp", "test-run");
const LOGS = join(WORK, "logs");
const STARTED_MS = Number(process.env.EGRESS_TEST_STARTED_MS) || Date.now();
/** Where `build-image.sh --early` (run by `npm test` before compiling) logs, and the PID it records. */
const EARLY_IMAGE_LOG = join(REPO, ".tmp", "guest-image-early.log");

const outcomes: StepOutcome[] = [];
let interrupted: NodeJS.Signals | undefined;

function log(line: string): void {
  process.stdout.write(`[test] ${line}\n`);
}

interface MochaOptions {
  reporter?: string;
  /**
   * At a lower CPU priority, so the lab's guests (qemu under TCG, on the
   * critical path and bound by boot deadlines) get the cores first and these
   * suites fill what is left.
   */
  niced?: boolean;
}

/**
 * Mocha's per-test timeout is a safety net against a hang, never a verdict: a test that waits for a
 * condition may wait long on a machine whose cores are busy (four emulated guests booting beside a
 * shard made a 20 s net fail a passing CLI test on such a machine). So the net is wide everywhere, and
 * suites that set their own set at least as much (120 s).
 */
const MOCHA_SAFETY_NET_MS = "120000";

function mocha(name: string, specs: readonly Spec[], options: MochaOptions = {}): StepSpec {
  const niced = options.niced ?? false;
  const node = [
    join(REPO, "node_modules", "mocha", "bin", "mocha.js"),
    "--no-config",
    "--enable-source-maps",
    "--timeout",
    MOCHA_SAFETY_NET_MS,
    "--reporter",
    options.reporter ?? "spec",
    "--exit",
    ...specs.map((s) => s.path),
  ];
  return niced
    ? { name, command: "nice", args: ["-n", "10", process.execPath, ...node] }
    : { name, command: process.execPath, args: node };
}

function bash(name: string, script: string, ...args: string[]): StepSpec {
  return { name, command: "bash", args: [join(REPO, script), ...args] };
}

const niced = (step: StepSpec): StepSpec => ({
  ...step,
  command: "nice",
  args: ["-n", "10", step.command, ...step.args],
});

/**
 * The lab suites on one worker per core, each suite (or group of suites
 * that share a stock host or the tiny pool) its own mocha process, taken from
 * one queue heaviest first, as long as the guests booting at once stay
 * within MAX_GUESTS_AT_ONCE (takeNextUnit): a guest under TCG keeps a core
 * busy while it boots, so more workers or more guests would only slow every
 * guest down (past its boot deadline, on a busy machine), and a queue rather
 * than fixed shards keeps both cores busy however far the weights
 * (LAB_SECONDS) are off. Every suite
 * gets its own row in the timing table. They share the labs the runner
 * started.
 */
async function labQueue(specs: readonly Spec[]): Promise<boolean> {
  const queue = workUnits(specs);
  if (queue.length === 0) return true;
  let guestsBooting = 0;
  let wake: Array<() => void> = [];
  const worker = async (): Promise<boolean> => {
    let ok = true;
    while (queue.length > 0) {
      const unit = takeNextUnit(queue, guestsBooting);
      if (unit === undefined) {
        await new Promise<void>((resolve) => wake.push(resolve));
        continue;
      }
      guestsBooting += guestsOf(unit);
      // The suite's guest budgets (test/lab/budgets.ts) follow the guests booting at once as it starts,
      // known here, rather than the load average alone, which lags behind guests that have just started.
      const labStep = {
        ...mocha(`lab ${unitName(unit)}`, unit),
        env: { ...process.env, EGRESS_TEST_GUESTS_AT_ONCE: String(guestsBooting) },
      };
      try {
        ok = (await step(labStep)) && ok;
      } finally {
        guestsBooting -= guestsOf(unit);
        const waiting = wake;
        wake = [];
        for (const resolve of waiting) resolve();
      }
    }
    return ok;
  };
  return parallel(...Array.from({ length: Math.max(1, cpus().length) }, worker));
}

/** The lab suites that assert on the whole host (`test-runs: alone`), before the queue starts. */
function labAlone(specs: readonly Spec[]): StepSpec[] {
  const alone = specs.filter((s) => s.kind === "lab" && s.alone);
  return alone.length === 0 ? [] : [mocha("lab-alone", alone)];
}

/**
 * Runs one step and prints it. After a signal no new step starts, except the
 * teardown's (`always`): those are what undo the run.
 */
async function step(spec: StepSpec, always = false): Promise<boolean> {
  if (interrupted && !always) return false;
  const outcome = await runStep(spec, REPO, LOGS);
  outcomes.push(outcome);
  const verdict = outcome.exitCode === 0 ? "passed" : `FAILED (exit ${outcome.exitCode})`;
  process.stdout.write(
    `\n──── ${spec.name}: ${verdict} in ${outcome.seconds.toFixed(0)} s ────\n${outcome.output}` +
      (outcome.output.endsWith("\n") ? "" : "\n"),
  );
  return outcome.exitCode === 0;
}

/** Runs steps one after the other, each whatever the others did; false if any failed. */
async function sequence(...steps: Array<StepSpec | (() => Promise<boolean>)>): Promise<boolean> {
  let ok = true;
  for (const s of steps) ok = (typeof s === "function" ? await s() : await step(s)) && ok;
  return ok;
}

/** Runs steps one after the other; stops at the first failure (what follows needs what failed). */
async function lane(...steps: Array<StepSpec | (() => Promise<boolean>)>): Promise<boolean> {
  for (const s of steps) {
    const ok = typeof s === "function" ? await s() : await step(s);
    if (!ok) return false;
  }
  return true;
}

async function parallel(...lanes: Array<Promise<boolean>>): Promise<boolean> {
  return (await Promise.all(lanes)).every(Boolean);
}

/**
 * The quick suites in `count` parallel shards: they wait on child processes,
 * loopback servers and deadlines often enough that one more process than
 * cores keeps the cores busy.
 */
function quickShards(specs: readonly Spec[], count: number, niced = false): StepSpec[] {
  return shard(
    specs.filter((s) => s.kind === "quick"),
    count,
  ).map((group, i) => mocha(`quick-${i + 1}`, group, { reporter: "dot", niced }));
}

function printTable(): void {
  const rows = outcomes.map((o) => [
    o.name,
    o.seconds.toFixed(0),
    o.exitCode === 0 ? "ok" : "FAILED",
    o.passed === undefined ? "" : String(o.passed),
    o.failed === undefined ? "" : String(o.failed),
  ]);
  const header = ["step", "seconds", "result", "passed", "failed"];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) =>
    cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join("  ");
  process.stdout.write(`\n${line(header)}\n${widths.map((w) => "-".repeat(w)).join("  ")}\n`);
  for (const row of rows) process.stdout.write(`${line(row)}\n`);
}

function printTotals(): void {
  const passed = outcomes.reduce((n, o) => n + (o.passed ?? 0), 0);
  const failed = outcomes.reduce((n, o) => n + (o.failed ?? 0), 0);
  process.stdout.write(`\n${passed} passed, ${failed} failed\n`);
  process.stdout.write(`tests wall_seconds=${Math.round((Date.now() - STARTED_MS) / 1000)}\n`);
}

function heartbeat(): NodeJS.Timeout {
  return setInterval(() => {
    const names = runningSteps();
    if (names.length > 0)
      log(`${Math.round((Date.now() - STARTED_MS) / 1000)} s: running ${names.join(", ")}`);
  }, 60_000).unref();
}

/** Packs the package once for every consumer project the engine tests make (test/engine/harness.ts). */
function packOnce(scratch: string): void {
  process.env.EGRESS_PACKED_TARBALL = packRepository(scratch);
}

/**
 * The floor run's quick suites (`--floor`, test/floor/run.sh): those whose
 * require closure reaches what differs between versions (test/runner/floor.ts);
 * prints the chosen and the left-out ones, each with its reason.
 */
function floorSpecs(specs: readonly Spec[]): Spec[] {
  const manifest = JSON.parse(readFileSync(join(REPO, "package.json"), "utf8")) as {
    name: string;
    main: string;
  };
  const choices = specs
    .filter((s) => s.kind === "quick")
    .map((s) => ({
      spec: s,
      ...floorChoice(s.path, join(REPO, "dist"), manifest.name, manifest.main),
    }));
  const chosen = choices.filter((c) => c.floor);
  const left = choices.filter((c) => !c.floor);
  log(
    `floor: rerunning ${chosen.length} quick suite(s), each reaching what differs between versions:`,
  );
  for (const c of chosen) log(`  run   ${c.path}: ${c.reason}`);
  log(`floor: leaving out ${left.length} (proven on the current LTS by the main run):`);
  for (const c of left) log(`  skip  ${c.path}: ${c.reason}`);
  return chosen.map((c) => c.spec);
}

async function quickRun(floorOnly: boolean): Promise<number> {
  rmSync(LOGS, { recursive: true, force: true });
  const all = findSpecs(join(REPO, "dist", "test"), REPO);
  const specs = floorOnly ? floorSpecs(all) : all;
  const scratch = mkdtempSync(join(tmpdir(), "egress-test-quick-"));
  // One V8 code cache for every node process of the run (mocha, consumer programs, providers, the CLI):
  // the SDK and TypeScript are compiled once, not once per process. Semantics are unchanged.
  process.env.NODE_COMPILE_CACHE ??= join(scratch, "compile-cache");
  packOnce(scratch);
  const beat = heartbeat();
  const ok = await parallel(
    ...quickShards(specs, Math.max(2, Math.min(4, cpus().length + 1))).map((s) => lane(s)),
  ).finally(() => rmSync(scratch, { recursive: true, force: true }));
  clearInterval(beat);
  printTable();
  printTotals();
  return ok ? 0 : 1;
}

/** The early image build (`build-image.sh --early`), if a run cut short left it running. */
function stopEarlyImageBuild(): void {
  try {
    execFileSync(
      "bash",
      [join(REPO, "test", "lab", "build-image.sh"), "--stop-early", EARLY_IMAGE_LOG],
      {
        stdio: ["ignore", "inherit", "inherit"],
      },
    );
  } catch (error) {
    process.stderr.write(
      `[test] could not stop the early image build: ${(error as Error).message}\n`,
    );
  }
}

/**
 * The machine's state into `file` (test/machine-state.sh): the runner's own
 * tree left out, processes carrying EGRESS_TEST_RUN=`run` counted as the run's.
 */
function snapshotMachine(file: string, run: string): void {
  execFileSync(
    "bash",
    [join(REPO, "test", "machine-state.sh"), "snapshot", file, String(process.pid), run],
    {
      stdio: ["ignore", "inherit", "inherit"],
    },
  );
}

/**
 * Removes both labs completely (idempotent): at the start (a killed earlier
 * run) and at the end. The stock host goes first: its daemons' private
 * /run/libvirt is mounted on the directory the regular lab may have made.
 */
async function tearDownLabs(name: string): Promise<boolean> {
  // The host-reboot test's private hypervisor (a stock-host profile under its own names), if a
  // killed run left it.
  const reboot = await step(bash(`${name}-reboot-host`, "test/lab/reboot-host.sh", "down"), true);
  const stock = await step(
    bash(`${name}-stock-host`, "test/lab/stock-host-down.sh", "--purge"),
    true,
  );
  const lab = await step(bash(`${name}-lab`, "test/lab/lab-down.sh", "--purge"), true);
  return reboot && stock && lab;
}

/** The labs, once, before the lab suites share them. */
function prepareLabs(): Array<StepSpec> {
  return [bash("lab-up", "test/lab/lab-up.sh"), bash("stock-host-up", "test/lab/stock-host-up.sh")];
}

/**
 * The lab lane once both labs are up. The guest image (built by `npm test`
 * in the background while TypeScript compiles, see build-image.sh --early;
 * this step waits for that build and shows its log, or builds) is what most
 * lab suites wait for, and on a fresh machine it takes minutes of mostly
 * downloads: the suites that boot no guest run meanwhile. Then the suites
 * that assert on the whole host, alone, then the rest.
 */
async function labSuites(specs: readonly Spec[]): Promise<boolean> {
  const lab = specs.filter((s) => s.kind === "lab" && !s.alone);
  const [imageBuilt, withoutImage] = await Promise.all([
    step(bash("guest-image", "test/lab/build-image.sh", "--join", EARLY_IMAGE_LOG)),
    labQueue(lab.filter((s) => !s.needsImage)),
  ]);
  if (!imageBuilt) return false;
  const withImage = await sequence(...labAlone(specs), async () =>
    labQueue(lab.filter((s) => s.needsImage)),
  );
  return withoutImage && withImage;
}

async function fullRun(): Promise<number> {
  if (process.getuid?.() !== 0) {
    log("the full test command needs root (network namespaces, a libvirtd, mounts).");
    log(
      "Run it as root in a disposable VM or container, or run `npm run test:quick` (no root, no lab).",
    );
    return 2;
  }
  rmSync(WORK, { recursive: true, force: true });
  mkdirSync(WORK, { recursive: true });
  const before = join(WORK, "machine-before.txt");
  const after = join(WORK, "machine-after.txt");

  // Every process the run starts, from the first teardown on, carries EGRESS_TEST_RUN: both snapshots
  // count a process as the run's by it (or by a /tmp/egress- path on its command line), so one left
  // running is found and other programs' are not.
  const run = String(process.pid);
  process.env.EGRESS_TEST_RUN = run;
  await tearDownLabs("leftovers");
  snapshotMachine(before, run);
  log("machine state recorded; every change the run makes is undone at its end");
  // Every step's temporary files go to one directory, removed before the machine is compared: the run
  // writes directly under /tmp only names starting with egress-, the only new /tmp entries the
  // comparison holds against it.
  const scratch = mkdtempSync("/tmp/egress-test-run-");
  process.env.TMPDIR = scratch;
  packOnce(scratch);

  let finishing: Promise<number> | undefined;
  const finish = async (): Promise<number> => {
    await stopAll(10_000);
    stopEarlyImageBuild();
    const labsDown = await tearDownLabs("teardown");
    rmSync(scratch, { recursive: true, force: true });
    snapshotMachine(after, run);
    let unchanged = true;
    try {
      execFileSync("bash", [join(REPO, "test", "machine-state.sh"), "diff", before, after], {
        stdio: ["ignore", "inherit", "inherit"],
      });
    } catch {
      unchanged = false;
    }
    outcomes.push({
      name: "machine-unchanged",
      seconds: 0,
      exitCode: unchanged ? 0 : 1,
      output: "",
    });
    printTable();
    printTotals();
    const failed = outcomes.some((o) => o.exitCode !== 0);
    if (interrupted) return interrupted === "SIGINT" ? 130 : 143;
    return failed || !labsDown || !unchanged ? 1 : 0;
  };
  // A bug in the runner itself still takes the labs down and compares the machine.
  process.on("uncaughtException", (error) => {
    process.stderr.write(`[test] the runner failed: ${error.stack ?? error.message}\n`);
    outcomes.push({ name: "runner", seconds: 0, exitCode: 1, output: "" });
    finishing ??= finish();
    void finishing.then(() => process.exit(1));
  });
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const)
    process.on(signal, () => {
      if (interrupted) return;
      interrupted = signal;
      log(`${signal}: stopping every step, then removing the labs`);
      finishing ??= finish();
      void finishing.then((code) => process.exit(code));
    });

  const specs = findSpecs(join(REPO, "dist", "test"), REPO);
  const rootSpecs = specs.filter((s) => s.kind === "root");
  writeFileSync(
    join(WORK, "suites.txt"),
    specs.map((s) => `${s.kind.padEnd(5)} ${s.path}`).join("\n") + "\n",
  );
  const beat = heartbeat();
  try {
    await parallel(
      lane(...prepareLabs(), async () => labSuites(specs)),
      sequence(
        niced({ name: "lint", command: "npm", args: ["run", "--silent", "lint"] }),
        async () => parallel(...quickShards(specs, 2, true).map((s) => lane(s))),
        mocha("root", rootSpecs, { niced: true }),
        // Not niced: the floor's suites carry deadlines of a few seconds (the simulator's flaky-API tests), so
        // they share the cores evenly with the guests (whose budgets scale with the load) rather than starve.
        bash("floor", "test/floor/run.sh"),
      ),
    );
  } catch (error) {
    const e = error as Error;
    process.stderr.write(`[test] the runner failed: ${e.stack ?? e.message}\n`);
    outcomes.push({ name: "runner", seconds: 0, exitCode: 1, output: "" });
  }
  clearInterval(beat);
  finishing ??= finish();
  return finishing;
}

// A reader that went away (`npm test | head`, a terminal closed under the run) turns every later write
// into an EPIPE error. Unhandled, it reached the uncaughtException handler, whose own report failed the
// same way: the runner spun at 100 % CPU, deaf to SIGTERM, and never took the labs down. The output is
// lost; the run, its logs under .tmp and its teardown are not.
for (const stream of [process.stdout, process.stderr]) stream.on("error", () => undefined);

const run = process.argv.includes("--quick")
  ? quickRun(process.argv.includes("--floor"))
  : fullRun();
run.then(
  (code) => process.exit(code),
  (error: Error) => {
    process.stderr.write(`[test] the runner failed: ${error.stack ?? error.message}\n`);
    process.exit(1);
  },
);
