/**
 * A small reader for the XDR language (RFC 4506 §6) as libvirt's `.x` files
 * use it: `const`, `typedef`, `enum`, `struct`, and `union` switched on an
 * int with `case` arms (no `default`: libvirt's one union has none). It resolves a struct to the wire layout that
 * `provider/libvirt-rpc-xdr/xdr-types.ts` describes, so the two compare with
 * `describeLayout`.
 */
import type { XdrField, XdrLayout, XdrUnionArm } from "../../../provider/libvirt-rpc-xdr/xdr-types";

/** One declaration: `type name`, `type *name`, `type name<max>` or `type name[size]`. */
export interface Declaration {
  readonly name: string;
  readonly type: string;
  readonly form: "plain" | "optional" | "variable" | "fixed";
  /** A number or a constant's name; null for an unbounded `<>`. */
  readonly size: string | null;
}

export interface XdrSpec {
  /** const name → its value as written (a number, or another constant's name). */
  readonly consts: Map<string, string>;
  /** enum name → member → value */
  readonly enums: Map<string, Map<string, number>>;
  readonly typedefs: Map<string, Declaration>;
  readonly structs: Map<string, Declaration[]>;
  /** union name → its arms: case label (a number or a constant's name) and declaration */
  readonly unions: Map<string, Array<{ label: string; declaration: Declaration }>>;
}

export function emptySpec(): XdrSpec {
  return {
    consts: new Map(),
    enums: new Map(),
    typedefs: new Map(),
    structs: new Map(),
    unions: new Map(),
  };
}

function tokenize(source: string): string[] {
  const text = source
    .replace(/\/\*[\s\S]*?\*\//g, " ")
    .split("\n")
    // `%` lines pass C through rpcgen untouched; they are not XDR.
    .filter((line) => !line.trimStart().startsWith("%"))
    .join("\n");
  const tokens: string[] = [];
  const pattern = /\s*(0x[0-9a-fA-F]+|-?\d+|[A-Za-z_]\w*|[{}();,<>[\]*=:])/y;
  let at = 0;
  for (let match = pattern.exec(text); match; match = pattern.exec(text)) {
    tokens.push(match[1]!);
    at = pattern.lastIndex;
  }
  const rest = text.slice(at).trim();
  if (rest) throw new Error(`cannot tokenize XDR near: ${rest.slice(0, 60)}`);
  return tokens;
}

class Parser {
  private at = 0;
  constructor(private readonly tokens: string[]) {}

  get done(): boolean {
    return this.at >= this.tokens.length;
  }
  peek(): string | undefined {
    return this.tokens[this.at];
  }
  next(): string {
    const token = this.tokens[this.at++];
    if (token === undefined) throw new Error("unexpected end of XDR source");
    return token;
  }
  expect(token: string): void {
    const got = this.next();
    if (got !== token) throw new Error(`expected "${token}", got "${got}" (token ${this.at})`);
  }

  typeSpecifier(): string {
    const first = this.next();
    if (first !== "unsigned") return first;
    const second = this.peek();
    if (second === "int" || second === "hyper" || second === "char" || second === "short") {
      this.next();
      return `unsigned ${second}`;
    }
    return "unsigned int";
  }

  declaration(): Declaration {
    const type = this.typeSpecifier();
    if (this.peek() === "*") {
      this.next();
      return { type, name: this.next(), form: "optional", size: null };
    }
    const name = this.next();
    const open = this.peek();
    if (open === "<" || open === "[") {
      this.next();
      const size = this.peek() === ">" ? null : this.next();
      this.expect(open === "<" ? ">" : "]");
      return { type, name, form: open === "<" ? "variable" : "fixed", size };
    }
    return { type, name, form: "plain", size: null };
  }

  /** `{ case LABEL: type name; ... }` */
  unionArms(): Array<{ label: string; declaration: Declaration }> {
    const arms: Array<{ label: string; declaration: Declaration }> = [];
    this.expect("{");
    while (this.peek() !== "}") {
      this.expect("case");
      const label = this.next();
      this.expect(":");
      arms.push({ label, declaration: this.declaration() });
      this.expect(";");
    }
    this.expect("}");
    return arms;
  }
}

/** A number, or a constant resolved when used (some name C macros the .x never defines). */
function numberOf(token: string, spec: XdrSpec): number {
  if (/^-?\d+$/.test(token) || /^0x/i.test(token)) return Number(token);
  const value = spec.consts.get(token);
  if (value === undefined) throw new Error(`unknown constant ${token}`);
  return numberOf(value, spec);
}

export function constant(spec: XdrSpec, name: string): number {
  return numberOf(name, spec);
}

/** Parses one `.x` file into `spec` (several files share one spec, as rpcgen includes do). */
export function parseXdr(source: string, spec: XdrSpec = emptySpec()): XdrSpec {
  const p = new Parser(tokenize(source));
  while (!p.done) {
    const keyword = p.next();
    if (keyword === "const") {
      const name = p.next();
      p.expect("=");
      spec.consts.set(name, p.next());
    } else if (keyword === "typedef") {
      const declaration = p.declaration();
      spec.typedefs.set(declaration.name, declaration);
    } else if (keyword === "enum") {
      const name = p.next();
      const members = new Map<string, number>();
      p.expect("{");
      while (p.peek() !== "}") {
        const member = p.next();
        p.expect("=");
        members.set(member, numberOf(p.next(), spec));
        if (p.peek() === ",") p.next();
      }
      p.expect("}");
      spec.enums.set(name, members);
    } else if (keyword === "struct") {
      const name = p.next();
      const fields: Declaration[] = [];
      p.expect("{");
      while (p.peek() !== "}") {
        fields.push(p.declaration());
        p.expect(";");
      }
      p.expect("}");
      spec.structs.set(name, fields);
    } else if (keyword === "union") {
      const name = p.next();
      p.expect("switch");
      p.expect("(");
      const discriminant = p.declaration();
      if (discriminant.type !== "int")
        throw new Error(`union ${name} switches on ${discriminant.type}`);
      p.expect(")");
      spec.unions.set(name, p.unionArms());
    } else {
      throw new Error(`unsupported XDR definition "${keyword}"`);
    }
    p.expect(";");
  }
  return spec;
}

const UNBOUNDED = 0xffffffff;

/** The wire layout of a declaration, typedefs and enums resolved. */
export function layoutOf(spec: XdrSpec, declaration: Declaration): XdrLayout {
  const { type, form, size } = declaration;
  const bound = size === null ? UNBOUNDED : numberOf(size, spec);
  if (type === "string") {
    if (form !== "variable") throw new Error(`string ${declaration.name} needs <max>`);
    return { kind: "string", max: bound };
  }
  if (type === "opaque") {
    if (form !== "fixed") throw new Error(`variable opaque ${declaration.name} is not modelled`);
    return { kind: "fixed opaque", length: bound };
  }
  const base = baseLayout(spec, type);
  switch (form) {
    case "plain":
      return base;
    case "optional":
      return { kind: "optional", of: base };
    case "variable":
      return { kind: "array", of: base, max: bound };
    case "fixed":
      throw new Error(`fixed array ${declaration.name}[${size}] is not modelled`);
  }
}

function baseLayout(spec: XdrSpec, type: string): XdrLayout {
  switch (type) {
    // XDR widens char and short to a 4-byte word; an enum is an int on the wire.
    case "int":
    case "char":
    case "short":
    case "bool":
      return { kind: "int" };
    case "unsigned int":
    case "unsigned char":
    case "unsigned short":
      return { kind: "unsigned int" };
    case "hyper":
      return { kind: "hyper" };
    case "unsigned hyper":
      return { kind: "unsigned hyper" };
    case "double":
      return { kind: "double" };
  }
  if (spec.enums.has(type)) return { kind: "int" };
  const typedef = spec.typedefs.get(type);
  if (typedef) return layoutOf(spec, typedef);
  if (spec.structs.has(type)) return structLayout(spec, type);
  if (spec.unions.has(type)) return unionLayout(spec, type);
  throw new Error(`unknown XDR type ${type}`);
}

export function structLayout(spec: XdrSpec, name: string): XdrLayout {
  const declarations = spec.structs.get(name);
  if (!declarations) throw new Error(`no struct ${name}`);
  const fields: XdrField[] = declarations.map((d) => ({ name: d.name, layout: layoutOf(spec, d) }));
  return { kind: "struct", name, fields };
}

export function unionLayout(spec: XdrSpec, name: string): XdrLayout {
  const declared = spec.unions.get(name);
  if (!declared) throw new Error(`no union ${name}`);
  const arms: XdrUnionArm[] = declared.map(({ label, declaration }) => ({
    value: numberOf(label, spec),
    field: { name: declaration.name, layout: layoutOf(spec, declaration) },
  }));
  return { kind: "union", name, arms };
}
