import assert from "node:assert/strict";
import { Deadline } from "../../provider/common/deadline";
import { isPermanent } from "../../provider/common/errors";
import { createMark } from "../../provider/common/mark";
import * as provider from "../../provider/proxmox/provider";
import { vmDescription } from "../../provider/proxmox/vm-config";
import { resizeDisk, writeConfig } from "../../provider/proxmox/vm";
import { useSimulator } from "./harness";
import { checked, OWNER, userInputs } from "./fixtures";

/**
 * Refresh reports the VM as Proxmox has it, identity is the VMID and our mark
 * (not the name), and `.get` adopts only a VM with this stack's mark. Changes
 * "by hand" go through the simulator's API, as a user's `qm set` would.
 */
describe("ProxmoxProxy read: drift, identity by mark, adoption (simulator)", () => {
  const env = useSimulator({ agentDelayMs: 20 });
  const deadline = () => new Deadline(20_000, "test");

  async function createdProxy(overrides: Record<string, unknown> = {}) {
    const program = userInputs(env.sim, overrides);
    const inputs = await checked(program);
    const { id, outs } = await provider.create(inputs);
    return { program, inputs, id, outs, ref: { node: "pve", vmid: outs.vmid } };
  }

  /** What the next `pulumi up` does after a refresh stored `read`'s props and inputs. */
  async function nextUp(
    program: Record<string, unknown>,
    read: { props: Record<string, unknown>; inputs?: Record<string, unknown> },
  ) {
    const news = await checked(program, read.inputs);
    return provider.diff("id", read.props, news);
  }

  it("a VM nobody touched reads back without drift: the same program proposes no change", async () => {
    const { program, id, outs } = await createdProxy({
      cores: 2,
      memoryMiB: 2048,
      bridge: "vmbr1",
      vlanTag: 20,
      diskGiB: 4,
      tags: ["Web"],
    });
    const read = await provider.read(id, { ...outs });
    assert.equal(read.id, id);
    assert.deepEqual(await nextUp(program, read), {
      changes: false,
      replaces: [],
      deleteBeforeReplace: false,
    });
  });

  it("reports cores, memory, net0's VLAN tag, disk size and tags changed by hand; the next up replaces or updates as the table says", async () => {
    const { program, id, outs, ref } = await createdProxy({
      cores: 2,
      memoryMiB: 2048,
      bridge: "vmbr1",
      vlanTag: 20,
      diskGiB: 4,
      tags: ["web"],
    });
    const net0 = env.sim.vms.get(outs.vmid)!.config.net0;
    const client = env.client();
    await writeConfig(
      client,
      ref,
      {
        cores: 4,
        memory: 3072,
        net0: net0.replace("tag=20", "tag=30"),
        tags: "egress-proxies;extra;web",
      },
      deadline(),
    );
    await resizeDisk(client, ref, "scsi0", 6, deadline());

    const read = await provider.read(id, { ...outs });
    for (const view of [read.props, read.inputs!]) {
      assert.equal(view.cores, 4);
      assert.equal(view.memoryMiB, 3072);
      assert.equal(view.vlanTag, 30);
      assert.equal(view.bridge, "vmbr1");
      assert.equal(view.diskGiB, 6);
      assert.deepEqual(view.tags, ["extra", "web"]);
    }
    assert.equal(read.props.mac, outs.mac, "the MAC is read from net0 and did not change");
    assert.equal(read.inputs!.mac, undefined, "outputs stay out of the inputs");

    const decision = await nextUp(program, read);
    assert.equal(decision.changes, true);
    // The generated name is replaced with the VM, so create-before-delete cannot collide.
    assert.deepEqual(decision.replaces.sort(), [
      "cores",
      "diskGiB",
      "memoryMiB",
      "vlanTag",
      "vmName",
    ]);
    // Tags alone update in place.
    const tagsOnly = await provider.read(id, { ...outs });
    const retagged = await nextUp(
      { ...program, cores: 4, memoryMiB: 3072, vlanTag: 30, diskGiB: 6 },
      tagsOnly,
    );
    assert.deepEqual([retagged.changes, retagged.replaces], [true, []]);
  });

  it("a VM of ours renamed by hand is still ours: read reports the new name, delete deletes it", async () => {
    const { program, id, outs, ref, inputs } = await createdProxy();
    await writeConfig(env.client(), ref, { name: "renamed-by-hand" }, deadline());
    const read = await provider.read(id, { ...outs });
    assert.equal(read.id, id, "the VMID is the identity");
    assert.equal(read.props.vmName, "renamed-by-hand");
    assert.equal(read.inputs!.vmName, "renamed-by-hand");
    // The generated name follows the VM: the next up keeps it and proposes nothing.
    assert.deepEqual(await nextUp(program, read), {
      changes: false,
      replaces: [],
      deleteBeforeReplace: false,
    });

    await provider.remove(id, read.props);
    assert.equal(env.sim.vms.has(outs.vmid), false, "the renamed VM is deleted");
    assert.equal(env.sim.isoFile("seeds", `${inputs.vmName}-seed.iso`), undefined);
  });

  it("another VM of this stack at our VMID means ours is gone: refresh keeps it for its seed, delete leaves the VM alone", async () => {
    const { id, outs, inputs } = await createdProxy();
    const later = createMark(OWNER, new Date(Date.parse(String(outs.createdAt)) + 60_000));
    env.sim.vms.get(outs.vmid)!.config.description = vmDescription(String(inputs.vmName), later);
    // Our seed is still there: state keeps naming it, marked, and the replacement's delete removes it.
    const kept = await provider.read(id, { ...outs });
    assert.equal(kept.id, id);
    assert.match(String(kept.props.replaceBecause), /gone .* left behind/);
    await provider.remove(id, kept.props);
    assert.equal(env.sim.vms.has(outs.vmid), true, "the other VM is untouched");
    assert.equal(env.sim.isoFile("seeds", String(outs.seedVolume).split("/")[1]!), undefined);
    assert.deepEqual(await provider.read(id, { ...outs }), { props: {} });
  });

  it("still refuses a VM at our VMID with our name and no mark, naming the fix", async () => {
    const { id, outs } = await createdProxy();
    env.sim.vms.get(outs.vmid)!.config.description = "taken over by hand";
    await assert.rejects(
      provider.read(id, { ...outs }),
      (error: Error) =>
        isPermanent(error) && /no egress-proxies mark.*choose another vmName/.test(error.message),
    );
  });

  describe(".get (adoption)", () => {
    /** What ProxmoxProxy.get(name, id, args) registers: the user's arguments and the owner, no outputs. */
    function getProps(
      args: Record<string, unknown> = {},
      owner = { ...OWNER, resource: "adopted" },
    ) {
      return {
        apiEndpoint: env.sim.endpoint,
        apiToken: env.sim.tokenFor(),
        caCertPem: env.sim.caCertPem,
        owner,
        ...args,
      };
    }

    it("adopts a VM with this stack's mark and reports it as it is", async () => {
      const { program, id, outs } = await createdProxy({ cores: 2, vlanTag: 20, tags: ["web"] });
      const read = await provider.read(id, getProps({ node: "pve" }));
      assert.equal(read.id, id);
      assert.equal(read.props.vmName, outs.vmName);
      assert.equal(read.props.vmid, outs.vmid);
      assert.equal(read.props.cores, 2);
      assert.equal(read.props.vlanTag, 20);
      // The mark says the creating program set vlanTag only: bridge and disk stay as cloned.
      assert.equal("bridge" in read.props || "diskGiB" in read.props, false);
      // And what PVE cannot say, from the mark: adoption reads back as the creating program.
      assert.equal(read.props.templateVmid, 9000);
      assert.equal(read.props.installGuestAgent, true);
      assert.equal(read.props.adopted, true);
      assert.deepEqual(read.props.tags, ["web"]);
      assert.equal(read.props.mac, outs.mac);
      assert.equal(read.props.ip, outs.ip);
      assert.equal(read.props.state, "running");
      assert.equal(read.props.createdAt, outs.createdAt);
      // Pulumi reads a .get resource again on every up: the same VM reads the same.
      assert.deepEqual(await provider.read(id, getProps({ node: "pve" })), read);
      // A value the creating program set and the VM lost by hand still shows as a change.
      const vm = env.sim.vms.get(outs.vmid)!;
      vm.config.net0 = vm.config.net0!.replace(/,tag=20/, "");
      const lost = await provider.read(id, getProps({ node: "pve" }));
      assert.equal(lost.props.vlanTag, null);
      const declared = {
        ...program,
        vmName: outs.vmName,
        owner: { ...OWNER, resource: "adopted" },
      };
      assert.deepEqual((await nextUp(declared, lost)).replaces, ["vlanTag"]);
    });

    it("a VM marked by an earlier release (no creation fields): what it cannot say is left out, and the creating program still diffs clean", async () => {
      const { program, id, outs } = await createdProxy({ bridge: "vmbr1", diskGiB: 4 });
      const vm = env.sim.vms.get(outs.vmid)!;
      const { creation: _, ...older } = createMark(OWNER, new Date(String(outs.createdAt)));
      vm.config.description = vmDescription(String(outs.vmName), older);
      const read = await provider.read(id, getProps({ node: "pve" }));
      for (const key of ["templateVmid", "diskStorage", "bridge", "diskGiB", "vmNameChosenBy"])
        assert.equal(key in read.props, false, key);
      // The program names the VM: an older mark cannot say its name was generated.
      const declared = {
        ...program,
        vmName: outs.vmName,
        owner: { ...OWNER, resource: "adopted" },
      };
      assert.deepEqual(await nextUp(declared, read), {
        changes: false,
        replaces: [],
        deleteBeforeReplace: false,
      });
      // What it does hold still compares: cores is the host's.
      assert.deepEqual((await nextUp({ ...declared, cores: 3 }, read)).replaces, ["cores"]);
    });

    it("checks the mark of a locked VM too: ours adopts as locked, someone else's is refused", async () => {
      const { id, outs } = await createdProxy();
      env.sim.vms.get(outs.vmid)!.config.lock = "backup";
      const read = await provider.read(id, getProps());
      assert.equal(read.props.state, "locked (backup)");
      assert.equal(read.props.vmName, outs.vmName);
      env.sim.addForeignVm(20124, "hand-made-locked");
      env.sim.vms.get(20124)!.config.lock = "backup";
      await assert.rejects(
        provider.read("nodes/pve/qemu/20124", getProps()),
        (error: Error) => isPermanent(error) && /cannot adopt it/.test(error.message),
      );
    });

    it("refuses a VM without our mark, and one another stack owns", async () => {
      env.sim.addForeignVm(20123, "hand-made");
      await assert.rejects(
        provider.read("nodes/pve/qemu/20123", getProps({ vmName: "something-else" })),
        (error: Error) =>
          isPermanent(error) && /ProxmoxProxy\.get cannot adopt it/.test(error.message),
      );
      const { id } = await createdProxy();
      await assert.rejects(
        provider.read(id, getProps({}, { project: "egress", stack: "prod", resource: "x" })),
        (error: Error) =>
          isPermanent(error) &&
          /belongs to egress\/test .*only the stack that owns it can adopt it/.test(error.message),
      );
    });
  });
});
