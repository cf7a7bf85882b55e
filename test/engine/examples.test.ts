/**
 * Every example under examples/ compiles against the packed package, installed
 * into a consumer project as a user installs it (types from the tarball's
 * .d.ts, nothing from this repository's sources).
 */
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { packIntoConsumerProject, type ConsumerProject } from "./harness";
import { EXAMPLES, exampleNames, typeCheckStacks, type TypeCheck } from "./typecheck";

const REPOSITORY = resolve(__dirname, "..", "..", "..");
const examples = exampleNames();

describe("examples compile against the packed package", function () {
  this.timeout(120_000);
  let project: ConsumerProject;
  let compilation: TypeCheck;

  /**
   * One strict tsc program over every example plus a deliberately broken
   * copy, so the package's types are loaded once.
   */
  before(() => {
    project = packIntoConsumerProject();
    const broken = readFileSync(join(EXAMPLES, "consumer-stack", "index.ts"), "utf8");
    compilation = typeCheckStacks(
      project,
      "examples",
      [
        ...examples.map((example) => ({ name: example, example })),
        {
          name: "broken",
          example: "consumer-stack",
          index: broken.replace("count: 2,", 'count: "two",'),
        },
      ],
      { skipLibCheck: true },
    );
  });
  after(() => project?.remove());

  it("lists the five examples the issue asks for, adoption's, static proxies' and the operator's", () => {
    assert.deepEqual(examples.sort(), [
      "adopt",
      "consumer-stack",
      "kvm-two-hosts",
      "mixed-kubernetes",
      "operator-stack",
      "proxmox",
      "stack-reference",
      "static-proxies",
    ]);
  });

  it("each example installs the package the way the README says: the tarball `npm pack` writes", () => {
    const manifest = JSON.parse(readFileSync(join(REPOSITORY, "package.json"), "utf8")) as {
      version: string;
      peerDependencies: Record<string, string>;
    };
    // What `npm pack` at the repository root writes (the name npm derives from name and version).
    const tarball = join(REPOSITORY, `egress-proxies-${manifest.version}.tgz`);
    const packed = readdirSync(project.dir).filter((file) => file.endsWith(".tgz"));
    assert.deepEqual(packed, [`egress-proxies-${manifest.version}.tgz`]);
    for (const example of examples) {
      const { dependencies } = JSON.parse(
        readFileSync(join(EXAMPLES, example, "package.json"), "utf8"),
      ) as { dependencies: Record<string, string> };
      const spec = dependencies["egress-proxies"] ?? "";
      assert.match(spec, /^file:/, `${example}: the package is not on the npm registry`);
      assert.equal(resolve(EXAMPLES, example, spec.slice("file:".length)), tarball, example);
      assert.equal(
        dependencies["@pulumi/pulumi"],
        manifest.peerDependencies["@pulumi/pulumi"],
        `${example} asks for the SDK range the package claims`,
      );
    }
  });

  for (const example of examples)
    it(`${example} type-checks (strict) with the package as users install it`, () => {
      const source = readFileSync(join(EXAMPLES, example, "index.ts"), "utf8");
      assert.match(source, /from "egress-proxies"/, "imports the package by name");
      assert.deepEqual(compilation.errorsByStack.get(example) ?? [], [], compilation.output);
    });

  it("a wrong use of the package fails to compile (the check can fail)", () => {
    assert.notEqual(compilation.status, 0);
    const errors = compilation.errorsByStack.get("broken") ?? [];
    assert.equal(errors.length, 1, compilation.output);
    assert.match(errors[0], /TS2322: Type 'string' is not assignable to type 'number'/);
    // Nothing else failed: every other diagnostic belongs to the broken copy.
    assert.deepEqual([...compilation.errorsByStack.keys()], ["broken"], compilation.output);
  });
});
