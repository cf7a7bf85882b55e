// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import { EgressProxyError, isTransient, PermanentError } from "../common/errors";
import { Deadline, sleepWithin } from "../common/deadline";
import { ProxmoxClient, segment } from "./client";
import { classifyTaskFailure } from "./classify";

/** UPID:<node>:<pid 8 hex>:<pstart 8-9 hex>:<starttime 8 hex>:<type>:<id>:<user>: (docs/proxmox.md, section 9, "Also relied on"). */
export interface Upid {
  text: string;
  node: string;
  pid: number;
  pstart: number;
  startTime: Date;
  type: string;
  id: string;
  user: string;
}

const UPID_PATTERN =
  /^UPID:([a-zA-Z0-9][a-zA-Z0-9.-]*):([0-9A-Fa-f]{8}):([0-9A-Fa-f]{8,9}):([0-9A-Fa-f]{8}):([^:\s]+):([^:\s]*):([^:\s]+):$/;

export function parseUpid(text: string): Upid {
  const match = UPID_PATTERN.exec(text);
  if (match === null)
    throw new PermanentError(
      `the API returned ${JSON.stringify(text)}, which is not a task id (UPID)`,
    );
  return {
    text,
    node: match[1],
    pid: parseInt(match[2], 16),
    pstart: parseInt(match[3], 16),
    startTime: new Date(parseInt(match[4], 16) * 1000),
    type: match[5],
    id: match[6],
    user: match[7],
  };
}

interface TaskStatus {
  status: "running" | "stopped";
  exitstatus?: string;
}

interface TaskLogLine {
  n: number;
  t: string;
}

export interface WaitOptions {
  deadline: Deadline;
  /** First poll interval; grows to `maxPollMs` for long tasks. */
  pollMs?: number;
  maxPollMs?: number;
  /** Lines of log put into the error on failure. */
  logTailLines?: number;
}

/**
 * Waits for any task until it is `stopped` and honours its `exitstatus` (F16):
 * "OK" (or "WARNINGS: n") is success; anything else fetches the log tail and
 * throws it, classified. A null UPID (some endpoints answer synchronously) is
 * already done.
 */
export async function waitForTask(
  client: ProxmoxClient,
  upidText: string | null,
  options: WaitOptions,
): Promise<void> {
  if (upidText === null || upidText === undefined) return;
  const upid = parseUpid(upidText);
  const statusPath = `/nodes/${segment(upid.node)}/tasks/${segment(upid.text)}/status`;
  let pollMs = options.pollMs ?? 50;
  const maxPollMs = options.maxPollMs ?? 2000;
  let lastPollProblem: unknown;
  for (;;) {
    if (options.deadline.expired())
      throw options.deadline.timeoutError(`task ${upid.type} (${upid.text})`, lastPollProblem);
    let status: TaskStatus | undefined;
    try {
      status = await client.get<TaskStatus>(
        statusPath,
        {},
        { timeoutMs: options.deadline.capped(15_000) },
      );
    } catch (error) {
      // A status poll is a read: a busy or flaky API only delays the answer.
      if (!isTransient(error)) throw error;
      lastPollProblem = error;
    }
    if (status?.status === "stopped") {
      const exit = status.exitstatus ?? "unknown";
      if (exit === "OK" || /^WARNINGS: \d+$/.test(exit)) return;
      throw classifyTaskFailure(upid.text, exit, await taskLogTail(client, upid, options));
    }
    await sleepWithin(pollMs, options.deadline);
    pollMs = Math.min(maxPollMs, Math.round(pollMs * 1.5));
  }
}

/** The last lines of a task's log; best effort, an unreadable log must not hide the real error. */
async function taskLogTail(
  client: ProxmoxClient,
  upid: Upid,
  options: Pick<WaitOptions, "deadline" | "logTailLines">,
): Promise<string[]> {
  const lines = options.logTailLines ?? 20;
  try {
    const log = await client.get<TaskLogLine[]>(
      `/nodes/${segment(upid.node)}/tasks/${segment(upid.text)}/log`,
      { start: 0, limit: 5000 },
      { timeoutMs: options.deadline.capped(10_000) },
    );
    return log.slice(-lines).map((line) => line.t);
  } catch (error) {
    return [
      `(task log unavailable: ${error instanceof EgressProxyError ? error.detail : String(error)})`,
    ];
  }
}
