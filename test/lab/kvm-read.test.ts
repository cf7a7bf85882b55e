/**
 * KvmProxy's read against the real lab: a domain changed out of band with
 * virsh (the tool an operator would use) shows the drift after refresh, a
 * domain renamed by hand is still ours (found by its libvirt UUID) and is
 * deleted with its volumes, and `.get` adopts only a domain with this stack's
 * mark. The guest never needs to boot: the domain is stopped right after
 * create, and every change is to its persistent definition.
 */
import { strict as assert } from "node:assert";
import { execFileSync } from "node:child_process";
import { errorClassOf } from "../../provider/common/errors";
import { closeAllHosts, countLibvirtCalls } from "../../provider/kvm/connect";
import { overlayVolumeName, seedVolumeName } from "../../provider/kvm/naming";
import * as kvm from "../../provider/kvm/provider";
import { CallCounter, Procedures, type LibvirtConnection } from "../../provider/libvirt-rpc-xdr";
import { openLocalLibvirt } from "../../provider/ssh/local";
import { useLab, type LabEnv } from "./fixture";
import { domainXml } from "./helpers";
import {
  ensureProxyImage,
  removeCachedBaseImage,
  serveImage,
  waitOutHostListings,
  type ProxyImage,
  type RunningServer,
} from "./kvm-support";

type Props = Record<string, unknown>;
const owner = { project: "egress-lab", stack: "kvm-read-test", resource: "proxy" };

describe("KvmProxy read in the lab: drift, identity by UUID, adoption", function () {
  this.timeout(300_000);
  let lab: LabEnv;
  let image: ProxyImage;
  let imageServer: RunningServer;
  let inspector: LibvirtConnection;
  const cleanups: Array<() => Promise<void>> = [];

  before(async () => {
    lab = await useLab();
    image = await ensureProxyImage();
    imageServer = await serveImage(image);
    inspector = await openLocalLibvirt({ socketPath: lab.libvirtSocket });
  });

  after(async () => {
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined);
    if (inspector && imageServer) {
      // This run's base image (its URL carries this run's port) goes with it.
      await removeCachedBaseImage(inspector, lab.pool, imageServer.url, image.sha256);
    }
    await inspector?.close();
    await closeAllHosts();
    await imageServer?.close();
  });

  const virsh = (...args: string[]): string =>
    execFileSync("virsh", ["-q", "-c", lab.uri, ...args], { encoding: "utf8" });

  async function domainExists(name: string): Promise<boolean> {
    return inspector.call(Procedures.domainLookupByName, { name }).then(
      () => true,
      () => false,
    );
  }

  function program(vmName: string): Props {
    return {
      owner,
      vmName,
      pool: lab.pool,
      network: { bridge: lab.bridge },
      domainType: "qemu",
      firmware: "bios",
      vcpus: 1,
      memoryMiB: 256,
      diskGiB: 3,
      image: { url: imageServer.url, sha256: image.sha256 },
      readiness: { mode: "none" },
      // Defined and never started: nothing here needs the guest to boot (and it costs no CPU).
      running: false,
      timeouts: { createSeconds: 240, readySeconds: 60, deleteSeconds: 120 },
    };
  }

  async function checked(raw: Props, olds: Props = {}): Promise<Props> {
    const { inputs, failures } = await kvm.check(olds, raw);
    assert.deepEqual(failures, []);
    return inputs;
  }

  /** Creates a proxy that is defined but never started (running: false). */
  async function stoppedProxy(vmName: string) {
    const inputs = await checked(program(vmName));
    const { id, outs } = await kvm.create(inputs);
    cleanups.push(async () => {
      const gone = await kvm.remove(id, outs).then(
        () => true,
        () => false,
      );
      if (!gone) virsh("undefine", "--nvram", vmName);
    });
    assert.equal(virsh("domstate", vmName).trim(), "shut off", "running: false never starts it");
    return { inputs, id, outs };
  }

  /** What the next `pulumi up` does after a refresh stored read's props and inputs. */
  async function nextUp(raw: Props, read: { props?: Props; inputs?: Props }) {
    const news = await checked(raw, read.inputs);
    return kvm.diff("id", read.props!, news);
  }

  it("shows vCPUs, memory and disk changed with virsh as drift; the next up replaces as the table says", async () => {
    const vmName = `drift-${process.pid}`;
    const { id, outs } = await stoppedProxy(vmName);

    // Untouched: the definition libvirt hands back reads as the inputs that made it.
    const calls = new CallCounter();
    countLibvirtCalls(calls);
    const untouched = await kvm.read(id, outs);
    countLibvirtCalls(undefined);
    // The host's listings (asked afresh: create's writes forgot them), then the domain's own two.
    assert.deepEqual(Object.fromEntries(calls.byProcedure()), {
      connectGetAllDomainStats: 1,
      connectListAllDomains: 1,
      connectListAllStoragePools: 1,
      storagePoolListAllVolumes: 1,
      domainGetXmlDesc: 1,
      storageVolGetInfo: 1,
    });
    assert.equal(untouched.id, id);
    assert.equal(untouched.props!.state, "stopped");
    assert.deepEqual(await nextUp(program(vmName), untouched), {
      changes: false,
      replaces: [],
      deleteBeforeReplace: false,
    });

    virsh("setmaxmem", vmName, "512M", "--config");
    virsh("setvcpus", vmName, "2", "--config", "--maximum");
    virsh("setvcpus", vmName, "2", "--config");
    virsh("vol-resize", overlayVolumeName(vmName), "4G", "--pool", lab.pool);

    calls.reset();
    countLibvirtCalls(calls);
    const read = await kvm.read(id, untouched.props!);
    countLibvirtCalls(undefined);
    // The domain's own two calls; the listings are shared when this read starts within their window
    // of the first (a slow machine may ask them again, once), never a per-member look-up.
    assert.equal(calls.of("domainGetXmlDesc"), 1);
    assert.equal(calls.of("storageVolGetInfo"), 1);
    for (const [procedure, count] of calls.byProcedure())
      assert.ok(
        count === 1 &&
          [
            "domainGetXmlDesc",
            "storageVolGetInfo",
            "connectGetAllDomainStats",
            "connectListAllDomains",
            "connectListAllStoragePools",
            "storagePoolListAllVolumes",
          ].includes(procedure),
        `${procedure} ×${count}`,
      );
    for (const view of [read.props!, read.inputs!]) {
      assert.equal(view.vcpus, 2);
      assert.equal(view.memoryMiB, 512);
      assert.equal(view.diskGiB, 4);
      assert.deepEqual(view.network, { bridge: lab.bridge });
      assert.equal(view.firmware, "bios");
    }
    assert.equal(read.props!.libvirtUuid, outs.libvirtUuid);
    assert.equal(read.inputs!.libvirtUuid, undefined, "outputs stay out of the inputs");
    const decision = await nextUp(program(vmName), read);
    assert.deepEqual(
      [decision.changes, decision.replaces?.sort(), decision.deleteBeforeReplace],
      // A fixed name cannot exist twice: the old VM goes first.
      [true, ["diskGiB", "memoryMiB", "vcpus"], true],
    );
  });

  it("finds a domain renamed by hand by its UUID, reports the new name, and deletes it with its volumes", async () => {
    const vmName = `rename-${process.pid}`;
    const { id, outs } = await stoppedProxy(vmName);
    const renamed = `renamed-${process.pid}`;
    virsh("domrename", vmName, renamed);
    cleanups.push(async () => {
      if (await domainExists(renamed)) virsh("undefine", "--nvram", renamed);
    });

    const read = await kvm.read(id, outs);
    assert.equal(read.id, `hosts/local/domains/${renamed}`, "the id follows the name");
    assert.equal(read.props!.vmName, renamed);
    assert.equal(read.inputs!.vmName, renamed);
    assert.equal(read.props!.libvirtUuid, outs.libvirtUuid);

    // Delete from state that was never refreshed (old id, old name): the UUID finds it.
    await kvm.remove(id, outs);
    assert.equal(await domainExists(renamed), false);
    const left = virsh("vol-list", lab.pool);
    assert.ok(!left.includes(overlayVolumeName(vmName)), left);
    assert.ok(!left.includes(seedVolumeName(vmName)), left);
  });

  it("reads a domain undefined by hand as gone even while the host's shared listing still names it", async () => {
    const vmName = `vanish-${process.pid}`;
    const { id, outs } = await stoppedProxy(vmName);
    const before = await kvm.read(id, outs); // asks the host's listings, which name the domain
    assert.equal(before.props!.state, "stopped");
    virsh("undefine", "--nvram", vmName); // its overlay and seed stay
    const calls = new CallCounter();
    countLibvirtCalls(calls);
    const after = await kvm.read(id, before.props!);
    countLibvirtCalls(undefined);
    assert.equal(calls.of("connectGetAllDomainStats"), 0, "the listing asked before is shared");
    assert.equal(after.id, id);
    assert.match(String(after.props!.replaceBecause), /domain .* gone .* left behind/);
  });

  it("adopts a marked domain with .get's props, and refuses another stack's or the wrong host", async () => {
    const vmName = `adopt-${process.pid}`;
    const { id, outs } = await stoppedProxy(vmName);
    // What KvmProxy.get(name, id, {}) registers: the owner and nothing else (local socket).
    const getProps = (stack = owner.stack): Props => ({
      owner: { ...owner, stack, resource: "adopted" },
    });

    const adopted = await kvm.read(id, getProps());
    assert.equal(adopted.id, id);
    assert.equal(adopted.props!.vmName, vmName);
    assert.equal(adopted.props!.state, "stopped");
    assert.equal(adopted.props!.vcpus, 1);
    assert.equal(adopted.props!.memoryMiB, 256);
    assert.equal(adopted.props!.diskGiB, 3);
    assert.equal(adopted.props!.mac, outs.mac);
    assert.equal(adopted.props!.createdAt, outs.createdAt);
    assert.equal(adopted.props!.libvirtUuid, outs.libvirtUuid);
    // Pulumi reads a .get resource on every up: an unchanged domain reads the same.
    assert.deepEqual(await kvm.read(id, getProps()), adopted);

    await assert.rejects(
      kvm.read(id, getProps("another-stack")),
      (error: Error) =>
        errorClassOf(error) === "Permanent" &&
        /belongs to egress-lab\/kvm-read-test .*only the stack that owns it can adopt it/.test(
          error.message,
        ),
    );
    await assert.rejects(
      kvm.read(`hosts/kvm9.lan/domains/${vmName}`, getProps()),
      (error: Error) =>
        errorClassOf(error) === "Permanent" &&
        /names host kvm9\.lan.*reaches local/.test(error.message),
    );
    // A domain without our mark cannot be adopted.
    const bare = `bare-${process.pid}`;
    const dom = await inspector.call(Procedures.domainDefineXml, { xml: domainXml(bare) });
    try {
      await waitOutHostListings(); // the reads above listed the host's domains without it
      await assert.rejects(
        kvm.read(`hosts/local/domains/${bare}`, getProps()),
        (error: Error) =>
          errorClassOf(error) === "Permanent" &&
          /no ownership mark.*KvmProxy\.get cannot adopt it/.test(error.message),
      );
    } finally {
      await inspector.call(Procedures.domainUndefine, { dom });
    }
  });
});
