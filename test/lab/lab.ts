/**
 * Bringing the lab up from Node (tests and benchmarks). `useLab()` runs
 * test/lab/lab-up.sh (idempotent: ~0.1 s when already up) and remembers which
 * processes this process started, so `stopWhatThisProcessStarted()` stops
 * exactly those, by PID, and leaves a lab someone else started alone. The
 * description is handed out again only while every recorded lab process is
 * still alive: after a stop (one bench suite ends, the next begins) the lab
 * is brought up anew instead of handing out a dead sshd's address. Failing to
 * start throws, loudly.
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

/** The lab's recorded processes (virtlogd, libvirtd, dnsmasq, sshd) all still run under their names. */
function labProcessesAlive(): boolean {
  const recorded = readPids(`${LAB_DIR}/pids`);
  return recorded.length > 0 && recorded.every((p) => commandNameOf(p.pid) === p.name);
}

/**
 * Brings the lab up (once while it stays up) and returns its description.
 * A description handed out earlier is re-validated: when the lab went down
 * since, it is brought up again.
 */
export async function useLab(): Promise<LabEnv> {
  if (labReady !== undefined) {
    const ready = labReady;
    const env = await ready.catch(() => undefined);
    if (env !== undefined && labProcessesAlive()) return env;
    if (labReady === ready) labReady = undefined;
  }
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
  if (startedHere.length === 0) return;
  if (startedHere.some((p) => p.name === "libvirtd")) await destroyLeftoverGuests();
  for (const p of startedHere.reverse()) await stopByPid(p);
  startedHere.length = 0;
  labReady = undefined;
}

/**
 * Guests still running on a libvirtd this process started are leaks of this
 * run (a test whose cleanup failed): qemu would outlive the daemon. Destroy
 * them before the daemon stops, as lab-down.sh does, and say so on stderr.
 */
async function destroyLeftoverGuests(): Promise<void> {
  const virsh = (...args: string[]) =>
    run("virsh", ["-q", "-c", "qemu:///system", ...args], { timeout: 30_000 });
  const running = await virsh("list", "--name", "--state-running", "--state-paused").then(
    ({ stdout }) =>
      stdout
        .split("\n")
        .map((line) => line.trim())
        .filter(Boolean),
    () => [] as string[],
  );
  for (const name of running) {
    console.error(
      `[lab] destroying guest ${name}, left running by this run, before stopping libvirtd`,
    );
    await virsh("destroy", name).catch(() => undefined);
  }
}
