import { strict as assert } from "node:assert";
import fc from "fast-check";
import { decideDiff } from "../../provider/common/diff";
import { UNKNOWN } from "../../provider/common/inputs";
import { createMark } from "../../provider/common/mark";
import { addressForMac, isRoutableIpv4, lookUpAddress } from "../../provider/kvm/addresses";
import { KVM_CHANGE_TABLE } from "../../provider/kvm/diff";
import {
  buildDomainXml,
  parseDomainXml,
  parseMarkElementXml,
  type DomainSpec,
} from "../../provider/kvm/domain-xml";
import {
  baseImageVolumeName,
  kvmResourceId,
  macAddressFor,
  overlayVolumeName,
  hostLabel,
  legacyHostLabel,
  parseKvmResourceId,
  seedVolumeName,
  vmNameOfVolume,
} from "../../provider/kvm/naming";
import { describeState } from "../../provider/kvm/host";
import * as kvm from "../../provider/kvm/provider";
import { effectiveCpuMode, validateKvmInputs } from "../../provider/kvm/schema";
import { GIB, overlayCapacity, parseVolumeXml } from "../../provider/kvm/volume-xml";

const owner = { project: "crawl", stack: "prod", resource: "proxy-0" };
const image = { url: "https://images.example/debian-12.qcow2" };

export const sampleDomain = (overrides: Partial<DomainSpec> = {}): DomainSpec => ({
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
  mac: "52:54:00:0a:0b:0c",
  mark: createMark(owner, new Date("2026-11-01T00:00:00Z")),
  ...overrides,
});

describe("KvmProxy inputs", () => {
  it("fills defaults for a minimal input", () => {
    const result = validateKvmInputs({ image, owner });
    assert.ok(result.ok, JSON.stringify(result));
    assert.equal(result.inputs.pool, "default");
    assert.deepEqual(result.inputs.network, { name: "default" });
    assert.equal(result.inputs.firmware, "uefi");
    assert.equal(result.inputs.image.format, "qcow2");
    assert.equal(result.inputs.readiness.port, 3128);
  });

  const failures: Array<[string, Record<string, unknown>, string, RegExp]> = [
    [
      "plain http without a digest",
      { image: { url: "http://x/y.qcow2" } },
      "image.sha256",
      /plain http, so image.sha256 is required/,
    ],
    [
      "credentials in the image URL",
      { image: { url: "https://u:p@x/y.qcow2" } },
      "image.url",
      /must not carry credentials/,
    ],
    ["a short digest", { image: { ...image, sha256: "abc" } }, "image.sha256", /64 hex characters/],
    [
      "a key path instead of a key",
      { image, connection: { host: "kvm1", privateKey: "~/.ssh/id_ed25519" } },
      "connection.privateKey",
      /not a path/,
    ],
    [
      "user@host in connection.host",
      { image, connection: { host: "root@kvm1" } },
      "connection.host",
      /without user or port/,
    ],
    [
      "a port out of range",
      { image, connection: { host: "kvm1", port: 70000 } },
      "connection.port",
      /at most 65535/,
    ],
    ["too much memory", { image, memoryMiB: 4_000_000 }, "memoryMiB", /at most 1048576/],
    ["a fractional vCPU count", { image, vcpus: 1.5 }, "vcpus", /whole number/],
    ["an unknown input", { image, colour: "red" }, "colour", /not an input of KvmProxy/],
    [
      "both user-data forms",
      { image, userData: "#cloud-config\n", userDataBase64: "AAAA" },
      "userDataBase64",
      /not both/,
    ],
    ["a bad VM name", { image, vmName: "Proxy_1" }, "vmName", /DNS label/],
    [
      "a bridge name too long",
      { image, network: { bridge: "a-very-long-bridge-name" } },
      "network.bridge",
      /at most 15 characters/,
    ],
  ];
  for (const [what, raw, property, reason] of failures) {
    it(`refuses ${what}, naming ${property}`, () => {
      const result = validateKvmInputs({ owner, ...raw });
      assert.ok(!result.ok);
      const failure = result.failures.find((f) => f.property === property);
      assert.ok(failure, `no failure for ${property}: ${JSON.stringify(result.failures)}`);
      assert.match(failure.reason, reason);
    });
  }

  it("accepts unknown values during preview instead of failing on them", () => {
    const result = validateKvmInputs({
      owner,
      image: { url: UNKNOWN },
      connection: { host: UNKNOWN, privateKey: UNKNOWN },
    });
    assert.ok(!result.ok && result.unknownOnly && result.failures.length === 0);
  });

  it("uses host-passthrough on KVM and an emulated model on plain QEMU unless told otherwise", () => {
    assert.equal(effectiveCpuMode({ domainType: "kvm", cpuMode: undefined }), "host-passthrough");
    assert.deepEqual(effectiveCpuMode({ domainType: "qemu", cpuMode: undefined }), {
      model: "qemu64",
    });
    assert.equal(effectiveCpuMode({ domainType: "qemu", cpuMode: "maximum" }), "maximum");
  });
});

describe("KvmProxy diff and naming decisions", () => {
  const base = {
    image,
    owner,
    vmName: "proxy-0-abcdefghij",
    vmNameChosenBy: "provider",
    vcpus: 1,
    connection: { host: "kvm1", port: 22, user: "root", privateKey: "k1" },
    readiness: { mode: "port", port: 3128 },
  };

  it("replaces for a change to the VM itself and updates in place for credentials and readiness", () => {
    assert.deepEqual(decideDiff(KVM_CHANGE_TABLE, base, { ...base, vcpus: 2 }).replaces, ["vcpus"]);
    assert.deepEqual(
      decideDiff(KVM_CHANGE_TABLE, base, {
        ...base,
        connection: { ...base.connection, host: "kvm2" },
      }).replaces,
      ["connection.host"],
    );
    const credentials = decideDiff(KVM_CHANGE_TABLE, base, {
      ...base,
      connection: { ...base.connection, privateKey: "k2" },
    });
    assert.deepEqual(credentials, { changes: true, replaces: [], deleteBeforeReplace: false });
    assert.deepEqual(
      decideDiff(KVM_CHANGE_TABLE, base, { ...base, readiness: { mode: "none", port: 3128 } })
        .replaces,
      [],
    );
    assert.deepEqual(decideDiff(KVM_CHANGE_TABLE, base, { ...base }), {
      changes: false,
      replaces: [],
      deleteBeforeReplace: false,
    });
  });

  it("deletes before replacing only when the user fixed the name", () => {
    const fixed = { ...base, vmNameChosenBy: "user" };
    assert.equal(
      decideDiff(KVM_CHANGE_TABLE, fixed, { ...fixed, vcpus: 4 }).deleteBeforeReplace,
      true,
    );
    assert.equal(
      decideDiff(KVM_CHANGE_TABLE, base, { ...base, vcpus: 4 }).deleteBeforeReplace,
      false,
    );
  });

  it("reports a change when only the provider code changed, so new code reaches state", () => {
    assert.equal(
      decideDiff(KVM_CHANGE_TABLE, { ...base, __provider: "a" }, { ...base, __provider: "b" })
        .changes,
      true,
    );
  });

  it("keeps the generated name when the same program runs again with defaults, and renames only for a replacement", async () => {
    const program = { image, owner: { ...owner, resource: "proxy-0" } };
    const first = await kvm.check({}, program);
    assert.deepEqual(first.failures, []);
    // The regression: olds carry defaults, news do not; an unchanged program must keep its name.
    const again = await kvm.check(first.inputs, program);
    assert.equal(again.inputs.vmName, first.inputs.vmName);
    const retimed = await kvm.check(first.inputs, { ...program, timeouts: { createSeconds: 60 } });
    assert.equal(retimed.inputs.vmName, first.inputs.vmName);
    const resized = await kvm.check(first.inputs, { ...program, vcpus: 8 });
    assert.notEqual(resized.inputs.vmName, first.inputs.vmName);
    assert.match(String(resized.inputs.vmName), /^proxy-0-[a-z2-7]{10}$/);
    const fixed = await kvm.check(first.inputs, { ...program, vmName: "mine" });
    assert.equal(fixed.inputs.vmName, "mine");
    assert.equal(fixed.inputs.vmNameChosenBy, "user");
  });

  it("treats every input the schema knows as either replace or update", () => {
    const result = validateKvmInputs({ image, owner, connection: { host: "h" } });
    assert.ok(result.ok);
    for (const key of Object.keys(result.inputs))
      assert.ok(
        Object.keys(KVM_CHANGE_TABLE).some((path) => path === key || path.startsWith(`${key}.`)) ||
          key === "vmNameChosenBy",
        key,
      );
  });
});

describe("KvmProxy names", () => {
  it("names per-VM volumes after the VM and maps them back", () => {
    assert.equal(overlayVolumeName("vm-1"), "vm-1.qcow2");
    assert.equal(seedVolumeName("vm-1"), "vm-1-seed.iso");
    assert.deepEqual(vmNameOfVolume("vm-1-seed.iso"), { vmName: "vm-1", kind: "seed" });
    assert.deepEqual(vmNameOfVolume("vm-1.qcow2"), { vmName: "vm-1", kind: "overlay" });
    assert.equal(vmNameOfVolume(baseImageVolumeName({ ...image, format: "qcow2" })), undefined);
  });

  it("keys the base image by URL and digest, not by a friendly name", () => {
    const a = baseImageVolumeName({ ...image, format: "qcow2" });
    assert.equal(a, baseImageVolumeName({ ...image, format: "qcow2" }));
    assert.notEqual(a, baseImageVolumeName({ ...image, sha256: "a".repeat(64), format: "qcow2" }));
    assert.notEqual(a, baseImageVolumeName({ url: image.url + "?v=2", format: "qcow2" }));
  });

  it("derives a stable locally administered MAC from the VM name", () => {
    assert.match(macAddressFor("vm-1"), /^52:54:00(:[0-9a-f]{2}){3}$/);
    assert.equal(macAddressFor("vm-1"), macAddressFor("vm-1"));
    assert.notEqual(macAddressFor("vm-1"), macAddressFor("vm-2"));
  });

  it("round-trips the resource id and refuses a foreign one", () => {
    assert.deepEqual(parseKvmResourceId(kvmResourceId("kvm1:2222", "vm-1")), {
      host: "kvm1:2222",
      vmName: "vm-1",
    });
    assert.throws(() => parseKvmResourceId("vm-1"), /not a KvmProxy id/);
  });

  it("brackets an IPv6 host in ids so its port cannot be read as part of it; reads ids of earlier releases", () => {
    const cases: [{ host: string; port: number }, string, string][] = [
      [{ host: "kvm1.lan", port: 22 }, "kvm1.lan", "kvm1.lan"],
      [{ host: "kvm1.lan", port: 2222 }, "kvm1.lan:2222", "kvm1.lan:2222"],
      [{ host: "192.0.2.10", port: 2222 }, "192.0.2.10:2222", "192.0.2.10:2222"],
      [{ host: "2001:db8::10", port: 22 }, "[2001:db8::10]", "2001:db8::10"],
      [{ host: "2001:db8::10", port: 2222 }, "[2001:db8::10]:2222", "2001:db8::10:2222"],
      [{ host: "[2001:db8::10]", port: 2222 }, "[2001:db8::10]:2222", "[2001:db8::10]:2222"],
    ];
    for (const [connection, label, legacy] of cases) {
      assert.equal(hostLabel(connection), label, JSON.stringify(connection));
      assert.equal(legacyHostLabel(connection), legacy, JSON.stringify(connection));
      assert.deepEqual(parseKvmResourceId(kvmResourceId(label, "vm-1")), {
        host: label,
        vmName: "vm-1",
      });
    }
    assert.equal(hostLabel(undefined), "local");
    assert.deepEqual(parseKvmResourceId("hosts/2001:db8::10:2222/domains/vm-1"), {
      host: "2001:db8::10:2222",
      vmName: "vm-1",
    });
  });
});

describe("domain XML", () => {
  it("round-trips the fields delete, read and the reaper rely on", () => {
    const spec = sampleDomain();
    const parsed = parseDomainXml(buildDomainXml(spec));
    assert.equal(parsed.name, spec.name);
    assert.equal(parsed.mac, spec.mac);
    assert.equal(parsed.firmware, "uefi");
    assert.deepEqual(parsed.volumes, [
      { device: "disk", pool: "lab", volume: spec.overlayVolume },
      { device: "cdrom", pool: "lab", volume: spec.seedVolume },
    ]);
    assert.deepEqual(parsed.mark, { kind: "marked", mark: spec.mark });
  });

  it("puts the seed on virtio-scsi and switches Secure Boot off explicitly for UEFI", () => {
    const xml = buildDomainXml(sampleDomain());
    assert.match(xml, /<controller type="scsi" index="0" model="virtio-scsi"\/>/);
    assert.match(xml, /<target dev="sda" bus="scsi"\/>/);
    assert.match(xml, /<feature enabled="no" name="secure-boot"\/>/);
    assert.doesNotMatch(xml, /sata|<graphics/);
    assert.doesNotMatch(
      buildDomainXml(sampleDomain({ firmware: "bios" })),
      /firmware="efi"|secure-boot/,
    );
  });

  it("escapes hostile text in the mark (property)", () => {
    fc.assert(
      fc.property(fc.string({ unit: "binary" }), (resource) => {
        const spec = sampleDomain({
          mark: createMark({ ...owner, resource: resource || "r" }, new Date(0)),
        });
        const reading = parseDomainXml(buildDomainXml(spec)).mark;
        assert.equal(reading.kind, "marked");
        assert.equal(reading.kind === "marked" && reading.mark.owner.resource, resource || "r");
      }),
      { numRuns: 300 },
    );
  });

  it("reads the mark whatever prefix the host serialises, and flags a broken one", () => {
    const ours =
      '<x:mark xmlns:x="urn:egress-proxies:ownership:1" managed="true" project="p" stack="s" resource="r" createdAt="2026-01-01T00:00:00Z"/>';
    assert.equal(parseMarkElementXml(ours).kind, "marked");
    assert.equal(parseMarkElementXml('<mark xmlns="urn:other" managed="true"/>').kind, "unmarked");
    // DOMAIN_GET_METADATA answers for the namespace it was asked about, without declaring it.
    assert.equal(
      parseMarkElementXml(
        '<mark managed="true" project="p" stack="s" resource="r" createdAt="2026-01-01T00:00:00Z"/>',
      ).kind,
      "marked",
    );
    assert.equal(
      parseMarkElementXml('<mark xmlns="urn:egress-proxies:ownership:1" project="p"/>').kind,
      "corrupt",
    );
  });
});

describe("volumes and addresses", () => {
  it("never makes the overlay smaller than the image's virtual size", () => {
    assert.deepEqual(overlayCapacity(10, 2n * GIB), { bytes: 10n * GIB });
    const tooSmall = overlayCapacity(2, 2n * GIB + 1n);
    assert.ok("problem" in tooSmall && /at least 3/.test(tooSmall.problem));
  });

  it("reads a base image's size and path from its volume XML, exact past 2^53 bytes", () => {
    const xml = `<volume type='file'>
  <name>egress-base-x.qcow2</name>
  <key>/var/lib/libvirt/images/egress-base-x.qcow2</key>
  <capacity unit='bytes'>9007199254740993</capacity>
  <allocation unit='bytes'>487653376</allocation>
  <target>
    <path>/var/lib/libvirt/images/egress-base-x.qcow2</path>
    <format type='qcow2'/>
  </target>
</volume>`;
    assert.deepEqual(parseVolumeXml(xml), {
      capacityBytes: 9007199254740993n,
      path: "/var/lib/libvirt/images/egress-base-x.qcow2",
      key: "/var/lib/libvirt/images/egress-base-x.qcow2",
    });
    assert.equal(
      parseVolumeXml(
        "<volume><capacity unit='GiB'>2</capacity><target><path>/p/a&amp;b</path></target></volume>",
      ).capacityBytes,
      2n * GIB,
    );
    assert.throws(
      () => parseVolumeXml("<volume><capacity>2</capacity></volume>"),
      /no target path/,
    );
    assert.throws(
      () =>
        parseVolumeXml(
          "<volume><capacity unit='furlong'>2</capacity><target><path>/p</path></target></volume>",
        ),
      /no capacity in a known unit/,
    );
  });

  it("takes the first routable IPv4 of the VM's own NIC only", () => {
    const interfaces = [
      {
        name: "docker0",
        hwaddr: "02:42:ac:11:00:01",
        addrs: [{ type: "ipv4" as const, addr: "172.17.0.1", prefix: 16 }],
      },
      {
        name: "eth0",
        hwaddr: "52:54:00:0A:0B:0C",
        addrs: [
          { type: "ipv6" as const, addr: "fe80::1", prefix: 64 },
          { type: "ipv4" as const, addr: "169.254.3.3", prefix: 16 },
          { type: "ipv4" as const, addr: "192.0.2.150", prefix: 24 },
        ],
      },
    ];
    assert.equal(addressForMac(interfaces, "52:54:00:0a:0b:0c"), "192.0.2.150");
    assert.equal(addressForMac(interfaces, "52:54:00:ff:ff:ff"), undefined);
    assert.deepEqual(
      ["127.0.0.1", "0.0.0.0", "169.254.1.1", "224.0.0.1", "10.0.0.1"].map(isRoutableIpv4),
      [false, false, false, false, true],
    );
  });

  it("falls through agent → lease → ARP and reports failing sources without giving up", async () => {
    const mac = "52:54:00:0a:0b:0c";
    const lookup = await lookUpAddress(mac, async (source) => {
      if (source === "agent") throw new Error("guest agent is not connected");
      if (source === "lease") return [];
      return [
        { name: "?", hwaddr: mac, addrs: [{ type: "ipv4", addr: "192.0.2.101", prefix: 0 }] },
      ];
    });
    assert.deepEqual(lookup, {
      ip: "192.0.2.101",
      source: "arp",
      failures: [{ source: "agent", message: "guest agent is not connected" }],
    });
  });
});

describe("domain states", () => {
  it("reports paused and suspended as such, never as stopped", () => {
    assert.deepEqual([1, 2, 3, 4, 5, 6, 7, 0].map(describeState), [
      "running",
      "running",
      "paused",
      "shutting-down",
      "stopped",
      "crashed",
      "suspended",
      "unknown",
    ]);
  });
});
