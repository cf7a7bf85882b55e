import assert from "node:assert/strict";
import fc from "fast-check";
import {
  Limits,
  Procedures,
  XdrError,
  XdrReader,
  XdrWriter,
  readRemoteError,
  toSafeNumber,
  writeRemoteError,
  type RemoteErrorFields,
} from "../../../provider/libvirt-rpc-xdr";

const hex = (b: Buffer) => b.toString("hex");

describe("XDR codec", () => {
  it("writes big-endian words, padded strings and optional markers exactly as the wire expects", () => {
    const bytes = new XdrWriter()
      .int(-2)
      .uint(0xdeadbeef)
      .hyper(-1n)
      .uhyper(2n ** 40n)
      .string("abcde")
      .optional("x", (w, s) => w.string(s))
      .optional(null, (w, s: string) => w.string(s))
      .fixedOpaque(Buffer.from([1, 2, 3]), 3)
      .finish();
    assert.equal(
      hex(bytes),
      "fffffffe" +
        "deadbeef" +
        "ffffffffffffffff" +
        "0000010000000000" +
        "00000005" +
        "6162636465000000" +
        "00000001" +
        "00000001" +
        "78000000" +
        "00000000" +
        "01020300",
    );
  });

  it("round-trips any mix of values (property)", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: -(2 ** 31), max: 2 ** 31 - 1 }),
        fc.integer({ min: 0, max: 2 ** 32 - 1 }),
        fc.bigInt({ min: -(2n ** 63n), max: 2n ** 63n - 1n }),
        fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }),
        fc.string({ unit: "grapheme", maxLength: 40 }),
        fc.uint8Array({ maxLength: 37 }),
        fc.option(fc.string({ maxLength: 9 }), { nil: null }),
        fc.array(fc.integer({ min: -5, max: 5 }), { maxLength: 12 }),
        (i, u, h, uh, s, bytes, opt, list) => {
          const buffer = new XdrWriter(4)
            .int(i)
            .uint(u)
            .hyper(h)
            .uhyper(uh)
            .string(s)
            .opaque(bytes)
            .optional(opt, (w, v) => w.string(v))
            .array(list, 100, (w, v) => w.int(v))
            .finish();
          assert.equal(buffer.length % 4, 0);
          const r = new XdrReader(Buffer.from(buffer));
          assert.equal(r.int(), i);
          assert.equal(r.uint(), u);
          assert.equal(r.hyper(), h);
          assert.equal(r.uhyper(), uh);
          assert.equal(r.string(), s);
          assert.deepEqual([...r.opaque()], [...bytes]);
          assert.equal(
            r.optional((x) => x.string()),
            opt,
          );
          assert.deepEqual(
            r.array(100, (x) => x.int()),
            list,
          );
          r.expectEnd("mix");
        },
      ),
    );
  });

  it("refuses values out of range and data that is short, oversized or lying about its length", () => {
    assert.throws(() => new XdrWriter().int(2 ** 31), XdrError);
    assert.throws(() => new XdrWriter().uint(-1), XdrError);
    assert.throws(() => new XdrWriter().uhyper(-1n), XdrError);
    assert.throws(() => new XdrWriter().string("toolong", 3), /exceeds its limit of 3/);
    assert.throws(() => new XdrWriter().array([1, 2], 1, (w, v) => w.int(v)), XdrError);
    assert.throws(() => new XdrReader(Buffer.from("000000", "hex")).int(), /truncated/);
    assert.throws(
      () => new XdrReader(Buffer.from("00000010" + "41".repeat(4), "hex")).string(),
      /truncated/,
    );
    assert.throws(
      () => new XdrReader(Buffer.from("00000005", "hex")).string(4),
      /exceeds its limit of 4/,
    );
    assert.throws(
      () => new XdrReader(Buffer.from("7fffffff", "hex")).array(2 ** 31, (r) => r.int()),
      /claims/,
    );
    assert.throws(
      () => new XdrReader(Buffer.from("00000002", "hex")).optional((r) => r.int()),
      /0 or 1/,
    );
    assert.throws(() => new XdrReader(Buffer.from("0000000100", "hex")).expectEnd("x"), /trailing/);
    assert.throws(() => toSafeNumber(2n ** 60n, "capacity"), /capacity/);
    assert.equal(toSafeNumber(2n ** 40n), 2 ** 40);
  });

  it("encodes CONNECT_OPEN's arguments as libvirt's own client does", () => {
    const writer = new XdrWriter();
    Procedures.connectOpen.encodeArgs(writer, { name: "qemu:///system", flags: 0 });
    assert.equal(
      hex(writer.finish()),
      "00000001" + "0000000e" + Buffer.from("qemu:///system").toString("hex") + "0000" + "00000000",
    );
  });

  it("reads char and unsigned char fields as 4 bytes (pool and volume info)", () => {
    const body = new XdrWriter().uint(2).uhyper(100n).uhyper(40n).uhyper(60n).finish();
    const r = new XdrReader(Buffer.from(body));
    assert.deepEqual(Procedures.storagePoolGetInfo.decodeRet(r), {
      state: 2,
      capacity: 100n,
      allocation: 40n,
      available: 60n,
    });
    r.expectEnd("pool info");
    const vol = new XdrReader(Buffer.from(new XdrWriter().int(0).uhyper(5n).uhyper(1n).finish()));
    assert.deepEqual(Procedures.storageVolGetInfo.decodeRet(vol), {
      type: 0,
      capacity: 5n,
      allocation: 1n,
    });
  });

  it("decodes all 11 fields of remote_error, including the optional domain and network", () => {
    const uuid = Buffer.alloc(16, 0xab);
    const error: RemoteErrorFields = {
      code: 42,
      domain: 10,
      message: "Domain not found",
      level: 2,
      dom: { name: "vm1", uuid, id: -1 },
      str1: "a",
      str2: null,
      str3: "c",
      int1: 7,
      int2: -3,
      net: { name: "default", uuid },
    };
    const writer = new XdrWriter();
    writeRemoteError(writer, error);
    const reader = new XdrReader(Buffer.from(writer.finish()));
    assert.deepEqual(readRemoteError(reader), error);
    reader.expectEnd("remote_error");
  });

  it("decodes interface addresses with nested arrays and optional hardware addresses", () => {
    const w = new XdrWriter()
      .uint(2)
      .string("lo")
      .uint(0)
      .uint(1)
      .int(0)
      .string("127.0.0.1")
      .uint(8)
      .string("eth0")
      .uint(1)
      .string("52:54:00:00:00:01")
      .uint(2)
      .int(0)
      .string("192.0.2.10")
      .uint(24)
      .int(1)
      .string("fe80::1")
      .uint(64);
    const ifaces = Procedures.domainInterfaceAddresses.decodeRet(
      new XdrReader(Buffer.from(w.finish())),
    );
    assert.equal(ifaces.length, 2);
    assert.equal(ifaces[0]!.hwaddr, null);
    assert.equal(ifaces[1]!.hwaddr, "52:54:00:00:00:01");
    assert.deepEqual(ifaces[1]!.addrs[1], { type: 1, addr: "fe80::1", prefix: 64 });
    assert.ok(Limits.interfacesMax === 2048 && Limits.addressesMax === 2048);
  });
});
