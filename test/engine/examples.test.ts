/**
 * Every example under examples/ compiles against the packed package, installed
 * into a consumer project as a user installs it (types from the tarball's
 * .d.ts, nothing from this repository's sources).
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { cpSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { packIntoConsumerProject, type ConsumerProject } from "./harness";

const REPOSITORY = resolve(__dirname, "..", "..", "..");
const EXAMPLES = join(REPOSITORY, "examples");
const TSC = join(REPOSITORY, "node_modules", "typescript", "bin", "tsc");

const examples = readdirSync(EXAMPLES, { withFileTypes: true })
  .filter((entry) => entry.isDirectory())
  .map((entry) => entry.name);

interface Compilation {
  status: number | null;
  /** tsc's diagnostics, by example directory name. */
  errorsByExample: Map<string, string[]>;
  output: string;
}

describe("examples compile against the packed package", function () {
  this.timeout(120_000);
  let project: ConsumerProject;
  let compilation: Compilation;

  /**
   * One strict tsc program over every example plus a deliberately broken
   * copy, so the package's types are loaded once.
   */
  before(() => {
    project = packIntoConsumerProject();
    const root = join(project.dir, "examples");
    for (const example of examples)
      cpSync(join(EXAMPLES, example), join(root, example), { recursive: true });
    const broken = readFileSync(join(EXAMPLES, "consumer-stack", "index.ts"), "utf8");
    cpSync(join(EXAMPLES, "consumer-stack"), join(root, "broken"), { recursive: true });
    writeFileSync(join(root, "broken", "index.ts"), broken.replace("count: 2,", 'count: "two",'));
    writeFileSync(
      join(root, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: {
          target: "ES2022",
          module: "commonjs",
          moduleResolution: "node",
          strict: true,
          esModuleInterop: true,
          skipLibCheck: true,
          noEmit: true,
          types: ["node"],
        },
        files: [...examples, "broken"].map((example) => `${example}/index.ts`),
      }),
    );
    const result = spawnSync(process.execPath, [TSC, "-p", root, "--pretty", "false"], {
      cwd: root,
      encoding: "utf8",
    });
    const errorsByExample = new Map<string, string[]>();
    for (const line of result.stdout.split("\n")) {
      const match = /^([^/]+)\/index\.ts\(\d+,\d+\): error/.exec(line);
      if (match) errorsByExample.set(match[1], [...(errorsByExample.get(match[1]) ?? []), line]);
    }
    compilation = { status: result.status, errorsByExample, output: result.stdout + result.stderr };
  });
  after(() => project?.remove());

  it("lists the five examples the issue asks for, adoption's and static proxies'", () => {
    assert.deepEqual(examples.sort(), [
      "adopt",
      "consumer-stack",
      "kvm-two-hosts",
      "mixed-kubernetes",
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
      assert.deepEqual(compilation.errorsByExample.get(example) ?? [], [], compilation.output);
    });

  it("a wrong use of the package fails to compile (the check can fail)", () => {
    assert.notEqual(compilation.status, 0);
    const errors = compilation.errorsByExample.get("broken") ?? [];
    assert.equal(errors.length, 1, compilation.output);
    assert.match(errors[0], /TS2322: Type 'string' is not assignable to type 'number'/);
    // Nothing else failed: every other diagnostic belongs to the broken copy.
    assert.deepEqual([...compilation.errorsByExample.keys()], ["broken"], compilation.output);
  });
});
