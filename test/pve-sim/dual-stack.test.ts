/**
 * A dual-stack ProxmoxProxy against the simulator: the seed asks for IPv6,
 * net0 gets the MAC the seed names, and the address the agent reports on that
 * NIC (the simulator's SLAAC address on the bridge's /64, or the static one
 * the seed wrote) becomes `ipv6Address`. The egress check over each family is
 * tested through real loopback proxies in test/unit/ip-families.test.ts: no
 * IPv6 address but ::1 is local here, and ::1 is no address a proxy has.
 */
import assert from "node:assert/strict";
import { eui64InterfaceId, guestNetworkConfig, ipv6Bytes } from "../../provider/common/ip-families";
import * as provider from "../../provider/proxmox/provider";
import { proxmoxMacFor } from "../../provider/proxmox/vm-config";
import { checked, userInputs } from "./fixtures";
import { useSimulator } from "./harness";

describe("ProxmoxProxy dual stack (simulator)", () => {
  const env = useSimulator({ agentDelayMs: 20 });

  it("records the SLAAC address of net0, whose MAC the seed's network-config names", async () => {
    const inputs = await checked(
      userInputs(env.sim, {
        vmName: "dual-a",
        ipFamilies: ["ipv4", "ipv6"],
        readiness: { mode: "address" },
      }),
    );
    const { outs } = await provider.create(inputs);
    const mac = proxmoxMacFor("dual-a");
    assert.equal(outs.mac, mac);
    assert.match(String(outs.ip), /^192\.168\./);
    const ipv6 = ipv6Bytes(String(outs.ipv6Address));
    assert.ok(ipv6 !== undefined, `ipv6Address ${String(outs.ipv6Address)}`);
    assert.ok(ipv6.subarray(8).equals(eui64InterfaceId(mac)), "the interface id is the MAC's");
    assert.equal(ipv6.readUInt32BE(0), 0x20010db8, "from the bridge's prefix");
    const vm = env.sim.vms.get(outs.vmid as number)!;
    assert.match(vm.config.net0, new RegExp(`=${mac.toUpperCase()},`));
    const seed = env.sim.isoFile("seeds", "dual-a-seed.iso")!;
    const networkConfig = guestNetworkConfig(mac, { ipFamilies: ["ipv4", "ipv6"] })!;
    assert.ok(seed.includes(Buffer.from(networkConfig)), "the seed carries the network-config");
  });

  it("records the static address of an IPv6-only proxy as its ip and endpoint too", async () => {
    const inputs = await checked(
      userInputs(env.sim, {
        vmName: "v6only-a",
        ipFamilies: ["ipv6"],
        ipv6: { mode: "static", address: "2001:db8:77::5/64", gateway: "2001:db8:77::1" },
        readiness: { mode: "address" },
      }),
    );
    const { outs } = await provider.create(inputs);
    assert.equal(outs.ip, "2001:db8:77::5");
    assert.equal(outs.ipv6Address, "2001:db8:77::5");
    assert.equal(outs.endpoint, "http://[2001:db8:77::5]:3128");
  });

  it("leaves an IPv4-only proxy as it was: the clone's MAC, no network-config, no IPv6 outputs", async () => {
    const inputs = await checked(
      userInputs(env.sim, { vmName: "plain-a", readiness: { mode: "address" } }),
    );
    const { outs } = await provider.create(inputs);
    assert.ok(!("ipv6Address" in outs) && !("egressIpv6" in outs), Object.keys(outs).join());
    assert.notEqual(outs.mac, proxmoxMacFor("plain-a"));
    const seed = env.sim.isoFile("seeds", "plain-a-seed.iso")!;
    assert.ok(!seed.includes(Buffer.from("network-config")), "no network-config on the seed");
  });

  it("reports schema errors naming the field and the fix", async () => {
    const result = await provider.check(
      {},
      userInputs(env.sim, {
        ipFamilies: ["ipv6"],
        ipv6: { mode: "static", address: "2001:db8::5" },
      }),
    );
    const reasons = result.failures.map((failure) => `${failure.property}: ${failure.reason}`);
    assert.ok(
      reasons.some((reason) => /^ipv6\.address: .*prefix length, e\.g\./.test(reason)),
      reasons.join("\n"),
    );
    const mismatch = await provider.check({}, userInputs(env.sim, { ipv6: { mode: "slaac" } }));
    assert.match(
      mismatch.failures.map((failure) => failure.reason).join("\n"),
      /ipv6 is set but ipFamilies does not include "ipv6"; write ipFamilies: \["ipv4", "ipv6"\]/,
    );
  });
});
