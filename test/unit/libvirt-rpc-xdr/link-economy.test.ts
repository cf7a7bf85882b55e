/**
 * What keeps many calls on one link cheap: the calls of one turn leave in one
 * transport write, every deadline shares one timer, and a reply that leaves
 * others owed is acknowledged at once (sshd holds the next reply until it is).
 */
import assert from "node:assert/strict";
import {
  KEEPALIVE_PROGRAM,
  KeepaliveProcedure,
  LibvirtTimeoutError,
  Procedures,
  XdrWriter,
} from "../../../provider/libvirt-rpc-xdr";
import { AcknowledgementNudge } from "../../../provider/libvirt-rpc-xdr/ack-nudge";
import { CallDeadlines } from "../../../provider/libvirt-rpc-xdr/deadlines";
import { FakeDaemon, tick } from "./fake-daemon";

const hostnameBody = (name: string) => Buffer.from(new XdrWriter().string(name).finish());
const isPong = (p: { header: { program: number; procedure: number } }) =>
  p.header.program === KEEPALIVE_PROGRAM && p.header.procedure === KeepaliveProcedure.PONG;

describe("one link, many calls", () => {
  it("sends the calls made in one turn, also from promise continuations, as one transport write", async () => {
    const daemon = new FakeDaemon();
    const conn = await daemon.open();
    let writes = 0;
    const write = daemon.clientSide.write.bind(daemon.clientSide);
    daemon.clientSide.write = ((...args: Parameters<typeof write>) => {
      // A lone keepalive PONG (the acknowledgement nudge on a silent link) is not a batch of calls.
      if ((args[0] as Buffer).length > 28) writes++;
      return write(...args);
    }) as typeof write;
    const direct = Array.from({ length: 100 }, () =>
      conn.call(Procedures.connectGetHostname, undefined),
    );
    const chained = (async () => {
      await Promise.resolve();
      await Promise.resolve();
      return conn.call(Procedures.connectGetHostname, undefined);
    })();
    await tick(5);
    assert.equal(writes, 1);
    const calls = daemon.received.filter((p) => p.header.procedure === 59);
    assert.equal(calls.length, 101);
    for (const call of calls) daemon.reply(call, hostnameBody("h"));
    await Promise.all([...direct, chained]);
    conn.destroy();
  });

  it("acknowledges a reply at once when others are still owed and nothing else was sent", async () => {
    const daemon = new FakeDaemon();
    const conn = await daemon.open();
    const first = conn.call(Procedures.connectGetHostname, undefined);
    const second = conn.call(Procedures.connectGetHostname, undefined);
    const [a, b] = [await daemon.nextCall(59), await daemon.nextCall(59)];
    daemon.reply(a, hostnameBody("a"));
    assert.equal(await first, "a");
    await new Promise((resolve) => setImmediate(resolve));
    await tick(1);
    assert.ok(daemon.received.some(isPong), "a keepalive PONG carried the acknowledgement");
    daemon.received.splice(0);
    daemon.reply(b, hostnameBody("b"));
    assert.equal(await second, "b");
    await tick(40);
    assert.ok(!daemon.received.some(isPong), "nothing owed: nothing sent");
    conn.destroy();
  });

  it("nudges a silent link after 1, 2, 4, 8, 16 and 32 ms, then leaves it to the delayed ACK", async () => {
    let owed = true;
    const sent: number[] = [];
    const started = Date.now();
    const nudge: AcknowledgementNudge = new AcknowledgementNudge(
      () => {
        sent.push(Date.now() - started);
        nudge.wrote();
      },
      () => owed,
    );
    nudge.wrote();
    // Timers run late on a busy machine: wait for the sixth, however long it takes, then for a seventh.
    for (let waited = 0; sent.length < 6 && waited < 5000; waited += 10) await tick(10);
    await tick(100);
    assert.equal(sent.length, 6, `nudged at ${sent.join(", ")} ms`);
    nudge.received();
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(sent.length, 7, "input with replies still owed: acknowledged at once");
    owed = false;
    nudge.wrote();
    await tick(20);
    assert.equal(sent.length, 7, "nothing owed: no nudge");
    nudge.stop();
  });

  it("expires every deadline on one timer, in order, never early, and forgets cancelled ones", async () => {
    const deadlines = new CallDeadlines();
    const expired: Array<{ name: string; late: number }> = [];
    const now = Date.now();
    const at = (name: string, ms: number) =>
      deadlines.add(now + ms, () => expired.push({ name, late: Date.now() - (now + ms) }));
    at("30", 30);
    const cancel = at("10", 10);
    at("20", 20);
    at("20 again", 20);
    cancel();
    for (let waited = 0; expired.length < 3 && waited < 5000; waited += 10) await tick(10);
    assert.deepEqual(
      expired.map((e) => e.name),
      ["20", "20 again", "30"],
    );
    assert.ok(
      expired.every((e) => e.late >= 0),
      "none before its deadline",
    );
    assert.equal(deadlines.size, 0);
  });

  it("times out one of many calls by its own deadline while the others wait on theirs", async () => {
    const daemon = new FakeDaemon();
    const conn = await daemon.open();
    const patient = Array.from({ length: 50 }, () =>
      conn.call(Procedures.connectGetHostname, undefined, { timeoutMs: 5000 }),
    );
    const hasty = conn.call(Procedures.connectGetHostname, undefined, { timeoutMs: 30 });
    const started = Date.now();
    await assert.rejects(hasty, LibvirtTimeoutError);
    assert.ok(Date.now() - started < 1000);
    for (const call of daemon.received.filter((p) => p.header.procedure === 59))
      daemon.reply(call, hostnameBody("late or not"));
    assert.equal((await Promise.all(patient)).length, 50);
    conn.destroy();
  });
});
