/**
 * Waits for every promise to settle, then returns their values, or throws the
 * first failure in the order given. So a step never returns (or fails) while
 * a call it started is still in flight: an undo, a record of what was made,
 * or the caller's next call would otherwise race it.
 */
export async function allSettledOrFirstFailure<T extends readonly unknown[]>(steps: {
  [K in keyof T]: Promise<T[K]>;
}): Promise<T> {
  const outcomes = await Promise.allSettled(steps);
  const failed = outcomes.find((outcome) => outcome.status === "rejected");
  if (failed) throw failed.reason;
  return outcomes.map(
    (outcome) => (outcome as PromiseFulfilledResult<unknown>).value,
  ) as unknown as T;
}
