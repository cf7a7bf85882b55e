/**
 * The pool's program under Pulumi mocks, as `pulumi up` and `refresh` run it
 * before any provider call: `new EgressProxyPool(...)` with `count` members
 * of one backend kind, timed from the constructor until every member is
 * registered and the pool's `endpoints` resolve. It runs in a node process of
 * its own in the consumer project (the package installed as users install
 * it; mocks never leak), which also hands back one member's inputs as the
 * pool registered them (secret marks removed): the inputs a member's state
 * holds, which the refresh bench reads with (test/engine/proxmox-fleet.ts).
 */
import { spawn } from "node:child_process";
import { existsSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { ConsumerProject, Props } from "../engine/harness";

export interface PoolProgramRun {
  /** From `new EgressProxyPool` until every member is registered and `endpoints` resolved. */
  programMs: number;
  /** `require("egress-proxies")` after setMocks. */
  loadMs: number;
  /** Resources the mock monitor saw registered (the pool, its members, anything they declare). */
  registered: number;
  /** The first member of `memberType` as registered, secret marks removed. */
  member: { type: string; name: string; inputs: Props };
  /** The program process's peak RSS, MB. */
  peakRssMb: number;
}

const PROGRAM = `
const fs = require("node:fs");
const { performance } = require("node:perf_hooks");
const pulumi = require("@pulumi/pulumi");
const SECRET = "4dabf18193072939515e22adb298388d";
const plain = (value) =>
  Array.isArray(value) ? value.map(plain)
  : value !== null && typeof value === "object"
    ? (SECRET in value ? plain(value.value)
      : Object.fromEntries(Object.entries(value).map(([key, item]) => [key, plain(item)])))
    : value;
async function main(outFile, packageName, memberType, argsJson) {
  let registered = 0;
  let member;
  await pulumi.runtime.setMocks({
    newResource(args) {
      registered++;
      const inputs = plain(args.inputs);
      if (member === undefined && args.type.endsWith(memberType))
        member = { type: args.type, name: args.name, inputs };
      const state = { ...inputs, state: "running", egressProblem: null, createdAt: null };
      if (args.type.endsWith("ProxmoxProxy")) {
        state.vmName = args.name + "-abcdefghij";
        state.host = inputs.node;
        state.ip = "198.51.100." + (registered % 250);
      }
      if (args.type.endsWith("StaticProxy")) {
        const url = new URL(String(inputs.url));
        Object.assign(state, { host: url.hostname, port: Number(url.port), ip: url.hostname });
      }
      if (state.ip !== undefined) state.endpoint = "http://" + state.ip + ":3128";
      return { id: args.name + "-id", state };
    },
    call: (args) => args.inputs,
  }, "scale-bench", "bench", false);
  let started = performance.now();
  const { EgressProxyPool } = require(packageName);
  const loadMs = performance.now() - started;
  started = performance.now();
  const pool = new EgressProxyPool("scale", JSON.parse(argsJson));
  await new Promise((resolve) => pool.endpoints.apply(resolve));
  const programMs = performance.now() - started;
  const hwm = /^VmHWM:\\s+(\\d+)\\s+kB$/m.exec(fs.readFileSync("/proc/self/status", "utf8"));
  fs.writeFileSync(outFile + ".part", JSON.stringify({
    programMs, loadMs, registered, member, peakRssMb: (Number(hwm[1]) * 1024) / 1e6,
  }));
  fs.renameSync(outFile + ".part", outFile);
}
main(...process.argv.slice(2)).then(
  () => process.exit(0),
  (error) => { console.error(error); process.exit(1); },
);
`;

/** Runs the pool's program once in a fresh node process in `project`; rejects after `timeoutMs`. */
export async function runPoolProgram(
  project: ConsumerProject,
  memberType: "ProxmoxProxy" | "StaticProxy",
  poolArgs: Props,
  timeoutMs = 120_000,
): Promise<PoolProgramRun> {
  const script = join(project.dir, "scale-pool-program.js");
  const outFile = join(project.dir, `scale-pool-${memberType}.json`);
  writeFileSync(script, PROGRAM);
  const argsFile = JSON.stringify(poolArgs);
  const child = spawn(
    process.execPath,
    [script, outFile, project.packageName, memberType, argsFile],
    { cwd: project.dir, stdio: ["ignore", "ignore", "pipe"] },
  );
  let stderr = "";
  child.stderr!.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
  try {
    const code = await new Promise<number | null>((resolve, reject) => {
      child.once("error", reject);
      child.once("exit", resolve);
    });
    // Exiting at once leaves the pool's later outputs pending, which the SDK reports as leaked
    // promises (exit status 1): what counts is that the figures were written.
    if (!existsSync(outFile)) throw new Error(`the pool program exited ${code}: ${stderr}`);
    return JSON.parse(readFileSync(outFile, "utf8")) as PoolProgramRun;
  } finally {
    clearTimeout(timer);
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    rmSync(outFile, { force: true });
  }
}
