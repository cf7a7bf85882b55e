/**
 * KvmProxy against the real lab where a create goes wrong or goes wide:
 * libvirtd + qemu (TCG), a Debian image built from Debian's packages and
 * served over HTTP, the real NoCloud seed. A create interrupted at each step
 * converges; a domain another stack made is refused; ten at once share one
 * download and one SSH login. None of these guests is waited for: a whole
 * proxy's life (boot, squid, read, delete) is lab/dual-stack's. The provider
 * methods run exactly as the dynamic provider server calls them.
 */
import { strict as assert } from "node:assert";
import { execFileSync } from "node:child_process";
import { errorClassOf } from "../../provider/common/errors";
import { createMark } from "../../provider/common/mark";
import { Deadline } from "../../provider/common/deadline";
import { closeAllHosts, dialCount, openHost } from "../../provider/kvm/connect";
import { buildDomainXml } from "../../provider/kvm/domain-xml";
import { baseImageVolumeName, overlayVolumeName, seedVolumeName } from "../../provider/kvm/naming";
import * as kvm from "../../provider/kvm/provider";
import { Procedures, type LibvirtConnection } from "../../provider/libvirt-rpc-xdr";
import { openLocalLibvirt } from "../../provider/ssh/local";
import { guestTestTimeoutMs, kvmTimeouts } from "./budgets";
import { useLab, type LabEnv } from "./fixture";
import { LabGuests } from "./guests";
import {
  squidUserData,
  ensureProxyImage,
  labConnection,
  removeCachedBaseImage,
  serveImage,
  type ProxyImage,
  type RunningServer,
} from "./kvm-support";

const owner = { project: "egress-lab", stack: "kvm-proxy-test", resource: "proxy" };

describe("KvmProxy in the lab: interrupted, foreign and parallel creates (real libvirtd, qemu)", function () {
  this.timeout(guestTestTimeoutMs(1));
  let lab: LabEnv;
  let image: ProxyImage;
  let imageServer: RunningServer;
  let inspector: LibvirtConnection;
  const progress: string[] = [];

  before(async () => {
    lab = await useLab();
    image = await ensureProxyImage();
    imageServer = await serveImage(image, { chunked: true });
    inspector = await openLocalLibvirt({ socketPath: lab.libvirtSocket });
    kvm.setProgressLog((line) => progress.push(line));
  });

  const cleanups: Array<() => Promise<unknown>> = [];
  const guests = new LabGuests();
  after(async () => {
    for (const cleanup of cleanups) await cleanup().catch(() => undefined);
    // Whatever the provider could not delete (a create cut short, a failed test) goes by name.
    if (lab) await guests.removeAll(lab);
    if (imageServer)
      for (const url of [imageServer.url, parallelImageUrl(), resumeImageUrl()])
        await removeBaseImage(url).catch(() => undefined);
    await inspector?.close();
    await closeAllHosts();
    await imageServer?.close();
  });

  /**
   * The image server listens on a new port each run, so each run's image URL,
   * and so its base volume, is new: the first create really downloads. Other
   * runs' bases (a concurrent run, say) are left alone; this run's go at the end.
   */
  const removeBaseImage = (url: string): Promise<void> =>
    removeCachedBaseImage(inspector, lab.pool, url, image.sha256);

  /** The same bytes under another URL: a separate cache entry for the parallel test. */
  const parallelImageUrl = (): string => `${imageServer.url}?set=parallel`;
  const resumeImageUrl = (): string => `${imageServer.url}?set=resume`;

  function volumeNames(): string[] {
    return execFileSync("virsh", ["-q", "-c", "qemu:///system", "vol-list", lab.pool])
      .toString()
      .split("\n")
      .map((line) => line.trim().split(/\s+/)[0])
      .filter((name): name is string => Boolean(name));
  }

  async function domainExists(name: string): Promise<boolean> {
    return inspector.call(Procedures.domainLookupByName, { name }).then(
      () => true,
      () => false,
    );
  }

  function userInputs(overrides: Record<string, unknown> = {}): Record<string, unknown> {
    return {
      owner,
      pool: lab.pool,
      network: { bridge: lab.bridge },
      domainType: "qemu",
      memoryMiB: 768,
      image: { url: imageServer.url, sha256: image.sha256 },
      userData: squidUserData(lab),
      readiness: { mode: "port", port: 3128 },
      timeouts: kvmTimeouts(),
      ...overrides,
    };
  }

  async function checked(
    raw: Record<string, unknown>,
    olds: Record<string, unknown> = {},
  ): Promise<Record<string, unknown>> {
    const { inputs, failures } = await kvm.check(olds, raw);
    assert.deepEqual(failures, []);
    guests.add(String(inputs.vmName));
    return inputs;
  }

  const sshConnection = (): Record<string, unknown> => labConnection(lab);

  it("converges after a create interrupted at each step: one domain, two per-VM volumes", async () => {
    const inputs = await checked(
      userInputs({
        readiness: { mode: "none" },
        vmName: "resume-test-1",
        image: { url: resumeImageUrl(), sha256: image.sha256 },
      }),
    );
    const pool = await inspector.call(Procedures.storagePoolLookupByName, { name: lab.pool });
    // Interrupted mid image upload: a base without its marker that no longer grows is a dead
    // upload, removed and fetched again (one that still grew would be waited for).
    const baseName = baseImageVolumeName({
      url: resumeImageUrl(),
      sha256: image.sha256,
      format: "qcow2",
    });
    await inspector.call(Procedures.storageVolCreateXml, {
      pool,
      xml: `<volume><name>${baseName}</name><capacity unit="bytes">65536</capacity><target><format type="raw"/></target></volume>`,
      flags: 0,
    });
    progress.length = 0;
    // Interrupted mid seed upload: a truncated seed is left behind and must be rebuilt, not reused.
    const truncatedSeed = await inspector.call(Procedures.storageVolCreateXml, {
      pool,
      xml: `<volume><name>${seedVolumeName("resume-test-1")}</name><capacity unit="bytes">4096</capacity><target><format type="raw"/></target></volume>`,
      flags: 0,
    });
    assert.ok(truncatedSeed);
    const first = await kvm.create(inputs);
    const seedInfo = await inspector.call(Procedures.storageVolGetInfo, {
      vol: await inspector.call(Procedures.storageVolLookupByName, {
        pool,
        name: seedVolumeName("resume-test-1"),
      }),
    });
    assert.ok(seedInfo.capacity > 4096n, "the truncated seed was rebuilt");
    assert.ok(
      progress.some((line) => /removing incomplete base image/.test(line)),
      progress.join(" | "),
    );
    const baseInfo = await inspector.call(Procedures.storageVolGetInfo, {
      vol: await inspector.call(Procedures.storageVolLookupByName, { pool, name: baseName }),
    });
    assert.equal(
      baseInfo.capacity,
      2n * 1024n ** 3n,
      "the base was fetched again whole (2 GiB virtual)",
    );
    // Interrupted after define, before start: create again finds the domain and starts it.
    const dom = await inspector.call(Procedures.domainLookupByName, { name: "resume-test-1" });
    await inspector.call(Procedures.domainDestroy, { dom });
    const second = await kvm.create(inputs);
    assert.equal(second.id, first.id);
    assert.equal(second.outs.state, "running");
    const state = await inspector.call(Procedures.domainGetState, { dom, flags: 0 });
    assert.equal(state.state, 1, "running again");
    const mine = volumeNames().filter((name) => name.startsWith("resume-test-1"));
    assert.deepEqual(
      mine.sort(),
      [overlayVolumeName("resume-test-1"), seedVolumeName("resume-test-1")].sort(),
    );
    // A paused VM reads as paused (never "stopped"), keeps its address, and still deletes cleanly.
    execFileSync("virsh", ["-q", "-c", "qemu:///system", "suspend", "resume-test-1"]);
    const paused = await kvm.read(first.id, { ...second.outs, ip: "198.51.100.99" });
    assert.equal(paused.props!.state, "paused");
    assert.equal(paused.props!.ip, "198.51.100.99", "a paused VM keeps the address it had");
    await kvm.remove(first.id, first.outs);
    assert.equal(await domainExists("resume-test-1"), false);
  });

  it("refuses to read or delete a domain it did not make, or one another stack owns", async () => {
    const inputs = await checked(userInputs({ readiness: { mode: "none" }, vmName: "not-ours-1" }));
    const foreignMark = createMark({ project: "someone", stack: "else", resource: "x" });
    const xml = buildDomainXml({
      name: "not-ours-1",
      domainType: "qemu",
      vcpus: 1,
      memoryMiB: 256,
      firmware: "bios",
      cpuMode: { model: "qemu64" },
      pool: lab.pool,
      overlayVolume: "nonexistent.qcow2",
      seedVolume: "nonexistent-seed.iso",
      network: { bridge: lab.bridge },
      mac: "52:54:00:99:99:99",
      mark: foreignMark,
    });
    const dom = await inspector.call(Procedures.domainDefineXml, { xml });
    try {
      // The mark as libvirt's own metadata call returns it (no namespace declaration on the element).
      const session = await openHost(
        { socketPath: lab.libvirtSocket, connection: undefined },
        Deadline.afterSeconds(30, "test"),
      );
      const reading = await session.host.mark(dom);
      assert.equal(reading.kind === "marked" && reading.mark.owner.stack, "else");
      const outs = { ...inputs, host: "local" };
      await assert.rejects(
        kvm.read("hosts/local/domains/not-ours-1", outs),
        (error: Error) =>
          errorClassOf(error) === "Permanent" && /belongs to someone\/else/.test(error.message),
      );
      await assert.rejects(
        kvm.remove("hosts/local/domains/not-ours-1", outs),
        /belongs to someone\/else/,
      );
      await assert.rejects(kvm.create(inputs), /belongs to someone\/else/);
      assert.equal(await domainExists("not-ours-1"), true, "the foreign domain is untouched");
    } finally {
      await inspector.call(Procedures.domainUndefine, { dom });
    }
  });

  it("creates ten proxies at once on one host with one download and one SSH login", async () => {
    const getsBefore = imageServer.requests.filter((r) => r.method === "GET").length;
    const dialsBefore = dialCount();
    await closeAllHosts();
    const names = Array.from({ length: 10 }, (_, i) => `parallel-${i}`);
    const all = await Promise.all(
      names.map((vmName) =>
        checked(
          userInputs({
            vmName,
            image: { url: parallelImageUrl(), sha256: image.sha256 },
            connection: sshConnection(),
            memoryMiB: 256,
            readiness: { mode: "none" },
          }),
        ),
      ),
    );
    for (const inputs of all)
      cleanups.push(() =>
        kvm.remove(`hosts/${lab.sshHost}:${lab.sshPort}/domains/${inputs.vmName}`, inputs),
      );
    const created = await Promise.all(all.map((inputs) => kvm.create(inputs)));
    try {
      assert.equal(
        imageServer.requests.filter((r) => r.method === "GET").length - getsBefore,
        1,
        "one image download",
      );
      assert.equal(dialCount() - dialsBefore, 1, "one SSH login for all ten");
      for (const name of names) {
        const dom = await inspector.call(Procedures.domainLookupByName, { name });
        const { state } = await inspector.call(Procedures.domainGetState, { dom, flags: 0 });
        assert.equal(state, 1, `${name} is running`);
      }
    } finally {
      await Promise.all(created.map(({ id, outs }) => kvm.remove(id, outs)));
    }
    for (const name of names) assert.equal(await domainExists(name), false);
  });
});
