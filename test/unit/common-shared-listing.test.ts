import assert from "node:assert/strict";
import { SharedListings } from "../../provider/common/shared-listing";

/** A listing the test answers by hand, counting how often the host was asked. */
function host() {
  const waiting: { resolve: (value: string[]) => void; reject: (error: Error) => void }[] = [];
  let calls = 0;
  return {
    list: () =>
      new Promise<string[]>((resolve, reject) => {
        calls += 1;
        waiting.push({ resolve, reject });
      }),
    answer(value: string[]) {
      waiting.shift()?.resolve(value);
    },
    fail(message: string) {
      waiting.shift()?.reject(new Error(message));
    },
    get calls() {
      return calls;
    },
  };
}

describe("SharedListings: one listing per host for the Reads of a refresh, never older than the window or our own writes", () => {
  let clock = 0;
  const listings = () => new SharedListings<string[]>({ windowMs: 1000, now: () => clock });
  beforeEach(() => {
    clock = 0;
  });

  it("calls arriving while a listing is in flight, and within the window after, share it", async () => {
    const shared = listings();
    const node = host();
    const first = shared.get("pve1", node.list);
    const second = shared.get("pve1", node.list);
    node.answer(["100", "101"]);
    assert.deepEqual(await first, ["100", "101"]);
    assert.equal(await second, await first);
    clock = 1000;
    assert.deepEqual(await shared.get("pve1", node.list), ["100", "101"]);
    assert.equal(node.calls, 1);
    assert.equal(shared.asked.get("pve1"), 1);
  });

  it("the window counts from when the listing was asked for: past it, the host is asked again", async () => {
    const shared = listings();
    const node = host();
    const first = shared.get("pve1", node.list);
    clock = 900; // a slow answer does not stretch the listing's life
    node.answer(["100"]);
    await first;
    clock = 1001;
    const second = shared.get("pve1", node.list);
    node.answer(["100", "102"]);
    assert.deepEqual(await second, ["100", "102"]);
    assert.equal(node.calls, 2);
  });

  it("each host has its own listing", async () => {
    const shared = listings();
    const one = host();
    const two = host();
    const a = shared.get("pve1", one.list);
    const b = shared.get("pve2", two.list);
    one.answer(["100"]);
    two.answer(["200"]);
    assert.deepEqual([await a, await b], [["100"], ["200"]]);
  });

  it("after forget, a call never gets a listing asked for before it, not even one still in flight", async () => {
    const shared = listings();
    const node = host();
    const before = shared.get("pve1", node.list);
    shared.forget("pve1"); // our own write to the node
    const after = shared.get("pve1", node.list);
    assert.equal(node.calls, 2);
    node.answer(["stale"]);
    node.answer(["fresh"]);
    assert.deepEqual(await before, ["stale"]);
    assert.deepEqual(await after, ["fresh"]);
    assert.deepEqual(
      await shared.get("pve1", node.list),
      ["fresh"],
      "the stale answer was not kept",
    );
    assert.equal(node.calls, 2);
  });

  it("a failed listing fails the calls that shared it and is not kept: the next call asks again", async () => {
    const shared = listings();
    const node = host();
    const first = shared.get("pve1", node.list);
    const second = shared.get("pve1", node.list);
    node.fail("connection reset");
    await assert.rejects(first, /connection reset/);
    await assert.rejects(second, /connection reset/);
    const third = shared.get("pve1", node.list);
    node.answer(["100"]);
    assert.deepEqual(await third, ["100"]);
    assert.equal(node.calls, 2);
  });

  it("refuses a negative window", () => {
    assert.throws(() => new SharedListings({ windowMs: -1 }), /windowMs/);
  });
});
