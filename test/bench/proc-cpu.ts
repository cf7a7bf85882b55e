/**
 * The CPU time of processes, read from Linux's /proc/<pid>/stat: what the
 * upload bench (libvirt.ts) uses to say what the host side (the lab's sshd and
 * libvirtd) spent on our upload. The parsing and the summing are pure
 * functions of the stat lines (test/unit/bench-proc-cpu.test.ts).
 *
 * Times are in clock ticks (USER_HZ, `getconf CLK_TCK`, 100 on every Linux
 * this runs on): the kernel keeps each process's time to the nanosecond but
 * hands it out truncated to a tick, so one reading is up to 10 ms short per
 * field.
 */
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";

/** The fields of one /proc/<pid>/stat line this module uses; times in clock ticks. */
export interface ProcStat {
  pid: number;
  /** The command name (at most 15 bytes); it may hold spaces and parentheses. */
  comm: string;
  state: string;
  ppid: number;
  /** This process's own time (all its threads, those that ended too), user and kernel. */
  utime: number;
  stime: number;
  /** The time of its children that ended and that it waited for (and of theirs, transitively). */
  cutime: number;
  cstime: number;
  /** When it started, in ticks after boot: with the PID, names one process even once the PID is reused. */
  starttime: number;
}

/**
 * One /proc/<pid>/stat line (proc(5)): `pid (comm) state ppid … utime stime
 * cutime cstime … starttime …`. The command name is whatever the process
 * called itself, spaces and parentheses included, so it runs from the first
 * "(" to the last ")": nothing after it can hold a ")".
 */
export function parseProcStat(line: string): ProcStat {
  const open = line.indexOf("(");
  const close = line.lastIndexOf(")");
  if (open < 0 || close < open) throw new Error(`not a /proc/<pid>/stat line: ${line}`);
  const pid = Number(line.slice(0, open).trim());
  // Field 3 (state) onwards: fields[n - 3] is proc(5)'s field n.
  const fields = line
    .slice(close + 1)
    .trim()
    .split(/\s+/);
  const number = (field: number): number => {
    const value = Number(fields[field - 3]);
    if (fields[field - 3] === undefined || !Number.isInteger(value))
      throw new Error(`/proc/<pid>/stat field ${field} is no integer in: ${line}`);
    return value;
  };
  if (!Number.isInteger(pid) || pid <= 0)
    throw new Error(`no PID in /proc/<pid>/stat line: ${line}`);
  return {
    pid,
    comm: line.slice(open + 1, close),
    state: fields[0] ?? "",
    ppid: number(4),
    utime: number(14),
    stime: number(15),
    cutime: number(16),
    cstime: number(17),
    starttime: number(22),
  };
}

/** A process's own time and that of the children it waited for, in ticks. */
export function ownAndReapedTicks(stat: ProcStat): number {
  return stat.utime + stat.stime + stat.cutime + stat.cstime;
}

/** One process, even across PID reuse. */
export function processKey(stat: ProcStat): string {
  return `${stat.pid}@${stat.starttime}`;
}

/** Every process below `root` in the parent links of `stats` (children, theirs, …), root excluded. */
export function descendantsOf(root: number, stats: readonly ProcStat[]): ProcStat[] {
  const children = new Map<number, ProcStat[]>();
  for (const stat of stats) children.set(stat.ppid, [...(children.get(stat.ppid) ?? []), stat]);
  const found: ProcStat[] = [];
  const pending = [root];
  const seen = new Set<number>(pending);
  for (let next = pending.pop(); next !== undefined; next = pending.pop())
    for (const child of children.get(next) ?? [])
      if (!seen.has(child.pid)) {
        seen.add(child.pid);
        found.push(child);
        pending.push(child.pid);
      }
  return found;
}

/** The processes below `root` now (`stats`) that were not among `before` (keys from processKey). */
export function newDescendants(
  root: number,
  before: ReadonlySet<string>,
  stats: readonly ProcStat[],
): ProcStat[] {
  return descendantsOf(root, stats).filter((stat) => !before.has(processKey(stat)));
}

/**
 * The ticks of processes that all started inside a window, up to now: each
 * one's own time plus its children's that it waited for. A process that is
 * alive counts its live children apart (they are among `stats` too), so
 * nothing is counted twice.
 */
export function sumTicks(stats: readonly ProcStat[]): number {
  return stats.reduce((sum, stat) => sum + ownAndReapedTicks(stat), 0);
}

/** The ticks one long-lived process spent between two readings of it; it must be the same process. */
export function ticksBetween(before: ProcStat, after: ProcStat): number {
  if (processKey(before) !== processKey(after))
    throw new Error(
      `process ${before.pid} (${before.comm}) was replaced by another (${processKey(after)}) between two readings`,
    );
  return ownAndReapedTicks(after) - ownAndReapedTicks(before);
}

/** /proc/<pid>/stat, or undefined once the process is gone. */
export function readProcStat(pid: number): ProcStat | undefined {
  try {
    return parseProcStat(readFileSync(`/proc/${pid}/stat`, "utf8"));
  } catch (error) {
    if (
      (error as NodeJS.ErrnoException).code === "ENOENT" ||
      (error as NodeJS.ErrnoException).code === "ESRCH"
    )
      return undefined;
    throw error;
  }
}

/** Every process of /proc (those that end while it is read are left out). */
export function readAllProcStats(): ProcStat[] {
  return readdirSync("/proc")
    .filter((name) => /^\d+$/.test(name))
    .flatMap((name) => readProcStat(Number(name)) ?? []);
}

let ticksPerSecond: number | undefined;

/** USER_HZ, the unit of /proc's times (Node has no sysconf). */
export function clockTicksPerSecond(): number {
  if (ticksPerSecond === undefined) {
    const value = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim());
    if (!Number.isInteger(value) || value <= 0)
      throw new Error("getconf CLK_TCK gave no tick rate");
    ticksPerSecond = value;
  }
  return ticksPerSecond;
}

export function ticksToMs(ticks: number): number {
  return (ticks * 1000) / clockTicksPerSecond();
}
