import assert from "node:assert/strict";
import { PermanentError } from "../../../provider/common/errors";
import { PartialCreateError } from "../../../provider/common/partial-create";
import {
  assertHostReady,
  recheckAfterFailure,
  STABLE_FACTS_MAX_AGE_MS,
} from "../../../provider/kvm/host-facts";
import type { LibvirtHost } from "../../../provider/kvm/host";
import { ListAllFlags } from "../../../provider/libvirt-rpc-xdr";
import {
  decidePreflight,
  describeFailures,
  failures,
  parseDomainCapabilities,
  type DomainCapsSummary,
  type Finding,
  type HostFacts,
  type PreflightWants,
} from "../../../provider/kvm/preflight";

/** Shaped like `virsh domcapabilities --virttype kvm --machine q35` on Debian 12 with ovmf. */
const DEBIAN_CAPS = `<domainCapabilities>
  <path>/usr/bin/qemu-system-x86_64</path>
  <domain>kvm</domain>
  <machine>pc-q35-7.2</machine>
  <arch>x86_64</arch>
  <os supported='yes'>
    <enum name='firmware'>
      <value>efi</value>
    </enum>
    <loader supported='yes'>
      <value>/usr/share/OVMF/OVMF_CODE_4M.ms.fd</value>
      <value>/usr/share/OVMF/OVMF_CODE_4M.fd</value>
      <enum name='type'><value>rom</value><value>pflash</value></enum>
      <enum name='secure'><value>yes</value><value>no</value></enum>
    </loader>
  </os>
</domainCapabilities>`;

/** The same host without the ovmf package: no firmware kinds, no loader paths. */
const NO_OVMF_CAPS = `<domainCapabilities>
  <domain>kvm</domain>
  <machine>pc-q35-7.2</machine>
  <os supported='yes'>
    <enum name='firmware'/>
    <loader supported='yes'>
      <enum name='type'><value>rom</value><value>pflash</value></enum>
    </loader>
  </os>
</domainCapabilities>`;

/** libvirt before 5.2 lists loader paths but no firmware kinds. */
const OLD_CAPS = `<domainCapabilities>
  <domain>kvm</domain>
  <machine>pc-q35-4.2</machine>
  <os supported='yes'>
    <loader supported='yes'>
      <value>/usr/share/OVMF/OVMF_CODE.fd</value>
    </loader>
  </os>
</domainCapabilities>`;

const caps = (overrides: Partial<DomainCapsSummary> = {}): DomainCapsSummary => ({
  domainType: "kvm",
  machine: "pc-q35-7.2",
  efi: true,
  efiWithoutSecureBoot: true,
  ...overrides,
});

const WANTS: PreflightWants = {
  pool: "default",
  network: { name: "default" },
  firmware: "uefi",
  domainType: "kvm",
};

/** A host where everything the defaults ask for exists and runs. */
const READY: HostFacts = {
  libVersion: { ok: true, value: 9_000_000 },
  pools: { ok: true, value: { active: ["default"], inactive: [], autostart: ["default"] } },
  networks: { ok: true, value: { active: ["default"], inactive: [], autostart: ["default"] } },
  domainCaps: { ok: true, value: caps() },
};

/** What Debian 12's packages leave: network default defined and stopped, no pool at all. */
const DEBIAN_FRESH: HostFacts = {
  ...READY,
  pools: { ok: true, value: { active: [], inactive: [] } },
  networks: { ok: true, value: { active: [], inactive: ["default"] } },
};

const byCheck = (findings: Finding[], check: Finding["check"]): Finding =>
  findings.find((finding) => finding.check === check)!;

describe("preflight decisions", () => {
  it("passes a ready host on every check, in the order a person fixes them", () => {
    const findings = decidePreflight(WANTS, READY);
    assert.deepEqual(
      findings.map((f) => [f.check, f.status]),
      [
        ["libvirt-version", "ok"],
        ["domain-type", "ok"],
        ["firmware", "ok"],
        ["pool", "ok"],
        ["network", "ok"],
      ],
    );
    assert.equal(failures(findings).length, 0);
  });

  it("on a fresh Debian host names both missing pieces with their commands and safe fixes", () => {
    const findings = decidePreflight(WANTS, DEBIAN_FRESH);
    const pool = byCheck(findings, "pool");
    assert.equal(pool.status, "fail");
    assert.match(pool.hostHas, /no such pool \(no pools at all\)/);
    assert.deepEqual(pool.fix, [
      "virsh pool-define-as default dir --target /var/lib/libvirt/images",
      "virsh pool-build default",
      "virsh pool-start default",
      "virsh pool-autostart default",
    ]);
    assert.deepEqual(pool.safeFix, {
      kind: "create-default-pool",
      path: "/var/lib/libvirt/images",
    });
    const network = byCheck(findings, "network");
    assert.equal(network.status, "fail");
    assert.equal(network.input, "network.name");
    assert.match(network.hostHas, /defined but not active/);
    assert.ok(network.fix.includes("virsh net-start default"));
    assert.ok(
      network.fix.some((step) => /dnsmasq-base/.test(step)),
      "dnsmasq is only a Recommends",
    );
    assert.deepEqual(network.safeFix, { kind: "start-network", network: "default" });

    const message = describeFailures("kvm1.lan", findings);
    assert.match(message, /^host kvm1\.lan is not ready for this VM \(nothing was created\):/);
    assert.match(message, /- pool "default": no such pool .* Fix: virsh pool-define-as default/);
    assert.match(
      message,
      /- network\.name "default": defined but not active.*virsh net-autostart default/,
    );
    assert.match(message, /egress-proxies doctor --fix/);
    assert.doesNotMatch(message, /firmware|domainType/, "passed checks stay out of the error");
  });

  it("lists the pools a host has when the one asked for is missing, and offers no automatic fix for other names", () => {
    const findings = decidePreflight(
      { ...WANTS, pool: "vms" },
      { ...READY, pools: { ok: true, value: { active: ["default", "iso"], inactive: ["old"] } } },
    );
    const pool = byCheck(findings, "pool");
    assert.equal(pool.status, "fail");
    assert.match(pool.hostHas, /pools: default \(active\), iso \(active\), old \(inactive\)/);
    assert.equal(pool.fix[0], "virsh pool-define-as vms dir --target /var/lib/libvirt/images/vms");
    assert.match(pool.fix.at(-1)!, /or set pool to one the host has \(default, iso\)/);
    assert.equal(pool.safeFix, undefined);
  });

  it("an inactive pool fails with start + autostart; an active one not started at boot only warns", () => {
    const inactive = byCheck(
      decidePreflight(WANTS, {
        ...READY,
        pools: { ok: true, value: { active: [], inactive: ["default"] } },
      }),
      "pool",
    );
    assert.equal(inactive.status, "fail");
    assert.deepEqual(inactive.fix, ["virsh pool-start default", "virsh pool-autostart default"]);
    assert.deepEqual(inactive.safeFix, { kind: "start-pool", pool: "default" });
    const notAtBoot = byCheck(
      decidePreflight(WANTS, {
        ...READY,
        pools: { ok: true, value: { active: ["default"], inactive: [], autostart: [] } },
      }),
      "pool",
    );
    assert.equal(notAtBoot.status, "warn");
    assert.deepEqual(notAtBoot.safeFix, { kind: "autostart-pool", pool: "default" });
    // Without autostart facts (create gathers none) an active pool is simply fine.
    const unknownBoot = byCheck(
      decidePreflight(WANTS, {
        ...READY,
        pools: { ok: true, value: { active: ["default"], inactive: [] } },
      }),
      "pool",
    );
    assert.equal(unknownBoot.status, "ok");
  });

  it("a missing network default points at the package that defines it", () => {
    const network = byCheck(
      decidePreflight(WANTS, {
        ...READY,
        networks: { ok: true, value: { active: [], inactive: [] } },
      }),
      "network",
    );
    assert.equal(network.status, "fail");
    assert.match(network.hostHas, /no such network \(no networks at all\)/);
    assert.match(network.fix[0]!, /apt install libvirt-daemon-config-network/);
    assert.equal(network.safeFix, undefined, "installing packages is not a safe fix");
  });

  it("checks a bridge against the host's interfaces: up, down, missing", () => {
    const wants = { ...WANTS, network: { bridge: "br0" } };
    const withInterfaces = (active: string[], inactive: string[]): Finding =>
      byCheck(
        decidePreflight(wants, { ...READY, interfaces: { ok: true, value: { active, inactive } } }),
        "network",
      );
    assert.equal(withInterfaces(["eth0", "br0"], []).status, "ok");
    const down = withInterfaces(["eth0"], ["br0"]);
    assert.equal(down.status, "warn");
    assert.match(down.fix[0]!, /^ip link set br0 up/);
    const missing = withInterfaces(["eth0"], ["lo"]);
    assert.equal(missing.status, "fail");
    assert.equal(missing.input, "network.bridge");
    assert.match(missing.hostHas, /interfaces: eth0 \(active\), lo \(inactive\)/);
    assert.match(
      missing.fix.join(" "),
      /bridge_ports eth0.*or set network to \{ name: "default" \}/,
    );
  });

  it("a host whose libvirt cannot list interfaces is 'unknown', which does not fail a create", () => {
    const findings = decidePreflight(
      { ...WANTS, network: { bridge: "br0" } },
      {
        ...READY,
        interfaces: { ok: false, problem: "this function is not supported", unsupported: true },
      },
    );
    assert.equal(byCheck(findings, "network").status, "unknown");
    assert.equal(failures(findings).length, 0);
  });

  it("without KVM says that only emulation is available and how to choose it", () => {
    const domainType = byCheck(
      decidePreflight(WANTS, {
        ...READY,
        domainCaps: {
          ok: false,
          problem: "KVM is not supported by '/usr/bin/qemu-system-x86_64' on this host",
        },
        emulationCaps: { ok: true, value: caps({ domainType: "qemu" }) },
      }),
      "domain-type",
    );
    assert.equal(domainType.status, "fail");
    assert.match(
      domainType.hostHas,
      /no KVM \(KVM is not supported.*only software emulation \(domainType "qemu"\) is available/,
    );
    assert.match(domainType.fix[0]!, /^set domainType: "qemu"/);
    assert.match(domainType.fix[1]!, /modprobe kvm_intel/);
  });

  it("without KVM answers the firmware row from the emulation's capabilities, OK or FAIL with the fix", () => {
    const noKvm = {
      ok: false as const,
      problem: "KVM is not supported by '/usr/bin/qemu-system-x86_64' on this host",
    };
    const withOvmf = byCheck(
      decidePreflight(WANTS, {
        ...READY,
        domainCaps: noKvm,
        emulationCaps: { ok: true, value: caps({ domainType: "qemu" }) },
      }),
      "firmware",
    );
    assert.equal(withOvmf.status, "ok");
    assert.match(
      withOvmf.hostHas,
      /^UEFI firmware \(OVMF\); answered for software emulation \(domainType "qemu"\): this host has no KVM$/,
    );
    assert.deepEqual(withOvmf.fix, []);

    const withoutOvmf = byCheck(
      decidePreflight(WANTS, {
        ...READY,
        domainCaps: noKvm,
        emulationCaps: {
          ok: true,
          value: caps({ domainType: "qemu", efi: false, efiWithoutSecureBoot: false }),
        },
      }),
      "firmware",
    );
    assert.equal(withoutOvmf.status, "fail");
    assert.match(
      withoutOvmf.hostHas,
      /^no UEFI firmware \(OVMF\) for QEMU; answered for software emulation/,
    );
    assert.match(withoutOvmf.fix[0]!, /^apt install ovmf/);

    // A host with KVM answers from KVM's own capabilities and says nothing of emulation.
    const withKvm = byCheck(decidePreflight(WANTS, READY), "firmware");
    assert.equal(withKvm.status, "ok");
    assert.equal(withKvm.hostHas, "UEFI firmware (OVMF)");
    // Neither kind of capabilities: the host cannot tell.
    const neither = byCheck(
      decidePreflight(WANTS, { ...READY, domainCaps: noKvm, emulationCaps: noKvm }),
      "firmware",
    );
    assert.equal(neither.status, "unknown");
  });

  it("without any QEMU for x86_64 q35 asks for qemu-system-x86", () => {
    const domainType = byCheck(
      decidePreflight(WANTS, {
        ...READY,
        domainCaps: { ok: false, problem: "Cannot find suitable emulator for x86_64" },
        emulationCaps: { ok: false, problem: "Cannot find suitable emulator for x86_64" },
      }),
      "domain-type",
    );
    assert.equal(domainType.status, "fail");
    assert.match(domainType.fix[0]!, /apt install qemu-system-x86/);
  });

  it("UEFI needs OVMF and libvirt 7.2; BIOS needs neither", () => {
    const noOvmf = decidePreflight(WANTS, {
      ...READY,
      domainCaps: { ok: true, value: caps({ efi: false, efiWithoutSecureBoot: false }) },
    });
    assert.equal(byCheck(noOvmf, "firmware").status, "fail");
    assert.match(byCheck(noOvmf, "firmware").fix[0]!, /^apt install ovmf/);
    assert.equal(byCheck(noOvmf, "firmware").fix[1], 'or set firmware: "bios"');
    const secureOnly = byCheck(
      decidePreflight(WANTS, {
        ...READY,
        domainCaps: { ok: true, value: caps({ efiWithoutSecureBoot: false }) },
      }),
      "firmware",
    );
    assert.equal(secureOnly.status, "fail");
    assert.match(secureOnly.hostHas, /only Secure Boot/);

    const focal = { ...READY, libVersion: { ok: true as const, value: 6_000_000 } };
    const version = byCheck(decidePreflight(WANTS, focal), "libvirt-version");
    assert.equal(version.status, "fail");
    assert.match(version.hostHas, /^libvirt 6\.0\.0; UEFI .* needs libvirt 7\.2\.0 or newer/);
    assert.match(version.fix[0]!, /^set firmware: "bios"/);
    const bios = decidePreflight(
      { ...WANTS, firmware: "bios" },
      {
        ...focal,
        domainCaps: { ok: true, value: caps({ efi: false, efiWithoutSecureBoot: false }) },
      },
    );
    assert.deepEqual(failures(bios), []);
  });

  it("a failed look-up it cannot judge is 'unknown', never a false failure", () => {
    const findings = decidePreflight(WANTS, {
      libVersion: { ok: false, problem: "denied" },
      pools: { ok: false, problem: "denied" },
      networks: { ok: false, problem: "denied" },
      domainCaps: { ok: false, problem: "unknown procedure: 342", unsupported: true },
    });
    assert.deepEqual(
      findings.map((f) => f.status),
      ["unknown", "unknown", "unknown", "unknown", "unknown"],
    );
    assert.match(findings[0]!.hostHas, /^cannot tell \(denied\)/);
  });
});

describe("parseDomainCapabilities", () => {
  it("reads Debian's capabilities: kvm, q35, UEFI with Secure Boot optional", () => {
    assert.deepEqual(parseDomainCapabilities(DEBIAN_CAPS), {
      domainType: "kvm",
      machine: "pc-q35-7.2",
      efi: true,
      efiWithoutSecureBoot: true,
    });
  });

  it("sees no UEFI on a host without ovmf", () => {
    const summary = parseDomainCapabilities(NO_OVMF_CAPS);
    assert.equal(summary.efi, false);
    assert.equal(summary.efiWithoutSecureBoot, false);
  });

  it("falls back to loader paths on libvirt without firmware kinds", () => {
    assert.equal(parseDomainCapabilities(OLD_CAPS).efi, true);
    assert.equal(parseDomainCapabilities(OLD_CAPS.replace(/<value>[^<]*<\/value>/, "")).efi, false);
  });
});

describe("preflight gathering", () => {
  /** A host that answers the preflight's look-ups from lists, recording what it was asked. */
  function listingHost(has: {
    activePools: string[];
    inactivePools: string[];
    activeNets: string[];
    activeInterfaces?: string[];
    inactiveInterfaces?: string[];
  }) {
    const asked: string[] = [];
    const handle = (name: string) => ({ name, uuid: Buffer.alloc(16, name.length) });
    const flagName = (flags: number) =>
      flags === ListAllFlags.ACTIVE
        ? "active"
        : flags === ListAllFlags.INACTIVE
          ? "inactive"
          : "all";
    const byFlags =
      (kind: string, active: string[], inactive: string[]) => async (flags: number) => {
        asked.push(`${kind}:${flagName(flags)}`);
        const all = [...active, ...inactive];
        return (
          flags === ListAllFlags.ACTIVE ? active : flags === ListAllFlags.INACTIVE ? inactive : all
        ).map(handle);
      };
    const state = { link: {}, caps: DEBIAN_CAPS };
    const host = {
      label: "stub",
      linkIdentity: async () => state.link,
      libVersion: async () => {
        asked.push("version");
        return 9_000_000;
      },
      domainCapabilities: async () => {
        asked.push("caps");
        return state.caps;
      },
      pools: byFlags("pools", has.activePools, has.inactivePools),
      networks: byFlags("networks", has.activeNets, []),
      hostInterfaces: byFlags(
        "interfaces",
        has.activeInterfaces ?? [],
        has.inactiveInterfaces ?? [],
      ),
      pool: async (name: string) => {
        asked.push(`lookup:${name}`);
        return handle(name);
      },
    };
    return { host: host as unknown as LibvirtHost, asked, state };
  }
  const readyHost = () =>
    listingHost({ activePools: ["other", "default"], inactivePools: [], activeNets: ["default"] });

  it("on a ready host lists only active pools and networks, and hands create the pool it listed", async () => {
    const { host, asked } = readyHost();
    const { pool, remembered } = await assertHostReady(host, WANTS);
    assert.equal(pool.name, "default");
    assert.equal(remembered, false);
    assert.deepEqual(asked.sort(), ["caps", "networks:active", "pools:active", "version"]);
  });

  it("asks for the inactive ones only when the wanted one is not active, and names them", async () => {
    const { host, asked } = listingHost({
      activePools: ["other"],
      inactivePools: ["default"],
      activeNets: ["default"],
    });
    await assert.rejects(assertHostReady(host, WANTS), /pool "default": defined but not active/);
    assert.deepEqual(asked.sort(), [
      "caps",
      "networks:active",
      "pools:active",
      "pools:inactive",
      "version",
    ]);
  });

  it("asks a ready host's version and capabilities once per link, pools and networks every time", async () => {
    const { host, asked, state } = readyHost();
    await assertHostReady(host, WANTS);
    asked.length = 0;
    assert.equal((await assertHostReady(host, WANTS)).remembered, true);
    assert.deepEqual(asked.sort(), ["networks:active", "pools:active"]);
    // Another domain type is another question.
    asked.length = 0;
    await assertHostReady(host, { ...WANTS, domainType: "qemu" });
    assert.deepEqual(asked.sort(), ["caps", "networks:active", "pools:active"]);
    // A new link (libvirtd restarted, or the old one idled out) asks again.
    state.link = {};
    asked.length = 0;
    assert.equal((await assertHostReady(host, WANTS)).remembered, false);
    assert.deepEqual(asked.sort(), ["caps", "networks:active", "pools:active", "version"]);
  });

  it("trusts remembered facts only for STABLE_FACTS_MAX_AGE_MS", async () => {
    const { host, asked } = readyHost();
    const realNow = Date.now;
    try {
      await assertHostReady(host, WANTS);
      const later = realNow() + STABLE_FACTS_MAX_AGE_MS + 1;
      Date.now = () => later;
      asked.length = 0;
      assert.equal((await assertHostReady(host, WANTS)).remembered, false);
      assert.deepEqual(asked.sort(), ["caps", "networks:active", "pools:active", "version"]);
    } finally {
      Date.now = realNow;
    }
  });

  it("does not remember what an unready host said", async () => {
    const { host, asked, state } = readyHost();
    state.caps = NO_OVMF_CAPS;
    await assert.rejects(assertHostReady(host, WANTS), /no UEFI firmware/);
    state.caps = DEBIAN_CAPS;
    asked.length = 0;
    await assertHostReady(host, WANTS);
    assert.ok(asked.includes("caps"));
  });

  it("for a bridge, one listing of every interface when it exists, up or down", async () => {
    const wants = { ...WANTS, network: { bridge: "br0" } };
    const { host, asked } = listingHost({
      activePools: ["default"],
      inactivePools: [],
      activeNets: [],
      activeInterfaces: ["eth0"],
      inactiveInterfaces: ["br0"],
    });
    await assertHostReady(host, wants);
    assert.deepEqual(asked.sort(), ["caps", "interfaces:all", "pools:active", "version"]);
  });

  it("for a missing bridge, also asks which interfaces are up, and names them", async () => {
    const wants = { ...WANTS, network: { bridge: "br0" } };
    const { host } = listingHost({
      activePools: ["default"],
      inactivePools: [],
      activeNets: [],
      activeInterfaces: ["eth0"],
      inactiveInterfaces: ["lo"],
    });
    await assert.rejects(
      assertHostReady(host, wants),
      /network.bridge "br0": no such interface \(interfaces: eth0 \(active\), lo \(inactive\)\)/,
    );
  });

  it("after a create failed on remembered facts, names what the host no longer has", async () => {
    const { host, state } = readyHost();
    await assertHostReady(host, WANTS);
    state.caps = NO_OVMF_CAPS;
    const original = new PermanentError("libvirt: Unable to find any firmware to satisfy 'efi'");
    const explained = (await recheckAfterFailure(host, WANTS, original)) as Error;
    assert.ok(explained instanceof PermanentError);
    assert.match(explained.message, /Unable to find any firmware/);
    assert.match(
      explained.message,
      /host stub is no longer ready for this VM:\n- firmware "uefi": no UEFI firmware/,
    );
    // A recorded partial create stays one, with the same record.
    const partial = new PartialCreateError("hosts/stub/domains/vm", { vmName: "vm" }, original);
    const kept = await recheckAfterFailure(host, WANTS, partial);
    assert.ok(kept instanceof PartialCreateError);
    assert.deepEqual(kept.properties, partial.properties);
    assert.match(kept.message, /no longer ready/);
  });

  it("after a create failed on a host that is still ready, returns the error unchanged", async () => {
    const { host } = readyHost();
    const original = new Error("something else");
    assert.equal(await recheckAfterFailure(host, WANTS, original), original);
  });
});
