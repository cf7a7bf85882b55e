/**
 * Every call deadline of one connection on a single timer. A sweep puts
 * hundreds of calls in flight at once; a timer each would cost an allocation,
 * a timer-list insert and a cancel per call, and nearly all of them are
 * cancelled unfired. Here a call costs a set insert and delete; the one timer
 * is armed for the earliest deadline and, when it fires, expires what is due
 * and re-arms for the next.
 */
import { LibvirtAbortedError, LibvirtTimeoutError } from "./errors";

export interface CallOptions {
  /** Milliseconds this call may take. Defaults to the connection's `defaultTimeoutMs`. */
  timeoutMs?: number;
  /** Absolute deadline (epoch ms). When both are given, the earlier wins. */
  deadline?: number;
  /** Aborting it fails this call only. */
  signal?: AbortSignal;
}

interface Entry {
  readonly at: number;
  readonly onExpired: () => void;
}

export class CallDeadlines {
  private readonly entries = new Set<Entry>();
  private timer: NodeJS.Timeout | undefined;
  /** When the armed timer fires (epoch ms); Infinity when none is armed. */
  private armedFor = Infinity;

  /** Calls `onExpired` once `at` (epoch ms) has passed, unless the returned function is called first. */
  add(at: number, onExpired: () => void): () => void {
    const entry: Entry = { at, onExpired };
    this.entries.add(entry);
    if (at < this.armedFor) this.arm(at);
    return () => void this.entries.delete(entry);
  }

  get size(): number {
    return this.entries.size;
  }

  /** Forgets every deadline and stops the timer (the connection is finished). */
  clear(): void {
    this.entries.clear();
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.armedFor = Infinity;
  }

  private arm(at: number): void {
    if (this.timer) clearTimeout(this.timer);
    this.armedFor = at;
    this.timer = setTimeout(this.fire, Math.max(0, at - Date.now()));
    // A pending call must not keep the process alive on its own.
    this.timer.unref();
  }

  private readonly fire = (): void => {
    this.timer = undefined;
    this.armedFor = Infinity;
    const now = Date.now();
    const due: Entry[] = [];
    let next = Infinity;
    for (const entry of this.entries) {
      if (entry.at <= now) due.push(entry);
      else if (entry.at < next) next = entry.at;
    }
    for (const entry of due) this.entries.delete(entry);
    // A timer that fired late may find several due: they expire in deadline order all the same.
    due.sort((a, b) => a.at - b.at);
    // Cancelled calls leave no entry, so the timer may fire with nothing due: it just re-arms.
    if (next !== Infinity) this.arm(next);
    for (const entry of due) entry.onExpired();
  };
}

/**
 * Registers one call's deadline (`timeoutMs` from now, or `deadline`, the
 * earlier of the two) and its signal listener; `onExpired` gets a
 * LibvirtTimeoutError or LibvirtAbortedError. Returns a function that disarms both.
 */
export function armCallDeadline(
  deadlines: CallDeadlines,
  defaultTimeoutMs: number,
  procedureName: string,
  options: CallOptions,
  onExpired: (error: Error) => void,
): () => void {
  const now = Date.now();
  let deadline = now + (options.timeoutMs ?? defaultTimeoutMs);
  if (options.deadline !== undefined && options.timeoutMs === undefined)
    deadline = options.deadline;
  else if (options.deadline !== undefined) deadline = Math.min(deadline, options.deadline);
  const timeoutMs = Math.max(0, deadline - now);
  const signal = options.signal;
  let armed = true;
  const disarm = (): void => {
    if (!armed) return;
    armed = false;
    forgetDeadline();
    signal?.removeEventListener("abort", onAbort);
  };
  const onAbort = (): void => {
    disarm();
    onExpired(new LibvirtAbortedError(procedureName, { cause: signal?.reason }));
  };
  const onTimeout = (): void => {
    if (!armed) return;
    disarm();
    onExpired(new LibvirtTimeoutError(procedureName, timeoutMs));
  };
  const forgetDeadline = deadlines.add(now + timeoutMs, onTimeout);
  // A deadline already past fails before any reply can be read, not after a timer tick.
  if (timeoutMs === 0) queueMicrotask(onTimeout);
  if (signal?.aborted) queueMicrotask(onAbort);
  else signal?.addEventListener("abort", onAbort, { once: true });
  return disarm;
}
