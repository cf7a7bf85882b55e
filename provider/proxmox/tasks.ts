// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import { EgressProxyError, isTransient, PermanentError } from "../common/errors";
import { Deadline, sleepWithin } from "../common/deadline";
import { ProxmoxClient, segment } from "./client";
import { classifyTaskFailure } from "./classify";
import { forgetNodeListings } from "./node-listings";

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
  /**
   * When the task was started (its request answered), as Date.now(); default
   * now. A task waited for late (one that ran beside other work) is asked
   * about at once, and the pauses go on from where its age puts them.
   */
  startedAt?: number;
  /** First pause; each next pause is `pollStepMs` longer, up to `maxPollMs`. */
  pollMs?: number;
  pollStepMs?: number;
  maxPollMs?: number;
  /** Lines of log put into the error on failure. */
  logTailLines?: number;
}

/**
 * The pause before each status poll: 50 ms, then 200 ms longer each time, up
 * to 2 s. Dense in the first two seconds, where most tasks of the create flow
 * end (a config write or a seed copy in well under a second, F16's full clone
 * (docs/proxmox.md section 9, fact F16) and a start in about two), so a task is seen done within a few hundred ms
 * of the end in five polls; a minutes-long clone is asked about every 2 s.
 */
export function taskPollPauseMs(
  poll: number,
  options: Pick<WaitOptions, "pollMs" | "pollStepMs" | "maxPollMs"> = {},
): number {
  const first = options.pollMs ?? 50;
  const step = options.pollStepMs ?? 200;
  const max = options.maxPollMs ?? 2000;
  return Math.min(max, first + step * poll);
}

/**
 * For a task that is `ageMs` old when the wait begins: how many pauses of the
 * schedule it has already lived through (0 for a task just started).
 */
export function pausesLivedThrough(
  ageMs: number,
  options: Pick<WaitOptions, "pollMs" | "pollStepMs" | "maxPollMs"> = {},
): number {
  let poll = 0;
  for (let elapsed = taskPollPauseMs(0, options); elapsed <= ageMs; poll++)
    elapsed += taskPollPauseMs(poll + 1, options);
  return poll;
}

/** A task PVE accepted: its UPID (null when the call finished at once), and when it was started. */
export interface StartedTask {
  upid: string | null;
  startedAt: number;
}

/** Waits for a task started earlier; one that ran beside other work is asked about at once. */
export function waitForStarted(
  client: ProxmoxClient,
  task: StartedTask,
  deadline: Deadline,
): Promise<void> {
  return waitForTask(client, task.upid, { deadline, startedAt: task.startedAt });
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
  try {
    await pollUntilStopped(client, upid, options);
  } finally {
    // The task changed its node while it ran (a clone, a start, a seed copy):
    // no listing asked before it ended answers a Read after (node-listings.ts).
    forgetNodeListings(upid.node);
  }
}

async function pollUntilStopped(
  client: ProxmoxClient,
  upid: Upid,
  options: WaitOptions,
): Promise<void> {
  const statusPath = `/nodes/${segment(upid.node)}/tasks/${segment(upid.text)}/status`;
  // A task already older than the first pause is asked about at once.
  let poll = pausesLivedThrough(Date.now() - (options.startedAt ?? Date.now()), options);
  if (poll === 0) await sleepWithin(taskPollPauseMs(poll++, options), options.deadline);
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
    await sleepWithin(taskPollPauseMs(poll++, options), options.deadline);
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
