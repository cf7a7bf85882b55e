/**
 * protocol.ts against its source: every procedure number, program constant,
 * message type/status and struct layout we encode or decode is compared with
 * libvirt's own `.x` files (copies in test/data/libvirt/, libvirt 9.6.0, same
 * procedures as the lab's 9.0.0). The layouts compared are the ones the codec
 * runs from (`argsLayout`/`retLayout`/`RemoteTypes`), and every procedure's
 * arguments are also encoded by our codec and by a codec driven by the parsed
 * `.x`, byte for byte.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { resolve } from "node:path";
import {
  AuthType,
  KEEPALIVE_PROGRAM,
  KEEPALIVE_PROTOCOL_VERSION,
  KeepaliveProcedure,
  Limits,
  MessageStatus,
  MessageType,
  Procedures,
  QEMU_PROGRAM,
  QEMU_PROTOCOL_VERSION,
  REMOTE_PROGRAM,
  REMOTE_PROTOCOL_VERSION,
  RemoteTypes,
  XdrReader,
  XdrWriter,
  type Procedure,
} from "../../../provider/libvirt-rpc-xdr";
import * as t from "../../../provider/libvirt-rpc-xdr/xdr-types";
import { describeLayout, type XdrLayout } from "../../../provider/libvirt-rpc-xdr/xdr-types";
import { constant, emptySpec, parseXdr, structLayout, type XdrSpec } from "./xdr-language";

const DATA = resolve(__dirname, "..", "..", "..", "..", "test", "data", "libvirt");

function loadSpec(): XdrSpec {
  const spec = emptySpec();
  // libvirt.h's VIR_UUID_BUFLEN, which remote_protocol.x and virnetprotocol.x use unexpanded.
  spec.consts.set("VIR_UUID_BUFLEN", "16");
  // libvirt-common.h's virTypedParameterType, the case labels of remote_typed_param_value.
  for (const [index, name] of [
    "INT",
    "UINT",
    "LLONG",
    "ULLONG",
    "DOUBLE",
    "BOOLEAN",
    "STRING",
  ].entries())
    spec.consts.set(`VIR_TYPED_PARAM_${name}`, String(index + 1));
  for (const file of [
    "virnetprotocol.x",
    "virkeepaliveprotocol.x",
    "remote_protocol.x",
    "qemu_protocol.x",
  ]) {
    parseXdr(readFileSync(resolve(DATA, file), "utf8"), spec);
  }
  return spec;
}

type AnyProcedure = Procedure<never, unknown>;
type ProcedureTable = Record<string, AnyProcedure>;

const upperSnake = (camel: string) => t.wireName(camel).toUpperCase();

/** libvirt's names for one of our procedures: enum member and struct prefix. */
function sourceNames(procedure: AnyProcedure): { member: string; struct: string } {
  if (procedure.program === QEMU_PROGRAM) {
    const rest = upperSnake(procedure.name.replace(/^qemu/, "")).replace(/^_/, "");
    return { member: `QEMU_PROC_${rest}`, struct: `qemu_${rest.toLowerCase()}` };
  }
  const rest = upperSnake(procedure.name);
  return { member: `REMOTE_PROC_${rest}`, struct: `remote_${rest.toLowerCase()}` };
}

const unnamed = (layout: XdrLayout): XdrLayout =>
  layout.kind === "struct" ? { ...layout, name: null } : layout;

/** Every way `table` disagrees with the `.x` files; empty when it agrees. */
function checkProcedures(table: ProcedureTable, spec: XdrSpec): string[] {
  const problems: string[] = [];
  const programs = new Map([
    [REMOTE_PROGRAM, { version: REMOTE_PROTOCOL_VERSION, procedures: "remote_procedure" }],
    [QEMU_PROGRAM, { version: QEMU_PROTOCOL_VERSION, procedures: "qemu_procedure" }],
  ]);
  for (const [key, procedure] of Object.entries(table)) {
    if (procedure.name !== key) problems.push(`${key}: named "${procedure.name}"`);
    const program = programs.get(procedure.program);
    if (!program) {
      problems.push(`${key}: unknown program ${procedure.program}`);
      continue;
    }
    if (procedure.version !== program.version) {
      problems.push(`${key}: version ${procedure.version}, the program's is ${program.version}`);
    }
    const names = sourceNames(procedure);
    const number = spec.enums.get(program.procedures)?.get(names.member);
    if (number === undefined) {
      problems.push(`${key}: libvirt has no ${names.member}`);
      continue;
    }
    if (number !== procedure.number) {
      problems.push(`${key}: number ${procedure.number}, libvirt's ${names.member} is ${number}`);
    }
    for (const [part, ours] of [
      ["args", procedure.argsLayout],
      ["ret", procedure.retLayout],
    ] as const) {
      const structName = `${names.struct}_${part}`;
      const theirs = spec.structs.has(structName)
        ? describeLayout(unnamed(structLayout(spec, structName)))
        : "(none)";
      const mine = ours ? describeLayout(ours) : "(none)";
      if (mine !== theirs) problems.push(`${key} ${part}: ours ${mine}, ${structName} ${theirs}`);
    }
  }
  return problems;
}

/** `{ A: 1 }` against enum `prefix + A` = 1, both ways (nothing missing, nothing extra). */
function checkEnum(
  label: string,
  ours: Record<string, number>,
  spec: XdrSpec,
  enumName: string,
  prefix: string,
): string[] {
  const theirs = spec.enums.get(enumName);
  if (!theirs) return [`${label}: libvirt has no enum ${enumName}`];
  const mine = new Map(Object.entries(ours).map(([k, v]) => [prefix + k, v]));
  const problems: string[] = [];
  for (const [name, value] of theirs) {
    if (mine.get(name) !== value)
      problems.push(`${label}: ${name} is ${value}, ours ${mine.get(name)}`);
  }
  for (const name of mine.keys()) {
    if (!theirs.has(name)) problems.push(`${label}: libvirt has no ${name}`);
  }
  return problems;
}

// ---- a codec driven by the parsed .x, to cross-check what ours puts on the wire -----------------

const camel = (snake: string) => snake.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());

/** A deterministic value for `layout`, keyed the way our procedures take it (camelCase). */
function sampleValue(layout: XdrLayout, seed: { n: number }): unknown {
  seed.n++;
  switch (layout.kind) {
    case "int":
      return -seed.n;
    case "unsigned int":
      return seed.n;
    case "hyper":
      return -BigInt(seed.n) * 2n ** 33n;
    case "unsigned hyper":
      return BigInt(seed.n) * 2n ** 33n;
    case "double":
      return seed.n + 0.5;
    case "string":
      return `s${seed.n}-é`;
    case "fixed opaque":
      return Buffer.alloc(layout.length, seed.n);
    case "optional":
      return seed.n % 2 === 0 ? null : sampleValue(layout.of, seed);
    case "array":
      return [sampleValue(layout.of, seed), sampleValue(layout.of, seed)];
    case "struct":
      return Object.fromEntries(
        layout.fields.map((f) => [camel(f.name), sampleValue(f.layout, seed)]),
      );
    case "union": {
      const arm = layout.arms[seed.n % layout.arms.length]!;
      return { type: arm.value, value: sampleValue(arm.field.layout, seed) };
    }
  }
}

function writeByLayout(w: XdrWriter, layout: XdrLayout, value: unknown): void {
  switch (layout.kind) {
    case "int":
      w.int(value as number);
      return;
    case "unsigned int":
      w.uint(value as number);
      return;
    case "hyper":
      w.hyper(value as bigint);
      return;
    case "unsigned hyper":
      w.uhyper(value as bigint);
      return;
    case "double":
      w.double(value as number);
      return;
    case "string":
      w.string(value as string, layout.max);
      return;
    case "fixed opaque":
      w.fixedOpaque(value as Buffer, layout.length);
      return;
    case "optional":
      w.optional(value, (inner, v) => writeByLayout(inner, layout.of, v));
      return;
    case "array":
      w.array(value as unknown[], layout.max, (inner, v) => writeByLayout(inner, layout.of, v));
      return;
    case "struct":
      for (const f of layout.fields) {
        writeByLayout(w, f.layout, (value as Record<string, unknown>)[camel(f.name)]);
      }
      return;
    case "union": {
      const chosen = value as { type: number; value: unknown };
      const arm = layout.arms.find((candidate) => candidate.value === chosen.type);
      if (!arm) throw new Error(`${layout.name}: no arm ${chosen.type}`);
      w.int(chosen.type);
      writeByLayout(w, arm.field.layout, chosen.value);
    }
  }
}

describe("libvirt protocol tables against libvirt's .x files", () => {
  const spec = loadSpec();
  const table = Procedures as unknown as ProcedureTable;

  it("reads the .x files it checks against (a parser that found nothing would agree with anything)", () => {
    assert.ok(spec.structs.size > 700, `only ${spec.structs.size} structs parsed`);
    assert.equal(spec.enums.get("remote_procedure")?.get("REMOTE_PROC_DOMAIN_FD_ASSOCIATE"), 443);
    assert.equal(spec.enums.get("qemu_procedure")?.get("QEMU_PROC_DOMAIN_AGENT_COMMAND"), 3);
    assert.equal(
      describeLayout(structLayout(spec, "remote_nonnull_domain")),
      "struct remote_nonnull_domain { string<4194304> name; opaque[16] uuid; int id; }",
    );
  });

  it("gives every procedure libvirt's number and its args/ret structs field by field", () => {
    assert.deepEqual(checkProcedures(table, spec), []);
  });

  it("matches program numbers and versions", () => {
    assert.deepEqual(
      {
        REMOTE_PROGRAM,
        REMOTE_PROTOCOL_VERSION,
        QEMU_PROGRAM,
        QEMU_PROTOCOL_VERSION,
        KEEPALIVE_PROGRAM,
        KEEPALIVE_PROTOCOL_VERSION,
      },
      Object.fromEntries(
        [
          "REMOTE_PROGRAM",
          "REMOTE_PROTOCOL_VERSION",
          "QEMU_PROGRAM",
          "QEMU_PROTOCOL_VERSION",
          "KEEPALIVE_PROGRAM",
          "KEEPALIVE_PROTOCOL_VERSION",
        ].map((name) => [name, constant(spec, name)]),
      ),
    );
  });

  it("matches message types, statuses, keepalive procedures and auth types", () => {
    assert.deepEqual(
      [
        ...checkEnum("MessageType", MessageType, spec, "virNetMessageType", "VIR_NET_"),
        ...checkEnum("MessageStatus", MessageStatus, spec, "virNetMessageStatus", "VIR_NET_"),
        ...checkEnum(
          "KeepaliveProcedure",
          KeepaliveProcedure,
          spec,
          "keepalive_procedure",
          "KEEPALIVE_PROC_",
        ),
        ...checkEnum("AuthType", AuthType, spec, "remote_auth_type", "REMOTE_AUTH_"),
      ],
      [],
    );
  });

  it("matches the limits it enforces", () => {
    const sources: Record<keyof typeof Limits, string> = {
      messageMax: "VIR_NET_MESSAGE_MAX",
      streamChunk: "VIR_NET_MESSAGE_LEGACY_PAYLOAD_MAX",
      stringMax: "REMOTE_STRING_MAX",
      domainListMax: "REMOTE_DOMAIN_LIST_MAX",
      storageVolListMax: "REMOTE_STORAGE_VOL_LIST_MAX",
      authTypeListMax: "REMOTE_AUTH_TYPE_LIST_MAX",
      interfacesMax: "REMOTE_DOMAIN_INTERFACE_MAX",
      addressesMax: "REMOTE_DOMAIN_IP_ADDR_MAX",
      dhcpLeasesMax: "REMOTE_NETWORK_DHCP_LEASES_MAX",
      storagePoolListMax: "REMOTE_STORAGE_POOL_LIST_MAX",
      networkListMax: "REMOTE_NETWORK_LIST_MAX",
      interfaceListMax: "REMOTE_INTERFACE_LIST_MAX",
      connectGetAllDomainStatsMax: "REMOTE_CONNECT_GET_ALL_DOMAIN_STATS_MAX",
    };
    for (const [key, name] of Object.entries(sources)) {
      assert.equal(Limits[key as keyof typeof Limits], constant(spec, name), `${key} vs ${name}`);
    }
    assert.equal(constant(spec, "VIR_NET_MESSAGE_STRING_MAX"), Limits.stringMax);
  });

  it("lays out the shared structs (handles, interfaces, leases, remote_error) as libvirt does", () => {
    for (const type of Object.values(RemoteTypes)) {
      if (type.layout.kind !== "struct" || !type.layout.name) continue;
      assert.equal(
        describeLayout(type.layout),
        describeLayout(structLayout(spec, type.layout.name)),
      );
    }
    // The error a reply carries is virnetprotocol.x's virNetMessageError, remote_error's twin
    // (same wire shape, its own struct names).
    const shape = (layout: XdrLayout) => describeLayout(layout).replace(/struct \w+ /g, "struct ");
    assert.equal(
      shape(RemoteTypes.remoteError.layout),
      shape(structLayout(spec, "virNetMessageError")),
    );
  });

  it("puts the same bytes on the wire as a codec driven by the .x file, for every procedure's arguments", () => {
    for (const procedure of Object.values(table)) {
      const names = sourceNames(procedure);
      if (!spec.structs.has(`${names.struct}_args`)) continue;
      const layout = structLayout(spec, `${names.struct}_args`);
      const args = sampleValue(layout, { n: procedure.number });
      const ours = new XdrWriter();
      procedure.encodeArgs(ours, args as never);
      const theirs = new XdrWriter();
      writeByLayout(theirs, layout, args);
      assert.equal(ours.finish().toString("hex"), theirs.finish().toString("hex"), procedure.name);
    }
  });

  it("reads every procedure's reply exactly to its end when the .x layout wrote it", () => {
    for (const procedure of Object.values(table)) {
      const names = sourceNames(procedure);
      if (!spec.structs.has(`${names.struct}_ret`)) continue;
      const layout = structLayout(spec, `${names.struct}_ret`);
      const w = new XdrWriter();
      writeByLayout(w, layout, sampleValue(layout, { n: procedure.number }));
      const reader = new XdrReader(w.finish());
      procedure.decodeRet(reader);
      reader.expectEnd(procedure.name);
    }
  });

  describe("fails when the table is wrong (checked on deliberately altered copies)", () => {
    const altered = (key: keyof typeof Procedures, change: Partial<AnyProcedure>) => ({
      ...table,
      [key]: { ...table[key]!, ...change },
    });

    it("a changed procedure number", () => {
      assert.deepEqual(checkProcedures(altered("domainLookupByName", { number: 22 }), spec), [
        "domainLookupByName: number 22, libvirt's REMOTE_PROC_DOMAIN_LOOKUP_BY_NAME is 23",
      ]);
      assert.deepEqual(
        checkProcedures(altered("storagePoolListAllVolumes", { number: 281 }), spec),
        [
          "storagePoolListAllVolumes: number 281, libvirt's REMOTE_PROC_STORAGE_POOL_LIST_ALL_VOLUMES is 282",
        ],
      );
    });

    it("swapped fields, a wrong field type, a missing struct and an unknown procedure", () => {
      const swapped = t.struct(null, {
        dom: RemoteTypes.domain,
        type: t.int,
        metadata: RemoteTypes.optionalString,
        uri: RemoteTypes.optionalString,
        key: RemoteTypes.optionalString,
        flags: t.uint,
      }).layout;
      const [order] = checkProcedures(altered("domainSetMetadata", { argsLayout: swapped }), spec);
      assert.match(
        order!,
        /^domainSetMetadata args: ours .*\*string<4194304> uri; \*string<4194304> key;/,
      );

      const signedPrefix = t.struct(null, {
        type: t.int,
        addr: t.string(Limits.stringMax),
        prefix: t.int,
      }).layout;
      const [type] = checkProcedures(
        altered("storageVolGetInfo", { retLayout: signedPrefix }),
        spec,
      );
      assert.match(
        type!,
        /^storageVolGetInfo ret: ours struct \{ int type; string<4194304> addr; int prefix; \}/,
      );

      const [missing] = checkProcedures(altered("connectGetHostname", { retLayout: null }), spec);
      assert.match(
        missing!,
        /^connectGetHostname ret: ours \(none\), remote_connect_get_hostname_ret struct/,
      );

      assert.deepEqual(checkProcedures(altered("connectClose", { name: "connectShut" }), spec), [
        'connectClose: named "connectShut"',
        "connectClose: libvirt has no REMOTE_PROC_CONNECT_SHUT",
      ]);
    });

    it("a wrong message type, status or auth type", () => {
      assert.deepEqual(
        checkEnum(
          "MessageType",
          { ...MessageType, STREAM: 4 },
          spec,
          "virNetMessageType",
          "VIR_NET_",
        ),
        ["MessageType: VIR_NET_STREAM is 3, ours 4"],
      );
      assert.deepEqual(
        checkEnum("MessageStatus", { OK: 0, ERROR: 1 }, spec, "virNetMessageStatus", "VIR_NET_"),
        ["MessageStatus: VIR_NET_CONTINUE is 2, ours undefined"],
      );
      assert.deepEqual(
        checkEnum("AuthType", { ...AuthType, GSSAPI: 3 }, spec, "remote_auth_type", "REMOTE_AUTH_"),
        ["AuthType: libvirt has no REMOTE_AUTH_GSSAPI"],
      );
    });
  });
});
