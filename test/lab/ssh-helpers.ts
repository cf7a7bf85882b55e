/** SSH pieces of the lab tests: dialing the lab's sshd and finding (by PID) the sshd serving us. */
import { readFileSync, readdirSync } from "node:fs";
import type { LibvirtConnection } from "../../provider/libvirt-rpc-xdr";
import { openLibvirtOverSsh, type SshDialOptions, type SshTarget } from "../../provider/ssh";
import type { LabEnv } from "./fixture";

export function labSshTarget(lab: LabEnv, overrides: Partial<SshTarget> = {}): SshTarget {
  return {
    host: lab.sshHost,
    port: lab.sshPort,
    username: lab.sshUser,
    privateKey: readFileSync(lab.clientKey, "utf8"),
    knownHostsFile: lab.knownHosts,
    socketPath: lab.libvirtSocket,
    uri: lab.uri,
    ...overrides,
  };
}

export function openLabSsh(
  lab: LabEnv,
  overrides: Partial<SshTarget> = {},
  options: SshDialOptions = {},
): Promise<LibvirtConnection> {
  return openLibvirtOverSsh(labSshTarget(lab, overrides), {
    handshakeTimeoutMs: 10_000,
    ...options,
  });
}

function parentOf(pid: number): number | undefined {
  try {
    // /proc/PID/stat: "pid (comm) state ppid ..."; comm may contain spaces, so split after the last ')'.
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
  } catch {
    return undefined;
  }
}

/** Every process descended from `root` (children, grandchildren...). */
export function descendantsOf(root: number): number[] {
  const all = readdirSync("/proc")
    .filter((name) => /^\d+$/.test(name))
    .map(Number);
  const found: number[] = [];
  let frontier = [root];
  while (frontier.length > 0) {
    const next = all.filter((pid) => frontier.includes(parentOf(pid) ?? -1));
    found.push(...next);
    frontier = next;
  }
  return found;
}

/** The lab's sshd listener PID, from the lab's pid file. */
export function labSshdPid(lab: LabEnv): number {
  const line = readFileSync(lab.pidsFile, "utf8")
    .split("\n")
    .find((l) => l.startsWith("sshd "));
  if (!line) throw new Error(`no sshd in ${lab.pidsFile}`);
  return Number(line.split(" ")[1]);
}

/**
 * Dials while watching the sshd listener's process tree: the processes that
 * appear during the dial are the ones serving this connection.
 */
export async function openLabSshWithServerPids(
  lab: LabEnv,
  options: SshDialOptions = {},
): Promise<{ conn: LibvirtConnection; serverPids: number[] }> {
  const sshd = labSshdPid(lab);
  const before = new Set(descendantsOf(sshd));
  const conn = await openLabSsh(lab, {}, options);
  const serverPids = descendantsOf(sshd).filter((pid) => !before.has(pid));
  if (serverPids.length === 0)
    throw new Error("could not find the sshd processes serving this connection");
  return { conn, serverPids };
}

export function signalAll(pids: number[], signal: NodeJS.Signals): void {
  for (const pid of pids) {
    try {
      process.kill(pid, signal);
    } catch {
      // already gone
    }
  }
}
