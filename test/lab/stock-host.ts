/**
 * The stock-host lab profile (stock-host-up.sh) from Node: a hypervisor as
 * Debian's packages leave it, beside the regular lab. `useStockHost()` brings
 * it up once per process (or finds the one the test command started) and
 * remembers whether this process brought it up; if so,
 * `stopStockHostProcesses()` takes it down completely (stock-host-down.sh
 * --purge), as does SIGINT/SIGTERM. `resetStockHost()` puts the libvirt
 * objects back to the packages' state between tests.
 */
import { execFile, execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { promisify } from "node:util";
import { commandNameOf, LAB_SCRIPTS_DIR, readPids, takeDown, takeDownOnSignal } from "./lab";

const run = promisify(execFile);
const SCRIPT = resolve(LAB_SCRIPTS_DIR, "stock-host-up.sh");
const STOCK_DIR = process.env.STOCK_LAB_DIR ?? "/tmp/egress-stock-lab";

export interface StockHostEnv {
  labDir: string;
  /** From outside the profile's mount namespace; libvirtd itself sees /run/libvirt/libvirt-sock. */
  libvirtSocket: string;
  /** The directory libvirtd sees as /run/libvirt (bind it there to make the socket the default one). */
  libvirtRunDir: string;
  /** The directory libvirtd sees as /var/lib/libvirt/images. */
  imagesDir: string;
  netns: string;
  subnet: string;
  hostAddress: string;
  sshHost: string;
  sshPort: number;
  sshUser: string;
  clientKey: string;
  knownHosts: string;
  pidsFile: string;
}

let ready: Promise<StockHostEnv> | undefined;
let broughtUpHere = false;

async function script(...args: string[]): Promise<string> {
  try {
    const { stdout } = await run("bash", [SCRIPT, ...args], { timeout: 120_000, env: process.env });
    return stdout;
  } catch (error) {
    const e = error as { stdout?: string; stderr?: string; message: string };
    throw new Error(
      `test/lab/stock-host-up.sh ${args.join(" ")} failed: ${e.message}\n${e.stdout ?? ""}${e.stderr ?? ""}\n` +
        "The stock-host lab needs root and the packages from test/setup-host.sh.",
    );
  }
}

async function bringUp(): Promise<StockHostEnv> {
  const pidsFile = `${STOCK_DIR}/pids`;
  const before = readPids(pidsFile).filter((p) => commandNameOf(p.pid) === p.name);
  try {
    await script();
  } catch (error) {
    broughtUpHere = true; // whatever it left half made goes with the purge
    throw error;
  }
  const libvirtd = readPids(pidsFile).find((p) => p.name === "libvirtd");
  if (
    libvirtd &&
    !before.some((b) => b.pid === libvirtd.pid) &&
    commandNameOf(libvirtd.pid) === "libvirtd"
  ) {
    broughtUpHere = true;
    takeDownOnSignal(LAB_SCRIPTS_DIR, "stock-host-down.sh");
  }
  return JSON.parse(readFileSync(`${STOCK_DIR}/env.json`, "utf8")) as StockHostEnv;
}

export function useStockHost(): Promise<StockHostEnv> {
  ready ??= bringUp();
  return ready;
}

/** Back to what the packages leave: network default inactive and not autostarted, no pool default. */
export async function resetStockHost(): Promise<void> {
  await script("reset");
}

/** Bridges this machine's leg (<subnet>.254) to virbr0; the network default must be running. */
export async function linkStockHost(): Promise<void> {
  await script("link");
}

export function stockVirsh(env: StockHostEnv, ...args: string[]): string {
  return execFileSync(
    "virsh",
    ["-q", "-c", `qemu:///system?socket=${env.libvirtSocket}`, ...args],
    {
      encoding: "utf8",
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
}

/** Takes the profile down completely if this process brought it up (unless LAB_KEEP=1). */
export async function stopStockHostProcesses(): Promise<void> {
  if (process.env.LAB_KEEP === "1" || !broughtUpHere) return;
  await takeDown(LAB_SCRIPTS_DIR, "stock-host-down.sh");
  broughtUpHere = false;
  ready = undefined;
}
