import assert from "node:assert/strict";
import { createMark, markFromText, markToText } from "../../provider/common/mark";
import { ADOPTED_KEY, decideDiff } from "../../provider/common/diff";
import { buildDomainXml, parseDomainXml } from "../../provider/kvm/domain-xml";
import * as kvmAdoption from "../../provider/kvm/adoption";
import { KVM_CHANGE_TABLE } from "../../provider/kvm/diff";
import * as kvm from "../../provider/kvm/provider";
import * as proxmoxAdoption from "../../provider/proxmox/adoption";
import { PROXMOX_CHANGE_TABLE } from "../../provider/proxmox/diff";
import * as proxmox from "../../provider/proxmox/provider";

const OWNER = { project: "egress", stack: "dev", resource: "edge-1" };
const PROGRAM = {
  node: "pve",
  templateVmid: 9000,
  diskStorage: "local-lvm",
  seedStorage: "seeds",
  vlanTag: 20,
  userData: "#cloud-config\n",
  owner: OWNER,
};

describe("adoption: the creating arguments in the mark, and the adoption rule", () => {
  it("Proxmox: what create writes into the mark reads back as the checked inputs (nothing secret)", async () => {
    const { inputs } = await proxmox.check({}, { ...PROGRAM, apiToken: "u@pve!t=secret" });
    const creation = proxmoxAdoption.creationOf(inputs as never);
    assert.equal(JSON.stringify(creation).includes("secret"), false);
    assert.equal(JSON.stringify(creation).includes("cloud-config"), false);
    const mark = createMark(OWNER, new Date(), creation);
    const reading = markFromText(markToText(mark));
    assert.ok(reading.kind === "marked");
    const adopted = proxmoxAdoption.adoptedCreation(reading.mark)!;
    for (const key of Object.keys(adopted.inputs))
      assert.deepEqual(adopted.inputs[key], inputs[key], key);
    assert.deepEqual(Object.keys(adopted.inputs).sort(), [
      "diskStorage",
      "installGuestAgent",
      "seedStorage",
      "templateVmid",
      "vmNameChosenBy",
      "vmidRange",
    ]);
    assert.deepEqual([...adopted.asClonedSet], ["vlanTag"]);
    // A mark from before creation fields existed says nothing.
    assert.equal(proxmoxAdoption.adoptedCreation(createMark(OWNER)), undefined);
  });

  it("KVM: the mark survives the domain XML; the image URL stays out of it", async () => {
    const image = {
      url: "https://images.example/x.qcow2?X-Amz-Signature=s3cr3t",
      sha256: "a".repeat(64),
    };
    const { inputs } = await kvm.check({}, { image, owner: OWNER });
    const mark = createMark(OWNER, new Date(), kvmAdoption.creationOf(inputs as never));
    const parsed = parseDomainXml(
      buildDomainXml({
        name: "edge-1-abcdefghij",
        domainType: "qemu",
        vcpus: 1,
        memoryMiB: 512,
        firmware: "uefi",
        cpuMode: { model: "qemu64" },
        pool: "lab",
        overlayVolume: "edge-1-abcdefghij.qcow2",
        seedVolume: "edge-1-abcdefghij-seed.iso",
        network: { bridge: "br-lab" },
        mac: "52:54:00:12:34:56",
        mark,
      }),
    );
    assert.ok(parsed.mark.kind === "marked");
    assert.equal(JSON.stringify(parsed.mark.mark).includes("s3cr3t"), false);
    assert.deepEqual(kvmAdoption.adoptedCreation(parsed.mark.mark), {
      installGuestAgent: true,
      vmNameChosenBy: "provider",
      image: { format: "qcow2", sha256: "a".repeat(64) },
    });
    assert.deepEqual(kvmAdoption.adoptedCreation(createMark(OWNER)), {});
  });

  it("create adopting a VM by name refuses one whose mark says it was made from something else", async () => {
    const { inputs } = await proxmox.check({}, PROGRAM);
    const mark = createMark(OWNER, new Date(), proxmoxAdoption.creationOf(inputs as never));
    assert.equal(proxmoxAdoption.creationMismatch(mark, inputs as never), undefined);
    assert.match(
      proxmoxAdoption.creationMismatch(mark, { ...inputs, templateVmid: 9001 } as never)!,
      /made with templateVmid 9000, but the program asks for templateVmid 9001/,
    );
    assert.equal(proxmoxAdoption.creationMismatch(createMark(OWNER), inputs as never), undefined);

    const image = { url: "https://images.example/x.qcow2", sha256: "a".repeat(64) };
    const kvmInputs = (await kvm.check({}, { image, owner: OWNER })).inputs as never;
    const kvmMark = createMark(OWNER, new Date(), kvmAdoption.creationOf(kvmInputs));
    assert.equal(kvmAdoption.creationMismatch(kvmMark, kvmInputs), undefined);
    const otherImage = { ...(kvmInputs as { image: object }).image, sha256: "b".repeat(64) };
    assert.match(
      kvmAdoption.creationMismatch(kvmMark, {
        ...(kvmInputs as object),
        image: otherImage,
      } as never)!,
      /made from image\.sha256 a{64}/,
    );
  });

  describe("diff", () => {
    /** What .get's read reports of a VM whose mark predates creation fields: the host's view only. */
    const adopted = {
      node: "pve",
      vmName: "edge-1-abcdefghij",
      cores: 1,
      memoryMiB: 1024,
      tags: [],
      owner: OWNER,
      createdAt: "2026-11-01T10:00:00.000Z",
      [ADOPTED_KEY]: true,
    };
    const declared = {
      ...PROGRAM,
      vmName: "edge-1-abcdefghij",
      vmNameChosenBy: "provider",
      cores: 1,
      memoryMiB: 1024,
      tags: [],
      installGuestAgent: true,
      timeouts: { createSeconds: 900, readySeconds: 600, deleteSeconds: 300 },
    };

    it("an adopted state without a value does not count as a change", () => {
      assert.deepEqual(decideDiff(PROXMOX_CHANGE_TABLE, adopted, declared), {
        changes: false,
        replaces: [],
        deleteBeforeReplace: false,
      });
    });

    it("a value the adopted state holds is compared as usual", () => {
      const marked = { ...adopted, templateVmid: 9000 };
      assert.deepEqual(
        decideDiff(PROXMOX_CHANGE_TABLE, marked, { ...declared, templateVmid: 9001 }).replaces,
        ["templateVmid"],
      );
      assert.deepEqual(
        decideDiff(PROXMOX_CHANGE_TABLE, adopted, { ...declared, cores: 2 }).replaces,
        ["cores"],
      );
    });

    it("a state create wrote never drops a change: a missing value there is 'unset'", () => {
      const created = { ...declared, userData: undefined, seedSha256: "" };
      assert.deepEqual(decideDiff(PROXMOX_CHANGE_TABLE, created, declared).replaces, ["userData"]);
      const kvmCreated = { image: { url: "https://a/x.qcow2", format: "qcow2" }, owner: OWNER };
      const kvmDeclared = { ...kvmCreated, image: { ...kvmCreated.image, sha256: "b".repeat(64) } };
      assert.deepEqual(decideDiff(KVM_CHANGE_TABLE, kvmCreated, kvmDeclared).replaces, [
        "image.sha256",
      ]);
      assert.deepEqual(
        decideDiff(KVM_CHANGE_TABLE, { ...kvmCreated, [ADOPTED_KEY]: true }, kvmDeclared).replaces,
        [],
      );
    });

    it("check keeps a generated name against adopted inputs that lack what the host cannot say", async () => {
      const olds = { ...adopted, vmNameChosenBy: "provider" };
      const { inputs } = await proxmox.check(olds, PROGRAM);
      assert.equal(inputs.vmName, adopted.vmName);
      // Without the adopted flag those olds would be a created state whose userData was unset.
      const { [ADOPTED_KEY]: _, ...created } = olds;
      assert.notEqual((await proxmox.check(created, PROGRAM)).inputs.vmName, adopted.vmName);
    });
  });
});
