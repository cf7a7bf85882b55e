/**
 * Create never leaks, for KvmProxy, on the real lab: every step of create is made
 * to fail for real (a bridge that does not exist, an inactive libvirt network,
 * a pool that fills up, a readiness that never comes, the SSH link cut
 * mid-create). Afterwards the host holds exactly what state would record:
 * nothing when create returns a plain error, the domain and its two volumes
 * when it returns a partial create (which `remove` then clears, and `update`
 * continues). Each test prints the host's domains and volumes before and
 * after. No call is left in flight on the provider's links. Since it compares
 * the whole host with state, no other lab suite may run beside it
 * (test-runs: alone: the test command runs it before the parallel shards).
 *
 * A preflight check (another change) may catch some injections before
 * anything is made: that outcome passes too, as long as nothing leaks.
 */
import { strict as assert } from "node:assert";
import { execFile, execFileSync } from "node:child_process";
import { randomBytes, createHash } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createServer, connect, type AddressInfo, type Socket } from "node:net";
import { promisify } from "node:util";
import { isIncompleteCreate, PartialCreateError } from "../../provider/common/partial-create";
import { callsInFlight, closeAllHosts } from "../../provider/kvm/connect";
import {
  BASE_IMAGE_PREFIX,
  baseImageMarkerName,
  baseImageVolumeName,
  overlayVolumeName,
  seedVolumeName,
} from "../../provider/kvm/naming";
import { Procedures, type LibvirtConnection } from "../../provider/libvirt-rpc-xdr";
import { openLocalLibvirt } from "../../provider/ssh/local";
import * as kvm from "../../provider/kvm/provider";
import { useLab, type LabEnv } from "./fixture";
import {
  ensureProxyImage,
  fillPoolOnceVolumeAppears,
  labConnection,
  serveImage,
  type ProxyImage,
  type RunningServer,
} from "./kvm-support";
import { signalAll, sshdServingThisProcess } from "./ssh-helpers";

const run = promisify(execFile);
const owner = { project: "egress-lab", stack: "kvm-no-leak", resource: "proxy" };
const SERIALIZED_PROVIDER = "exports.handler = () => provider; // captured under mocks";
const INACTIVE_NETWORK = "egress-noleak-off";

interface HostView {
  domains: string[];
  /** Volume names per pool, the shared base-image cache left out (it belongs to no resource). */
  volumes: string[];
}

describe("KvmProxy create never leaks (failures made for real in the lab)", function () {
  this.timeout(300_000);
  let lab: LabEnv;
  let image: ProxyImage;
  let imageServer: RunningServer;
  let smallImage: ProxyImage;
  let smallImageServer: RunningServer;
  let scratch: string;
  let inspector: LibvirtConnection;
  const leftovers: Array<{ id: string; props: Record<string, unknown> }> = [];

  before(async function () {
    this.timeout(900_000);
    lab = await useLab();
    image = await ensureProxyImage();
    imageServer = await serveImage(image);
    // A tiny base for the tiny pool: it fits, so the pool fills up at the seed instead.
    scratch = mkdtempSync(join(tmpdir(), "egress-noleak-"));
    const small = join(scratch, "small.qcow2");
    await run("qemu-img", ["create", "-q", "-f", "qcow2", small, "64M"]);
    smallImage = {
      path: small,
      sha256: createHash("sha256").update(readFileSync(small)).digest("hex"),
      bytes: statSync(small).size,
    };
    smallImageServer = await serveImage(smallImage);
    inspector = await openLocalLibvirt({ socketPath: lab.libvirtSocket });
    virshQuiet("net-undefine", INACTIVE_NETWORK); // left by an interrupted run
    const networkXml = join(scratch, "network.xml");
    writeFileSync(networkXml, inactiveNetworkXml());
    virsh("net-define", networkXml);
  });

  after(async () => {
    for (const { id, props } of leftovers) await kvm.remove(id, props).catch(() => undefined);
    // This run's base images (its image servers listen on new ports, so the URLs are this run's).
    const bases = [
      { pool: lab.pool, image, url: imageServer?.url },
      { pool: lab.tinyPool, image: smallImage, url: smallImageServer?.url },
    ];
    for (const { pool, image: served, url } of bases) {
      if (url === undefined || served === undefined) continue;
      const base = baseImageVolumeName({ url, sha256: served.sha256, format: "qcow2" });
      for (const name of [base, baseImageMarkerName(base)])
        virshQuiet("vol-delete", "--pool", pool, name);
    }
    await inspector?.close();
    virshQuiet("net-destroy", INACTIVE_NETWORK);
    virshQuiet("net-undefine", INACTIVE_NETWORK);
    await closeAllHosts();
    await imageServer?.close();
    await smallImageServer?.close();
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  });

  function virsh(...args: string[]): string {
    return execFileSync("virsh", ["-q", "-c", lab.uri, ...args], {
      stdio: ["ignore", "pipe", "pipe"],
    }).toString();
  }

  function virshQuiet(...args: string[]): void {
    try {
      virsh(...args);
    } catch {
      // already gone
    }
  }

  const inactiveNetworkXml = (): string =>
    `<network><name>${INACTIVE_NETWORK}</name><forward mode="bridge"/><bridge name="${lab.bridge}"/></network>`;

  function volumeNames(pool: string): string[] {
    return virsh("vol-list", pool)
      .split("\n")
      .map((line) => line.trim().split(/\s+/)[0])
      .filter((name): name is string => Boolean(name));
  }

  function hostView(): HostView {
    const domains = virsh("list", "--all", "--name")
      .split("\n")
      .map((line) => line.trim())
      .filter(Boolean)
      .sort();
    const volumes = [lab.pool, lab.tinyPool]
      .flatMap((pool) => volumeNames(pool).map((name) => `${pool}/${name}`))
      .filter((name) => !name.split("/")[1]!.startsWith(BASE_IMAGE_PREFIX))
      .sort();
    return { domains, volumes };
  }

  function show(label: string, view: HostView): void {
    console.log(`      ${label}: domains=[${view.domains.join(",")}]`);
    console.log(`      ${" ".repeat(label.length)}  volumes=[${view.volumes.join(",")}]`);
  }

  /** What state names after the failure: nothing, or the domain and its two volumes. */
  function recordedBy(error: Error, vmName: string, pool: string): HostView {
    if (!(error instanceof PartialCreateError)) return { domains: [], volumes: [] };
    return {
      domains: [vmName],
      volumes: [`${pool}/${overlayVolumeName(vmName)}`, `${pool}/${seedVolumeName(vmName)}`].sort(),
    };
  }

  const added = (before: HostView, after: HostView): HostView => ({
    domains: after.domains.filter((name) => !before.domains.includes(name)),
    volumes: after.volumes.filter((name) => !before.volumes.includes(name)),
  });

  /**
   * The host holds exactly what state records: nothing new without a record;
   * with one, everything new is a thing it names (it may name a volume or
   * domain the attempt never got to: delete removes by name, and skips those).
   */
  function assertHoldsWhatStateRecords(
    before: HostView,
    error: Error,
    vmName: string,
    pool: string,
  ): HostView {
    const after = hostView();
    const inState = recordedBy(error, vmName, pool);
    show("after ", after);
    show("state ", inState);
    const extra = added(before, after);
    for (const domain of extra.domains)
      assert.ok(inState.domains.includes(domain), `domain ${domain} is on the host, not in state`);
    for (const volume of extra.volumes)
      assert.ok(inState.volumes.includes(volume), `${volume} is on the host but not in state`);
    assert.equal(callsInFlight(), 0, "no call left in flight on the provider's links");
    return extra;
  }

  function request(vmName: string, overrides: Record<string, unknown> = {}) {
    return {
      owner,
      vmName,
      pool: lab.pool,
      network: { bridge: lab.bridge },
      domainType: "qemu",
      memoryMiB: 256,
      firmware: "bios",
      image: { url: imageServer.url, sha256: image.sha256 },
      readiness: { mode: "none" },
      timeouts: { createSeconds: 240, readySeconds: 5, deleteSeconds: 60 },
      ...overrides,
    };
  }

  async function checked(raw: Record<string, unknown>): Promise<Record<string, unknown>> {
    const { inputs, failures } = await kvm.check({}, raw);
    assert.deepEqual(failures, []);
    return { ...inputs, __provider: SERIALIZED_PROVIDER };
  }

  async function failedCreate(news: Record<string, unknown>): Promise<Error> {
    try {
      const { id, outs } = await kvm.create(news);
      leftovers.push({ id, props: outs });
    } catch (error) {
      if (error instanceof PartialCreateError)
        leftovers.push({ id: error.id, props: error.properties });
      return error as Error;
    }
    throw new Error("create succeeded, but the injected failure should have failed it");
  }

  /**
   * A record this test removed itself is not removed again in `after`: its host
   * may be a relay that is gone by then, and that removal would wait out the
   * whole delete budget (a minute) for nothing.
   */
  function forgetLeftover(id: string): void {
    const index = leftovers.findIndex((leftover) => leftover.id === id);
    if (index >= 0) leftovers.splice(index, 1);
  }

  /** Destroy of the record (as `pulumi destroy` sends it) leaves the host as it was before. */
  async function destroyRecord(error: Error, before: HostView): Promise<void> {
    if (!(error instanceof PartialCreateError)) return;
    assert.equal(error.properties.__provider, SERIALIZED_PROVIDER, "the record can be deleted");
    assert.ok(isIncompleteCreate(error.properties));
    await kvm.remove(error.id, error.properties);
    forgetLeftover(error.id);
    const after = hostView();
    show("destroyed", after);
    assert.deepEqual(added(before, after), { domains: [], volumes: [] });
  }

  it("warms the base image cache (so later injections hit the per-VM steps)", async () => {
    const news = await checked(request("noleak-warm"));
    const { id, outs } = await kvm.create(news);
    await kvm.remove(id, outs);
    assert.equal(callsInFlight(), 0);
  });

  it("a bridge that does not exist: nothing is left that state does not record", async () => {
    const vmName = "noleak-bridge";
    const news = await checked(request(vmName, { network: { bridge: "br-noleak404" } }));
    const before = hostView();
    show("before", before);
    const error = await failedCreate(news);
    console.log(`      error : ${error.name}: ${error.message.split("\n")[0]}`);
    assert.match(error.message, /br-noleak404/);
    assertHoldsWhatStateRecords(before, error, vmName, lab.pool);
    await destroyRecord(error, before);
  });

  it("an inactive libvirt network: the domain is recorded; once the network is up the next up continues it", async () => {
    const vmName = "noleak-network";
    const news = await checked(request(vmName, { network: { name: INACTIVE_NETWORK } }));
    const before = hostView();
    show("before", before);
    const error = await failedCreate(news);
    console.log(`      error : ${error.name}: ${error.message.split("\n")[0]}`);
    assert.match(error.message, new RegExp(INACTIVE_NETWORK));
    assertHoldsWhatStateRecords(before, error, vmName, lab.pool);
    if (!(error instanceof PartialCreateError)) return; // stopped before anything was made
    assert.equal(error.properties.state, "stopped");
    assert.ok(hostView().domains.includes(vmName), "the recorded domain is defined");
    virsh("net-start", INACTIVE_NETWORK);
    try {
      // The next `up`: the engine calls update on the record; update continues the create.
      const { outs } = await kvm.update(error.id, error.properties, news);
      assert.equal(outs.state, "running");
      assert.ok(!isIncompleteCreate(outs));
      assert.deepEqual(added(before, hostView()), recordedBy(error, vmName, lab.pool));
      await kvm.remove(error.id, outs);
    } finally {
      virshQuiet("net-destroy", INACTIVE_NETWORK);
    }
    assert.deepEqual(added(before, hostView()), { domains: [], volumes: [] });
  });

  it("a pool that fills up while the base image uploads: nothing is left in it", async () => {
    const vmName = "noleak-fullbase";
    // An image larger than the pool's free space is refused before the upload (image-limits.ts):
    // this one (about 6 MiB) fits at that check, and the pool is filled behind its back once
    // the base volume exists, so the upload runs out of room midway, for real.
    const path = join(scratch, "fits-at-check.qcow2");
    await run("qemu-img", ["create", "-q", "-f", "qcow2", "-o", "preallocation=full", path, "6M"]);
    const fitting: ProxyImage = {
      path,
      sha256: createHash("sha256").update(readFileSync(path)).digest("hex"),
      bytes: statSync(path).size,
    };
    let url = "";
    const base = () => baseImageVolumeName({ url, sha256: fitting.sha256, format: "qcow2" });
    const filler = fillPoolOnceVolumeAppears(lab, lab.tinyPool, base, 256 * 1024);
    const server = await serveImage(fitting, { beforeBody: filler.fill });
    url = server.url;
    try {
      const news = await checked(
        request(vmName, { pool: lab.tinyPool, image: { url, sha256: fitting.sha256 } }),
      );
      const tinyBefore = volumeNames(lab.tinyPool);
      const before = hostView();
      show("before", before);
      const error = await failedCreate(news);
      console.log(`      error : ${error.name}: ${error.message.split("\n")[0]}`);
      await filler.release();
      assertHoldsWhatStateRecords(before, error, vmName, lab.tinyPool);
      assert.ok(!(error instanceof PartialCreateError), "nothing of the VM was made");
      assert.doesNotMatch(error.message, /nothing was uploaded/, "the free-space check let it in");
      assert.deepEqual(volumeNames(lab.tinyPool), tinyBefore, "not even a half-uploaded base");
    } finally {
      await filler.release();
      await server.close();
    }
  });

  it("a pool that fills up at the seed: the overlay this attempt made is removed too", async () => {
    const vmName = "noleak-fullseed";
    // Incompressible user-data larger than the whole tiny pool: the seed cannot fit.
    const userDataBase64 = randomBytes((lab.tinyPoolMiB + 2) * 1024 * 1024).toString("base64");
    const news = await checked(
      request(vmName, {
        pool: lab.tinyPool,
        image: { url: smallImageServer.url, sha256: smallImage.sha256 },
        userDataBase64,
      }),
    );
    const before = hostView();
    show("before", before);
    const error = await failedCreate(news);
    console.log(`      error : ${error.name}: ${error.message.split("\n")[0]}`);
    assertHoldsWhatStateRecords(before, error, vmName, lab.tinyPool);
    assert.ok(!(error instanceof PartialCreateError), "undone before any domain existed");
    assert.ok(
      volumeNames(lab.tinyPool).some((name) => name.startsWith(BASE_IMAGE_PREFIX)),
      "the small base fitted: the failure was at the seed, after the overlay",
    );
  });

  it("a readiness that never comes: the running domain is recorded, and destroy removes it", async () => {
    const vmName = "noleak-ready";
    const news = await checked(
      request(vmName, {
        readiness: { mode: "address" },
        timeouts: { createSeconds: 120, readySeconds: 3, deleteSeconds: 60 },
      }),
    );
    const before = hostView();
    show("before", before);
    const error = await failedCreate(news);
    console.log(`      error : ${error.name}: ${error.message.split("\n")[0]}`);
    assert.ok(error instanceof PartialCreateError, String(error));
    assert.match(error.message, /timeouts\.readySeconds/);
    assert.equal(error.properties.state, "running");
    const extra = assertHoldsWhatStateRecords(before, error, vmName, lab.pool);
    assert.deepEqual(extra, recordedBy(error, vmName, lab.pool), "domain and both volumes");
    await destroyRecord(error, before);
  });

  it("the SSH link cut mid-create (after the overlay, at the seed): undone over a fresh link, or recorded", async () => {
    const vmName = "noleak-sshcut";
    const news = await checked(
      request(vmName, {
        connection: labConnection(lab),
        // A seed of a few MiB: the upload is still running when the link is cut.
        userDataBase64: randomBytes(24 * 1024 * 1024).toString("base64"),
      }),
    );
    const before = hostView();
    show("before", before);
    let cutAt = "";
    let settled = false;
    const creating = failedCreate(news).finally(() => (settled = true));
    // Cut the link the moment this attempt's overlay exists: the seed comes next.
    const pool = await inspector.call(Procedures.storagePoolLookupByName, { name: lab.pool });
    const overlayExists = () =>
      inspector
        .call(Procedures.storageVolLookupByName, { pool, name: overlayVolumeName(vmName) })
        .then(
          () => true,
          () => false,
        );
    const cutter = (async () => {
      while (!settled && cutAt === "") {
        if (await overlayExists()) {
          const pids = sshdServingThisProcess(lab);
          signalAll(pids, "SIGKILL");
          cutAt = `overlay present; killed sshd ${pids.join(",")}`;
        } else await new Promise((resolve) => setTimeout(resolve, 2));
      }
    })();
    const error = await creating;
    await cutter;
    console.log(`      cut   : ${cutAt}`);
    console.log(`      error : ${error.name}: ${error.message.split("\n")[0]}`);
    assert.notEqual(cutAt, "", "the link was cut mid-create");
    assertHoldsWhatStateRecords(before, error, vmName, lab.pool);
    await destroyRecord(error, before);
  });

  it("the SSH link cut during the base image upload: the half-uploaded base is removed over a fresh link", async () => {
    const vmName = "noleak-basecut";
    // The same bytes under a URL of its own: a base this test is the first to upload.
    const url = `${imageServer.url}?set=noleak-basecut`;
    const baseName = baseImageVolumeName({ url, sha256: image.sha256, format: "qcow2" });
    const news = await checked(
      request(vmName, { connection: labConnection(lab), image: { url, sha256: image.sha256 } }),
    );
    const poolBefore = volumeNames(lab.pool);
    const before = hostView();
    show("before", before);
    let settled = false;
    const creating = failedCreate(news).finally(() => (settled = true));
    const pool = await inspector.call(Procedures.storagePoolLookupByName, { name: lab.pool });
    let cutAt = "";
    while (!settled && cutAt === "") {
      const vol = await inspector
        .call(Procedures.storageVolLookupByName, { pool, name: baseName })
        .catch(() => undefined);
      const info =
        vol && (await inspector.call(Procedures.storageVolGetInfo, { vol }).catch(() => undefined));
      // Cut once the upload is well under way (tens of MiB written).
      if (info && info.allocation > 32n * 1024n * 1024n) {
        const pids = sshdServingThisProcess(lab);
        signalAll(pids, "SIGKILL");
        cutAt = `${info.allocation / 1024n / 1024n} MiB of the base written; killed sshd ${pids.join(",")}`;
      } else await new Promise((resolve) => setTimeout(resolve, 5));
    }
    const error = await creating;
    console.log(`      cut   : ${cutAt}`);
    console.log(`      error : ${error.name}: ${error.message.split("\n")[0]}`);
    assert.notEqual(cutAt, "", "the link was cut mid-upload");
    assert.ok(!(error instanceof PartialCreateError), "nothing of the VM existed yet");
    assertHoldsWhatStateRecords(before, error, vmName, lab.pool);
    assert.deepEqual(volumeNames(lab.pool), poolBefore, "no half-uploaded base is left either");
  });

  it("the SSH link cut for good mid-create (no new link either): recorded, then continued by the next up", async () => {
    const vmName = "noleak-sshgone";
    const relay = await startRelay(lab.sshPort);
    try {
      const news = await checked(
        request(vmName, {
          connection: relayedConnection(relay.port),
          userDataBase64: randomBytes(24 * 1024 * 1024).toString("base64"),
        }),
      );
      const before = hostView();
      show("before", before);
      let settled = false;
      const creating = failedCreate(news).finally(() => (settled = true));
      const pool = await inspector.call(Procedures.storagePoolLookupByName, { name: lab.pool });
      let cut = false;
      while (!settled && !cut) {
        const overlay = await inspector
          .call(Procedures.storageVolLookupByName, { pool, name: overlayVolumeName(vmName) })
          .then(
            () => true,
            () => false,
          );
        if (overlay) {
          relay.cut(); // the link dies, and the host refuses every new one
          cut = true;
        } else await new Promise((resolve) => setTimeout(resolve, 2));
      }
      const error = await creating;
      console.log(`      error : ${error.name}: ${error.message.split("\n")[0]}`);
      assert.ok(cut, "the link was cut mid-create");
      assert.ok(
        error instanceof PartialCreateError,
        `undo was impossible, so: recorded (${error})`,
      );
      const extra = assertHoldsWhatStateRecords(before, error, vmName, lab.pool);
      assert.ok(extra.volumes.includes(`${lab.pool}/${overlayVolumeName(vmName)}`));

      // The host is reachable again; the next `up` continues the recorded create.
      relay.restore();
      // A refresh keeps the record while its volumes remain (there is no domain yet).
      const refreshed = await kvm.read(error.id, error.properties);
      assert.equal(refreshed.id, error.id, "refresh keeps the record");
      const { outs } = await kvm.update(error.id, error.properties, news);
      assert.equal(outs.state, "running");
      assert.ok(!isIncompleteCreate(outs));
      show("continued", hostView());
      assert.deepEqual(added(before, hostView()), recordedBy(error, vmName, lab.pool));
      await kvm.remove(error.id, outs);
      forgetLeftover(error.id);
      assert.deepEqual(added(before, hostView()), { domains: [], volumes: [] });
    } finally {
      relay.restore();
      await relay.close();
    }
  });

  /** The lab's known_hosts line for the relay's port: same host keys, another address. */
  function relayedConnection(port: number): Record<string, unknown> {
    const connection = labConnection(lab);
    return {
      ...connection,
      port,
      knownHosts: String(connection.knownHosts).replaceAll(
        `[${lab.sshHost}]:${lab.sshPort}`,
        `[${lab.sshHost}]:${port}`,
      ),
    };
  }
});

interface Relay {
  port: number;
  /** Destroys every relayed connection and refuses new ones. */
  cut(): void;
  restore(): void;
  close(): Promise<void>;
}

/** A TCP relay on loopback to the lab's sshd: the test decides when the host is unreachable. */
async function startRelay(targetPort: number): Promise<Relay> {
  const sockets = new Set<Socket>();
  let refusing = false;
  const server = createServer((client) => {
    if (refusing) return void client.destroy();
    const upstream = connect(targetPort, "127.0.0.1");
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.on("close", () => sockets.delete(socket));
      socket.on("error", () => undefined);
    }
    client.pipe(upstream).pipe(client);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const cutAll = () => {
    for (const socket of sockets) socket.destroy();
  };
  return {
    port: (server.address() as AddressInfo).port,
    cut: () => {
      refusing = true;
      cutAll();
    },
    restore: () => (refusing = false),
    close: () =>
      new Promise((resolve) => {
        cutAll();
        server.close(() => resolve());
      }),
  };
}
