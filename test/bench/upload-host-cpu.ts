/**
 * What the host side (the lab's sshd and libvirtd) spends on one upload of
 * ours: `upload_host_cpu_ms` and the goal on it (libvirt.ts). Opened just
 * before the uploading process dials, closed once the upload is done and
 * before that process closes its connection.
 *
 * - sshd: every process that appeared below the lab's listening sshd during
 *   the window (our connection's: for a root login, one process that
 *   authenticates and then serves the session, the unix-socket forward
 *   included, plus its pre-authentication child, which it has already waited
 *   for), each with its own time and that of the children it waited for,
 *   read while they are still alive. Not the listener's cutime/cstime after
 *   the connection ends: that is exact only if every process of the
 *   connection is waited for by its parent up the chain, and OpenSSH 9.2's
 *   monitor of a non-root (privilege-separated) login exits without waiting
 *   for its session process when the peer hangs up (init reaps that one, and
 *   its time with it); it would also take in every other connection that
 *   ended in the window. Read before the close, the sum covers the login and
 *   the upload, all of it, and nothing of other connections that came and
 *   went; a connection that is still open beside ours is refused (exactly one
 *   new child of the listener, or the bench fails).
 * - libvirtd: its time (all threads, those that ended too: the stream's
 *   `fd-stream` thread) and its waited-for children's, the difference across
 *   the window. It is one process for every client, so the bench must have
 *   the lab to itself (it runs alone); an idle daemon spends nothing.
 *
 * Both are read to the clock tick (10 ms; proc-cpu.ts), so the figure is up
 * to ~30 ms short, ~3 % of the ~1 s the host spends on 512 MiB.
 */
import { commandNameOf, readPids, type LabEnv } from "../lab/lab";
import {
  newDescendants,
  processKey,
  readAllProcStats,
  readProcStat,
  sumTicks,
  ticksBetween,
  ticksToMs,
  descendantsOf,
  type ProcStat,
} from "./proc-cpu";

export interface HostCpuWindow {
  sshdPid: number;
  /** The processes below the listening sshd when the window opened. */
  sshdBefore: ReadonlySet<string>;
  libvirtdBefore: ProcStat;
}

export interface HostCpu {
  sshdMs: number;
  libvirtdMs: number;
}

/** The lab's recorded daemon `name` (lab-up.sh's $LAB/pids), checked to still run under that name. */
function labDaemon(lab: LabEnv, name: string): number {
  const recorded = readPids(lab.pidsFile).find((process) => process.name === name);
  if (recorded === undefined || commandNameOf(recorded.pid) !== name)
    throw new Error(`the lab's ${name} is not running (${lab.pidsFile})`);
  return recorded.pid;
}

export function openHostCpuWindow(lab: LabEnv): HostCpuWindow {
  const sshdPid = labDaemon(lab, "sshd");
  const libvirtdBefore = readProcStat(labDaemon(lab, "libvirtd"));
  if (libvirtdBefore === undefined) throw new Error("the lab's libvirtd is gone");
  return {
    sshdPid,
    sshdBefore: new Set(descendantsOf(sshdPid, readAllProcStats()).map(processKey)),
    libvirtdBefore,
  };
}

/** The host side's CPU since the window opened; call it while our connection is still open. */
export function closeHostCpuWindow(window: HostCpuWindow): HostCpu {
  const libvirtdNow = readProcStat(window.libvirtdBefore.pid);
  if (libvirtdNow === undefined) throw new Error("the lab's libvirtd ended during our upload");
  const sshd = newDescendants(window.sshdPid, window.sshdBefore, readAllProcStats());
  const connections = sshd.filter((process) => process.ppid === window.sshdPid);
  if (connections.length === 0)
    throw new Error(
      `found no new process below the lab's sshd (${window.sshdPid}) while our upload's connection was open`,
    );
  if (connections.length > 1)
    throw new Error(
      `expected one new connection to the lab's sshd during our upload, found ${connections.length} ` +
        `(${sshd.map((process) => `${process.pid} ${process.comm}`).join(", ")}): ` +
        "the host's CPU would not be our upload's alone; does something else use the lab?",
    );
  return {
    sshdMs: ticksToMs(sumTicks(sshd)),
    libvirtdMs: ticksToMs(ticksBetween(window.libvirtdBefore, libvirtdNow)),
  };
}
