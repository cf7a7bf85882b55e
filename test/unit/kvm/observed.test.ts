import { strict as assert } from "node:assert";
import fc from "fast-check";
import { createMark } from "../../../provider/common/mark";
import { decideDiff } from "../../../provider/common/diff";
import { KVM_CHANGE_TABLE } from "../../../provider/kvm/diff";
import { buildDomainXml, parseDomainXml, type DomainSpec } from "../../../provider/kvm/domain-xml";
import { gibOf, observedInputs, runningOf } from "../../../provider/kvm/observed";
import { anyInPlaceChange, inPlaceChanges } from "../../../provider/kvm/power";
import { validateKvmInputs, type KvmProxyInputs } from "../../../provider/kvm/schema";

const owner = { project: "crawl", stack: "prod", resource: "proxy-0" };

const spec = (overrides: Partial<DomainSpec> = {}): DomainSpec => ({
  name: "proxy-0-abcdefghij",
  domainType: "qemu",
  vcpus: 2,
  memoryMiB: 768,
  firmware: "uefi",
  cpuMode: { model: "qemu64" },
  pool: "lab",
  overlayVolume: "proxy-0-abcdefghij.qcow2",
  seedVolume: "proxy-0-abcdefghij-seed.iso",
  network: { bridge: "br-lab" },
  mac: "52:54:00:12:34:56",
  mark: createMark(owner),
  ...overrides,
});

/** How libvirt itself writes a domain back (KiB, `current`, a NIC on a libvirt network). */
const LIBVIRT_STYLE = `<domain type='kvm' id='3'>
  <name>renamed-by-hand</name>
  <uuid>8f0c1b8e-4c1f-4b63-9f3e-3a1f5b7c2d10</uuid>
  <memory unit='KiB'>2097152</memory>
  <currentMemory unit='KiB'>1048576</currentMemory>
  <vcpu placement='static' current='3'>4</vcpu>
  <os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type><loader readonly='yes' type='pflash'>/usr/share/OVMF/OVMF_CODE_4M.fd</loader></os>
  <cpu mode='host-model' check='partial'/>
  <devices>
    <disk type='volume' device='disk'><source pool='fast' volume='proxy-0-abcdefghij.qcow2'/><target dev='vda' bus='virtio'/></disk>
    <interface type='network'><mac address='52:54:00:AB:CD:EF'/><source network='default' portid='0f1e' bridge='virbr0'/><target dev='vnet2'/></interface>
  </devices>
</domain>`;

describe("kvm read: the domain as the host defines it", () => {
  it("parses back what buildDomainXml wrote: vCPUs, memory, firmware, CPU mode, network", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 128 }),
        fc.integer({ min: 256, max: 1_048_576 }),
        fc.constantFrom("uefi" as const, "bios" as const),
        fc.oneof(
          fc.constantFrom("host-passthrough" as const, "host-model" as const, "maximum" as const),
          fc.constantFrom({ model: "qemu64" }, { model: "Skylake-Server" }),
        ),
        fc.oneof(
          fc.constantFrom({ bridge: "br0" }, { bridge: "br-lab" }),
          fc.constantFrom({ name: "default" }, { name: "isolated.1" }),
        ),
        (vcpus, memoryMiB, firmware, cpuMode, network) => {
          const parsed = parseDomainXml(
            buildDomainXml(spec({ vcpus, memoryMiB, firmware, cpuMode, network })),
          );
          assert.deepEqual(
            {
              vcpus: parsed.vcpus,
              memoryMiB: parsed.memoryMiB,
              firmware: parsed.firmware,
              cpuMode: parsed.cpuMode,
              network: parsed.network,
            },
            { vcpus, memoryMiB, firmware, cpuMode, network },
          );
        },
      ),
    );
  });

  it("reads libvirt's own form: KiB, the current vCPU count, a pflash loader, a libvirt network", () => {
    const parsed = parseDomainXml(LIBVIRT_STYLE);
    assert.equal(parsed.name, "renamed-by-hand");
    assert.equal(parsed.vcpus, 3, "current, not the maximum");
    assert.equal(parsed.memoryMiB, 2048, "<memory>, the size the domain is defined with");
    assert.equal(parsed.firmware, "uefi");
    assert.equal(parsed.cpuMode, "host-model");
    assert.deepEqual(parsed.network, { name: "default" });
    assert.equal(parsed.mac, "52:54:00:ab:cd:ef");
  });

  it("reports a NIC kind KvmProxy does not create by its type, so it reads as a change", () => {
    const xml = LIBVIRT_STYLE.replace(
      /<interface[\s\S]*<\/interface>/,
      "<interface type='direct'><source dev='eth0' mode='bridge'/></interface>",
    );
    assert.deepEqual(parseDomainXml(xml).network, { type: "direct", source: "eth0" });
  });

  it("puts what the host says over the previous inputs and keeps what it cannot say", () => {
    const previous = {
      vmName: "proxy-0-abcdefghij",
      vcpus: 1,
      memoryMiB: 1024,
      diskGiB: 10,
      pool: "lab",
      network: { bridge: "br-lab" },
      firmware: "bios",
      domainType: "kvm",
      image: { url: "https://images.example/debian.qcow2" },
      userData: "#cloud-config\n",
    };
    const observed = observedInputs(previous, {
      description: parseDomainXml(LIBVIRT_STYLE),
      diskBytes: 12n * 1024n ** 3n,
    });
    assert.deepEqual(observed, {
      ...previous,
      vmName: "renamed-by-hand",
      vcpus: 3,
      memoryMiB: 2048,
      diskGiB: 12,
      pool: "fast",
      network: { name: "default" },
      firmware: "uefi",
      domainType: "kvm",
      cpuMode: "host-model",
    });
  });

  it("reports libvirt's autostart flag as startOnBoot, and keeps the previous value when it was not read", () => {
    const previous = { vmName: "proxy-0-abcdefghij", startOnBoot: true };
    const description = parseDomainXml(LIBVIRT_STYLE);
    const off = observedInputs(previous, { description, diskBytes: undefined, autostart: false });
    assert.equal(off.startOnBoot, false);
    const unread = observedInputs(previous, { description, diskBytes: undefined });
    assert.equal(unread.startOnBoot, true);
  });

  it("reports running: false for a stopped, crashed or shutting-down domain and true for a paused one", () => {
    for (const [state, running] of [
      ["running", true],
      ["paused", true],
      ["suspended", true],
      ["stopped", false],
      ["crashed", false],
      ["shutting-down", false],
    ] as const)
      assert.equal(runningOf(state), running, state);
    assert.equal(runningOf("unknown"), undefined);
    const previous = { vmName: "proxy-0-abcdefghij", running: true };
    const description = parseDomainXml(LIBVIRT_STYLE);
    assert.equal(
      observedInputs(previous, { description, diskBytes: undefined, state: "crashed" }).running,
      false,
    );
    assert.equal(
      observedInputs(previous, { description, diskBytes: undefined, state: "unknown" }).running,
      true,
      "an unknown state keeps what was known",
    );
  });

  it("update touches the host only for startOnBoot or running, and for state written before them", () => {
    const inputs = { startOnBoot: true, running: true } as KvmProxyInputs;
    assert.deepEqual(inPlaceChanges({ startOnBoot: true, running: true }, inputs), {
      startOnBoot: false,
      running: false,
    });
    assert.equal(
      anyInPlaceChange(inPlaceChanges({ startOnBoot: true, running: true }, inputs)),
      false,
    );
    assert.deepEqual(inPlaceChanges({ startOnBoot: false, running: false }, inputs), {
      startOnBoot: true,
      running: true,
    });
    assert.deepEqual(inPlaceChanges({}, inputs), { startOnBoot: true, running: true });
  });

  it("leaves cpuMode unset while the domain runs the default for its type, so an untouched VM shows no drift", () => {
    const inputs = validateKvmInputs({
      owner,
      vmName: "proxy-0-abcdefghij",
      pool: "lab",
      network: { bridge: "br-lab" },
      domainType: "qemu",
      vcpus: 2,
      memoryMiB: 768,
      image: { url: "https://images.example/debian.qcow2" },
    });
    assert.ok(inputs.ok);
    const xml = buildDomainXml(spec());
    const observed = observedInputs(inputs.inputs, {
      description: parseDomainXml(xml),
      diskBytes: 10n * 1024n ** 3n,
    });
    assert.equal("cpuMode" in observed, false);
    assert.deepEqual(decideDiff(KVM_CHANGE_TABLE, observed, inputs.inputs), {
      changes: false,
      replaces: [],
      deleteBeforeReplace: false,
    });
    // The same domain resized by hand replaces, as the change table says.
    const resized = observedInputs(inputs.inputs, {
      description: parseDomainXml(buildDomainXml(spec({ vcpus: 4, memoryMiB: 2048 }))),
      diskBytes: 20n * 1024n ** 3n,
    });
    assert.deepEqual(decideDiff(KVM_CHANGE_TABLE, resized, inputs.inputs).replaces.sort(), [
      "diskGiB",
      "memoryMiB",
      "vcpus",
    ]);
  });

  it("gives whole GiB as whole numbers and keeps the fraction of any other size", () => {
    assert.equal(gibOf(10n * 1024n ** 3n), 10);
    assert.equal(gibOf(10n * 1024n ** 3n + 512n * 1024n ** 2n), 10.5);
  });
});
