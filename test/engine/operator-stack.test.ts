/**
 * examples/operator-stack: the Pulumi Kubernetes Operator's `Stack` and the
 * RBAC it needs, checked against what they must match.
 *
 * - Every field path of the Stack exists in the operator's v2 `Stack` CRD
 *   with the type used. The paths are held here, not the CRD: read off
 *   operator/config/crd/bases/pulumi.com_stacks.yaml of
 *   pulumi/pulumi-kubernetes-operator at 475dbc6c (2.9.0 and 8 commits,
 *   August 2026), version `pulumi.com/v1`, the one it serves and stores.
 * - The workspace's ServiceAccount is the one the file defines, bound to
 *   `system:auth-delegator` (operator v2 needs it), and its Role in the
 *   pool's namespace grants every kind the pool really publishes there: the
 *   example's pool, run under mocks with the example's own stack config,
 *   says which.
 * - The Secrets and config keys the Stack feeds are the ones the program
 *   reads.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { loadAll, load } from "js-yaml";
import { packIntoConsumerProject, type ConsumerProject } from "./harness";

const EXAMPLE = resolve(__dirname, "..", "..", "..", "examples", "operator-stack");

type Manifest = {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string };
  [key: string]: unknown;
};

/** The Stack CRD's `spec` fields this example may use, with their schema types. */
const STACK_SPEC_FIELDS: Record<string, "string" | "boolean" | "integer" | "object"> = {
  stack: "string",
  serviceAccountName: "string",
  projectRepo: "string",
  repoDir: "string",
  branch: "string",
  commit: "string",
  backend: "string",
  refresh: "boolean",
  continueResyncOnCommitMatch: "boolean",
  resyncFrequencySeconds: "integer",
  destroyOnFinalize: "boolean",
  envRefs: "object",
  secretsRef: "object",
};
/** A ResourceRef (envRefs, secretsRef values): `type` (required) and the object it selects. */
const RESOURCE_REF_SELECTORS: Record<string, { field: string; required: string[] }> = {
  Secret: { field: "secret", required: ["name", "key"] },
  Env: { field: "env", required: ["name"] },
  FS: { field: "filesystem", required: ["path"] },
  Literal: { field: "literal", required: ["value"] },
};

const typeOf = (value: unknown): string =>
  Number.isInteger(value) ? "integer" : Array.isArray(value) ? "array" : typeof value;

/** A Kubernetes type token (kubernetes:core/v1:Secret) as the API group and resource RBAC names. */
function rbacResourceOf(type: string): { group: string; resource: string } {
  const [, groupVersion, kind] = type.split(":") as [string, string, string];
  const group = groupVersion.split("/")[0]!;
  return { group: group === "core" ? "" : group, resource: `${kind.toLowerCase()}s` };
}

/** The example's pool under Pulumi mocks, configured by its Pulumi.prod.yaml: what it registers. */
const MOCK_RUN = `
const pulumi = require("@pulumi/pulumi");
const [configFile, outFile] = process.argv.slice(2);
const seen = [];
process.env.PULUMI_CONFIG = require("node:fs").readFileSync(configFile, "utf8");
pulumi.runtime.setMocks(
  {
    newResource(resource) {
      seen.push({ type: resource.type, name: resource.name, inputs: resource.inputs });
      return { id: resource.name + "-id", state: { ...resource.inputs, ip: "192.0.2.10", state: "running" } };
    },
    call: (call) => call.inputs,
  },
  "egress-pool",
  "prod",
  false,
).then(async () => {
  const program = require("./operator-program.js");
  await program.endpoints.promise();
  const deadline = Date.now() + 10000;
  while (!seen.some((r) => r.type.includes("EndpointSlice")) && Date.now() < deadline)
    await new Promise((resolve) => setTimeout(resolve, 50));
  require("node:fs").writeFileSync(outFile, JSON.stringify(seen));
});
`;

describe("examples/operator-stack: the operator's Stack and its RBAC", function () {
  this.timeout(120_000);
  const manifests = loadAll(
    readFileSync(join(EXAMPLE, "operator", "stack.yaml"), "utf8"),
  ) as Manifest[];
  const find = (kind: string) => manifests.filter((manifest) => manifest.kind === kind);
  const stack = find("Stack")[0]!;
  const spec = stack.spec as Record<string, unknown>;
  const stackConfig = (
    load(readFileSync(join(EXAMPLE, "Pulumi.prod.yaml"), "utf8")) as {
      config: Record<string, unknown>;
    }
  ).config;
  let project: ConsumerProject;

  after(() => project?.remove());

  it("is a pulumi.com/v1 Stack whose every spec field is in the operator's CRD, with its type", () => {
    assert.equal(stack.apiVersion, "pulumi.com/v1");
    assert.equal(typeof spec.stack, "string", "spec.stack is the CRD's one required field");
    for (const [field, value] of Object.entries(spec)) {
      assert.ok(field in STACK_SPEC_FIELDS, `spec.${field} is not a field of the Stack CRD`);
      assert.equal(typeOf(value), STACK_SPEC_FIELDS[field], `spec.${field}`);
    }
    for (const refs of ["envRefs", "secretsRef"])
      for (const [name, ref] of Object.entries(spec[refs] as Record<string, Manifest>)) {
        const selector = RESOURCE_REF_SELECTORS[String(ref.type)];
        assert.ok(selector, `spec.${refs}.${name}.type must be one of Env, FS, Secret, Literal`);
        const selected = ref[selector.field] as Record<string, unknown> | undefined;
        for (const required of selector.required)
          assert.equal(
            typeof selected?.[required],
            "string",
            `spec.${refs}.${name}.${selector.field}.${required}`,
          );
      }
  });

  it("keeps reconciling: refresh before every up, a resync period, and no destroy when the object goes", () => {
    assert.equal(spec.refresh, true);
    assert.equal(spec.continueResyncOnCommitMatch, true);
    assert.ok(Number(spec.resyncFrequencySeconds) >= 60, "at least a minute between resyncs");
    assert.equal(spec.destroyOnFinalize, false);
  });

  it("runs as its own ServiceAccount, bound to system:auth-delegator", () => {
    const account = find("ServiceAccount").find(
      (sa) => sa.metadata.name === spec.serviceAccountName,
    );
    assert.ok(account, "the ServiceAccount spec.serviceAccountName names is in the file");
    assert.equal(account.metadata.namespace, stack.metadata.namespace);
    const delegator = find("ClusterRoleBinding").find(
      (binding) => (binding.roleRef as { name: string }).name === "system:auth-delegator",
    );
    assert.deepEqual(delegator?.subjects, [
      {
        kind: "ServiceAccount",
        name: account.metadata.name,
        namespace: account.metadata.namespace,
      },
    ]);
  });

  it("feeds the program the secrets it reads, from Secrets in the Stack's namespace", () => {
    const program = readFileSync(join(EXAMPLE, "index.ts"), "utf8");
    const secretKeys = [...program.matchAll(/requireSecret\("([^"]+)"\)/g)].map((m) => m[1]).sort();
    assert.deepEqual(Object.keys(spec.secretsRef as object).sort(), secretKeys);
    const configKeys = [...program.matchAll(/require(?:Object<[^>]+>|Number)?\("([^"]+)"\)/g)].map(
      (m) => `egress-pool:${m[1]}`,
    );
    for (const key of configKeys) assert.ok(key in stackConfig, `${key} is in Pulumi.prod.yaml`);
  });

  it("grants in the pool's namespace every kind the example's pool publishes there (the pool under mocks says which)", () => {
    project = packIntoConsumerProject();
    // The example's program as tsc would emit it, with its secrets given as the operator would.
    const compiled = spawnSync(
      process.execPath,
      [
        require.resolve("typescript/bin/tsc"),
        "--outDir",
        project.dir,
        "--module",
        "commonjs",
        "--target",
        "es2022",
        "--skipLibCheck",
        "--strict",
        "--types",
        "node",
        "--typeRoots",
        join(project.dir, "node_modules", "@types"),
        join(EXAMPLE, "index.ts"),
      ],
      { cwd: project.dir, encoding: "utf8" },
    );
    assert.equal(compiled.status, 0, compiled.stdout + compiled.stderr);
    writeFileSync(
      join(project.dir, "operator-program.js"),
      readFileSync(join(project.dir, "index.js")),
    );
    const config = {
      ...Object.fromEntries(
        Object.entries(stackConfig).map(([key, value]) => [
          key,
          typeof value === "string" ? value : JSON.stringify(value),
        ]),
      ),
      "egress-pool:kvmPrivateKey":
        "-----BEGIN OPENSSH PRIVATE KEY-----\nexample\n-----END OPENSSH PRIVATE KEY-----\n",
      "egress-pool:proxyPassword": "example password",
    };
    writeFileSync(join(project.dir, "operator-config.json"), JSON.stringify(config));
    writeFileSync(join(project.dir, "operator-run.js"), MOCK_RUN);
    const out = join(project.dir, "operator-seen.json");
    const run = spawnSync(process.execPath, ["operator-run.js", "operator-config.json", out], {
      cwd: project.dir,
      encoding: "utf8",
      timeout: 60_000,
      env: { ...process.env, PULUMI_TEST_MODE: "true" },
    });
    assert.equal(run.status, 0, run.stdout + run.stderr);
    const seen = JSON.parse(readFileSync(out, "utf8")) as Array<{
      type: string;
      inputs: { metadata?: { namespace?: string } };
    }>;
    const published = seen.filter((resource) => resource.type.startsWith("kubernetes:"));
    const namespace = (stackConfig["egress-pool:kubernetes"] as { namespace: string }).namespace;
    assert.deepEqual(
      [...new Set(published.map((resource) => resource.type))].sort(),
      [
        "kubernetes:core/v1:Secret",
        "kubernetes:core/v1:Service",
        "kubernetes:discovery.k8s.io/v1:EndpointSlice",
      ],
      "what this pool publishes (a change here must reach the Role)",
    );
    const role = find("Role").find((r) => r.metadata.namespace === namespace);
    assert.ok(role, `a Role in ${namespace}`);
    const binding = find("RoleBinding").find(
      (b) =>
        b.metadata.namespace === namespace &&
        (b.roleRef as { name: string }).name === role.metadata.name,
    );
    assert.deepEqual(binding?.subjects, [
      {
        kind: "ServiceAccount",
        name: spec.serviceAccountName,
        namespace: stack.metadata.namespace,
      },
    ]);
    const rules = role.rules as Array<{
      apiGroups: string[];
      resources: string[];
      verbs: string[];
    }>;
    for (const resource of published) {
      assert.equal(resource.inputs.metadata?.namespace, namespace, resource.type);
      const { group, resource: plural } = rbacResourceOf(resource.type);
      const rule = rules.find((r) => r.apiGroups.includes(group) && r.resources.includes(plural));
      assert.ok(rule, `the Role grants ${plural} in API group "${group}"`);
      for (const verb of ["get", "list", "create", "update", "patch", "delete"])
        assert.ok(rule.verbs.includes(verb), `${verb} ${plural}`);
    }
  });
});
