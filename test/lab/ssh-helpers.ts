/** SSH pieces of the lab tests: dialing the lab's sshd and finding (by PID) the sshd serving us. */
import { readFileSync, readdirSync, readlinkSync } from "node:fs";
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

/** Socket inodes of TCP connections from 127.0.0.1:`serverPort` to 127.0.0.1:`clientPort` (server side). */
function serverSocketInodes(serverPort: number, clientPort: number): Set<string> {
  const inodes = new Set<string>();
  const hexPort = (port: number) => port.toString(16).toUpperCase().padStart(4, "0");
  for (const line of readFileSync("/proc/net/tcp", "utf8").split("\n").slice(1)) {
    const fields = line.trim().split(/\s+/);
    if (fields.length < 10) continue;
    const [, local, remote] = fields;
    if (local?.endsWith(`:${hexPort(serverPort)}`) && remote?.endsWith(`:${hexPort(clientPort)}`)) {
      inodes.add(fields[9]!);
    }
  }
  return inodes;
}

/** PIDs of processes holding any of these socket inodes. */
function holdersOf(inodes: Set<string>): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync("/proc").filter((name) => /^\d+$/.test(name))) {
    let fds: string[];
    try {
      fds = readdirSync(`/proc/${entry}/fd`);
    } catch {
      continue;
    }
    const holds = fds.some((fd) => {
      try {
        const target = readlinkSync(`/proc/${entry}/fd/${fd}`);
        return inodes.has(target.replace(/^socket:\[(\d+)\]$/, "$1"));
      } catch {
        return false;
      }
    });
    if (holds) pids.push(Number(entry));
  }
  return pids;
}

/**
 * Dials and finds the sshd processes serving exactly this connection: the
 * ones holding the server side of our TCP link (matched by our local port),
 * so a test never signals a process serving anyone else.
 */
export async function openLabSshWithServerPids(
  lab: LabEnv,
  options: SshDialOptions = {},
): Promise<{ conn: LibvirtConnection; serverPids: number[] }> {
  let localPort = 0;
  const conn = await openLabSsh(
    lab,
    {},
    { ...options, onLinkEstablished: (link) => (localPort = link.localPort) },
  );
  const serverPids = holdersOf(serverSocketInodes(lab.sshPort, localPort)).filter(
    (pid) => pid !== process.pid,
  );
  if (serverPids.length === 0)
    throw new Error(`no sshd process holds the server side of port ${localPort}`);
  for (const pid of serverPids) {
    const comm = readFileSync(`/proc/${pid}/comm`, "utf8").trim();
    if (comm !== "sshd")
      throw new Error(`process ${pid} holding our SSH link is ${comm}, not sshd`);
  }
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

/** Socket inodes this process holds. */
function socketInodesOfThisProcess(): Set<string> {
  const inodes = new Set<string>();
  for (const fd of readdirSync("/proc/self/fd")) {
    try {
      const match = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/self/fd/${fd}`));
      if (match) inodes.add(match[1]!);
    } catch {
      // closed meanwhile
    }
  }
  return inodes;
}

/**
 * The sshd processes serving every SSH link this process has open to the lab
 * (the provider's pooled link included), found by the client ports this
 * process holds: cutting them is a link lost mid-operation, and nobody
 * else's session is touched.
 */
export function sshdServingThisProcess(lab: LabEnv): number[] {
  const mine = socketInodesOfThisProcess();
  const hexPort = lab.sshPort.toString(16).toUpperCase().padStart(4, "0");
  const pids = new Set<number>();
  for (const line of readFileSync("/proc/net/tcp", "utf8").split("\n").slice(1)) {
    const fields = line.trim().split(/\s+/);
    if (fields.length < 10 || !fields[2]?.endsWith(`:${hexPort}`) || !mine.has(fields[9]!))
      continue;
    const clientPort = parseInt(fields[1]!.split(":")[1]!, 16);
    for (const pid of holdersOf(serverSocketInodes(lab.sshPort, clientPort)))
      if (pid !== process.pid && readFileSync(`/proc/${pid}/comm`, "utf8").trim() === "sshd")
        pids.add(pid);
  }
  return [...pids];
}
