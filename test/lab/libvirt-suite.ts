/**
 * The libvirt client's behaviour against the real daemon. The same suite runs
 * over the local unix socket and through SSH (see *.test.ts beside this).
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import {
  DomainState,
  ErrorCode,
  InterfaceAddressSource,
  LibvirtAbortedError,
  LibvirtError,
  LibvirtStreamEndpointError,
  LibvirtTimeoutError,
  ListAllDomainsFlags,
  MetadataType,
  Procedures,
  UndefineFlags,
  fileUploadSource,
  type LibvirtConnection,
  type Procedure,
  type StoragePoolHandle,
} from "../../provider/libvirt-rpc-xdr";
import { classifyLibvirtError } from "../../provider/kvm/classify";
import { useLab, type LabEnv } from "./fixture";
import {
  MARK_URI,
  MIB,
  deleteVolumeIfPresent,
  domainXml,
  hashingSink,
  randomSource,
  rejectionOf,
  removeDomainIfPresent,
  stallingSource,
  uniqueName,
  volumeXml,
} from "./helpers";

const run = promisify(execFile);

export function describeLibvirtAgainstLab(
  transportName: string,
  open: (lab: LabEnv) => Promise<LibvirtConnection>,
): void {
  describe(`libvirt client against the lab's libvirtd (${transportName})`, function () {
    this.timeout(120_000);
    let lab: LabEnv;
    let conn: LibvirtConnection;
    let pool: StoragePoolHandle;
    const domains: string[] = [];
    const volumes: string[] = [];

    before(async function () {
      this.timeout(180_000);
      lab = await useLab();
      conn = await open(lab);
      pool = await conn.call(Procedures.storagePoolLookupByName, { name: lab.pool });
    });

    after(async function () {
      this.timeout(60_000);
      if (!conn) return;
      for (const name of domains) await removeDomainIfPresent(conn, name);
      for (const name of volumes) await deleteVolumeIfPresent(conn, pool, name);
      await conn.close();
    });

    async function createVolume(name: string, capacity: number, poolHandle = pool) {
      volumes.push(name);
      await deleteVolumeIfPresent(conn, poolHandle, name);
      return conn.call(Procedures.storageVolCreateXml, {
        pool: poolHandle,
        xml: volumeXml(name, capacity),
        flags: 0,
      });
    }

    it("reads the daemon's version, hostname and capabilities", async () => {
      const version = await conn.call(Procedures.connectGetLibVersion, undefined);
      assert.ok(version >= 9_000_000n, `libvirt version ${version}`);
      const hostname = await conn.call(Procedures.connectGetHostname, undefined);
      assert.ok(hostname.length > 0);
      const caps = await conn.call(Procedures.connectGetCapabilities, undefined);
      assert.match(caps, /<capabilities>/);
    });

    it("defines a domain with a metadata element, reads it back, runs it through its lifecycle and undefines it", async () => {
      const name = uniqueName("life");
      domains.push(name);
      const defined = await conn.call(Procedures.domainDefineXml, {
        xml: domainXml(name, "owner-a"),
      });
      assert.equal(defined.name, name);
      assert.equal(defined.uuid.length, 16);

      const byName = await conn.call(Procedures.domainLookupByName, { name });
      const byUuid = await conn.call(Procedures.domainLookupByUuid, { uuid: byName.uuid });
      assert.deepEqual(byUuid.uuid, defined.uuid);

      const mark = await conn.call(Procedures.domainGetMetadata, {
        dom: byName,
        type: MetadataType.ELEMENT,
        uri: MARK_URI,
        flags: 0,
      });
      assert.match(mark, /<egress:owner>owner-a<\/egress:owner>|owner-a/);
      await conn.call(Procedures.domainSetMetadata, {
        dom: byName,
        type: MetadataType.ELEMENT,
        metadata: "<mark><owner>owner-b</owner></mark>",
        key: "egress",
        uri: MARK_URI,
        flags: 0,
      });
      const xml = await conn.call(Procedures.domainGetXmlDesc, { dom: byName, flags: 0 });
      assert.match(xml, /owner-b/);

      const all = await conn.call(Procedures.connectListAllDomains, { needResults: 1, flags: 0 });
      assert.ok(all.domains.some((d) => d.name === name));
      const inactive = await conn.call(Procedures.connectListAllDomains, {
        needResults: 1,
        flags: ListAllDomainsFlags.INACTIVE,
      });
      assert.ok(inactive.domains.some((d) => d.name === name));

      let state = await conn.call(Procedures.domainGetState, { dom: byName, flags: 0 });
      assert.equal(state.state, DomainState.SHUTOFF);

      const started = await conn.call(Procedures.domainCreateWithFlags, { dom: byName, flags: 0 });
      assert.ok(started.id > 0, "a running domain has an id");
      state = await conn.call(Procedures.domainGetState, { dom: byName, flags: 0 });
      assert.equal(state.state, DomainState.RUNNING);
      const active = await conn.call(Procedures.connectListAllDomains, {
        needResults: 1,
        flags: ListAllDomainsFlags.ACTIVE,
      });
      assert.ok(active.domains.some((d) => d.name === name));

      // No guest agent in this domain: the daemon says so with a typed error, and the link survives.
      const agentError = await rejectionOf(
        conn.call(Procedures.domainInterfaceAddresses, {
          dom: byName,
          source: InterfaceAddressSource.AGENT,
          flags: 0,
        }),
      );
      assert.ok(agentError instanceof LibvirtError);
      assert.ok(
        [ErrorCode.ARGUMENT_UNSUPPORTED, ErrorCode.AGENT_UNRESPONSIVE].includes(
          agentError.code as 74 | 86,
        ),
        agentError.message,
      );
      const leases = await conn.call(Procedures.domainInterfaceAddresses, {
        dom: byName,
        source: InterfaceAddressSource.LEASE,
        flags: 0,
      });
      assert.deepEqual(leases, []);
      const agentCommand = await rejectionOf(
        conn.call(Procedures.qemuDomainAgentCommand, {
          dom: byName,
          cmd: '{"execute":"guest-ping"}',
          timeout: 5,
          flags: 0,
        }),
      );
      assert.ok(agentCommand instanceof LibvirtError, agentCommand.message);
      assert.match(agentCommand.libvirtMessage, /guest agent is not configured/);
      const hostnameError = await rejectionOf(
        conn.call(Procedures.domainGetHostname, { dom: byName, flags: 0 }),
      );
      assert.ok(hostnameError instanceof LibvirtError, hostnameError.message);

      // A shutdown request is accepted even though nothing in the guest listens for ACPI.
      await conn.call(Procedures.domainShutdownFlags, { dom: byName, flags: 0 });
      await conn.call(Procedures.domainShutdown, { dom: byName });
      // Still running (not paused, not off): the calls were the shutdown requests and nothing else.
      state = await conn.call(Procedures.domainGetState, { dom: byName, flags: 0 });
      assert.equal(state.state, DomainState.RUNNING);
      await conn.call(Procedures.domainDestroyFlags, { dom: byName, flags: 0 });
      state = await conn.call(Procedures.domainGetState, { dom: byName, flags: 0 });
      assert.equal(state.state, DomainState.SHUTOFF);

      // Destroying a stopped domain is "operation invalid", which the provider treats as done.
      const invalid = await rejectionOf(conn.call(Procedures.domainDestroy, { dom: byName }));
      assert.ok(invalid instanceof LibvirtError);
      assert.equal(invalid.code, ErrorCode.OPERATION_INVALID);

      await conn.call(Procedures.domainUndefineFlags, {
        dom: byName,
        flags: UndefineFlags.MANAGED_SAVE | UndefineFlags.SNAPSHOTS_METADATA | UndefineFlags.NVRAM,
      });
      const gone = await rejectionOf(conn.call(Procedures.domainLookupByName, { name }));
      assert.ok(gone instanceof LibvirtError);
      assert.equal(gone.code, ErrorCode.NO_DOMAIN);
      assert.equal(classifyLibvirtError(gone).errorClass, "NotFound");
    });

    it("starts with domainCreate, stops with domainDestroy and undefines with the plain procedures", async () => {
      const name = uniqueName("plain");
      domains.push(name);
      const dom = await conn.call(Procedures.domainDefineXmlFlags, {
        xml: domainXml(name),
        flags: 0,
      });
      await conn.call(Procedures.domainCreate, { dom });
      assert.equal(
        (await conn.call(Procedures.domainGetState, { dom, flags: 0 })).state,
        DomainState.RUNNING,
      );
      await conn.call(Procedures.domainDestroy, { dom });
      await conn.call(Procedures.domainUndefine, { dom });
      const gone = await rejectionOf(conn.call(Procedures.domainLookupByUuid, { uuid: dom.uuid }));
      assert.ok(gone instanceof LibvirtError && gone.code === ErrorCode.NO_DOMAIN, gone.message);
    });

    it("looks up a libvirt-managed network and reads its DHCP leases (none yet)", async () => {
      const suffix = Math.random().toString(36).slice(2, 8);
      const name = `egress-rpc-test-net-${suffix}`;
      const xml =
        `<network><name>${name}</name><bridge name='egt${suffix}'/>` +
        `<ip address='203.0.113.1' netmask='255.255.255.0'>` +
        `<dhcp><range start='203.0.113.100' end='203.0.113.120'/></dhcp></ip></network>`;
      const file = join(lab.labDir, `${name}.xml`);
      writeFileSync(file, xml);
      // Setup only: the client has no network-creation procedure (the provider never creates networks).
      await run("virsh", ["-q", "-c", lab.uri, "net-create", file]);
      try {
        const net = await conn.call(Procedures.networkLookupByName, { name });
        assert.equal(net.name, name);
        const count = await conn.call(Procedures.networkGetDhcpLeases, {
          net,
          mac: null,
          needResults: 0,
          flags: 0,
        });
        assert.deepEqual(count, { leases: [], ret: 0 });
        const leases = await conn.call(Procedures.networkGetDhcpLeases, {
          net,
          mac: "52:54:00:00:00:01",
          needResults: 1,
          flags: 0,
        });
        assert.deepEqual(leases, { leases: [], ret: 0 });
      } finally {
        await run("virsh", ["-q", "-c", lab.uri, "net-destroy", name]);
        rmSync(file, { force: true });
      }
      const missing = await rejectionOf(conn.call(Procedures.networkLookupByName, { name }));
      assert.ok(missing instanceof LibvirtError);
      assert.match(missing.libvirtMessage, /Network not found/);
    });

    it("looks up, refreshes and reads the storage pool; a missing pool is a typed error", async () => {
      await conn.call(Procedures.storagePoolRefresh, { pool, flags: 0 });
      const info = await conn.call(Procedures.storagePoolGetInfo, { pool });
      assert.equal(info.state, 2, "VIR_STORAGE_POOL_RUNNING");
      assert.ok(info.capacity > 0n && info.available > 0n);
      const missing = await rejectionOf(
        conn.call(Procedures.storagePoolLookupByName, { name: "no-such-pool" }),
      );
      assert.ok(missing instanceof LibvirtError);
      assert.equal(missing.code, ErrorCode.NO_STORAGE_POOL);
      assert.equal(classifyLibvirtError(missing).errorClass, "Permanent");
    });

    it("creates, inspects, resizes and deletes a volume", async () => {
      const name = uniqueName("vol");
      const vol = await createVolume(name, MIB);
      assert.equal(vol.name, name);
      assert.equal(vol.pool, lab.pool);
      const path = await conn.call(Procedures.storageVolGetPath, { vol });
      assert.equal(path, `${lab.labDir}/pool/${name}`);
      let info = await conn.call(Procedures.storageVolGetInfo, { vol });
      assert.equal(info.capacity, BigInt(MIB));
      await conn.call(Procedures.storageVolResize, { vol, capacity: 2 * MIB, flags: 0 });
      info = await conn.call(Procedures.storageVolGetInfo, { vol });
      assert.equal(info.capacity, BigInt(2 * MIB));
      const again = await rejectionOf(
        conn.call(Procedures.storageVolCreateXml, { pool, xml: volumeXml(name, MIB), flags: 0 }),
      );
      assert.ok(again instanceof LibvirtError);
      assert.equal(again.code, ErrorCode.STORAGE_VOL_EXIST);
      await conn.call(Procedures.storageVolDelete, { vol, flags: 0 });
      const gone = await rejectionOf(conn.call(Procedures.storageVolLookupByName, { pool, name }));
      assert.ok(gone instanceof LibvirtError);
      assert.equal(gone.code, ErrorCode.NO_STORAGE_VOL);
      assert.equal(classifyLibvirtError(gone).errorClass, "NotFound");
    });

    it("uploads and downloads 128 MiB byte-exact", async function () {
      this.timeout(180_000);
      const size = 128 * MIB;
      const name = uniqueName("big");
      const vol = await createVolume(name, size);
      const source = randomSource(size);
      const started = Date.now();
      const sent = await conn.upload({ vol }, source.stream, { timeoutMs: 120_000 });
      assert.equal(sent.bytes, size);
      const uploadMs = Date.now() - started;
      const sink = hashingSink();
      const received = await conn.download({ vol }, sink.sink, { timeoutMs: 120_000 });
      assert.equal(received.bytes, size);
      assert.equal(sink.bytes(), size);
      assert.equal(sink.digest(), source.digest());
      const info = await conn.call(Procedures.storageVolGetInfo, { vol });
      assert.equal(info.capacity, BigInt(size));
      console.log(
        `      (${transportName}: upload ${uploadMs} ms, download ${Date.now() - started - uploadMs} ms)`,
      );
    });

    it("uploads a file read straight into its frames (fileUploadSource) byte-exact", async function () {
      this.timeout(120_000);
      const size = 40 * MIB + 12_345;
      const name = uniqueName("file");
      const vol = await createVolume(name, size);
      const bytes = randomBytes(size);
      const file = join(lab.labDir, `${name}.img`);
      writeFileSync(file, bytes);
      try {
        const sent = await conn.upload({ vol }, await fileUploadSource(file), {
          timeoutMs: 60_000,
        });
        assert.equal(sent.bytes, size);
      } finally {
        rmSync(file, { force: true });
      }
      const sink = hashingSink();
      await conn.download({ vol }, sink.sink, { timeoutMs: 60_000 });
      assert.equal(sink.bytes(), size);
      assert.equal(sink.digest(), createHash("sha256").update(bytes).digest("hex"));
    });

    it("answers 200 concurrent calls on one connection, each with its own result", async () => {
      const name = uniqueName("pipe");
      domains.push(name);
      const dom = await conn.call(Procedures.domainDefineXml, {
        xml: domainXml(name, "pipelined"),
      });
      const calls = Array.from({ length: 200 }, (_, i) => {
        switch (i % 4) {
          case 0:
            return conn.call(Procedures.connectGetLibVersion, undefined).then((v) => `v${v > 0n}`);
          case 1:
            return conn.call(Procedures.domainLookupByName, { name }).then((d) => d.name);
          case 2:
            return conn
              .call(Procedures.domainGetMetadata, {
                dom,
                type: MetadataType.ELEMENT,
                uri: MARK_URI,
                flags: 0,
              })
              .then((m) => (m.includes("pipelined") ? "mark" : m));
          default:
            return conn.call(Procedures.domainLookupByName, { name: `missing-${i}` }).then(
              () => "found?",
              (e: unknown) =>
                e instanceof LibvirtError && e.code === ErrorCode.NO_DOMAIN ? `missing` : String(e),
            );
        }
      });
      const results = await Promise.all(calls);
      results.forEach((result, i) =>
        assert.equal(result, ["vtrue", name, "mark", "missing"][i % 4], `call ${i}`),
      );
      assert.equal(conn.inFlight, 0);
    });

    it("maps an unknown procedure to NO_SUPPORT and keeps the connection", async () => {
      const bogus: Procedure<void, void> = {
        ...Procedures.connectGetHostname,
        name: "bogus",
        number: 9999,
        decodeRet: () => undefined,
      };
      const error = await rejectionOf(conn.call(bogus, undefined));
      assert.ok(error instanceof LibvirtError, error.message);
      assert.equal(error.code, ErrorCode.NO_SUPPORT);
      assert.ok((await conn.call(Procedures.connectGetHostname, undefined)).length > 0);
    });

    it("cancels one call by signal and one by deadline without disturbing the others", async () => {
      const controller = new AbortController();
      const cancelled = conn.call(Procedures.connectGetCapabilities, undefined, {
        signal: controller.signal,
      });
      const timedOut = conn.call(Procedures.connectGetCapabilities, undefined, { timeoutMs: 0 });
      const others = Array.from({ length: 20 }, () =>
        conn.call(Procedures.connectGetHostname, undefined),
      );
      controller.abort();
      assert.ok((await rejectionOf(cancelled)) instanceof LibvirtAbortedError);
      assert.ok((await rejectionOf(timedOut)) instanceof LibvirtTimeoutError);
      for (const hostname of await Promise.all(others)) assert.ok(hostname.length > 0);
      assert.ok(
        (await conn.call(Procedures.connectGetCapabilities, undefined)).includes("<capabilities>"),
      );
    });

    it("ends an upload promptly when its source fails half way, and the link recovers", async () => {
      const name = uniqueName("srcfail");
      const vol = await createVolume(name, 64 * MIB);
      const source = randomSource(64 * MIB, { failAfter: 24 * MIB });
      const started = Date.now();
      const error = await rejectionOf(conn.upload({ vol }, source.stream, { timeoutMs: 30_000 }));
      assert.ok(error instanceof LibvirtStreamEndpointError, error.message);
      assert.equal(error.endpoint, "source");
      assert.ok(Date.now() - started < 15_000, "ended well within its deadline");
      assert.equal(classifyLibvirtError(error).errorClass, "Transient");
      assert.ok((await conn.call(Procedures.connectGetHostname, undefined)).length > 0);
      await conn.call(Procedures.storageVolDelete, { vol, flags: 0 });
    });

    it("stops at once when the daemon fails a stream half way (the pool's disk fills up)", async () => {
      const tiny = await conn.call(Procedures.storagePoolLookupByName, { name: lab.tinyPool });
      const name = uniqueName("full");
      const vol = await createVolume(name, MIB, tiny);
      try {
        // Far more than the pool holds: what is read before the daemon's error arrives is the
        // pool's room plus what the socket buffers hold (several MiB over a local socket).
        const offered = 16 * lab.tinyPoolMiB * MIB;
        const source = randomSource(offered);
        const error = await rejectionOf(conn.upload({ vol }, source.stream, { timeoutMs: 30_000 }));
        assert.ok(error instanceof LibvirtError, `expected a daemon error, got ${error.message}`);
        assert.match(error.libvirtMessage, /space|write/i);
        assert.ok(
          source.produced() < offered / 2,
          `the source was not read on after the failure (${source.produced()} of ${offered} bytes)`,
        );
        assert.ok((await conn.call(Procedures.connectGetHostname, undefined)).length > 0);
      } finally {
        await deleteVolumeIfPresent(conn, tiny, name);
      }
    });

    it("fails a stalled upload at its deadline and the connection carries on", async () => {
      const name = uniqueName("stall");
      const vol = await createVolume(name, 8 * MIB);
      const started = Date.now();
      const error = await rejectionOf(
        conn.upload({ vol }, stallingSource(MIB), { timeoutMs: 1500 }),
      );
      assert.ok(error instanceof LibvirtTimeoutError, error.message);
      assert.ok(Date.now() - started < 5000);
      assert.equal(classifyLibvirtError(error).errorClass, "Transient");
      assert.ok((await conn.call(Procedures.connectGetHostname, undefined)).length > 0);
    });

    it("aborts a download by signal half way and the connection carries on", async () => {
      const name = uniqueName("dlabort");
      const vol = await createVolume(name, 64 * MIB);
      const source = randomSource(64 * MIB);
      await conn.upload({ vol }, source.stream, { timeoutMs: 60_000 });
      const controller = new AbortController();
      const sink = hashingSink();
      sink.sink.on("data", () => undefined);
      const download = conn.download({ vol }, sink.sink, {
        signal: controller.signal,
        timeoutMs: 60_000,
      });
      while (sink.bytes() < 4 * MIB) await new Promise((r) => setTimeout(r, 5));
      controller.abort();
      const error = await rejectionOf(download);
      assert.ok(error instanceof LibvirtAbortedError, error.message);
      assert.ok(sink.bytes() < 64 * MIB);
      assert.ok((await conn.call(Procedures.connectGetHostname, undefined)).length > 0);
      // The volume can be downloaded again in full on the same connection.
      const again = hashingSink();
      assert.equal(
        (await conn.download({ vol }, again.sink, { timeoutMs: 60_000 })).bytes,
        64 * MIB,
      );
      assert.equal(again.digest(), source.digest(), "the same bytes, none lost or reordered");
    });
  });
}
