/**
 * Turns for work that a whole refresh starts at once: at most `total` in
 * flight in the process, and at most `perKey` for any one key. Older Pulumi
 * CLIs launch every Read of a refresh at the same moment, and the engine
 * serves all of a deployment's dynamic resources from one process: a pool
 * of a thousand would open a thousand probes at once, all to the same echo
 * service, from one runner.
 *
 * Waiting for a turn is bounded by the caller's deadline, less what the
 * work itself needs: a probe started with no time left would fail on our
 * own queue and be taken for a proxy that does not answer. So a wait that
 * cannot leave `needMs` throws a TransientError (the read fails, state is
 * kept, the next refresh tries again) and the work never starts.
 */
import type { Deadline } from "./deadline";
import { TransientError } from "./errors";

export interface TurnLimits {
  total: number;
  perKey: number;
}

interface Waiter {
  key: string;
  start: () => void;
}

export class Turns {
  private inFlight = 0;
  private readonly perKeyInFlight = new Map<string, number>();
  private waiting: Waiter[] = [];
  /** The most ever in flight at once, in total and for one key: for tests and benches. */
  peak = { total: 0, perKey: 0 };

  constructor(private readonly limits: TurnLimits) {
    if (!(limits.total >= 1 && limits.perKey >= 1))
      throw new RangeError("turn limits must be 1 or more");
  }

  /**
   * Runs `work` once a turn is free for `key`. Throws a TransientError naming
   * `what` when no turn came while `deadline` still left `needMs`.
   */
  async run<T>(
    key: string,
    deadline: Deadline,
    needMs: number,
    what: string,
    work: () => Promise<T>,
  ): Promise<T> {
    await this.turn(key, deadline, needMs, what);
    try {
      return await work();
    } finally {
      this.release(key);
    }
  }

  private free(key: string): boolean {
    return (
      this.inFlight < this.limits.total && (this.perKeyInFlight.get(key) ?? 0) < this.limits.perKey
    );
  }

  private take(key: string): void {
    this.inFlight += 1;
    const forKey = (this.perKeyInFlight.get(key) ?? 0) + 1;
    this.perKeyInFlight.set(key, forKey);
    this.peak = {
      total: Math.max(this.peak.total, this.inFlight),
      perKey: Math.max(this.peak.perKey, forKey),
    };
  }

  private release(key: string): void {
    this.inFlight -= 1;
    const forKey = (this.perKeyInFlight.get(key) ?? 1) - 1;
    if (forKey === 0) this.perKeyInFlight.delete(key);
    else this.perKeyInFlight.set(key, forKey);
    // First come, first served among those whose key has room.
    const next = this.waiting.find((waiter) => this.free(waiter.key));
    if (next === undefined) return;
    this.waiting = this.waiting.filter((waiter) => waiter !== next);
    this.take(next.key);
    next.start();
  }

  private turn(key: string, deadline: Deadline, needMs: number, what: string): Promise<void> {
    // Free, and nobody of the same key queued before: a key held back by its own bound holds back no other.
    if (this.free(key) && !this.waiting.some((waiter) => waiter.key === key)) {
      this.take(key);
      return Promise.resolve();
    }
    const patienceMs = deadline.remainingMs() - needMs;
    return new Promise<void>((resolve, reject) => {
      const waiter: Waiter = {
        key,
        start: () => {
          clearTimeout(timer);
          resolve();
        },
      };
      const timer = setTimeout(
        () => {
          this.waiting = this.waiting.filter((other) => other !== waiter);
          reject(
            new TransientError(
              `${what} waited for a turn (${this.limits.total} at once, ${this.limits.perKey} per ${key}) until too little of its deadline was left to run; nothing was concluded, the next refresh tries again`,
            ),
          );
        },
        Math.max(0, patienceMs),
      );
      this.waiting.push(waiter);
    });
  }
}
