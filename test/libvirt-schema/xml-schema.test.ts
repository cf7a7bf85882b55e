/**
 * The XML we hand libvirt, checked against libvirt's own RelaxNG schemas
 * with `virt-xml-validate` (Debian's libvirt-clients), before any daemon sees it.
 */
import { strict as assert } from "node:assert";
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { createMark } from "../../provider/common/mark";
import { buildDomainXml, type DomainSpec } from "../../provider/kvm/domain-xml";
import { baseImageVolumeXml, overlayVolumeXml, rawVolumeXml } from "../../provider/kvm/volume-xml";
import { scratchDir } from "../support/iso-tools";

const spec: DomainSpec = {
  name: "proxy-0-abcdefghij",
  domainType: "kvm",
  vcpus: 2,
  memoryMiB: 1024,
  firmware: "uefi",
  cpuMode: "host-passthrough",
  pool: "default",
  overlayVolume: "proxy-0-abcdefghij.qcow2",
  seedVolume: "proxy-0-abcdefghij-seed.iso",
  network: { bridge: "br0" },
  mac: "52:54:00:0a:0b:0c",
  mark: createMark(
    { project: "crawl", stack: "prod", resource: 'odd "name"\n<&>\t%' },
    new Date(0),
  ),
};

function validate(xml: string, kind: "domain" | "storagevol"): void {
  const scratch = scratchDir("xml-schema");
  try {
    const path = join(scratch.dir, `${kind}.xml`);
    writeFileSync(path, xml);
    const result = spawnSync("virt-xml-validate", [path, kind], { encoding: "utf8" });
    if (result.error)
      throw new Error(
        `virt-xml-validate is not installed: run "bash test/setup-host.sh" (${result.error.message})`,
      );
    assert.equal(result.status, 0, `${kind} XML fails to validate:\n${result.stderr}\n${xml}`);
    assert.match(result.stderr + result.stdout, / validates$/m);
  } finally {
    scratch.remove();
  }
}

describe("XML accepted by libvirt's own schemas (virt-xml-validate)", function () {
  this.timeout(120_000);
  const variants: Array<[string, Partial<DomainSpec>]> = [
    ["UEFI on a bridge with host-passthrough", {}],
    [
      "BIOS on a libvirt network with an emulated CPU model",
      {
        firmware: "bios",
        network: { name: "default" },
        cpuMode: { model: "qemu64" },
        domainType: "qemu",
      },
    ],
    ["host-model and maximum CPU modes", { cpuMode: "host-model" }],
    [
      "with a UUID kept from an earlier define",
      { uuid: "8f6a1f5e-3c1d-4a59-9a1a-1d2b3c4d5e6f", cpuMode: "maximum" },
    ],
  ];
  for (const [what, overrides] of variants) {
    it(`domain: ${what}`, () => validate(buildDomainXml({ ...spec, ...overrides }), "domain"));
  }

  it("storage volumes: base image, raw seed or marker, qcow2 overlay", () => {
    validate(baseImageVolumeXml("egress-base-abc.qcow2", "qcow2", 491_520_000), "storagevol");
    validate(rawVolumeXml("proxy-0-seed.iso", 374_784), "storagevol");
    validate(
      overlayVolumeXml("proxy-0.qcow2", 10n * 1024n ** 3n, {
        path: "/var/lib/libvirt/images/egress-base-abc.qcow2",
        format: "qcow2",
      }),
      "storagevol",
    );
  });

  it("fails for XML libvirt would reject (the check can fail)", () => {
    assert.throws(
      () => validate(buildDomainXml(spec).replace('type="kvm"', 'type="nonsense"'), "domain"),
      /fails to validate/,
    );
  });
});
