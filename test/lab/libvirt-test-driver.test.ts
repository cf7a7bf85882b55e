/**
 * libvirt's test driver (test:///default), reached through the lab's libvirtd,
 * answers some procedures with canned data the qemu driver cannot give
 * without a booted guest: interface addresses, a guest hostname, a network.
 * It round-trips those decoders against the real daemon.
 */
import assert from "node:assert/strict";
import {
  ErrorCode,
  InterfaceAddressSource,
  IpAddressType,
  LibvirtError,
  Procedures,
  type LibvirtConnection,
} from "../../provider/libvirt-rpc-xdr";
import { openLocalLibvirt } from "../../provider/ssh/local";
import { useLab } from "./fixture";
import { rejectionOf } from "./helpers";
import { openLabSsh } from "./ssh-helpers";

describe("libvirt client against the test driver through the lab's libvirtd", function () {
  this.timeout(60_000);
  let local: LibvirtConnection;
  let viaSsh: LibvirtConnection;

  before(async function () {
    this.timeout(180_000);
    const lab = await useLab();
    local = await openLocalLibvirt({ socketPath: lab.libvirtSocket, uri: "test:///default" });
    viaSsh = await openLabSsh(lab, { uri: "test:///default" });
  });
  after(async () => {
    await local?.close();
    await viaSsh?.close();
  });

  for (const [label, conn] of [
    ["local", () => local],
    ["ssh", () => viaSsh],
  ] as const) {
    it(`decodes interface addresses, a guest hostname and a network (${label})`, async () => {
      const dom = await conn().call(Procedures.domainLookupByName, { name: "test" });
      const ifaces = await conn().call(Procedures.domainInterfaceAddresses, {
        dom,
        source: InterfaceAddressSource.AGENT,
        flags: 0,
      });
      assert.equal(ifaces.length, 1);
      assert.match(ifaces[0]!.hwaddr ?? "", /^([0-9a-f]{2}:){5}[0-9a-f]{2}$/);
      assert.equal(ifaces[0]!.addrs[0]!.type, IpAddressType.IPV4);
      assert.match(ifaces[0]!.addrs[0]!.addr, /^\d+\.\d+\.\d+\.\d+$/);
      assert.equal(ifaces[0]!.addrs[0]!.prefix, 24);

      assert.equal(await conn().call(Procedures.domainGetHostname, { dom, flags: 0 }), "testhost");

      const net = await conn().call(Procedures.networkLookupByName, { name: "default" });
      assert.equal(net.name, "default");
      assert.equal(net.uuid.length, 16);
      const unsupported = await rejectionOf(
        conn().call(Procedures.networkGetDhcpLeases, { net, mac: null, needResults: 1, flags: 0 }),
      );
      assert.ok(unsupported instanceof LibvirtError);
      assert.equal(unsupported.code, ErrorCode.NO_SUPPORT);
      // The daemon names the API it dispatched to, which proves the procedure number.
      assert.match(unsupported.libvirtMessage, /virNetworkGetDHCPLeases/);
      const agent = await rejectionOf(
        conn().call(Procedures.qemuDomainAgentCommand, {
          dom,
          cmd: '{"execute":"guest-ping"}',
          timeout: 5,
          flags: 0,
        }),
      );
      assert.ok(agent instanceof LibvirtError);
      assert.equal(agent.code, ErrorCode.NO_SUPPORT);
      assert.match(agent.libvirtMessage, /virDomainQemuAgentCommand/);
    });
  }
});
