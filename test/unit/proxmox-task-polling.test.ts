// Fn, "rule n" and "flow step n" name the Proxmox behaviours listed in docs/proxmox.md, section 9.
import assert from "node:assert/strict";
import { pausesLivedThrough, taskPollPauseMs } from "../../provider/proxmox/tasks";

describe("proxmox task polling schedule", () => {
  it("starts at 50 ms and grows by 200 ms a poll up to 2 s", () => {
    const pauses = Array.from({ length: 12 }, (_, poll) => taskPollPauseMs(poll));
    assert.deepEqual(pauses, [50, 250, 450, 650, 850, 1050, 1250, 1450, 1650, 1850, 2000, 2000]);
  });

  it("sees a 2 s task (F16's clone, a start) done in five polls, within 400 ms of its end", () => {
    let at = 0;
    let polls = 0;
    while (at < 2000) at += taskPollPauseMs(polls++);
    assert.equal(polls, 5);
    assert.ok(at - 2000 <= 400, `seen ${at - 2000} ms late`);
  });

  it("never asks more than once a second after the first five seconds, and once per 2 s after twelve", () => {
    let at = 0;
    for (let poll = 0; poll < 40; poll++) {
      const pause = taskPollPauseMs(poll);
      if (at >= 5000) assert.ok(pause >= 1000);
      if (at >= 12_000) assert.equal(pause, 2000);
      at += pause;
    }
  });

  it("a task waited for late skips the pauses it has lived through", () => {
    assert.equal(pausesLivedThrough(0), 0);
    assert.equal(pausesLivedThrough(49), 0);
    assert.equal(pausesLivedThrough(50), 1);
    assert.equal(pausesLivedThrough(2249), 4);
    assert.equal(pausesLivedThrough(2250), 5);
  });

  it("follows the options a caller passes", () => {
    assert.equal(taskPollPauseMs(0, { pollMs: 5 }), 5);
    assert.equal(taskPollPauseMs(3, { pollMs: 5, pollStepMs: 10, maxPollMs: 20 }), 20);
  });
});
