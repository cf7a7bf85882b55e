/**
 * Bringing the lab up from Node (tests and benchmarks). `useLab()` runs
 * test/lab/lab-up.sh once per process (idempotent: ~0.1 s when already up)
 * and remembers which processes this process started, so
 * `stopWhatThisProcessStarted()` stops exactly those, by PID, and leaves a
 * lab someone else started alone. Failing to start throws, loudly.
 */
import { execFile } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { resolve } from "node:path";
import { promisify } from "node:util";

const run = promisify(execFile);

export interface LabEnv {
  labDir: string;
  libvirtSocket: string;
  uri: string;
  pool: string;
  tinyPool: string;
  tinyPoolMiB: number;
  bridge: string;
  netns: string;
  sshHost: string;
  sshPort: number;
  sshUser: string;
  clientKey: string;
  clientKeyWithPassphrase: string;
  clientKeyPassphraseFile: string;
  knownHosts: string;
  hostKeys: string[];
  pidsFile: string;
}

/** test/lab in the source tree, also when running from dist/test/lab. */
export const LAB_SCRIPTS_DIR = resolve(__dirname, "..", "..", "..", "test", "lab");
const LAB_DIR = process.env.LAB_DIR ?? "/tmp/egress-lab";

interface RecordedProcess {
  name: string;
  pid: number;
}

let labReady: Promise<LabEnv> | undefined;
const startedHere: RecordedProcess[] = [];

export function readPids(file: string): RecordedProcess[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, "utf8")
    .split("\n")
    .map((line) => line.trim().split(/\s+/))
    .filter((parts) => parts.length === 2 && /^\d+$/.test(parts[1]!))
    .map(([name, pid]) => ({ name: name!, pid: Number(pid) }));
}

export function commandNameOf(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/comm`, "utf8").trim();
  } catch {
    return undefined;
  }
}

async function bringUp(): Promise<LabEnv> {
  const pidsFile = `${LAB_DIR}/pids`;
  const before = readPids(pidsFile).filter((p) => commandNameOf(p.pid) === p.name);
  try {
    await run("bash", [resolve(LAB_SCRIPTS_DIR, "lab-up.sh")], {
      timeout: 120_000,
      env: process.env,
    });
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string; message: string };
    throw new Error(
      `the libvirt lab could not start (test/lab/lab-up.sh): ${e.message}\n${e.stdout ?? ""}${e.stderr ?? ""}\n` +
        "Lab tests need root and the packages from test/setup-host.sh.",
    );
  } finally {
    for (const p of readPids(pidsFile)) {
      const wasRunning = before.some((b) => b.name === p.name && b.pid === p.pid);
      if (!wasRunning && commandNameOf(p.pid) === p.name) startedHere.push(p);
    }
  }
  return JSON.parse(readFileSync(`${LAB_DIR}/env.json`, "utf8")) as LabEnv;
}

/** Brings the lab up once per test run and returns its description. */
export function useLab(): Promise<LabEnv> {
  labReady ??= bringUp();
  return labReady;
}

export async function stopByPid({ name, pid }: RecordedProcess): Promise<void> {
  if (commandNameOf(pid) !== name) return;
  process.kill(pid, "SIGTERM");
  for (let i = 0; i < 50 && commandNameOf(pid) === name; i++)
    await new Promise((r) => setTimeout(r, 100));
  if (commandNameOf(pid) === name) process.kill(pid, "SIGKILL");
}

/** Stops, newest first and by PID, the lab processes this process started (unless LAB_KEEP=1). */
export async function stopWhatThisProcessStarted(): Promise<void> {
  if (process.env.LAB_KEEP === "1") return;
  for (const p of startedHere.reverse()) await stopByPid(p);
  startedHere.length = 0;
}
