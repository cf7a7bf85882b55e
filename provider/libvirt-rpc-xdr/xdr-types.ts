/**
 * XDR types as values: each knows how to write and read itself and carries a
 * machine-readable `layout` in the terms of the XDR language (RFC 4506 §6).
 * The protocol's structs are declared with these, so the codec that runs and
 * the description a test compares with libvirt's `.x` files are one thing
 * (the check lives in test/unit/libvirt-rpc-xdr/protocol-source.test.ts).
 */
import { XdrError, XdrReader, XdrWriter } from "./xdr";

/** The wire shape of a type, with typedefs and enums resolved to what travels. */
export type XdrLayout =
  | { readonly kind: "int" | "unsigned int" | "hyper" | "unsigned hyper" | "double" }
  | { readonly kind: "string"; readonly max: number }
  | { readonly kind: "fixed opaque"; readonly length: number }
  | { readonly kind: "optional"; readonly of: XdrLayout }
  | { readonly kind: "array"; readonly of: XdrLayout; readonly max: number }
  | { readonly kind: "struct"; readonly name: string | null; readonly fields: readonly XdrField[] }
  | { readonly kind: "union"; readonly name: string; readonly arms: readonly XdrUnionArm[] };

/** One `case value: type name;` of a union switched on an int (no default arm is modelled). */
export interface XdrUnionArm {
  readonly value: number;
  readonly field: XdrField;
}

export type StructLayout = Extract<XdrLayout, { kind: "struct" }>;

/** A struct member: its name as the `.x` file spells it (snake_case) and its layout. */
export interface XdrField {
  readonly name: string;
  readonly layout: XdrLayout;
}

/** `In` is what encoding accepts (hypers take a Number too), `Out` what decoding gives. */
export interface XdrType<Out, In = Out> {
  readonly layout: XdrLayout;
  write(writer: XdrWriter, value: In): void;
  read(reader: XdrReader): Out;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- any member type fits a struct
type AnyXdrType = XdrType<any, any>;
type Members = Record<string, AnyXdrType>;
export type StructOut<M extends Members> = {
  [K in keyof M]: M[K] extends XdrType<infer O, unknown> ? O : never;
};
export type StructIn<M extends Members> = {
  [K in keyof M]: M[K] extends XdrType<unknown, infer I> ? I : never;
};
export interface XdrStruct<M extends Members> extends XdrType<StructOut<M>, StructIn<M>> {
  readonly layout: StructLayout;
  readonly members: M;
}

const primitive = <T, I = T>(
  kind: "int" | "unsigned int" | "hyper" | "unsigned hyper" | "double",
  write: (w: XdrWriter, v: I) => void,
  read: (r: XdrReader) => T,
): XdrType<T, I> => ({ layout: { kind }, write, read });

export const int = primitive<number>(
  "int",
  (w, v) => w.int(v),
  (r) => r.int(),
);
export const uint = primitive<number>(
  "unsigned int",
  (w, v) => w.uint(v),
  (r) => r.uint(),
);
export const hyper = primitive<bigint, bigint | number>(
  "hyper",
  (w, v) => w.hyper(v),
  (r) => r.hyper(),
);
export const uhyper = primitive<bigint, bigint | number>(
  "unsigned hyper",
  (w, v) => w.uhyper(v),
  (r) => r.uhyper(),
);
export const double = primitive<number>(
  "double",
  (w, v) => w.double(v),
  (r) => r.double(),
);
/** An `int` that libvirt uses as a yes/no answer (`supported`, `complete`). */
export const intBool = primitive<boolean>(
  "int",
  (w, v) => w.int(v ? 1 : 0),
  (r) => r.int() !== 0,
);

export function string(max: number): XdrType<string> {
  return {
    layout: { kind: "string", max },
    write: (w, v) => w.string(v, max),
    read: (r) => r.string(max),
  };
}

export function fixedOpaque(length: number): XdrType<Buffer> {
  return {
    layout: { kind: "fixed opaque", length },
    write: (w, v) => w.fixedOpaque(v, length),
    read: (r) => r.fixedOpaque(length),
  };
}

/** An XDR pointer (`T *x`): absent is `null` when read; `null` or `undefined` when written. */
export function optional<O, I>(of: XdrType<O, I>): XdrType<O | null, I | null | undefined> {
  return {
    layout: { kind: "optional", of: of.layout },
    write: (w, v) => w.optional(v, (inner, value) => of.write(inner, value)),
    read: (r) => r.optional((inner) => of.read(inner)),
  };
}

/** A variable-length array (`T x<max>`). */
export function array<O, I>(of: XdrType<O, I>, max: number): XdrType<O[], readonly I[]> {
  return {
    layout: { kind: "array", of: of.layout, max },
    write: (w, v) => w.array(v, max, (inner, item) => of.write(inner, item)),
    read: (r) => r.array(max, (inner) => of.read(inner)),
  };
}

/** `fooBar` → `foo_bar`: the `.x` spelling of a member declared here in camelCase. */
export function wireName(member: string): string {
  return member.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
}

/**
 * A struct; members are encoded in declaration order. `name` is the `.x` struct
 * name for shared structs, `null` for a procedure's args/ret (named after it).
 */
export function struct<M extends Members>(name: string | null, members: M): XdrStruct<M> {
  const entries = Object.entries(members);
  return {
    members,
    layout: {
      kind: "struct",
      name,
      fields: entries.map(([key, type]) => ({ name: wireName(key), layout: type.layout })),
    },
    write(w, value) {
      for (const [key, type] of entries) type.write(w, value[key]);
    },
    read(r) {
      const out: Record<string, unknown> = {};
      for (const [key, type] of entries) out[key] = type.read(r);
      return out as StructOut<M>;
    },
  };
}

/** What a union decodes to: its discriminant and the value of the arm it selects. */
export interface UnionValue<V> {
  readonly type: number;
  readonly value: V;
}

/**
 * A union switched on an int (`union name switch (int type) { case 1: int i;
 * ... }`). A discriminant with no arm is an error: XDR has no way to skip a
 * value whose size it does not know.
 */
export function union<V>(
  name: string,
  arms: ReadonlyArray<{ value: number; name: string; type: XdrType<V, V> }>,
): XdrType<UnionValue<V>> {
  const byValue = new Map(arms.map((arm) => [arm.value, arm]));
  const armOf = (type: number) => {
    const arm = byValue.get(type);
    if (arm === undefined) throw new XdrError(`${name}: no arm for discriminant ${type}`);
    return arm;
  };
  return {
    layout: {
      kind: "union",
      name,
      arms: arms.map((arm) => ({
        value: arm.value,
        field: { name: arm.name, layout: arm.type.layout },
      })),
    },
    write(w, { type, value }) {
      w.int(type);
      armOf(type).type.write(w, value);
    },
    read(r) {
      const type = r.int();
      return { type, value: armOf(type).type.read(r) };
    },
  };
}

/** A procedure body: a struct, or nothing at all (libvirt declares no struct for void). */
export interface XdrBody<Out, In> {
  readonly layout: StructLayout | null;
  write(writer: XdrWriter, value: In): void;
  read(reader: XdrReader): Out;
}

export const empty: XdrBody<void, void> = {
  layout: null,
  write: () => undefined,
  read: () => undefined,
};

/**
 * A one-member struct whose member is the body's value: `remote_X_ret {
 * remote_nonnull_string xml; }` reads as a plain string.
 */
export function only<K extends string, O, I>(
  key: K,
  type: XdrType<O, I>,
  /** The member's name in the `.x` when it is not `key` in snake_case (libvirt wrote `retStats`). */
  spelledInSource?: string,
): XdrBody<O, I> & { readonly layout: StructLayout } {
  const s = struct(null, { [key]: type } as Record<K, XdrType<O, I>>);
  const layout: StructLayout =
    spelledInSource === undefined
      ? s.layout
      : { ...s.layout, fields: [{ name: spelledInSource, layout: type.layout }] };
  return {
    layout,
    write: (w, value) => type.write(w, value),
    read: (r) => type.read(r),
  };
}

/** One line per layout, for messages and for comparing with a parsed `.x` file. */
export function describeLayout(layout: XdrLayout): string {
  switch (layout.kind) {
    case "string":
      return `string<${layout.max}>`;
    case "fixed opaque":
      return `opaque[${layout.length}]`;
    case "optional":
      return `*${describeLayout(layout.of)}`;
    case "array":
      return `${describeLayout(layout.of)}<${layout.max}>`;
    case "union": {
      const arms = layout.arms.map(
        (arm) => `case ${arm.value}: ${describeLayout(arm.field.layout)} ${arm.field.name};`,
      );
      return `union ${layout.name} switch (int) { ${arms.join(" ")} }`;
    }
    case "struct": {
      const fields = layout.fields.map((f) => `${describeLayout(f.layout)} ${f.name};`);
      return `struct${layout.name ? ` ${layout.name}` : ""} { ${fields.join(" ")} }`;
    }
    default:
      return layout.kind;
  }
}
