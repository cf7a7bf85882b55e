/**
 * CONNECT_GET_ALL_DOMAIN_STATS (344) through our codec: the typed-parameter
 * union in both directions, a reply as the daemon builds it, and the
 * discriminants it must refuse. Layouts against remote_protocol.x are checked
 * in protocol-source.test.ts; here, the values.
 */
import assert from "node:assert/strict";
import {
  DomainStatsTypes,
  Procedures,
  RemoteTypes,
  TypedParamType,
  XdrError,
  XdrReader,
  XdrWriter,
} from "../../../provider/libvirt-rpc-xdr";

const uuid = Buffer.alloc(16, 7);

/** A reply written word by word, as libvirtd's XDR encoder lays it out. */
function replyFromDaemon(): Buffer {
  const w = new XdrWriter();
  w.uint(1); // one record
  w.string("edge-a").fixedOpaque(uuid, 16).int(-1); // remote_nonnull_domain
  w.uint(4); // four params
  w.string("state.state").int(TypedParamType.INT).int(3);
  w.string("state.reason").int(TypedParamType.INT).int(1);
  w.string("cpu.time")
    .int(TypedParamType.ULLONG)
    .uhyper(2n ** 40n);
  w.string("note").int(TypedParamType.STRING).string("paused by hand");
  return w.finish();
}

describe("libvirt connectGetAllDomainStats codec", () => {
  it("encodes every domain (none named), the STATE group and the flags", () => {
    const w = new XdrWriter();
    Procedures.connectGetAllDomainStats.encodeArgs(w, {
      doms: [],
      stats: DomainStatsTypes.STATE,
      flags: 0,
    });
    assert.equal(w.finish().toString("hex"), "00000000" + "00000001" + "00000000");
  });

  it("decodes a record's domain handle and typed parameters of several types", () => {
    const reader = new XdrReader(replyFromDaemon());
    const records = Procedures.connectGetAllDomainStats.decodeRet(reader);
    reader.expectEnd("connectGetAllDomainStats");
    assert.equal(records.length, 1);
    assert.equal(records[0]!.dom.name, "edge-a");
    assert.deepEqual(records[0]!.dom.uuid, uuid);
    assert.deepEqual(
      records[0]!.params.map((param) => [param.field, param.value.type, param.value.value]),
      [
        ["state.state", TypedParamType.INT, 3],
        ["state.reason", TypedParamType.INT, 1],
        ["cpu.time", TypedParamType.ULLONG, 2n ** 40n],
        ["note", TypedParamType.STRING, "paused by hand"],
      ],
    );
  });

  it("round-trips every arm of the typed-parameter union, doubles included", () => {
    const values = [
      { type: TypedParamType.INT, value: -5 },
      { type: TypedParamType.UINT, value: 4_000_000_000 },
      { type: TypedParamType.LLONG, value: -(2n ** 40n) },
      { type: TypedParamType.ULLONG, value: 2n ** 63n },
      { type: TypedParamType.DOUBLE, value: 0.25 },
      { type: TypedParamType.BOOLEAN, value: 1 },
      { type: TypedParamType.STRING, value: "é" },
    ];
    for (const value of values) {
      const w = new XdrWriter();
      RemoteTypes.typedParam.write(w, { field: "f", value });
      const reader = new XdrReader(w.finish());
      assert.deepEqual(RemoteTypes.typedParam.read(reader).value, value);
      reader.expectEnd(`typed param ${value.type}`);
    }
  });

  it("refuses a discriminant with no arm rather than guessing the value's size", () => {
    const w = new XdrWriter();
    w.string("state.state").int(99).int(1);
    assert.throws(
      () => RemoteTypes.typedParam.read(new XdrReader(w.finish())),
      (error: unknown) =>
        error instanceof XdrError && /no arm for discriminant 99/.test(error.message),
    );
  });
});
