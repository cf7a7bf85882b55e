/**
 * The pure logic behind `pulumi preview` with unknown inputs (check fills the
 * defaults of what is known, diff gives the table's verdict for what is not),
 * and the one secret set both resources register.
 */
import { strict as assert } from "node:assert";
import fc from "fast-check";
import { z } from "zod";
import { decideDiff, type ChangeTable } from "../../provider/common/diff";
import { containsUnknown, fillKnown, UNKNOWN } from "../../provider/common/inputs";
import {
  hasUserinfo,
  secretOutputNames,
  SECRET_INPUT_PATHS,
  URL_INPUT_PATHS,
} from "../../provider/common/secrets";
import { KVM_CHANGE_TABLE } from "../../provider/kvm/diff";
import * as kvm from "../../provider/kvm/provider";
import { kvmProxyInputsSchema } from "../../provider/kvm/schema";
import { PROXMOX_CHANGE_TABLE } from "../../provider/proxmox/diff";
import * as proxmox from "../../provider/proxmox/provider";
import { proxmoxProxyInputsSchema } from "../../provider/proxmox/schema";
import { staticProxyInputsSchema } from "../../provider/static/schema";

type Props = Record<string, unknown>;
const owner = { project: "p", stack: "s", resource: "edge" };

const valueAt = (value: unknown, path: string[]): unknown =>
  path.reduce<unknown>(
    (inner, key) =>
      inner === UNKNOWN
        ? UNKNOWN
        : typeof inner === "object" && inner !== null
          ? (inner as Props)[key]
          : undefined,
    value,
  );

/** Every path to a leaf (and to every object on the way), so an unknown can stand anywhere. */
function pathsOf(value: unknown, prefix: string[] = []): string[][] {
  if (typeof value !== "object" || value === null) return [prefix];
  const inner = Object.entries(value).flatMap(([key, item]) => pathsOf(item, [...prefix, key]));
  return Array.isArray(value) ? [prefix] : [...(prefix.length > 0 ? [prefix] : []), ...inner];
}

function withUnknownAt(value: Props, path: string[]): Props {
  if (typeof value !== "object" || value === null) return value; // already unknown above
  const [key, ...rest] = path;
  return {
    ...value,
    [key]: rest.length === 0 ? UNKNOWN : withUnknownAt(value[key] as Props, rest),
  };
}

const kvmInputs: fc.Arbitrary<Props> = fc
  .record(
    {
      connection: fc.record(
        {
          host: fc.constantFrom("kvm1.lan", "10.0.0.5"),
          port: fc.integer({ min: 1, max: 65535 }),
          user: fc.constantFrom("root", "ops"),
          privateKey: fc.constant("-----BEGIN OPENSSH PRIVATE KEY-----\nx\n"),
          insecureIgnoreHostKey: fc.boolean(),
        },
        { requiredKeys: ["host"] },
      ),
      pool: fc.constantFrom("default", "fast"),
      network: fc.oneof(
        fc.record({ bridge: fc.constant("br0") }),
        fc.record({ name: fc.constant("lan") }),
      ),
      vcpus: fc.integer({ min: 1, max: 128 }),
      memoryMiB: fc.integer({ min: 256, max: 65536 }),
      diskGiB: fc.integer({ min: 1, max: 500 }),
      firmware: fc.constantFrom("uefi", "bios"),
      image: fc.record(
        {
          url: fc.constantFrom("https://i.example/a.qcow2", "https://i.example/b.img"),
          sha256: fc.constant("AB".repeat(32)),
          format: fc.constantFrom("qcow2", "raw"),
          maxMiB: fc.integer({ min: 1, max: 16384 }),
        },
        { requiredKeys: ["url"] },
      ),
      userData: fc.constantFrom("#cloud-config\n", "#!/bin/sh\necho hi\n"),
      readiness: fc.record(
        {
          mode: fc.constantFrom("port", "address", "none"),
          port: fc.integer({ min: 1, max: 65535 }),
          probeUrl: fc.constant("http://example.com/"),
        },
        { requiredKeys: [] },
      ),
      timeouts: fc.record({ readySeconds: fc.integer({ min: 1, max: 900 }) }, { requiredKeys: [] }),
    },
    { requiredKeys: ["image"] },
  )
  .map((inputs) => ({ ...inputs, owner }));

const proxmoxInputs: fc.Arbitrary<Props> = fc
  .record(
    {
      apiToken: fc.constant("root@pam!edge=5ecret"),
      node: fc.constantFrom("pve", "pve2"),
      templateVmid: fc.integer({ min: 100, max: 99999 }),
      diskStorage: fc.constantFrom("local-lvm", "ceph"),
      seedStorage: fc.constant("seeds"),
      vmidRange: fc.constant({ first: 20000, last: 29999 }),
      cores: fc.integer({ min: 1, max: 128 }),
      memoryMiB: fc.integer({ min: 256, max: 65536 }),
      vlanTag: fc.integer({ min: 1, max: 4094 }),
      tags: fc.array(fc.constantFrom("Edge", "blue", "a.b"), { maxLength: 3 }),
      userData: fc.constantFrom("#cloud-config\n", "#!/bin/sh\n"),
      readiness: fc.record({ mode: fc.constantFrom("port", "address") }, { requiredKeys: [] }),
    },
    { requiredKeys: ["node", "templateVmid", "diskStorage", "seedStorage"] },
  )
  .map((inputs) => ({ ...inputs, owner }));

type Backend = {
  name: string;
  inputs: fc.Arbitrary<Props>;
  table: ChangeTable;
  check: (olds: Props, news: Props) => Promise<{ inputs: Props; failures: unknown[] }>;
  diff: (olds: Props, news: Props) => Promise<{ changes?: boolean; replaces?: string[] }>;
};

const backends: Backend[] = [
  {
    name: "KvmProxy",
    inputs: kvmInputs,
    table: KVM_CHANGE_TABLE,
    check: kvm.check,
    diff: (olds, news) => kvm.diff("id", olds, news),
  },
  {
    name: "ProxmoxProxy",
    inputs: proxmoxInputs,
    table: PROXMOX_CHANGE_TABLE,
    check: proxmox.check,
    diff: (olds, news) => proxmox.diff("id", olds, news),
  },
];

const related = (a: string[], b: string[]) => {
  const n = Math.min(a.length, b.length);
  return a.slice(0, n).every((part, index) => part === b[index]);
};

describe("preview with unknown inputs (check and diff, pure)", () => {
  for (const backend of backends)
    describe(backend.name, () => {
      it("an unknown anywhere: no failure, the same name, every other table field checked as before, and diff gives exactly the table's verdict for the unknown fields", async () => {
        await fc.assert(
          fc.asyncProperty(
            backend.inputs.chain((raw) =>
              fc.tuple(
                fc.constant(raw),
                fc.subarray(
                  pathsOf(raw).filter((path) => path[0] !== "owner"),
                  { minLength: 1, maxLength: 3 },
                ),
              ),
            ),
            async ([raw, unknownPaths]) => {
              const full = await backend.check({}, raw);
              assert.deepEqual(full.failures, []);
              const outputs = { ...full.inputs, host: "h", ip: null };
              const news = unknownPaths.reduce(withUnknownAt, raw);
              const checked = await backend.check(full.inputs, news);
              assert.deepEqual(checked.failures, []);
              assert.equal(checked.inputs.vmName, full.inputs.vmName);
              const touched = Object.keys(backend.table).filter((path) =>
                containsUnknown(valueAt(checked.inputs, path.split("."))),
              );
              for (const path of Object.keys(backend.table)) {
                const parts = path.split(".");
                if (touched.includes(path)) {
                  assert.ok(
                    unknownPaths.some((unknown) => related(unknown, parts)),
                    `${path} is unknown but no unknown input is near it`,
                  );
                } else
                  assert.deepEqual(
                    valueAt(checked.inputs, parts),
                    valueAt(full.inputs, parts),
                    path,
                  );
              }
              const decision = await backend.diff(outputs, checked.inputs);
              assert.equal(decision.changes, true);
              assert.deepEqual(
                [...(decision.replaces ?? [])].sort(),
                touched.filter((path) => backend.table[path] === "replace").sort(),
              );
            },
          ),
          { numRuns: 150 },
        );
      });

      it("no unknown: the same program diffs as no change", async () => {
        await fc.assert(
          fc.asyncProperty(backend.inputs, async (raw) => {
            const first = await backend.check({}, raw);
            const again = await backend.check(first.inputs, raw);
            const decision = await backend.diff(first.inputs, again.inputs);
            assert.deepEqual([decision.changes, decision.replaces], [false, []]);
          }),
          { numRuns: 100 },
        );
      });
    });

  it("a path under an unknown object is unknown: a whole unknown connection replaces even with no connection before", () => {
    const olds = { vmName: "edge-aaaaaaaaaa", image: { url: "u" } };
    const decision = decideDiff(KVM_CHANGE_TABLE, olds, { ...olds, connection: UNKNOWN });
    assert.equal(decision.changes, true);
    assert.deepEqual(decision.replaces, ["connection.host", "connection.port"]);
  });

  it("fillKnown fills defaults beside unknowns and keeps unions with an unknown as given", () => {
    const schema = z.strictObject({
      a: z.number().default(1),
      nested: z
        .strictObject({ b: z.string(), c: z.string().default("c") })
        .default({ b: "x", c: "c" }),
      choice: z.union([z.strictObject({ x: z.string() }), z.strictObject({ y: z.string() })]),
    });
    assert.deepEqual(fillKnown(schema, { nested: { b: UNKNOWN }, choice: { x: UNKNOWN } }), {
      a: 1,
      nested: { b: UNKNOWN, c: "c" },
      choice: { x: UNKNOWN },
    });
    assert.deepEqual(fillKnown(schema, { a: UNKNOWN, choice: { y: "y" } }), {
      a: UNKNOWN,
      nested: { b: "x", c: "c" },
      choice: { y: "y" },
    });
  });
});

describe("the one secret set", () => {
  const shapes = [kvmProxyInputsSchema, proxmoxProxyInputsSchema, staticProxyInputsSchema].map(
    (schema) => schema.shape as Record<string, z.ZodType>,
  );

  /** The schemas a value at `schema` may match: optional, default and preprocess unwrapped, unions spread. */
  function alternatives(schema: z.ZodType): z.ZodType[] {
    let inner = schema;
    for (;;) {
      if (inner instanceof z.ZodOptional || inner instanceof z.ZodDefault)
        inner = inner.unwrap() as z.ZodType;
      else if (inner instanceof z.ZodPipe)
        inner = inner.out as z.ZodType; // preprocess: the schema after it
      else break;
    }
    return inner instanceof z.ZodUnion
      ? (inner.options as z.ZodType[]).flatMap(alternatives)
      : [inner];
  }

  /** Where `key` leads from `schema` (`*` is a list's items), in any alternative. */
  function child(schema: z.ZodType, key: string): z.ZodType[] {
    return alternatives(schema).flatMap((inner) => {
      if (key === "*") return inner instanceof z.ZodArray ? [inner.element as z.ZodType] : [];
      const next =
        inner instanceof z.ZodObject ? (inner.shape as Record<string, z.ZodType>)[key] : undefined;
      return next === undefined ? [] : [next];
    });
  }

  function fieldExists(shape: Record<string, z.ZodType>, path: string[]): boolean {
    let schemas: z.ZodType[] = shape[path[0]!] === undefined ? [] : [shape[path[0]!]!];
    for (const key of path.slice(1)) schemas = schemas.flatMap((schema) => child(schema, key));
    return schemas.length > 0;
  }

  it("names only inputs that exist in one of the resources", () => {
    for (const path of [...SECRET_INPUT_PATHS, ...URL_INPUT_PATHS])
      assert.ok(
        shapes.some((shape) => fieldExists(shape, path.split("."))),
        `${path} is no input of either resource`,
      );
  });

  it("covers every input whose name says it holds a credential or cloud-init", () => {
    const listed = new Set<string>([...SECRET_INPUT_PATHS, ...URL_INPUT_PATHS]);
    const suspicious =
      /privatekey|passphrase|password|token|secret|userdata|vendordata|networkconfig|url$|endpoint/i;
    const walk = (schema: z.ZodType, path: string[]): string[] =>
      alternatives(schema).flatMap((inner) => {
        if (inner instanceof z.ZodObject)
          return Object.entries(inner.shape as Record<string, z.ZodType>).flatMap(([key, field]) =>
            walk(field, [...path, key]),
          );
        if (inner instanceof z.ZodArray) return walk(inner.element as z.ZodType, [...path, "*"]);
        return [path.join(".")];
      });
    const paths = shapes.flatMap((shape) =>
      Object.entries(shape).flatMap(([key, schema]) => walk(schema, [key])),
    );
    assert.ok(
      paths.includes("connection.proxyJump.*.privateKey"),
      "the walk reaches into lists of objects",
    );
    for (const path of new Set(paths))
      if (suspicious.test(path.split(".").at(-1)!) && !path.startsWith("owner"))
        assert.ok(listed.has(path), `${path} looks secret but is not in the secret set`);
  });

  it("additionalSecretOutputs: the top-level holder of every secret input the resource has, plus derived ones", () => {
    assert.deepEqual(secretOutputNames(["connection", "userData", "image"]).sort(), [
      "connection",
      "seedSha256",
      "userData",
    ]);
    assert.deepEqual(secretOutputNames(["apiToken", "vendorData"]).sort(), [
      "apiToken",
      "seedSha256",
      "vendorData",
    ]);
  });

  it("hasUserinfo sees a user or a password in any URL, and nothing else", () => {
    fc.assert(
      fc.property(
        fc.constantFrom("http", "https", "ftp"),
        fc.stringMatching(/^[a-z0-9]{1,8}$/),
        fc.option(fc.stringMatching(/^[a-z0-9]{1,8}$/), { nil: undefined }),
        fc.domain(),
        (scheme, user, password, host) => {
          const userinfo = password === undefined ? user : `${user}:${password}`;
          assert.equal(hasUserinfo(`${scheme}://${userinfo}@${host}/p`), true);
          assert.equal(hasUserinfo(`${scheme}://${host}/p@x`), false);
        },
      ),
    );
    assert.equal(hasUserinfo("not a url"), false);
  });
});
