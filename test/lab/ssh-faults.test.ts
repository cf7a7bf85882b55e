/**
 * Faults on the SSH path, made real: the sshd process serving us is killed
 * (or frozen) by PID mid-call and mid-stream, and a TCP listener that never
 * speaks stands in for a host that is up but wedged.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createServer, type Server, type Socket } from "node:net";
import { resolve } from "node:path";
import { classifyLibvirtError } from "../../provider/kvm/classify";
import {
  LibvirtTransportError,
  Procedures,
  type LibvirtConnection,
  type StoragePoolHandle,
} from "../../provider/libvirt-rpc-xdr";
import {
  LibvirtConnectionPool,
  SshConnectError,
  openLibvirtOverSsh,
  sshTargetKey,
  type SshTarget,
} from "../../provider/ssh";
import { useLab, type LabEnv } from "./fixture";
import {
  MIB,
  deleteVolumeIfPresent,
  randomSource,
  rejectionOf,
  uniqueName,
  volumeXml,
} from "./helpers";
import { labSshTarget, openLabSsh, openLabSshWithServerPids, signalAll } from "./ssh-helpers";

describe("libvirt over SSH when the link fails", function () {
  this.timeout(60_000);
  let lab: LabEnv;
  let admin: LibvirtConnection;
  let pool: StoragePoolHandle;
  const frozen: number[] = [];
  const volumes: string[] = [];

  before(async function () {
    this.timeout(180_000);
    lab = await useLab();
    admin = await openLabSsh(lab);
    pool = await admin.call(Procedures.storagePoolLookupByName, { name: lab.pool });
  });

  afterEach(() => {
    // Never leave a frozen sshd behind, whatever the test did.
    signalAll(frozen.splice(0), "SIGKILL");
  });

  after(async () => {
    for (const name of volumes) await deleteVolumeIfPresent(admin, pool, name);
    await admin?.close();
  });

  it("fails calls in flight at once when the sshd serving them is killed, and the pool redials", async () => {
    let serverPids: number[] = [];
    const poolOfLinks = new LibvirtConnectionPool<SshTarget>({
      keyOf: sshTargetKey,
      dial: async (target) => {
        const opened = await openLabSshWithServerPids(lab);
        serverPids = opened.serverPids;
        void target;
        return opened.conn;
      },
    });
    const target = labSshTarget(lab);
    try {
      assert.ok(
        (await poolOfLinks.run(target, (c) => c.call(Procedures.connectGetHostname, undefined)))
          .length > 0,
      );
      // Freeze the server first so the calls are surely in flight when it dies.
      signalAll(serverPids, "SIGSTOP");
      frozen.push(...serverPids);
      const inFlight = Array.from({ length: 10 }, () =>
        poolOfLinks.run(target, (c) =>
          c.call(Procedures.connectGetLibVersion, undefined, { timeoutMs: 30_000 }),
        ),
      );
      await new Promise((r) => setTimeout(r, 200));
      const started = Date.now();
      signalAll(serverPids, "SIGKILL");
      const errors = await Promise.all(inFlight.map((p) => rejectionOf(p)));
      assert.ok(Date.now() - started < 5000, "failed promptly, long before the 30 s deadline");
      for (const error of errors) {
        assert.ok(error instanceof LibvirtTransportError, error.message);
        assert.equal(classifyLibvirtError(error).errorClass, "Transient");
      }
      // The next call dials a fresh link.
      assert.ok(
        (await poolOfLinks.run(target, (c) => c.call(Procedures.connectGetHostname, undefined)))
          .length > 0,
      );
      assert.equal(poolOfLinks.dialCount, 2);
    } finally {
      await poolOfLinks.closeAll();
    }
  });

  it("fails an upload promptly when the sshd is killed mid-stream", async () => {
    const { conn, serverPids } = await openLabSshWithServerPids(lab);
    const name = uniqueName("sshkill");
    volumes.push(name);
    const vol = await conn.call(Procedures.storageVolCreateXml, {
      pool,
      xml: volumeXml(name, 256 * MIB),
      flags: 0,
    });
    const source = randomSource(256 * MIB);
    const upload = conn.upload({ vol }, source.stream, { timeoutMs: 60_000 });
    while (source.produced() < 32 * MIB) await new Promise((r) => setTimeout(r, 10));
    const started = Date.now();
    signalAll(serverPids, "SIGKILL");
    const error = await rejectionOf(upload);
    assert.ok(error instanceof LibvirtTransportError, error.message);
    assert.ok(Date.now() - started < 5000);
    assert.equal(classifyLibvirtError(error).errorClass, "Transient");
    assert.ok(conn.isClosed);
    assert.ok(source.stream.destroyed, "the source was released");
  });

  it("declares a frozen link dead through keepalives, and closing it does not block", async () => {
    const { conn, serverPids } = await openLabSshWithServerPids(lab, {
      keepaliveIntervalMs: 300,
      keepaliveCountMax: 2,
    });
    signalAll(serverPids, "SIGSTOP");
    frozen.push(...serverPids);
    const started = Date.now();
    const error = await rejectionOf(
      conn.call(Procedures.connectGetHostname, undefined, { timeoutMs: 30_000 }),
    );
    assert.ok(error instanceof LibvirtTransportError, error.message);
    assert.ok(Date.now() - started < 5000, `dead link found in ${Date.now() - started} ms`);

    const second = await openLabSshWithServerPids(lab, { keepaliveIntervalMs: 60_000 });
    signalAll(second.serverPids, "SIGSTOP");
    frozen.push(...second.serverPids);
    const closeStarted = Date.now();
    await second.conn.close();
    assert.ok(Date.now() - closeStarted < 2000, "close returned although the peer is silent");
    assert.ok(second.conn.isClosed);
  });

  describe("a host that accepts TCP but never answers", () => {
    let server: Server;
    let port: number;
    const sockets: Socket[] = [];
    before(async () => {
      server = createServer((socket) => {
        sockets.push(socket);
        socket.on("data", () => undefined); // read everything, say nothing
      });
      await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
      port = (server.address() as { port: number }).port;
    });
    after(async () => {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => server.close(resolve));
    });

    it("gives up at the handshake deadline with a transient error", async () => {
      const started = Date.now();
      const error = await rejectionOf(
        openLibvirtOverSsh(labSshTarget(lab, { port }), { handshakeTimeoutMs: 1500 }),
      );
      const elapsed = Date.now() - started;
      assert.ok(error instanceof SshConnectError, error.message);
      assert.ok(elapsed >= 1400 && elapsed < 4000, `ended after ${elapsed} ms`);
      assert.equal(classifyLibvirtError(error).errorClass, "Transient");
      assert.match(error.message, /127\.0\.0\.1/);
    });
  });

  it("lets a process exit on its own after calls, a timeout, a failed upload and close (no --exit)", async () => {
    const script = `
      const { openLibvirtOverSsh, LibvirtConnectionPool, sshTargetKey } = require(${JSON.stringify(resolve(__dirname, "../../provider/ssh"))});
      const { Procedures } = require(${JSON.stringify(resolve(__dirname, "../../provider/libvirt-rpc-xdr"))});
      const { Readable } = require("node:stream");
      const target = ${JSON.stringify({ ...labSshTarget(lab), privateKey: undefined })};
      target.privateKey = require("node:fs").readFileSync(${JSON.stringify(lab.clientKey)}, "utf8");
      (async () => {
        const pool = new LibvirtConnectionPool({ keyOf: sshTargetKey, dial: (t) => openLibvirtOverSsh(t) });
        await pool.run(target, (c) => c.call(Procedures.connectGetHostname, undefined, { timeoutMs: 120000 }));
        const conn = await openLibvirtOverSsh(target);
        await conn.call(Procedures.connectGetCapabilities, undefined, { timeoutMs: 0 }).catch(() => undefined);
        const pool0 = await conn.call(Procedures.storagePoolLookupByName, { name: ${JSON.stringify(lab.pool)} });
        const vol = await conn.call(Procedures.storageVolCreateXml, { pool: pool0, xml: ${JSON.stringify(volumeXml(uniqueName("exit"), MIB))}, flags: 0 });
        const failing = new Readable({ read() { this.destroy(new Error("boom")); } });
        await conn.upload({ vol }, failing, { timeoutMs: 120000 }).catch(() => undefined);
        await conn.call(Procedures.storageVolDelete, { vol, flags: 0 });
        await conn.close();
        await pool.closeAll();
        console.log("finished");
      })().catch((e) => { console.error(e); process.exit(3); });`;
    const started = Date.now();
    const { code, stdout } = await new Promise<{ code: number | null; stdout: string }>(
      (resolvePromise) => {
        const child = spawn(process.execPath, ["-e", script], {
          stdio: ["ignore", "pipe", "inherit"],
        });
        let out = "";
        child.stdout.on("data", (d: Buffer) => (out += d.toString()));
        const killer = setTimeout(() => child.kill("SIGKILL"), 15_000);
        child.on("exit", (exitCode) => {
          clearTimeout(killer);
          resolvePromise({ code: exitCode, stdout: out });
        });
      },
    );
    assert.match(stdout, /finished/);
    assert.equal(code, 0, "exited by itself, nothing kept it alive");
    assert.ok(Date.now() - started < 10_000, `took ${Date.now() - started} ms to exit`);
  });

  it("leaves no socket of its own open once its connections are closed", async () => {
    const countSockets = () =>
      process.getActiveResourcesInfo().filter((r) => r === "TCPSocketWrap").length;
    const before = countSockets();
    const conn = await openLabSsh(lab);
    await conn.call(Procedures.connectGetHostname, undefined);
    await conn.close();
    await new Promise((r) => setTimeout(r, 800));
    assert.ok(countSockets() <= before, `${countSockets()} TCP sockets open, ${before} before`);
  });
});
