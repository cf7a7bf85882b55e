/**
 * The network-config a proxy that takes IPv6 boots with, as Debian 12's
 * cloud-init reads it from the seed (NoCloud) and renders it for ifupdown:
 * SLAAC must come out as `inet6 auto` (router advertisements accepted), a
 * static address as `inet6 static` with its gateway, and the NIC named by
 * its MAC.
 */
import { strict as assert } from "node:assert";
import { guestNetworkConfig } from "../../provider/common/ip-families";
import { readSeedWithCloudInit, renderNetworkWithCloudInit } from "../support/cloud-init";

const MAC = "52:54:00:0a:0b:0c";

/** The stanzas of an interfaces file, blank lines and comments dropped, options indented. */
const stanzas = (text: string): string[] =>
  text
    .split("\n")
    .map((line) => line.trimEnd())
    .filter((line) => line !== "" && !line.startsWith("#"));

describe("network-config for IPv6 (cloud-init's own parser and ENI renderer)", () => {
  it("reaches cloud-init byte for byte on the seed", () => {
    const networkConfig = guestNetworkConfig(MAC, { ipFamilies: ["ipv4", "ipv6"] })!;
    const view = readSeedWithCloudInit({ vmName: "dual-a", networkConfig });
    assert.equal(view.files.get("network-config")?.toString("utf8"), networkConfig);
  });

  it("dual stack with SLAAC: DHCPv4 and inet6 auto on the NIC with our MAC", () => {
    const rendered = renderNetworkWithCloudInit(
      guestNetworkConfig(MAC, { ipFamilies: ["ipv4", "ipv6"] })!,
    );
    assert.deepEqual(stanzas(rendered.interfaces), [
      "auto lo",
      "iface lo inet loopback",
      "auto eth0",
      "iface eth0 inet dhcp",
      "iface eth0 inet6 auto",
    ]);
    assert.match(rendered.udevRules ?? "", new RegExp(`ATTR\\{address\\}=="${MAC}", NAME="eth0"`));
    assert.deepEqual(
      rendered.state[0].subnets.map((subnet) => subnet.type),
      ["dhcp4", "ipv6_slaac"],
    );
  });

  it("IPv6 only, static: no DHCPv4, the address, gateway and name servers", () => {
    const rendered = renderNetworkWithCloudInit(
      guestNetworkConfig(MAC, {
        ipFamilies: ["ipv6"],
        ipv6: {
          mode: "static",
          address: "2001:db8:10::5/64",
          gateway: "2001:db8:10::1",
          nameservers: ["2001:db8::53"],
        },
      })!,
    );
    assert.deepEqual(stanzas(rendered.interfaces), [
      "auto lo",
      "iface lo inet loopback",
      "auto eth0",
      "iface eth0 inet6 static",
      "    address 2001:db8:10::5/64",
      "    dns-nameservers 2001:db8::53",
      "    gateway 2001:db8:10::1",
    ]);
  });

  it("writes nothing for an IPv4-only proxy (cloud-init's DHCPv4 fallback, as before)", () => {
    assert.equal(guestNetworkConfig(MAC, {}), undefined);
    assert.equal(guestNetworkConfig(MAC, { ipFamilies: ["ipv4"] }), undefined);
  });
});
