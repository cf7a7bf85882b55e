import assert from "node:assert/strict";
import { ListAllFlags, Procedures, XdrReader, XdrWriter } from "../../../provider/libvirt-rpc-xdr";

/** Encodes a procedure's arguments as they go on the wire. */
function wire<Args>(procedure: { encodeArgs(w: XdrWriter, a: Args): void }, args: Args): string {
  const writer = new XdrWriter();
  procedure.encodeArgs(writer, args);
  return writer.finish().toString("hex");
}

const u32 = (n: number) => n.toString(16).padStart(8, "0");
const str = (s: string) =>
  u32(s.length) + Buffer.from(s).toString("hex") + "00".repeat((4 - (s.length % 4)) % 4);

describe("preflight procedures on the wire (remote_protocol.x)", () => {
  it("numbers them as remote_protocol.x does", () => {
    assert.deepEqual(
      [
        Procedures.networkCreate,
        Procedures.networkLookupByName,
        Procedures.networkSetAutostart,
        Procedures.storagePoolDefineXml,
        Procedures.storagePoolCreate,
        Procedures.storagePoolBuild,
        Procedures.storagePoolSetAutostart,
        Procedures.networkIsActive,
        Procedures.storagePoolIsActive,
        Procedures.connectGetLibVersion,
        Procedures.connectListAllStoragePools,
        Procedures.connectListAllNetworks,
        Procedures.connectListAllInterfaces,
        Procedures.connectGetDomainCapabilities,
      ].map((p) => p.number),
      [39, 46, 48, 77, 78, 79, 90, 152, 154, 157, 281, 283, 284, 342],
    );
  });

  it("sends domain capabilities' four optional strings then flags", () => {
    assert.equal(
      wire(Procedures.connectGetDomainCapabilities, {
        emulatorbin: null,
        arch: "x86_64",
        machine: "q35",
        virttype: "kvm",
        flags: 0,
      }),
      u32(0) + u32(1) + str("x86_64") + u32(1) + str("q35") + u32(1) + str("kvm") + u32(0),
    );
  });

  it("asks list-all calls for results with the filter flags, and reads the list and count back", () => {
    assert.equal(
      wire(Procedures.connectListAllStoragePools, { needResults: 1, flags: ListAllFlags.ACTIVE }),
      u32(1) + u32(2),
    );
    const uuid = "ab".repeat(16);
    const reply = Buffer.from(u32(1) + str("default") + uuid + u32(1), "hex");
    const pools = Procedures.connectListAllStoragePools.decodeRet(new XdrReader(reply));
    assert.deepEqual(pools.pools, [{ name: "default", uuid: Buffer.from(uuid, "hex") }]);
    const ifaces = Procedures.connectListAllInterfaces.decodeRet(
      new XdrReader(Buffer.from(u32(1) + str("br0") + str("52:54:00:00:00:01") + u32(1), "hex")),
    );
    assert.deepEqual(ifaces.ifaces, [{ name: "br0", mac: "52:54:00:00:00:01" }]);
  });

  it("sends autostart as an int after the handle", () => {
    const pool = { name: "default", uuid: Buffer.alloc(16, 1) };
    assert.equal(
      wire(Procedures.storagePoolSetAutostart, { pool, autostart: 1 }),
      str("default") + "01".repeat(16) + u32(1),
    );
  });
});
