import assert from "node:assert/strict";
import { observedInputs, tagsOf } from "../../provider/proxmox/observed";

/** A cloned VM's config as the API returns it (after our one config write). */
const CONFIG = {
  name: "edge-1-abcdefghij",
  cores: "2",
  memory: "2048",
  boot: "order=scsi0;ide2",
  scsi0: "local-lvm:vm-20001-disk-0,size=3G",
  ide2: "seeds:iso/edge-1-abcdefghij-seed.iso,media=cdrom",
  net0: "virtio=BC:24:11:AA:BB:CC,bridge=vmbr0,firewall=1",
  tags: "egress-proxies;web",
};

describe("proxmox read: the VM's config in the terms of the inputs", () => {
  it("reports name, cores, memory and tags; keeps what the config cannot say", () => {
    const previous = {
      vmName: "old-name",
      cores: 1,
      memoryMiB: 1024,
      tags: [],
      templateVmid: 9000,
    };
    assert.deepEqual(observedInputs(previous, CONFIG), {
      vmName: "edge-1-abcdefghij",
      cores: 2,
      memoryMiB: 2048,
      tags: ["web"],
      templateVmid: 9000,
      startOnBoot: false,
    });
  });

  it("reports onboot as startOnBoot: 1 is on, absent or 0 is off (PVE's default)", () => {
    assert.equal(observedInputs({}, { ...CONFIG, onboot: "1" }).startOnBoot, true);
    assert.equal(observedInputs({}, { ...CONFIG, onboot: "0" }).startOnBoot, false);
    assert.equal(observedInputs({ startOnBoot: true }, CONFIG).startOnBoot, false);
  });

  it("reports bridge, VLAN tag and disk size only when the inputs set them (else the template's would be drift)", () => {
    const unset = observedInputs({ cores: 2 }, CONFIG);
    assert.equal("bridge" in unset || "vlanTag" in unset || "diskGiB" in unset, false);
    const set = observedInputs({ bridge: "vmbr1", vlanTag: 20, diskGiB: 4 }, CONFIG);
    assert.equal(set.bridge, "vmbr0");
    assert.equal("vlanTag" in set, false, "a tag removed by hand is reported as unset");
    assert.equal(set.diskGiB, 3);
  });

  it("adopting, reports the host's bridge, VLAN tag and disk size for those the creating program set (the mark says which)", () => {
    const config = { ...CONFIG, net0: `${CONFIG.net0},tag=30`, scsi0: "local-lvm:vm-1,size=3584M" };
    const all = observedInputs({}, config, new Set(["bridge", "vlanTag", "diskGiB"]));
    assert.deepEqual([all.bridge, all.vlanTag, all.diskGiB], ["vmbr0", 30, 3.5]);
    const some = observedInputs({}, config, new Set(["vlanTag"]));
    assert.deepEqual([some.bridge, some.vlanTag, some.diskGiB], [undefined, 30, undefined]);
  });

  it("reads PVE 8.1's memory property string and PVE's defaults when a key is missing", () => {
    assert.equal(observedInputs({}, { memory: "current=4096" }).memoryMiB, 4096);
    const bare = observedInputs({}, {});
    assert.deepEqual([bare.cores, bare.memoryMiB], [1, 512]);
  });

  it("folds and sorts tags in any separator, dropping our mark tag unless the user listed it", () => {
    assert.deepEqual(tagsOf("Web,b egress-proxies;a"), ["a", "b", "web"]);
    assert.deepEqual(tagsOf("egress-proxies;a", true), ["a", "egress-proxies"]);
    assert.deepEqual(tagsOf(undefined), []);
  });
});
