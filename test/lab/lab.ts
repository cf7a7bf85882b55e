/**
 * Bringing the lab up from Node (tests and benchmarks). `useLab()` runs
 * test/lab/lab-up.sh (which reuses a complete running lab, e.g. the one the
 * test command started for all suites) and remembers whether this process
 * brought it up. If it did, `stopWhatThisProcessStarted()` takes the whole lab
 * down again with `lab-down.sh --purge` (guests, daemons, namespace, links,
 * files: the machine as before), also on SIGINT/SIGTERM; a lab someone else
 * started is left alone. The description is handed out again only while every
 * recorded lab process is still alive: after a stop (one bench suite ends, the
 * next begins) the lab is brought up anew instead of handing out a dead sshd's
 * address. Failing to start throws, loudly.
 */
import { execFile, execFileSync } from "node:child_process";
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
  /** The lab's /24 ("A.B.C.0/24"), picked at lab-up from ranges nothing on this machine uses. */
  subnet: string;
  /** The bridge's own address (<subnet>.1) inside the lab netns. */
  bridgeAddress: string;
  /** This machine's address on the lab bridge (<subnet>.254) once host-link.sh ran. */
  hostAddress: string;
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

/** An address from the DHCP range (.100–.199) of a lab's subnet ("A.B.C.0/24"), as a pattern. */
export function dhcpAddressPattern(subnet: string): RegExp {
  const prefix = subnet.replace(/\.0\/24$/, "").replaceAll(".", "\\.");
  return new RegExp(`^${prefix}\\.1\\d\\d$`);
}

/** A literal address inside a regular expression. */
export const escapedAddress = (address: string): string => address.replaceAll(".", "\\.");

/** test/lab in the source tree, also when running from dist/test/lab. */
export const LAB_SCRIPTS_DIR = resolve(__dirname, "..", "..", "..", "test", "lab");
const LAB_DIR = process.env.LAB_DIR ?? "/tmp/egress-lab";

interface RecordedProcess {
  name: string;
  pid: number;
}

let labReady: Promise<LabEnv> | undefined;
let broughtUpHere = false;

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
    broughtUpHere = true; // whatever it left half made goes with the purge
    throw new Error(
      `the libvirt lab could not start (test/lab/lab-up.sh): ${e.message}\n${e.stdout ?? ""}${e.stderr ?? ""}\n` +
        "Lab tests need root and the packages from test/setup-host.sh.",
    );
  }
  const libvirtd = readPids(pidsFile).find((p) => p.name === "libvirtd");
  if (libvirtd && !before.some((b) => b.pid === libvirtd.pid)) {
    broughtUpHere = true;
    takeDownOnSignal(LAB_SCRIPTS_DIR, "lab-down.sh");
  }
  return JSON.parse(readFileSync(`${LAB_DIR}/env.json`, "utf8")) as LabEnv;
}

/**
 * On SIGINT/SIGTERM a process that brought a lab up takes it down before it
 * exits (mocha run by hand and interrupted): nothing may outlive the run.
 */
export function takeDownOnSignal(scriptsDir: string, downScript: string): void {
  for (const signal of ["SIGINT", "SIGTERM"] as const)
    process.once(signal, () => {
      if (process.env.LAB_KEEP !== "1")
        execFileSync("bash", [resolve(scriptsDir, downScript), "--purge"], { stdio: "inherit" });
      process.exit(signal === "SIGINT" ? 130 : 143);
    });
}

/**
 * The lab's recorded processes (virtlogd, libvirtd, dnsmasq, sshd) all still
 * run under their names. A role is recorded as "name:role" (dnsmasq:ra); the
 * process's own name is the part before. (Comparing the whole record made a
 * second useLab in one process always run lab-up.sh again.)
 */
function labProcessesAlive(): boolean {
  const recorded = readPids(`${LAB_DIR}/pids`);
  return (
    recorded.length > 0 && recorded.every((p) => commandNameOf(p.pid) === p.name.split(":")[0])
  );
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

/**
 * The lab's description when it is up already, else undefined: for a bench
 * that measures on the lab only when someone brought it up (never starts it).
 */
export function labIfUp(): LabEnv | undefined {
  const envFile = `${LAB_DIR}/env.json`;
  if (!labProcessesAlive() || !existsSync(envFile)) return undefined;
  return JSON.parse(readFileSync(envFile, "utf8")) as LabEnv;
}

/**
 * Takes the lab down completely (lab-down.sh --purge: guests first, then the
 * daemons by PID, then everything else lab-up.sh made) if this process
 * brought it up, unless LAB_KEEP=1. A failing purge fails loudly.
 */
export async function stopWhatThisProcessStarted(): Promise<void> {
  if (process.env.LAB_KEEP === "1" || !broughtUpHere) return;
  await takeDown(LAB_SCRIPTS_DIR, "lab-down.sh");
  broughtUpHere = false;
  labReady = undefined;
}

export async function takeDown(scriptsDir: string, downScript: string): Promise<void> {
  try {
    await run("bash", [resolve(scriptsDir, downScript), "--purge"], { timeout: 120_000 });
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string; message: string };
    throw new Error(
      `${downScript} --purge failed: ${e.message}\n${e.stdout ?? ""}${e.stderr ?? ""}`,
    );
  }
}
