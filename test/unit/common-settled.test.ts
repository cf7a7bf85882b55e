import assert from "node:assert/strict";
import { allSettledOrFirstFailure } from "../../provider/common/settled";

const after = <T>(ms: number, value: T, fail = false): Promise<T> =>
  new Promise((resolve, reject) =>
    setTimeout(() => (fail ? reject(new Error(String(value))) : resolve(value)), ms),
  );

describe("allSettledOrFirstFailure: nothing left in flight when a step returns or fails", () => {
  it("returns every value in order", async () => {
    assert.deepEqual(await allSettledOrFirstFailure([after(5, 1), after(1, "two")] as const), [
      1,
      "two",
    ]);
  });

  it("throws only once the slower call has settled, and the first failure in the order given", async () => {
    let slowSettled = false;
    const slow = after(40, "autostart set").then((value) => {
      slowSettled = true;
      return value;
    });
    await assert.rejects(
      allSettledOrFirstFailure([after(30, "second", true), after(1, "start failed", true), slow]),
      (error: Error) => {
        assert.equal(error.message, "second", "the first failure in the order given");
        assert.equal(slowSettled, true, "the call still in flight was waited for");
        return true;
      },
    );
  });
});
