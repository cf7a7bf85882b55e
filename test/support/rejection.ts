/** Resolves with the rejection of `promise` (fails the test when it resolves). */
export async function rejectionOf(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (error) {
    return error as Error;
  }
  throw new Error("expected the promise to reject, but it resolved");
}

/** An ssh2 key pair's public half as a known_hosts / authorized_keys key: "<type> <base64>". */
export const publicLine = (key: { public: string }): string =>
  key.public.split(" ").slice(0, 2).join(" ");
