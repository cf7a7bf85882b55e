/** Dual stack's pure pieces: the inputs' checks, the IPv6 address picked, the look-up, and the egress check per family. */
import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { Deadline } from "../../provider/common/deadline";
import { egressAtReadiness, egressCheckProblems } from "../../provider/common/egress";
import {
  eui64InterfaceId,
  isRoutableIpv6,
  pickIpv6,
  proxyEndpoint,
} from "../../provider/common/ip-families";
import { lookUpAddress, refreshedAddresses } from "../../provider/kvm/addresses";
import { validateKvmInputs } from "../../provider/kvm/schema";
import { ipv6Output, seedInputOf } from "../../provider/kvm/steps";
import {
  startEchoServer,
  startForwardProxy,
  type ForwardProxy,
  type RunningServer,
} from "../support/forward-proxy";

const MAC = "52:54:00:0a:0b:0c";
const SLAAC = "2001:db8:1:0:5054:ff:fe0a:b0c";

describe("ipFamilies and ipv6 inputs", () => {
  const base = {
    owner: { project: "p", stack: "s", resource: "r" },
    vmName: "vm-1",
    image: { url: "https://images.example/debian.qcow2" },
  };
  const problems = (extra: Record<string, unknown>): string => {
    const result = validateKvmInputs({ ...base, ...extra });
    assert.equal(result.ok, false, JSON.stringify(extra));
    return JSON.stringify(result);
  };

  it("accepts the three family lists and both IPv6 modes", () => {
    for (const ipFamilies of [["ipv4"], ["ipv4", "ipv6"], ["ipv6"]])
      assert.equal(validateKvmInputs({ ...base, ipFamilies }).ok, true, String(ipFamilies));
    const staticV6 = { mode: "static", address: "2001:db8::5/64", gateway: "2001:db8::1" };
    assert.equal(validateKvmInputs({ ...base, ipFamilies: ["ipv6"], ipv6: staticV6 }).ok, true);
  });

  it(`checks ["ipv4"] as unset: writing the default out replaces no VM`, () => {
    const written = validateKvmInputs({ ...base, ipFamilies: ["ipv4"] });
    assert.ok(written.ok);
    assert.ok(!("ipFamilies" in written.inputs) || written.inputs.ipFamilies === undefined);
  });

  it("names the field and the fix", () => {
    assert.match(problems({ ipFamilies: [] }), /ipFamilies must name at least one family/);
    assert.match(problems({ ipFamilies: ["ipv4", "ipv4"] }), /names a family twice/);
    assert.match(problems({ ipFamilies: ["inet6"] }), /entries must be \\"ipv4\\" or \\"ipv6\\"/);
    assert.match(
      problems({ ipv6: { mode: "slaac" } }),
      /ipv6 is set but ipFamilies does not include/,
    );
    assert.match(
      problems({ ipFamilies: ["ipv6"], ipv6: { mode: "static", address: "10.0.0.5/24" } }),
      /ipv6\.address must be an IPv6 address with its prefix length/,
    );
    assert.match(
      problems({ ipFamilies: ["ipv6"], ipv6: { mode: "dhcp6" } }),
      /ipv6 must be \{ mode: \\"slaac\\" \}/,
    );
    assert.match(
      problems({ ipFamilies: ["ipv4", "ipv6"], networkConfig: "version: 2" }),
      /networkConfig is your own network-config, but ipFamilies asks the provider to write one/,
    );
  });

  it("puts the network-config on an IPv6 proxy's seed only, and ipv6Address in its outputs only", () => {
    const dual = validateKvmInputs({ ...base, ipFamilies: ["ipv4", "ipv6"] });
    const plain = validateKvmInputs(base);
    assert.ok(dual.ok && plain.ok);
    const seedOf = (inputs: object) =>
      seedInputOf({ ...(inputs as Record<string, unknown>), vmName: "vm-1" } as never);
    assert.match(String(seedOf(dual.inputs).networkConfig), /type: ipv6_slaac/);
    assert.equal(seedOf(plain.inputs).networkConfig, undefined);
    assert.deepEqual(ipv6Output(dual.inputs, { ipv6: SLAAC }), { ipv6Address: SLAAC });
    assert.equal(ipv6Output(plain.inputs, { ipv6: SLAAC }), undefined);
  });

  it("egressCheck.ipv6Url must be an IPv6 literal URL", () => {
    const names = { url: "egressCheck.url", field: "egressCheck.field" };
    assert.deepEqual(
      egressCheckProblems(
        { url: "http://192.0.2.7/", ipv6Url: "http://[2001:db8::7]:8080/ip" } as never,
        names,
      ),
      [],
    );
    assert.match(
      egressCheckProblems(
        { url: "http://192.0.2.7/", ipv6Url: "http://echo.example/" } as never,
        names,
      ).join(),
      /ipv6Url must be an http:\/\/ URL whose host is an IPv6 literal in brackets/,
    );
  });
});

describe("the VM's IPv6 address", () => {
  it("counts global and unique-local addresses, never loopback, link-local, multicast or mapped IPv4", () => {
    assert.deepEqual(
      [
        "2001:db8::1",
        "fd12:3456::1",
        "::1",
        "::",
        "fe80::1",
        "ff02::1",
        "::ffff:192.0.2.1",
        "10.0.0.1",
      ].map(isRoutableIpv6),
      [true, true, false, false, false, false, false, false],
    );
  });

  it("prefers the static address, then the SLAAC address of the MAC over privacy addresses", () => {
    assert.equal(eui64InterfaceId(MAC).toString("hex"), "505400fffe0a0b0c");
    const reported = ["fe80::5054:ff:fe0a:b0c", "2001:db8:1::9a3f:1c2d:77e1:4410", SLAAC];
    assert.equal(pickIpv6(reported, MAC), SLAAC);
    assert.equal(
      pickIpv6(["2001:db8:1::9a3f:1c2d:77e1:4410"], MAC),
      "2001:db8:1::9a3f:1c2d:77e1:4410",
    );
    assert.equal(
      pickIpv6([...reported, "2001:DB8:2::5"], MAC, {
        mode: "static",
        address: "2001:db8:2:0::5/64",
      }),
      "2001:db8:2::5",
    );
    assert.equal(pickIpv6(["fe80::1"], MAC), undefined);
    assert.equal(proxyEndpoint(SLAAC, 3128), `http://[${SLAAC}]:3128`);
    assert.equal(proxyEndpoint("192.0.2.1", 3128), "http://192.0.2.1:3128");
  });

  it("looks on past a source with IPv4 only until the IPv6 address is found; IPv6-only is reached at it", async () => {
    const asked: string[] = [];
    const both = await lookUpAddress(
      MAC,
      async (source) => {
        asked.push(source);
        if (source === "agent")
          return [
            {
              name: "eth0",
              hwaddr: MAC,
              addrs: [
                { type: "ipv4", addr: "192.0.2.5", prefix: 24 },
                { type: "ipv6", addr: SLAAC, prefix: 64 },
              ],
            },
          ];
        throw new Error("not asked");
      },
      { ipv4: true, ipv6: true },
    );
    assert.deepEqual(both, { ip: "192.0.2.5", ipv6: SLAAC, source: "agent", failures: [] });
    assert.deepEqual(asked, ["agent"]);
    const v4Only = await lookUpAddress(
      MAC,
      async () => [
        { name: "eth0", hwaddr: MAC, addrs: [{ type: "ipv4", addr: "192.0.2.5", prefix: 24 }] },
      ],
      { ipv4: true, ipv6: true },
    );
    assert.equal(v4Only.ipv6, undefined, "SLAAC not done yet: the caller waits");
    const v6Only = await lookUpAddress(
      MAC,
      async () => [
        { name: "eth0", hwaddr: MAC, addrs: [{ type: "ipv6", addr: SLAAC, prefix: 64 }] },
      ],
      { ipv4: false, ipv6: true },
    );
    assert.equal(v6Only.ip, SLAAC);
  });
});

describe("the egress check over each family (loopback proxies)", () => {
  let echo4: RunningServer;
  let echo6: RunningServer;
  let proxy4: ForwardProxy;
  let proxy6: ForwardProxy;

  before(async () => {
    echo4 = await startEchoServer("127.0.0.1");
    echo6 = await startEchoServer("::1");
    proxy4 = await startForwardProxy({ host: "127.0.0.2", egressAddress: "127.0.0.3" });
    // One squid answers on both families: the same port on the IPv6 address.
    proxy6 = await startForwardProxy({ host: "::1", port: proxy4.port, egressAddress: "::1" });
  });
  after(async () => {
    await proxy6?.close();
    await proxy4?.close();
    await echo6?.close();
    await echo4?.close();
  });

  const inputs = () => ({
    readiness: { mode: "port", port: proxy4.port },
    egressCheck: { url: `http://127.0.0.1:${echo4.port}/`, ipv6Url: `http://[::1]:${echo6.port}/` },
  });

  it("fetches the IPv4 URL through the IPv4 address and the IPv6 URL through the IPv6 address", async () => {
    const served = [proxy4.served, proxy6.served];
    const finding = await egressAtReadiness(
      "127.0.0.2",
      inputs(),
      Deadline.afterSeconds(20, "t"),
      "::1",
    );
    assert.equal(finding.egressIp, "127.0.0.3");
    assert.equal(finding.egressIpv6, "::1");
    assert.deepEqual([proxy4.served - served[0], proxy6.served - served[1]], [1, 1]);
  });

  it("leaves egressIpv6 out for an IPv4-only proxy, and null for one without ipv6Url", async () => {
    const v4 = await egressAtReadiness("127.0.0.2", inputs(), Deadline.afterSeconds(20, "t"));
    assert.ok(!("egressIpv6" in v4));
    const check = { ...inputs(), egressCheck: { url: inputs().egressCheck.url } };
    const noUrl = await egressAtReadiness(
      "127.0.0.2",
      check,
      Deadline.afterSeconds(20, "t"),
      "::1",
    );
    assert.equal(noUrl.egressIpv6, null);
  });

  it("refuses an IPv6 check whose answer is an IPv4 address", async () => {
    // An echo service on [::1] that answers with an IPv4 address, as one behind a NAT64 would.
    const liar = createServer((_request, response) => response.end("192.0.2.9\n"));
    await new Promise<void>((resolve) => liar.listen(0, "::1", resolve));
    const port = (liar.address() as AddressInfo).port;
    try {
      const check = {
        ...inputs(),
        egressCheck: { ...inputs().egressCheck, ipv6Url: `http://[::1]:${port}/` },
      };
      await assert.rejects(
        egressAtReadiness("127.0.0.2", check, Deadline.afterSeconds(20, "t"), "::1"),
        /the answer 192\.0\.2\.9 is not an IPv6 address; egressCheck\.ipv6Url must reach the echo service over IPv6 only/,
      );
    } finally {
      await new Promise((resolve) => liar.close(resolve));
    }
  });
});

describe("KvmProxy refresh: the addresses looked up again (kvm/addresses.ts refreshedAddresses)", () => {
  const wanted = { ipv4: true, ipv6: true };
  const known = { ip: "192.0.2.5", ipv6Address: SLAAC };
  const nic = (...addrs: Array<[type: "ipv4" | "ipv6", addr: string]>) => [
    {
      name: "eth0",
      hwaddr: MAC,
      addrs: addrs.map(([type, addr]) => ({ type, addr, prefix: type === "ipv4" ? 24 : 64 })),
    },
  ];
  const MOVED = "2001:db8:2:0:5054:ff:fe0a:b0c";

  it("reports the IPv6 address the agent reports now, not the one state holds", async () => {
    const found = await refreshedAddresses(
      "running",
      MAC,
      async () => nic(["ipv4", "192.0.2.5"], ["ipv6", MOVED]),
      known,
      wanted,
    );
    assert.deepEqual(found, { ip: "192.0.2.5", ipv6: MOVED });
  });

  it("an agent that answers without an IPv6 address: lost (null); one that fails: kept", async () => {
    const lost = await refreshedAddresses(
      "running",
      MAC,
      async (source) => (source === "agent" ? nic(["ipv4", "192.0.2.5"]) : []),
      known,
      wanted,
    );
    assert.deepEqual(lost, { ip: "192.0.2.5", ipv6: null });
    const silent = await refreshedAddresses(
      "running",
      MAC,
      async (source) => {
        if (source === "agent") throw new Error("guest agent is not connected");
        return source === "lease" ? nic(["ipv4", "192.0.2.5"]) : [];
      },
      known,
      wanted,
    );
    assert.deepEqual(silent, { ip: "192.0.2.5", ipv6: SLAAC });
  });

  it("a stopped VM has no address; a paused one keeps what state holds, unasked", async () => {
    const never = async (): Promise<never> => assert.fail("not asked");
    assert.deepEqual(await refreshedAddresses("stopped", MAC, never, known, wanted), {
      ip: null,
      ipv6: null,
    });
    assert.deepEqual(await refreshedAddresses("paused", MAC, never, known, wanted), {
      ip: "192.0.2.5",
      ipv6: SLAAC,
    });
  });
});
