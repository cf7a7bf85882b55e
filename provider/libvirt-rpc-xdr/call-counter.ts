/**
 * How many calls a connection made, by procedure name: what a test or a bench
 * reads to say "one domain listing per host, two calls per member". A
 * connection counts only while a counter is attached (`countCallsInto`), so
 * the provider pays one undefined check per call otherwise.
 */
export class CallCounter {
  private readonly counts = new Map<string, number>();

  add(procedure: string): void {
    this.counts.set(procedure, (this.counts.get(procedure) ?? 0) + 1);
  }

  /** Calls of one procedure (0 when none). */
  of(procedure: string): number {
    return this.counts.get(procedure) ?? 0;
  }

  get total(): number {
    let sum = 0;
    for (const count of this.counts.values()) sum += count;
    return sum;
  }

  /** Procedure → calls, most called first. */
  byProcedure(): Array<[string, number]> {
    return [...this.counts].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
  }

  reset(): void {
    this.counts.clear();
  }
}
