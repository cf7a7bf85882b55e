/**
 * One step of the test command as a child process in its own process group:
 * its output is kept (and written to a log file) and printed in one piece when
 * it ends, so steps that run side by side do not interleave; mocha's summary
 * lines give the pass and fail counts. `stopAll` ends every running step's
 * whole group, by PID, for Ctrl-C.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, mkdirSync } from "node:fs";
import { join } from "node:path";

export interface StepSpec {
  name: string;
  command: string;
  args: string[];
  env?: NodeJS.ProcessEnv;
}

export interface StepOutcome {
  name: string;
  seconds: number;
  exitCode: number;
  /** From mocha's "N passing" / "N failing" lines, when the step ran mocha. */
  passed?: number;
  failed?: number;
  output: string;
}

const running = new Map<string, ChildProcess>();

export function mochaCounts(output: string): { passed?: number; failed?: number } {
  const counts: { passed?: number; failed?: number } = {};
  for (const [, n, word] of output.matchAll(/^\s*(\d+) (passing|failing)\b/gm)) {
    if (word === "passing") counts.passed = (counts.passed ?? 0) + Number(n);
    else counts.failed = (counts.failed ?? 0) + Number(n);
  }
  if (counts.passed !== undefined && counts.failed === undefined) counts.failed = 0;
  return counts;
}

/** A step's name as a file name: lab suites are named by their path ("lab engine/kvm"). */
export const logFileName = (stepName: string): string =>
  `${stepName.replace(/[^A-Za-z0-9._-]+/g, "_")}.log`;

export function runStep(step: StepSpec, cwd: string, logDir: string): Promise<StepOutcome> {
  mkdirSync(logDir, { recursive: true });
  const log = createWriteStream(join(logDir, logFileName(step.name)));
  // A log that cannot be written must not end the runner (and skip the teardown): the output is kept anyway.
  log.on("error", (error) => process.stderr.write(`[test] ${step.name}: log: ${error.message}\n`));
  const started = Date.now();
  return new Promise((resolve) => {
    const child = spawn(step.command, step.args, {
      cwd,
      env: step.env ?? process.env,
      detached: true, // its own process group: a terminal's Ctrl-C reaches the runner, which decides
      stdio: ["ignore", "pipe", "pipe"],
    });
    running.set(step.name, child);
    const chunks: Buffer[] = [];
    const keep = (chunk: Buffer) => {
      chunks.push(chunk);
      log.write(chunk);
    };
    child.stdout!.on("data", keep);
    child.stderr!.on("data", keep);
    const finish = (exitCode: number, extra = "") => {
      running.delete(step.name);
      if (extra) keep(Buffer.from(extra));
      log.end();
      const output = Buffer.concat(chunks).toString("utf8");
      resolve({
        name: step.name,
        seconds: (Date.now() - started) / 1000,
        exitCode,
        output,
        ...mochaCounts(output),
      });
    };
    child.once("error", (error) =>
      finish(127, `\n[test] ${step.command} could not start: ${error.message}\n`),
    );
    child.once("close", (code, signal) =>
      finish(code ?? 128, signal ? `\n[test] ${step.name} ended by ${signal}\n` : ""),
    );
  });
}

export function runningSteps(): string[] {
  return [...running.keys()];
}

/** Ends every running step's process group: TERM, then KILL after `graceMs`. */
export async function stopAll(graceMs: number): Promise<void> {
  const groups = [...running.values()].map((child) => child.pid).filter((pid) => pid !== undefined);
  const signal = (pid: number, name: NodeJS.Signals) => {
    try {
      process.kill(-pid, name);
    } catch {
      // The group is gone already.
    }
  };
  for (const pid of groups) signal(pid, "SIGTERM");
  const deadline = Date.now() + graceMs;
  while (running.size > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  for (const pid of groups) signal(pid, "SIGKILL");
}
