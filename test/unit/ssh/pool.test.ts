import assert from "node:assert/strict";
import { Readable } from "node:stream";
import {
  LibvirtError,
  LibvirtTransportError,
  type LibvirtConnection,
} from "../../../provider/libvirt-rpc-xdr";
import { LibvirtConnectionPool, sshTargetKey } from "../../../provider/ssh";
import { FakeDaemon } from "../libvirt-rpc-xdr/fake-daemon";

interface Target {
  host: string;
  username: string;
}

/** Only what the pool touches: liveness and closing. */
function fakeConnection(): LibvirtConnection & { closes: number } {
  const fake = {
    isClosed: false,
    inFlight: 0,
    closes: 0,
    destroy() {
      fake.isClosed = true;
      fake.closes++;
    },
    async close() {
      fake.destroy();
    },
  };
  return fake as unknown as LibvirtConnection & { closes: number };
}

const daemonError = () =>
  new LibvirtError("domainLookupByName", {
    code: 42,
    domain: 10,
    message: "Domain not found",
    level: 2,
    dom: null,
    str1: null,
    str2: null,
    str3: null,
    int1: 0,
    int2: 0,
    net: null,
  });

describe("per-host libvirt connection pool", () => {
  const target: Target = { host: "kvm1", username: "ops" };

  it("dials once for many concurrent callers of the same host, separately per host", async () => {
    let dials = 0;
    const pool = new LibvirtConnectionPool<Target>({
      keyOf: sshTargetKey,
      dial: async () => {
        dials++;
        await new Promise((r) => setTimeout(r, 10));
        return fakeConnection();
      },
    });
    const conns = await Promise.all(Array.from({ length: 10 }, () => pool.get(target)));
    assert.equal(dials, 1);
    assert.ok(conns.every((c) => c === conns[0]));
    await pool.get({ host: "kvm2", username: "ops" });
    assert.equal(dials, 2);
    assert.equal(pool.size, 2);
    await pool.closeAll();
    assert.equal(conns[0]!.isClosed, true);
  });

  it("keeps the link after a daemon error and drops it after a transport error", async () => {
    const made: (LibvirtConnection & { closes: number })[] = [];
    const pool = new LibvirtConnectionPool<Target>({
      keyOf: sshTargetKey,
      dial: async () => {
        const c = fakeConnection();
        made.push(c);
        return c;
      },
    });
    await assert.rejects(
      pool.run(target, async () => Promise.reject(daemonError())),
      LibvirtError,
    );
    assert.equal(made[0]!.isClosed, false);
    assert.equal(await pool.run(target, async () => "same link"), "same link");
    assert.equal(made.length, 1);
    await assert.rejects(
      pool.run(target, async () => Promise.reject(new LibvirtTransportError("io", "reset"))),
      LibvirtTransportError,
    );
    assert.equal(made[0]!.isClosed, true);
    await pool.run(target, async (c) => assert.equal(c, made[1]));
    assert.equal(made.length, 2);
  });

  it("redials when the cached link died on its own, and after a failed dial", async () => {
    let attempt = 0;
    const pool = new LibvirtConnectionPool<Target>({
      keyOf: sshTargetKey,
      dial: async () => {
        attempt++;
        if (attempt === 1) throw new Error("refused");
        return fakeConnection();
      },
    });
    await assert.rejects(pool.get(target), /refused/);
    const first = await pool.get(target);
    first.destroy();
    const second = await pool.get(target);
    assert.notEqual(first, second);
    assert.equal(attempt, 3);
  });

  it("lets one caller stop waiting for a shared dial without cancelling it for others", async () => {
    let finishDial: ((c: LibvirtConnection) => void) | undefined;
    const pool = new LibvirtConnectionPool<Target>({
      keyOf: sshTargetKey,
      dial: () => new Promise((resolve) => (finishDial = resolve)),
    });
    const controller = new AbortController();
    const impatient = pool.get(target, { signal: controller.signal });
    const patient = pool.get(target);
    controller.abort();
    await assert.rejects(impatient, LibvirtTransportError);
    const conn = fakeConnection();
    finishDial!(conn);
    assert.equal(await patient, conn);
    await assert.rejects(
      pool.get({ host: "kvm9", username: "x" }, { timeoutMs: 10 }),
      /longer than 10 ms/,
    );
  });

  it("closes a link left idle, but not one with a call in flight", async () => {
    const pool = new LibvirtConnectionPool<Target>({
      keyOf: sshTargetKey,
      idleCloseMs: 30,
      dial: async () => fakeConnection(),
    });
    const busy = await pool.get({ host: "busy", username: "u" });
    (busy as unknown as { inFlight: number }).inFlight = 1;
    const idle = await pool.get(target);
    await new Promise((r) => setTimeout(r, 120));
    assert.equal(idle.isClosed, true);
    assert.equal(busy.isClosed, false);
    assert.notEqual(await pool.get(target), idle, "the next call dials afresh");
    await pool.closeAll();
  });

  it("closes an idle link whose only upload timed out before the daemon answered (a silent daemon)", async () => {
    const daemon = new FakeDaemon();
    const pool = new LibvirtConnectionPool<Target>({
      keyOf: sshTargetKey,
      idleCloseMs: 30,
      // The fake daemon does not answer CONNECT_CLOSE: a short polite-close bound keeps the test quick.
      dial: () => daemon.open({ closeTimeoutMs: 20 }),
    });
    const conn = await pool.get(target);
    const vol = { pool: "lab", name: "seed.iso", key: "/pool/seed.iso" };
    const source = Readable.from([Buffer.alloc(16)]);
    await assert.rejects(conn.upload({ vol }, source, { timeoutMs: 10 }), /deadline/);
    assert.equal(pool.callsInFlight, 0, "a call nobody waits for is not in flight");
    for (let i = 0; i < 150 && !conn.isClosed; i++) await new Promise((r) => setTimeout(r, 20));
    assert.equal(conn.isClosed, true, "the idle link was closed");
    await pool.closeAll();
  });

  it("keys targets by user, host, port, socket and URI", () => {
    assert.equal(sshTargetKey({ username: "u", host: "h" }), "u@h:22#qemu:///system");
    assert.notEqual(
      sshTargetKey({ username: "u", host: "h", port: 2222 }),
      sshTargetKey({ username: "u", host: "h" }),
    );
  });
});
