/**
 * The stock-host lab profile (stock-host-up.sh) from Node: a hypervisor as
 * Debian's packages leave it, beside the regular lab. `useStockHost()` brings
 * it up once per process and remembers which processes this process started,
 * so `stopStockHostProcesses()` stops exactly those, by PID. `resetStockHost()`
 * puts the libvirt objects back to the packages' state between tests.
 */
import { execFile, execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import { promisify } from "node:util";
import { commandNameOf, LAB_SCRIPTS_DIR, readPids, stopByPid } from "./lab";

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
const startedHere: Array<{ name: string; pid: number }> = [];

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
  } finally {
    for (const p of readPids(pidsFile))
      if (!before.some((b) => b.pid === p.pid) && commandNameOf(p.pid) === p.name)
        startedHere.push(p);
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

/** Bridges this machine's leg (203.0.113.254) to virbr0; the network default must be running. */
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

/** Stops, newest first and by PID, the stock-host processes this process started (unless LAB_KEEP=1). */
export async function stopStockHostProcesses(): Promise<void> {
  if (process.env.LAB_KEEP === "1") return;
  for (const p of startedHere.reverse()) await stopByPid(p);
  startedHere.length = 0;
}
