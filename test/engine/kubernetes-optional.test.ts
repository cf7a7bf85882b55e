/**
 * `@pulumi/kubernetes` is an optional peer dependency: a consumer stack that
 * does not publish to Kubernetes installs, type-checks and runs a pool
 * without it, and one that sets `kubernetes:` without it gets an error that
 * names the package and the command to install it. The packed package is
 * installed into a consumer project whose node_modules lacks
 * `@pulumi/kubernetes` (everything else is linked from this repository).
 */
import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { captureResourceInputs, packIntoConsumerProject, type ConsumerProject } from "./harness";
import { exampleNames, typeCheckStacks } from "./typecheck";
const KUBERNETES = "@pulumi/kubernetes";

const POOL_ARGS = {
  count: 2,
  backends: [
    { name: "kvm1", kvm: { connection: { host: "kvm1.lan" }, network: { bridge: "br0" } } },
  ],
};

/** A stack that uses the pool's Kubernetes-related types without publishing. */
const TYPED_STACK = `
import { EgressProxyPool, type KubernetesObjects, type KubernetesPublishingArgs } from "egress-proxies";

const pool = new EgressProxyPool("edge", ${JSON.stringify(POOL_ARGS)});
const publishing: KubernetesPublishingArgs = { namespace: "crawlers", name: "egress" };
const published: KubernetesObjects | undefined = pool.kubernetes;
export const endpoints = pool.endpoints;
export const unused = [publishing, published];
`;

describe(`a consumer stack without ${KUBERNETES} installed`, function () {
  this.timeout(120_000);
  let project: ConsumerProject;

  before(() => {
    project = packIntoConsumerProject({ without: [KUBERNETES] });
  });
  after(() => project?.remove());

  it("really lacks it, and the package's manifest does not make npm install it", () => {
    assert.throws(
      () => require.resolve(KUBERNETES, { paths: [project.dir] }),
      /Cannot find module/,
    );
    const manifest = JSON.parse(
      readFileSync(join(project.dir, "node_modules", project.packageName, "package.json"), "utf8"),
    ) as Record<string, Record<string, unknown> | undefined>;
    assert.equal(manifest.dependencies?.[KUBERNETES], undefined);
    assert.ok(manifest.peerDependencies?.[KUBERNETES], "declared as a peer dependency");
    assert.deepEqual(manifest.peerDependenciesMeta?.[KUBERNETES], { optional: true });
  });

  it("ships no .d.ts that imports it", () => {
    const dist = join(project.dir, "node_modules", project.packageName, "dist");
    const offenders = readdirSync(dist, { recursive: true, encoding: "utf8" })
      .filter((file) => file.endsWith(".d.ts"))
      .filter((file) =>
        /(from|import\()\s*["']@pulumi\/kubernetes["']/.test(
          readFileSync(join(dist, file), "utf8"),
        ),
      );
    assert.deepEqual(offenders, []);
  });

  it("type-checks the examples that do not publish, and a stack using the Kubernetes types, with the package's .d.ts checked too", () => {
    // Only egress-proxies' own declarations are checked in full; skipLibCheck would
    // silently turn an unresolved import in them into \`any\`.
    const result = typeCheckStacks(
      project,
      "stacks",
      [
        ...exampleNames().map((example) => ({ name: example, example })),
        { name: "typed", example: "consumer-stack", index: TYPED_STACK },
      ],
      { skipLibCheck: false },
    );
    const ours = result.errors.filter(
      (line) => !line.startsWith("../node_modules/@pulumi/pulumi/"),
    );
    // The one example that publishes imports the package itself, so it cannot compile here:
    // that it fails shows the package really is absent to tsc.
    assert.ok(
      ours.some((line) =>
        /^mixed-kubernetes\/index\.ts.*Cannot find module '@pulumi\/kubernetes'/.test(line),
      ),
      result.output,
    );
    assert.deepEqual(
      ours.filter((line) => !line.startsWith("mixed-kubernetes/")),
      [],
      result.output,
    );
  });

  it("runs a pool under Pulumi mocks", async () => {
    const captured = await captureResourceInputs(project, "EgressProxyPool", "edge", POOL_ARGS);
    assert.match(captured.type, /KvmProxy/);
  });

  it(`fails with the package name and \`npm install ${KUBERNETES}\` when kubernetes is set`, async () => {
    await assert.rejects(
      () =>
        captureResourceInputs(project, "EgressProxyPool", "published", {
          ...POOL_ARGS,
          kubernetes: { namespace: "crawlers", name: "egress" },
        }),
      (error: Error) =>
        /KubernetesPackageMissingError: EgressProxyPool published: kubernetes is set/.test(
          error.message,
        ) && error.message.includes("Run `npm install @pulumi/kubernetes`"),
    );
  });
});
