/**
 * What a host answers for all its VMs in one call (a node's VM listing, a
 * storage's content, libvirt's domain listing), shared by the Reads of one
 * refresh. The engine starts a provider process per deployment and hands it
 * every Read of a refresh at `--parallel` at once, so one listing per host
 * can answer a hundred Reads; without sharing, each member pays for the
 * whole host's answer and the refresh grows with the square of the pool.
 *
 * Freshness is what matters more than saving calls:
 * - a listing is shared by the calls that arrive while it is in flight and
 *   by those that start within `windowMs` of when it was asked for (not of
 *   when it answered: a slow answer does not stretch its life);
 * - `forget(host)` is called by every write this process sends to that host,
 *   and by every task it waits for there: a call after it never sees a
 *   listing asked for before it, not even one still in flight;
 * - a failed listing is not kept: the next call asks again.
 * So no Read sees an answer older than `windowMs`, or older than this
 * process's own last change to the host. A process that outlives one
 * refresh (an engine test refreshing twice on one server) sees a change made
 * behind its back once the window has passed.
 */
export interface SharedListingOptions {
  /** How long after it was asked for a listing may still be handed out. */
  windowMs: number;
  /** Milliseconds, monotonic; `performance.now` unless a test drives the clock. */
  now?: () => number;
}

interface Entry<T> {
  askedAt: number;
  /** What `forget` names: the host the listing came from (the key itself unless given). */
  group: string;
  answer: Promise<T>;
}

export class SharedListings<T> {
  private readonly entries = new Map<string, Entry<T>>();
  private readonly windowMs: number;
  private readonly now: () => number;
  /** How many listings were asked of the host, by key: for tests and benches. */
  readonly asked = new Map<string, number>();

  constructor(options: SharedListingOptions) {
    if (!(options.windowMs >= 0)) throw new RangeError("windowMs must be 0 or more");
    this.windowMs = options.windowMs;
    this.now = options.now ?? (() => performance.now());
  }

  /**
   * The shared listing of `key`, asking `list` only when none fresh enough is
   * in hand. `group` (default: the key) is the host it belongs to, which
   * `forget` names: a host can have several listings (a pool's volumes each).
   */
  get(key: string, list: () => Promise<T>, group: string = key): Promise<T> {
    const now = this.now();
    const entry = this.entries.get(key);
    if (entry !== undefined && now - entry.askedAt <= this.windowMs) return entry.answer;
    this.asked.set(key, (this.asked.get(key) ?? 0) + 1);
    const answer = list();
    const fresh: Entry<T> = { askedAt: now, group, answer };
    this.entries.set(key, fresh);
    answer.catch(() => {
      if (this.entries.get(key) === fresh) this.entries.delete(key);
    });
    return answer;
  }

  /**
   * The host changed (a write of ours, a task we waited for): later calls ask
   * again. A listing in flight is dropped too; only `get` ever stores one, so
   * its answer never comes back into the map.
   */
  forget(group: string): void {
    for (const [key, entry] of this.entries) if (entry.group === group) this.entries.delete(key);
  }

  /** Every host changed (a write not addressed to one): later calls ask again. */
  forgetAll(): void {
    this.entries.clear();
  }

  /** Drop every listing and the counters (a provider reconfigured, a test starting). */
  clear(): void {
    this.entries.clear();
    this.asked.clear();
  }
}
