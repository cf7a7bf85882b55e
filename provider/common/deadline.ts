import { isTransient, TransientError } from "./errors";

/**
 * A point in time by which an operation must be over. Passed down a call chain
 * so every network call and every wait takes what is left, never a fresh
 * allowance of its own: a dead host cannot stretch a create past its timeout.
 */
export class Deadline {
  readonly at: number;

  constructor(
    readonly budgetMs: number,
    /** Named in the timeout error, e.g. "timeouts.createSeconds". */
    readonly setting: string,
    now: number = Date.now(),
  ) {
    this.at = now + budgetMs;
  }

  static afterSeconds(seconds: number, setting: string): Deadline {
    return new Deadline(seconds * 1000, setting);
  }

  remainingMs(): number {
    return Math.max(0, this.at - Date.now());
  }

  expired(): boolean {
    return this.remainingMs() === 0;
  }

  /** A per-call timeout: at most `capMs`, never past the deadline (and at least 1 ms). */
  capped(capMs: number): number {
    return Math.max(1, Math.min(capMs, this.remainingMs()));
  }

  /** A deadline `reserveMs` earlier (never before now): the time after it is kept for a last step. */
  leaving(reserveMs: number): Deadline {
    return new Deadline(Math.max(0, this.remainingMs() - reserveMs), this.setting);
  }

  /** Throws the timeout error when the deadline has passed. */
  check(what: string): void {
    if (this.expired()) throw this.timeoutError(what);
  }

  timeoutError(what: string, cause?: unknown): TransientError {
    return new TransientError(
      `${what} did not finish within ${Math.round(this.budgetMs / 1000)} s; raise ${this.setting} if the host is just slow`,
      cause === undefined ? {} : { cause },
    );
  }
}

/** Sleeps, but never past the deadline. */
/**
 * How long a guest gets to power off cleanly before it is stopped hard, on every backend: a minute, or
 * half of what the deadline leaves, so the hard stop and what follows it still fit.
 */
export function shutdownGraceMs(deadline: Deadline): number {
  return Math.min(60_000, deadline.remainingMs() / 2);
}

export function sleepWithin(ms: number, deadline?: Deadline): Promise<void> {
  const wait = deadline === undefined ? ms : Math.min(ms, deadline.remainingMs());
  return new Promise((resolve) => setTimeout(resolve, wait));
}

export interface BackoffOptions {
  /** First pause, doubled after each attempt up to `maxDelayMs`. */
  initialDelayMs: number;
  maxDelayMs: number;
  /** Which failures deserve another attempt; Transient ones by default. */
  retryable?: (error: unknown) => boolean;
  /** Called before each pause, e.g. to log the reason. */
  onRetry?: (error: unknown, attempt: number) => void;
}

/**
 * Runs `attempt` until it succeeds, a non-retryable error comes up, or the
 * deadline passes (then the last error is wrapped in the deadline's timeout
 * error). Jitter spreads parallel callers that failed together.
 */
export async function retryWithBackoff<T>(
  what: string,
  deadline: Deadline,
  options: BackoffOptions,
  attempt: (attemptNumber: number) => Promise<T>,
): Promise<T> {
  const retryable = options.retryable ?? isTransient;
  let delay = options.initialDelayMs;
  for (let attemptNumber = 1; ; attemptNumber++) {
    try {
      return await attempt(attemptNumber);
    } catch (error) {
      if (!retryable(error)) throw error;
      if (deadline.remainingMs() <= delay) throw deadline.timeoutError(what, error);
      options.onRetry?.(error, attemptNumber);
      await sleepWithin(delay * (0.5 + Math.random()), deadline);
      delay = Math.min(options.maxDelayMs, delay * 2);
    }
  }
}
