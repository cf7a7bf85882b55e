/**
 * The frozen API (docs/frozen-api.md): names that existing Pulumi state and
 * existing VMs depend on. Code of a later version reads them back, so each is
 * checked here against a literal value: moving provider/kvm/provider.ts,
 * renaming an export the stored closure calls, changing a type token or the
 * ownership mark fails this file until a shim (or a deliberate, documented
 * migration) is in place.
 *
 * The serialized provider is captured from the packed package under mocks,
 * exactly as a consumer's `pulumi up` would store it (test/engine/harness.ts).
 */
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import * as pulumi from "@pulumi/pulumi";
import * as mark from "../../provider/common/mark";
import * as partial from "../../provider/common/partial-create";
import * as domainXml from "../../provider/kvm/domain-xml";
import * as naming from "../../provider/kvm/naming";
import * as proxmox from "../../provider/proxmox/provider";
import { captureResourceInputs, packIntoConsumerProject, type ConsumerProject } from "./harness";
import { STORED_PROVIDER_CLOSURES_0_1_0 } from "./stored-provider-closures";

const PACKAGE = "egress-proxies";
/** Loads a file of the installed package as Pulumi's provider process would. */
const load = createRequire(__filename);

interface FrozenResource {
  /** The package-relative module the stored closure requires. */
  module: string;
  /** What the dynamic-provider server calls on the stored provider, which is the module itself. */
  exports: readonly string[];
  /** Names closures stored by earlier releases call: exported for them, not called by new ones. */
  formerExports: readonly string[];
  type: string;
  /** Enough args to construct the resource under mocks (nothing is contacted). */
  args: Record<string, unknown>;
  /** Declared outputs that old state carries and later code reads back. */
  stateKeys: readonly string[];
  /** Whether check names a VM (vmName / vmNameChosenBy in state); a static proxy has no VM. */
  namesVm: boolean;
}

/** The frozen list. A new dynamic resource adds its row here and in docs/frozen-api.md. */
const FROZEN_RESOURCES: Record<string, FrozenResource> = {
  KvmProxy: {
    module: "dist/provider/kvm/provider.js",
    exports: ["configure", "check", "diff", "create", "read", "update", "delete"],
    // What the closures stored up to 0.1.0 call (seven wrappers around the module).
    formerExports: ["remove"],
    type: "pulumi-nodejs:dynamic/egress-proxies:KvmProxy",
    args: {
      image: { url: "https://images.invalid/debian-13.qcow2" },
      connection: { host: "kvm.invalid" },
    },
    stateKeys: ["vmName", "libvirtUuid"],
    namesVm: true,
  },
  ProxmoxProxy: {
    module: "dist/provider/proxmox/provider.js",
    exports: ["configure", "check", "diff", "create", "read", "update", "delete"],
    // What the closures stored by earlier versions call: still exported, no longer called.
    formerExports: ["remove", "deleteProxy"],
    type: "pulumi-nodejs:dynamic/egress-proxies:ProxmoxProxy",
    args: { node: "pve", apiEndpoint: "https://pve.invalid:8006" },
    stateKeys: ["vmName", "vmid"],
    namesVm: true,
  },
  StaticProxy: {
    module: "dist/provider/static/provider.js",
    exports: ["check", "diff", "create", "read", "update", "delete"],
    formerExports: ["remove"],
    type: "pulumi-nodejs:dynamic/egress-proxies:StaticProxy",
    args: { url: "http://proxy.invalid:3128" },
    stateKeys: ["endpoint", "state"],
    namesVm: false,
  },
};

const POOL_TYPE = "egress-proxies:index:EgressProxyPool";

type StoredProvider = Record<string, (...args: unknown[]) => Promise<unknown>> & {
  check(olds: object, news: object): Promise<unknown>;
};

/** A stored `__provider` evaluated as the dynamic-provider server does, inside the consumer project. */
function evaluateStoredClosure(project: ConsumerProject, stored: string): StoredProvider {
  const inProject = createRequire(join(project.dir, "index.js"));
  const requireFromString = inProject("require-from-string") as (
    code: string,
    filename: string,
  ) => { handler(): StoredProvider };
  return requireFromString(stored, join(project.dir, "stored-provider.js")).handler();
}

/** `const x = require("egress-proxies/…")` lines of a serialized closure, and what it calls on each. */
function requiresOf(serialized: string): Array<{ path: string; calls: string[] }> {
  const found: Array<{ path: string; calls: string[] }> = [];
  for (const match of serialized.matchAll(/(?:(\w+)\s*=\s*)?require\("([^"]+)"\)/g)) {
    const [, variable, path] = match;
    const calls =
      variable === undefined
        ? []
        : [...serialized.matchAll(new RegExp(`\\b${variable}\\.(\\w+)\\(`, "g"))].map((m) => m[1]);
    found.push({ path, calls: [...new Set(calls)].sort() });
  }
  return found;
}

describe("frozen API: what existing state and VMs depend on (docs/frozen-api.md)", function () {
  this.timeout(120_000);
  let project: ConsumerProject;
  let installed: string;

  before(() => {
    project = packIntoConsumerProject();
    installed = join(project.dir, "node_modules", PACKAGE);
  });

  after(() => project?.remove());

  it("every dynamic resource the package exports is on the frozen list", () => {
    const entry = load(installed) as Record<string, unknown>;
    const dynamic = Object.entries(entry)
      .filter(
        ([, value]) =>
          typeof value === "function" && value.prototype instanceof pulumi.dynamic.Resource,
      )
      .map(([name]) => name)
      .sort();
    assert.deepEqual(dynamic, Object.keys(FROZEN_RESOURCES).sort());
  });

  it("the package has no exports map that would block the stored deep requires", () => {
    const manifest = JSON.parse(readFileSync(join(installed, "package.json"), "utf8")) as {
      exports?: unknown;
    };
    assert.equal(manifest.exports, undefined);
  });

  for (const [name, frozen] of Object.entries(FROZEN_RESOURCES)) {
    describe(name, () => {
      it(`${frozen.module} is in the packed package and exports what the stored closure calls`, () => {
        const file = join(installed, frozen.module);
        assert.ok(existsSync(file), `${frozen.module} is missing from the packed package`);
        const module = load(file) as Record<string, unknown>;
        for (const method of [...frozen.exports, ...frozen.formerExports])
          assert.equal(typeof module[method], "function", `${frozen.module} must export ${method}`);
      });

      it("its serialized provider is the frozen module itself: one require, nothing else stored", async () => {
        const captured = await captureResourceInputs(project, name, "frozen", frozen.args);
        assert.equal(captured.type, frozen.type);
        const stored = String(captured.inputs.__provider);
        const requires = requiresOf(stored);
        assert.deepEqual(
          requires.map((r) => r.path),
          [`${PACKAGE}/${frozen.module}`],
          "the closure stored in state requires exactly the frozen module; a moved module needs a shim at the old path, a new path is frozen from its first release (add it here and to docs/frozen-api.md)",
        );
        const provider = evaluateStoredClosure(project, stored);
        assert.equal(
          provider,
          load(join(installed, frozen.module)),
          "the stored provider is the module",
        );
        for (const method of frozen.exports)
          assert.equal(typeof provider[method], "function", `the server calls ${method}`);
        assert.ok(
          stored.length < 600,
          `the stored provider is ${stored.length} bytes, once per input and output`,
        );
      });

      it("the closure releases up to 0.1.0 stored still runs: it calls only former or frozen exports, and its check is today's", async () => {
        const stored = STORED_PROVIDER_CLOSURES_0_1_0[name];
        const requires = requiresOf(stored);
        assert.deepEqual(
          requires.map((r) => r.path),
          [`${PACKAGE}/${frozen.module}`],
        );
        for (const call of requires[0].calls)
          assert.ok(
            [...frozen.exports, ...frozen.formerExports].includes(call),
            `old state calls ${call}, which must stay exported`,
          );
        const provider = evaluateStoredClosure(project, stored);
        const captured = await captureResourceInputs(project, name, "frozen", frozen.args);
        const module = load(join(installed, frozen.module)) as typeof provider;
        // Olds with a name already chosen: check would otherwise draw a new random one each call.
        const { inputs: olds } = (await module.check({}, captured.inputs)) as { inputs: object };
        assert.deepEqual(
          await provider.check(olds, captured.inputs),
          await module.check(olds, captured.inputs),
        );
      });

      if (frozen.namesVm)
        it("check reuses a generated name that old state records under vmName and vmNameChosenBy", async () => {
          const captured = await captureResourceInputs(project, name, "frozen", frozen.args);
          const module = load(join(installed, frozen.module)) as {
            check(olds: object, news: object): Promise<{ inputs: Record<string, unknown> }>;
          };
          // Old state: checked inputs (defaults filled) with a name an earlier version generated.
          const first = await module.check({}, captured.inputs);
          const olds = {
            ...first.inputs,
            vmName: "frozen-abcdefghij",
            vmNameChosenBy: "provider",
          };
          const { inputs } = await module.check(olds, captured.inputs);
          assert.equal(inputs.vmName, "frozen-abcdefghij");
          assert.equal(inputs.vmNameChosenBy, "provider");
        });

      it(`declares the outputs old state carries: ${frozen.stateKeys.join(", ")}`, () => {
        const resourceTypes = readFileSync(
          join(installed, frozen.module.replace(/provider\.js$/, "resource.d.ts")),
          "utf8",
        );
        for (const key of frozen.stateKeys)
          assert.match(resourceTypes, new RegExp(`readonly ${key}: pulumi\\.Output<`));
      });
    });
  }

  it("the pool's component type token", () => {
    const components = load(installed) as { EGRESS_PROXY_POOL_TYPE: string };
    assert.equal(components.EGRESS_PROXY_POOL_TYPE, POOL_TYPE);
  });
});

describe("frozen API: the ownership mark, ids, names and state keys (literal values)", () => {
  const MARK: mark.OwnershipMark = {
    managed: true,
    owner: { project: "shop", stack: "prod", resource: "edge a=b" },
    createdAt: "2026-01-02T03:04:05.678Z",
    packageVersion: "0.1.0",
  };
  /** As written on libvirt domains since the first release. */
  const LIBVIRT_MARK =
    '<egress:mark xmlns:egress="urn:egress-proxies:ownership:1" managed="true" project="shop" ' +
    'stack="prod" resource="edge a=b" createdAt="2026-01-02T03:04:05.678Z" version="0.1.0"/>';
  /** As written in Proxmox VM descriptions since the first release. */
  const PROXMOX_MARK = [
    "[egress-proxies]",
    "managed=true",
    "project=shop",
    "stack=prod",
    "resource=edge%20a%3Db",
    "createdAt=2026-01-02T03%3A04%3A05.678Z",
    "version=0.1.0",
  ].join("\n");

  it("the mark's namespace, prefix, element name and Proxmox tag", () => {
    assert.equal(mark.MARK_XML_NAMESPACE, "urn:egress-proxies:ownership:1");
    assert.equal(mark.MARK_XML_PREFIX, "egress");
    assert.equal(mark.MARK_TAG, "egress-proxies");
    assert.equal(domainXml.markElementXml(MARK).trim(), LIBVIRT_MARK);
    assert.equal(mark.markToText(MARK), PROXMOX_MARK);
  });

  it("marks written by earlier versions are still read as ours", () => {
    assert.deepEqual(domainXml.parseMarkElementXml(LIBVIRT_MARK), { kind: "marked", mark: MARK });
    const description = `Egress proxy edge-x, managed by egress-proxies.\n\n${PROXMOX_MARK}`;
    assert.deepEqual(mark.markFromText(description), { kind: "marked", mark: MARK });
  });

  it("resource ids, KVM volume names and the partial-create key", () => {
    assert.equal(naming.kvmResourceId("kvm1:2222", "edge-x"), "hosts/kvm1:2222/domains/edge-x");
    assert.equal(proxmox.resourceId({ node: "pve", vmid: 20001 }), "nodes/pve/qemu/20001");
    assert.equal(naming.overlayVolumeName("edge-x"), "edge-x.qcow2");
    assert.equal(naming.seedVolumeName("edge-x"), "edge-x-seed.iso");
    assert.equal(naming.BASE_IMAGE_PREFIX, "egress-base-");
    assert.equal(partial.CREATE_INCOMPLETE_KEY, "createIncomplete");
  });
});
