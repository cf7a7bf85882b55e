import assert from "node:assert/strict";
import { Deadline } from "../../provider/common/deadline";
import { isTransient } from "../../provider/common/errors";
import { recheckEgress, RECHECK_TURNS } from "../../provider/common/egress-recheck";
import { Turns } from "../../provider/common/turns";
import {
  startEchoServer,
  startForwardProxy,
  type ForwardProxy,
  type RunningServer,
} from "../support/forward-proxy";

/** Work the test finishes by hand, counting how many ran at once. */
function gate() {
  let running = 0;
  let peak = 0;
  const waiting: Array<() => void> = [];
  return {
    work: () =>
      new Promise<string>((resolve) => {
        running += 1;
        peak = Math.max(peak, running);
        waiting.push(() => {
          running -= 1;
          resolve("done");
        });
      }),
    finishOne() {
      waiting.shift()?.();
    },
    get running() {
      return running;
    },
    get peak() {
      return peak;
    },
  };
}

const tick = () => new Promise((resolve) => setImmediate(resolve));
const roomy = () => Deadline.afterSeconds(60, "test");

describe("Turns: work a refresh starts all at once, bounded in total and per key", () => {
  it("never more than `total` at once; the others start as turns free up, first come first served", async () => {
    const turns = new Turns({ total: 3, perKey: 3 });
    const work = gate();
    const order: number[] = [];
    const all = Array.from({ length: 7 }, (_, i) =>
      turns.run(`echo${i % 3}`, roomy(), 0, "probe", async () => {
        order.push(i);
        return work.work();
      }),
    );
    await tick();
    assert.equal(work.running, 3);
    while (work.running > 0) {
      work.finishOne();
      await tick();
    }
    assert.deepEqual(await Promise.all(all), Array(7).fill("done"));
    assert.equal(work.peak, 3);
    assert.deepEqual(order, [0, 1, 2, 3, 4, 5, 6]);
    assert.deepEqual(turns.peak, { total: 3, perKey: 1 });
  });

  it("a key at its own bound holds back only itself", async () => {
    const turns = new Turns({ total: 10, perKey: 2 });
    const busy = gate();
    const other = gate();
    const held = Array.from({ length: 5 }, () =>
      turns.run("echo.a", roomy(), 0, "probe", busy.work),
    );
    await tick();
    const free = turns.run("echo.b", roomy(), 0, "probe", other.work);
    await tick();
    assert.equal(busy.running, 2, "echo.a at its bound");
    assert.equal(other.running, 1, "echo.b started beside it, not behind the queued echo.a");
    other.finishOne();
    await free;
    while (busy.running > 0) {
      busy.finishOne();
      await tick();
    }
    await Promise.all(held);
    assert.equal(busy.peak, 2);
  });

  it("a turn freed by failed work is a turn: the failure reaches its caller only", async () => {
    const turns = new Turns({ total: 1, perKey: 1 });
    const failing = turns.run("k", roomy(), 0, "probe", () => Promise.reject(new Error("reset")));
    const next = turns.run("k", roomy(), 0, "probe", async () => "ran");
    await assert.rejects(failing, /reset/);
    assert.equal(await next, "ran");
  });

  it("no turn while the deadline still leaves what the work needs: a TransientError, and the work never runs", async () => {
    const turns = new Turns({ total: 1, perKey: 1 });
    const holder = gate();
    const holding = turns.run("k", roomy(), 0, "probe", holder.work);
    let ran = false;
    const started = Date.now();
    await assert.rejects(
      turns.run(
        "k",
        new Deadline(300, "timeouts.readSeconds"),
        200,
        "the egress re-check of edge-1",
        async () => {
          ran = true;
        },
      ),
      (error: Error) => {
        assert.ok(isTransient(error), error.message);
        assert.match(error.message, /the egress re-check of edge-1 waited for a turn/);
        assert.match(error.message, /next refresh tries again/);
        return true;
      },
    );
    assert.ok(Date.now() - started < 290, "gave up once only the work's need was left");
    assert.equal(ran, false);
    holder.finishOne();
    await holding;
    assert.equal(await turns.run("k", roomy(), 0, "probe", async () => "free again"), "free again");
  });

  it("refuses limits below 1", () => {
    assert.throws(() => new Turns({ total: 0, perKey: 1 }), RangeError);
    assert.throws(() => new Turns({ total: 1, perKey: 0 }), RangeError);
  });
});

describe("egress re-checks of a whole refresh at once (common/egress-recheck.ts, RECHECK_TURNS)", function () {
  this.timeout(60_000);
  let echo: RunningServer;
  let proxy: ForwardProxy;
  before(async () => {
    // An echo across the internet answers in tens of milliseconds: long enough for probes to pile up.
    echo = await startEchoServer("127.0.0.1", 60);
    proxy = await startForwardProxy({ host: "127.0.0.2", egressAddress: "127.0.0.3" });
  });
  after(async () => {
    await proxy?.close();
    await echo?.close();
  });

  it("150 re-checks started at once (an unbounded refresh): every one answered, never more than 32 at the echo service at a time", async () => {
    RECHECK_TURNS.peak = { total: 0, perKey: 0 };
    const check = { url: `http://127.0.0.1:${echo.port}/` };
    const findings = await Promise.all(
      Array.from({ length: 150 }, () =>
        recheckEgress({ host: "127.0.0.2", port: proxy.port }, check, {}, roomy()),
      ),
    );
    assert.ok(
      findings.every(
        (finding) => finding.egressIp === "127.0.0.3" && finding.egressProblem === null,
      ),
    );
    assert.deepEqual(RECHECK_TURNS.peak, { total: 32, perKey: 32 });
  });
});
