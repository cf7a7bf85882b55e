import { fork, type ChildProcess } from "node:child_process";
import { writeFileSync } from "node:fs";

/**
 * A consumer program kept running between runs: one node process per program
 * and consumer directory, started at its first run, that runs the program's
 * `main` once per request, one request at a time.
 *
 * Why not a process per run: most of a run's cost is loading the package and
 * the SDK and serializing the dynamic provider's closure (~0.6 core-second);
 * the registration itself is milliseconds. A test file captures a dozen
 * resources, and the floor run captures them all again. One process that
 * registers many resources one after another is also what `pulumi up` runs:
 * a program with many resources of one class.
 *
 * What stays as it was: each run calls `setMocks` afresh (its own project,
 * stack and preview flag), a run ends when the SDK's RPC queue has drained
 * (as a process ends when its event loop has), and an error of any kind
 * (a rejected promise nobody awaited included) fails the run, whose host is
 * then stopped so that the next run starts from a fresh process.
 */

/**
 * Appended to a program that defines `async function main(...args)`: serves
 * runs over the IPC channel and exits when the test process goes away.
 */
const HOST_RUNNER = `
const pulumiSettings = require("@pulumi/pulumi/runtime/settings");
let failure;
process.on("unhandledRejection", (error) => { failure ??= error; });
process.on("uncaughtException", (error) => { failure ??= error; });
process.on("disconnect", () => process.exit(0));
process.on("message", async ({ args }) => {
  failure = undefined;
  try {
    await main(...args);
    // The run is over when every registration the program started has been answered.
    await pulumiSettings.waitForRPCs();
    await new Promise((resolve) => setImmediate(resolve));
    if (failure !== undefined) throw failure;
    process.send({ ok: true });
  } catch (error) {
    process.send({ ok: false, error: error && error.stack ? error.stack : String(error) });
  }
});
process.send({ ready: true });
`;

interface Reply {
  ready?: boolean;
  ok?: boolean;
  error?: string;
}

const RUN_TIMEOUT_MS = 60_000;
const hosts = new Map<string, ProgramHost>();

process.on("exit", () => {
  for (const host of hosts.values()) host.stop();
});

export class ProgramHost {
  private queue: Promise<unknown> = Promise.resolve();
  private child: ChildProcess | undefined;
  private stderr = "";
  private replies: Array<(reply: Reply | Error) => void> = [];

  private constructor(
    private readonly programFile: string,
    private readonly cwd: string,
  ) {}

  /** The host of `program`, written to `programFile` in `cwd`; a changed program gets a new host. */
  static for(programFile: string, program: string, cwd: string): ProgramHost {
    const key = `${programFile}\0${program}`;
    let host = hosts.get(key);
    if (host === undefined) {
      for (const [other, stale] of hosts)
        if (other.startsWith(`${programFile}\0`)) {
          stale.stop();
          hosts.delete(other);
        }
      writeFileSync(programFile, program + HOST_RUNNER);
      host = new ProgramHost(programFile, cwd);
      hosts.set(key, host);
    }
    return host;
  }

  /** Stops the hosts of every program under `dir` (a consumer project being removed). */
  static stopUnder(dir: string): void {
    for (const [key, host] of hosts)
      if (key.startsWith(`${dir}/`)) {
        host.stop();
        hosts.delete(key);
      }
  }

  /** Runs `main(...args)` once; resolves when it and its registrations are done. */
  run(args: readonly string[]): Promise<void> {
    const result = this.queue.then(() => this.runNow(args));
    this.queue = result.catch(() => undefined);
    return result;
  }

  stop(): void {
    const child = this.child;
    this.child = undefined;
    if (child !== undefined && child.exitCode === null && child.signalCode === null) child.kill();
    for (const reply of this.replies.splice(0)) reply(new Error("its process was stopped"));
  }

  private async runNow(args: readonly string[]): Promise<void> {
    let child: ChildProcess | undefined;
    try {
      child = await this.started();
      child.ref();
      this.stderr = "";
      const running = child;
      const reply = await this.reply(RUN_TIMEOUT_MS, () => running.send({ args }));
      if (reply.ok !== true) throw new Error(reply.error ?? "no reply");
    } catch (error) {
      // A failed run may leave the SDK's state half-way: the next run gets a fresh process.
      this.stop();
      const detail = error instanceof Error ? error.message : String(error);
      throw new Error(
        `the consumer program failed: ${detail}${this.stderr ? `\n${this.stderr}` : ""}`,
      );
    } finally {
      child?.unref();
    }
  }

  private async started(): Promise<ChildProcess> {
    if (this.child !== undefined) return this.child;
    const child = fork(this.programFile, [], {
      cwd: this.cwd,
      stdio: ["ignore", "ignore", "pipe", "ipc"],
      env: { ...process.env, PULUMI_TEST_MODE: "true" },
    });
    this.child = child;
    child.stderr!.on("data", (chunk: Buffer) => (this.stderr += chunk.toString()));
    child.on("message", (reply: Reply) => this.replies.shift()?.(reply));
    child.on("exit", (code, signal) => {
      if (this.child === child) this.child = undefined;
      for (const reply of this.replies.splice(0))
        reply(new Error(`its process exited (${signal ?? code})`));
    });
    const ready = await this.reply(RUN_TIMEOUT_MS, () => undefined);
    if (ready.ready !== true) throw new Error(`the consumer program did not start: ${this.stderr}`);
    return child;
  }

  /** The host's next message after `request` was sent, within `timeoutMs`. */
  private reply(timeoutMs: number, request: () => void): Promise<Reply> {
    return new Promise<Reply>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new Error(`no answer in ${timeoutMs / 1000} s`));
        this.stop();
      }, timeoutMs);
      this.replies.push((reply) => {
        clearTimeout(timer);
        if (reply instanceof Error) reject(reply);
        else resolve(reply);
      });
      request();
    });
  }
}
