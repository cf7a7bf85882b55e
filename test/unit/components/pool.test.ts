/**
 * EgressProxyPool under pulumi.runtime.setMocks: what it declares (children,
 * their inputs, Kubernetes objects), scaling without touching survivors,
 * secrets staying secret, and preview with unknown values. The code under
 * test is imported after setMocks, as the SDK requires, and from the packed
 * package installed in a consumer project: Pulumi serializes a dynamic
 * provider that lives outside node_modules by value, which is not how users
 * run it (and fails on zod's export map), so the in-repo copy cannot be used.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import * as pulumi from "@pulumi/pulumi";
import type * as poolModule from "../../../components/pool";
import { packIntoConsumerProject, type ConsumerProject } from "../../engine/harness";

interface Registered {
  type: string;
  name: string;
  inputs: Record<string, unknown>;
}

let registered: Registered[] = [];

/** The SDK's wire marker for a secret: mocks see secret inputs wrapped in it. */
const SECRET_SIGNATURE_KEY = "4dabf18193072939515e22adb298388d";
const isSecretValue = (value: unknown): boolean =>
  typeof value === "object" && value !== null && SECRET_SIGNATURE_KEY in value;
/** Inputs as a provider sees them: secrets unwrapped. */
function plain(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(plain);
  if (isSecretValue(value)) return plain((value as { value: unknown }).value);
  if (typeof value === "object" && value !== null)
    return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, plain(item)]));
  return value;
}
let previewMode = false;

async function useMocks(preview: boolean): Promise<void> {
  previewMode = preview;
  await pulumi.runtime.setMocks(
    {
      newResource(args) {
        registered.push({ type: args.type, name: args.name, inputs: args.inputs });
        const inputs = plain(args.inputs) as Record<string, unknown>;
        // In preview nothing is created: outputs the provider computes stay unknown.
        if (previewMode) return { id: undefined as unknown as string, state: {} };
        const index = registered.length;
        const state: Record<string, unknown> = { ...inputs };
        if (args.type.includes("KvmProxy") || args.type.includes("ProxmoxProxy")) {
          state.vmName = `${args.name}-abcdefghij`;
          state.host = args.type.includes("Kvm") ? "kvm1.lan" : "pve1";
          state.ip = `198.51.100.${10 + index}`;
          state.checkedAt = "2026-11-30T12:00:00.000Z";
          // What an egress check would see: every KVM proxy behind one NAT address, Proxmox ones apart.
          if (inputs.egressCheck !== undefined)
            state.egressIp = args.type.includes("Kvm") ? "203.0.113.1" : `203.0.113.${100 + index}`;
          // A proxy that takes IPv6 (ipFamilies) reports its address; IPv6 only, it is its ip too.
          const families = inputs.ipFamilies as string[] | undefined;
          if (families?.includes("ipv6")) {
            state.ipv6Address = `2001:db8:1::${10 + index}`;
            if (!families.includes("ipv4")) state.ip = state.ipv6Address;
            const check = inputs.egressCheck as { ipv6Url?: string } | undefined;
            state.egressIpv6 = check?.ipv6Url === undefined ? null : `2001:db8:ffff::${index}`;
          }
        }
        // What a refresh finds when a VM was stopped by hand: the member named "*-stopped-*".
        if (args.type.includes("KvmProxy") || args.type.includes("ProxmoxProxy")) {
          state.state = args.name.includes("-stopped-") ? "stopped" : "running";
          state.createdAt = "2026-11-01T00:00:00.000Z";
        }
        // What a refresh with the egress re-check finds when squid stopped answering: "*-silent-*".
        state.egressProblem = args.name.includes("-silent-")
          ? {
              kind: "unanswered",
              reason: "connect ECONNREFUSED 198.51.100.12:3128",
              since: "2026-12-02T10:00:00.000Z",
            }
          : null;
        if (args.type.includes("StaticProxy")) {
          const url = new URL(String(inputs.url));
          state.host = url.hostname;
          state.port = Number(url.port);
          state.ip = /^[\d.]+$/.test(url.hostname) ? url.hostname : null;
          state.endpoint = `http://${url.hostname}:${url.port}`;
          state.checkedAt = "2026-11-30T12:00:00.000Z";
          if (inputs.egressCheck !== undefined) state.egressIp = "192.0.2.200";
        }
        return { id: `${args.name}-id`, state };
      },
      call: (args) => args.inputs,
    },
    "pool-test",
    "unit",
    preview,
  );
}

const valueOf = <T>(output: pulumi.Output<T>): Promise<T> =>
  new Promise((resolve) => output.apply((value) => resolve(value)));
const isSecret = (output: pulumi.Output<unknown>): Promise<boolean> =>
  (output as unknown as { isSecret: Promise<boolean> }).isSecret;
const isKnown = (output: pulumi.Output<unknown>): Promise<boolean> =>
  (output as unknown as { isKnown: Promise<boolean> }).isKnown;

/** Lets the SDK finish registering everything declared so far. */
const settle = () => new Promise((resolve) => setTimeout(resolve, 50));

const KVM = (name: string, extra: Record<string, unknown> = {}) => ({
  name,
  ...extra,
  kvm: { connection: { host: `${name}.lan` }, network: { bridge: "br0" } },
});
const PROXMOX = (name: string, extra: Record<string, unknown> = {}) => ({
  name,
  ...extra,
  proxmox: { node: name, templateVmid: 9000, diskStorage: "local-lvm", seedStorage: "local" },
});

const STATIC = (name: string, urls: string[], extra: Record<string, unknown> = {}) => ({
  name,
  ...extra,
  static: { urls },
});

describe("EgressProxyPool (under Pulumi mocks)", function () {
  this.timeout(120_000);
  let pool: typeof poolModule;
  let project: ConsumerProject;

  before(async () => {
    await useMocks(false);
    project = packIntoConsumerProject();
    // eslint-disable-next-line @typescript-eslint/no-require-imports
    pool = require(
      join(project.dir, "node_modules", project.packageName, "dist/components/pool.js"),
    );
  });
  beforeEach(() => (registered = []));
  after(async () => {
    await useMocks(false);
    project?.remove();
  });

  const proxiesOf = () => registered.filter((r) => /KvmProxy|ProxmoxProxy/.test(r.type));

  it("declares one child per placed proxy, parented, with stable names and the squid document", async () => {
    const instance = new pool.EgressProxyPool("edge", {
      backends: [KVM("kvm1"), KVM("kvm2"), PROXMOX("pve1")],
      count: 4,
      machine: { cpus: 2, memoryMiB: 768 },
      tags: ["crawler"],
    });
    const proxies = await valueOf(instance.proxies);
    await settle();
    assert.equal(registered[0].type, pool.EGRESS_PROXY_POOL_TYPE);
    assert.equal(pool.EGRESS_PROXY_POOL_TYPE, "egress-proxies:index:EgressProxyPool");
    assert.deepEqual(
      proxiesOf().map((r) => [r.type.split(":").at(-1), r.name]),
      [
        ["KvmProxy", "edge-kvm1-0"],
        ["KvmProxy", "edge-kvm1-1"],
        ["KvmProxy", "edge-kvm2-0"],
        ["ProxmoxProxy", "edge-pve1-0"],
      ],
    );
    const [kvm, , , proxmox] = proxiesOf().map((r) => ({
      ...r,
      inputs: plain(r.inputs) as Record<string, unknown>,
    }));
    assert.ok(isSecretValue(proxiesOf()[0].inputs.userData), "user-data is a secret input");
    assert.equal(kvm.inputs.vcpus, 2);
    assert.equal(kvm.inputs.memoryMiB, 768);
    assert.deepEqual(kvm.inputs.image, pool.DEFAULT_KVM_IMAGE);
    assert.deepEqual(kvm.inputs.readiness, { mode: "port", port: 3128 });
    assert.match(String(kvm.inputs.userData), /^#cloud-config\n/);
    assert.equal(proxmox.inputs.cores, 2);
    assert.deepEqual(proxmox.inputs.tags, ["crawler"]);
    assert.equal(await valueOf(instance.count), 4);
    const childUrn = await valueOf(instance.children.get("kvm1-0")!.urn);
    assert.match(
      childUrn,
      /::egress-proxies:index:EgressProxyPool\$pulumi-nodejs:dynamic\/egress-proxies:KvmProxy::edge-kvm1-0$/,
    );
    assert.deepEqual(
      proxies.map((proxy) => [proxy.name, proxy.backend, proxy.kind, proxy.host]),
      [
        ["kvm1-0", "kvm1", "kvm", "kvm1.lan"],
        ["kvm1-1", "kvm1", "kvm", "kvm1.lan"],
        ["kvm2-0", "kvm2", "kvm", "kvm1.lan"],
        ["pve1-0", "pve1", "proxmox", "pve1"],
      ],
    );
    const endpoints = await valueOf(instance.endpoints);
    assert.equal(endpoints.length, 4);
    assert.ok(
      endpoints.every((url) => /^http:\/\/198\.51\.100\.\d+:3128$/.test(url)),
      endpoints.join(),
    );
    assert.deepEqual(
      proxies.map((proxy) => proxy.endpoint),
      endpoints,
    );
  });

  it("scaling up or down keeps every survivor's name and inputs (nothing replaced)", async () => {
    const declare = async (count: number) => {
      registered = [];
      const instance = new pool.EgressProxyPool("scale", {
        backends: [KVM("a"), KVM("b", { weight: 2 }), PROXMOX("c")],
        count,
      });
      await valueOf(instance.proxies);
      await settle();
      return new Map(proxiesOf().map((r) => [r.name, JSON.stringify(r.inputs)]));
    };
    const three = await declare(3);
    const six = await declare(6);
    const two = await declare(2);
    assert.deepEqual([three.size, six.size, two.size], [3, 6, 2]);
    for (const [name, inputs] of three)
      assert.equal(six.get(name), inputs, `${name} unchanged when growing`);
    for (const [name, inputs] of two)
      assert.equal(three.get(name), inputs, `${name} unchanged when shrinking`);
  });

  it("keeps the basic-auth password secret: hash on the VM, secret URLs, plain URLs without it", async () => {
    const password = "s3cret horse/battery";
    const instance = new pool.EgressProxyPool("auth", {
      backends: [KVM("kvm1")],
      count: 2,
      squid: {
        port: 8080,
        basicAuth: { user: "crawler", password },
        allowedClientCidrs: ["10.1.0.0/16"],
      },
      kubernetes: { namespace: "crawlers", name: "egress" },
    });
    const withCredentials = await valueOf(instance.endpointsWithCredentials);
    await settle();
    assert.equal(await isSecret(instance.endpointsWithCredentials), true);
    assert.ok(
      withCredentials.every((url) => url.startsWith("http://crawler:s3cret%20horse%2Fbattery@")),
    );
    assert.equal(await isSecret(instance.endpoints), false);
    assert.ok((await valueOf(instance.endpoints)).every((url) => !url.includes("s3cret")));
    assert.equal(await isSecret(instance.proxies), false);
    // Nothing registered carries the password except the Kubernetes Secret's data, which is secret.
    for (const resource of registered.filter((r) => r.type !== "kubernetes:core/v1:Secret"))
      assert.ok(
        !JSON.stringify(resource.inputs).includes("s3cret"),
        `${resource.name} carries the password`,
      );
    const child = proxiesOf()[0];
    assert.ok(isSecretValue(child.inputs.userData));
    assert.match(String(plain(child.inputs.userData)), /crawler:\$6\$/);
    const secretObject = registered.find((r) => r.type === "kubernetes:core/v1:Secret")!;
    assert.ok(
      isSecretValue(secretObject.inputs.stringData),
      "the Secret's data is registered as a secret",
    );
  });

  it("takes a static backend like the others: its URLs by index, weights, credentials secret", async () => {
    const instance = new pool.EgressProxyPool("mixed", {
      backends: [
        KVM("kvm1"),
        STATIC("shop", ["http://buyer:s3cret@203.0.113.7:3128", "http://proxy.shop.example:8080"], {
          weight: 2,
        }),
      ],
      count: 3,
      egressCheck: { url: "http://check.example/ip" },
    });
    const proxies = await valueOf(instance.proxies);
    await settle();
    assert.deepEqual(
      proxies.map((proxy) => [proxy.name, proxy.kind, proxy.endpoint]),
      [
        ["kvm1-0", "kvm", proxies[0]!.endpoint],
        ["shop-0", "static", "http://203.0.113.7:3128"],
        ["shop-1", "static", "http://proxy.shop.example:8080"],
      ],
    );
    const statics = registered.filter((r) => r.type.includes("StaticProxy"));
    assert.deepEqual(
      statics.map((r) => r.type),
      [
        "pulumi-nodejs:dynamic/egress-proxies:StaticProxy",
        "pulumi-nodejs:dynamic/egress-proxies:StaticProxy",
      ],
    );
    assert.ok(isSecretValue(statics[0]!.inputs.url), "a URL with credentials is a secret input");
    const first = plain(statics[0]!.inputs) as Record<string, unknown>;
    assert.deepEqual(first.readiness, { mode: "port" });
    // The proxy's own credentials go with the egress check, not squid's.
    assert.deepEqual(first.egressCheck, { url: "http://check.example/ip" });
    const endpoints = await valueOf(instance.endpoints);
    assert.deepEqual(endpoints.slice(1), [
      "http://203.0.113.7:3128",
      "http://proxy.shop.example:8080",
    ]);
    assert.ok(endpoints.every((url) => !url.includes("s3cret")));
    assert.equal(await isSecret(instance.endpointsWithCredentials), true);
    assert.deepEqual((await valueOf(instance.endpointsWithCredentials)).slice(1), [
      "http://buyer:s3cret@203.0.113.7:3128",
      "http://proxy.shop.example:8080",
    ]);
    assert.deepEqual(
      proxies.map((proxy) => proxy.egressIp),
      ["203.0.113.1", "192.0.2.200", "192.0.2.200"],
    );
  });

  it("refuses more proxies than a static backend lists, naming the backend and the fix", () => {
    const fixed = pool.poolArgsProblems({
      backends: [STATIC("shop", ["http://203.0.113.7:3128"], { count: 2 })],
    });
    assert.ok(
      fixed.some((problem) =>
        /backends\[0\]\.count is 2 but that backend has only 1 proxy; lower its count or list more/.test(
          problem,
        ),
      ),
      fixed.join("; "),
    );
    const weighted = pool.poolArgsProblems({
      backends: [
        STATIC("a", ["http://203.0.113.7:3128"]),
        STATIC("b", ["http://203.0.113.8:3128"]),
      ],
      count: 3,
    });
    assert.ok(
      weighted.some((problem) =>
        /count is 3 but the backends hold at most 2 proxies/.test(problem),
      ),
      weighted.join("; "),
    );
    // With a VM backend beside them there is always room: the rest go there.
    assert.deepEqual(
      pool.poolArgsProblems({
        backends: [STATIC("a", ["http://203.0.113.7:3128"], { weight: 5 }), KVM("kvm1")],
        count: 4,
      }),
      [],
    );
  });

  it("publishes static proxies in the Secret, and in the EndpointSlice only an IPv4 on the pool's port", async () => {
    const instance = new pool.EgressProxyPool("k8s-static", {
      backends: [
        KVM("kvm1"),
        STATIC("shop", [
          "http://203.0.113.7:3128",
          "http://proxy.shop.example:3128",
          "http://203.0.113.9:8080",
        ]),
      ],
      count: 4,
      kubernetes: { namespace: "crawlers", name: "egress" },
    });
    const endpoints = await valueOf(instance.endpoints);
    await settle();
    const byType = (type: string) =>
      plain(registered.find((r) => r.type === type)!.inputs) as never;
    const secret = byType("kubernetes:core/v1:Secret") as { stringData: Record<string, string> };
    const slice = byType("kubernetes:discovery.k8s.io/v1:EndpointSlice") as {
      endpoints: Array<{ addresses: string[] }>;
    };
    assert.equal(endpoints.length, 4);
    assert.equal(secret.stringData["proxies.txt"], endpoints.map((url) => `${url}\n`).join(""));
    const published = JSON.parse(secret.stringData["proxies.json"]) as Array<{ url: string }>;
    assert.deepEqual(
      published.map((entry) => entry.url),
      endpoints,
    );
    assert.deepEqual(
      slice.endpoints.map((endpoint) => endpoint.addresses[0]),
      [
        ...(await valueOf(instance.proxies))
          .filter((proxy) => proxy.kind === "kvm")
          .map((proxy) => proxy.ip),
        "203.0.113.7",
      ],
    );
  });

  it("publishes to Kubernetes: Secret with URLs, selector-less Service, EndpointSlice of VM IPs", async () => {
    const instance = new pool.EgressProxyPool("k8s", {
      backends: [KVM("kvm1"), PROXMOX("pve1")],
      count: 2,
      kubernetes: { namespace: "crawlers", name: "egress", labels: { team: "data" } },
    });
    const endpoints = await valueOf(instance.endpoints);
    await settle();
    const byType = (type: string) =>
      plain(registered.find((r) => r.type === type)!.inputs) as never;
    const secret = byType("kubernetes:core/v1:Secret") as {
      metadata: { name: string; namespace: string; labels: Record<string, string> };
      stringData: Record<string, string>;
    };
    const service = byType("kubernetes:core/v1:Service") as {
      metadata: { name: string; labels: Record<string, string> };
      spec: { selector?: unknown; ports: Array<{ port: number }> };
    };
    const slice = byType("kubernetes:discovery.k8s.io/v1:EndpointSlice") as {
      metadata: { name: string; labels: Record<string, string> };
      addressType: string;
      endpoints: Array<{ addresses: string[]; conditions: { ready?: boolean } }>;
      ports: Array<{ port: number }>;
    };
    assert.deepEqual(
      slice.endpoints.map((endpoint) => endpoint.conditions),
      [{ ready: true }, { ready: true }],
    );
    assert.deepEqual([secret.metadata.name, secret.metadata.namespace], ["egress", "crawlers"]);
    assert.equal(secret.stringData["proxies.txt"], endpoints.map((url) => `${url}\n`).join(""));
    const published = JSON.parse(secret.stringData["proxies.json"]) as Array<
      Record<string, unknown>
    >;
    assert.deepEqual(
      published.map((entry) => entry.url),
      endpoints,
    );
    // What readiness found at create (mode "port", no egress check), not a constant; no check time.
    assert.deepEqual(published[0], {
      url: endpoints[0],
      ready: true,
      egressIp: null,
      checkedAt: null,
    });
    assert.equal(service.spec.selector, undefined, "no selector: the slice lists the endpoints");
    assert.equal(service.spec.ports[0].port, 3128);
    assert.equal(slice.metadata.labels["kubernetes.io/service-name"], "egress");
    assert.equal(slice.addressType, "IPv4");
    assert.deepEqual(
      slice.endpoints.flatMap((endpoint) => endpoint.addresses).map((ip) => `http://${ip}:3128`),
      endpoints,
    );
    for (const labels of [secret.metadata.labels, service.metadata.labels, slice.metadata.labels]) {
      assert.equal(labels["app.kubernetes.io/part-of"], "egress-proxies");
      assert.equal(labels["app.kubernetes.io/instance"], "egress");
      assert.equal(labels["app.kubernetes.io/managed-by"], "pulumi");
      assert.equal(labels.team, "data");
    }
  });

  it("dual stack: both URLs per proxy, both families in the member list the exporter writes its slices from, a PreferDualStack Service", async () => {
    const instance = new pool.EgressProxyPool("dual", {
      backends: [KVM("kvm1"), PROXMOX("pve1"), KVM("kvm2")],
      count: 3,
      ipFamilies: ["ipv4", "ipv6"],
      squid: { allowedClientCidrs: ["10.0.0.0/8", "fd00::/8"] },
      egressCheck: { url: "http://192.0.2.7/ip", ipv6Url: "http://[2001:db8::7]/ip" },
      kubernetes: {
        namespace: "crawlers",
        name: "egress",
        exporter: {
          target: "http://example.com/",
          egressUrl: "http://192.0.2.7/ip",
          egressUrlIpv6: "http://[2001:db8::7]/ip",
        },
      },
    } as never);
    const [endpoints, proxies] = await Promise.all([
      valueOf(instance.endpoints),
      valueOf(instance.proxies),
    ]);
    await settle();
    const kvm = plain(registered.find((r) => r.type.includes("KvmProxy"))!.inputs) as {
      ipFamilies: string[];
      egressCheck: { ipv6Url: string };
    };
    assert.deepEqual(kvm.ipFamilies, ["ipv4", "ipv6"], "the pool's families reach its members");
    assert.equal(kvm.egressCheck.ipv6Url, "http://[2001:db8::7]/ip");
    const v6 = proxies.map((proxy) => proxy.ipv6Address);
    assert.ok(
      v6.every((address) => typeof address === "string" && address.startsWith("2001:db8:1::")),
    );
    assert.deepEqual(
      endpoints,
      proxies.flatMap((proxy) => [`http://${proxy.ip}:3128`, `http://[${proxy.ipv6Address}]:3128`]),
    );
    assert.ok(proxies.every((proxy) => proxy.egressIpv6?.startsWith("2001:db8:ffff::")));
    // The exporter writes both families' slices: Pulumi declares none, and lists the members in the Secret.
    assert.equal(
      registered.filter((r) => r.type === "kubernetes:discovery.k8s.io/v1:EndpointSlice").length,
      0,
    );
    const secret = plain(
      registered.find((r) => r.type === "kubernetes:core/v1:Secret")!.inputs,
    ) as { stringData: Record<string, string> };
    assert.deepEqual(JSON.parse(secret.stringData["endpoints.json"]!), {
      port: 3128,
      ipv4: proxies.map((proxy) => proxy.ip),
      ipv6: v6,
    });
    const service = plain(
      registered.find((r) => r.type === "kubernetes:core/v1:Service")!.inputs,
    ) as { spec: { ipFamilyPolicy?: string } };
    assert.equal(service.spec.ipFamilyPolicy, "PreferDualStack");
    const deployment = plain(
      registered.find((r) => r.type === "kubernetes:apps/v1:Deployment")!.inputs,
    ) as { spec: { template: { spec: { containers: Array<{ command: string[] }> } } } };
    const command = deployment.spec.template.spec.containers[0]!.command;
    const egressUrlIpv6 = command.indexOf("--egress-url-ipv6");
    assert.equal(command[egressUrlIpv6 + 1], "http://[2001:db8::7]/ip");
    assert.equal(command[command.indexOf("--endpointslices") + 1], "crawlers/egress");
    const role = plain(
      registered.find((r) => r.type === "kubernetes:rbac.authorization.k8s.io/v1:Role")!.inputs,
    ) as { rules: Array<{ resourceNames?: string[]; verbs: string[] }> };
    assert.deepEqual(role.rules[0]!.resourceNames, ["egress-checked", "egress-checked-ipv6"]);
  });

  it("dual stack without the exporter: Pulumi writes an IPv6 EndpointSlice beside the IPv4 one", async () => {
    const instance = new pool.EgressProxyPool("dual", {
      backends: [KVM("kvm1"), KVM("kvm2")],
      count: 2,
      ipFamilies: ["ipv4", "ipv6"],
      squid: { allowedClientCidrs: ["10.0.0.0/8", "fd00::/8"] },
      kubernetes: { namespace: "crawlers", name: "egress" },
    } as never);
    const proxies = await valueOf(instance.proxies);
    await settle();
    const slices = registered
      .filter((r) => r.type === "kubernetes:discovery.k8s.io/v1:EndpointSlice")
      .map((r) => plain(r.inputs)) as Array<{
      metadata: { name: string; labels: Record<string, string> };
      addressType: string;
      endpoints: Array<{ addresses: string[] }>;
    }>;
    assert.deepEqual(
      slices.map((slice) => [slice.metadata.name, slice.addressType]),
      [
        ["egress-vms", "IPv4"],
        ["egress-vms-ipv6", "IPv6"],
      ],
    );
    assert.deepEqual(
      slices[1]!.endpoints.flatMap((endpoint) => endpoint.addresses),
      proxies.map((proxy) => proxy.ipv6Address),
    );
    assert.equal(slices[1]!.metadata.labels["kubernetes.io/service-name"], "egress");
    const secret = plain(
      registered.find((r) => r.type === "kubernetes:core/v1:Secret")!.inputs,
    ) as { stringData: Record<string, string> };
    assert.equal(
      secret.stringData["endpoints.json"],
      undefined,
      "the member list is the exporter's",
    );
  });

  it("ipv6Prefix: a /56 on a backend gives member i the i-th /64, in its own squid document, sampled, with its route", async () => {
    const instance = new pool.EgressProxyPool("spread", {
      backends: [
        KVM("kvm1", { ipv6Prefix: { prefix: "2001:db8:7:100::/56", mode: "random" } }),
        KVM("kvm2"),
      ],
      count: 3,
      ipFamilies: ["ipv4", "ipv6"],
      squid: { allowedClientCidrs: ["10.0.0.0/8", "fd00::/8"] },
      egressCheck: {
        url: "http://192.0.2.7/ip",
        ipv6Url: "http://[2001:db8::7]/ip",
        ipv6Samples: 30,
      },
    } as never);
    const [proxies, routes] = await Promise.all([
      valueOf(instance.proxies),
      valueOf(instance.ipv6Routes),
    ]);
    await settle();
    const byName = (name: string) =>
      plain(proxiesOf().find((r) => r.name === `spread-${name}`)!.inputs) as {
        userData: string;
        egressCheck: Record<string, unknown>;
      };
    const inputs = ["kvm1-0", "kvm1-1", "kvm2-0"].map(byName);
    assert.deepEqual(
      proxies.map((proxy) => [proxy.name, proxy.ipv6Prefix]),
      [
        ["kvm1-0", "2001:db8:7:100::/64"],
        ["kvm1-1", "2001:db8:7:101::/64"],
        ["kvm2-0", undefined],
      ],
    );
    assert.match(inputs[0]!.userData, /--prefix 2001:db8:7:100::\/64 --mode random/);
    assert.match(inputs[1]!.userData, /--prefix 2001:db8:7:101::\/64 --mode random/);
    assert.doesNotMatch(inputs[2]!.userData, /prefix-dialer/);
    assert.deepEqual(inputs[0]!.egressCheck.ipv6Prefix, {
      prefix: "2001:db8:7:100::/64",
      mode: "random",
    });
    assert.equal(inputs[0]!.egressCheck.ipv6Samples, 30);
    assert.ok(
      !("ipv6Prefix" in inputs[2]!.egressCheck) && !("ipv6Samples" in inputs[2]!.egressCheck),
    );
    assert.deepEqual(routes, [
      `ip -6 route add 2001:db8:7:100::/64 via ${proxies[0]!.ipv6Address} dev br0`,
      `ip -6 route add 2001:db8:7:101::/64 via ${proxies[1]!.ipv6Address} dev br0`,
    ]);
    // Deterministic: the same arguments give the same documents.
    registered = [];
    new pool.EgressProxyPool("spread", {
      backends: [
        KVM("kvm1", { ipv6Prefix: { prefix: "2001:db8:7:100::/56", mode: "random" } }),
        KVM("kvm2"),
      ],
      count: 3,
      ipFamilies: ["ipv4", "ipv6"],
      squid: { allowedClientCidrs: ["10.0.0.0/8", "fd00::/8"] },
    } as never);
    await settle();
    await settle();
    assert.equal(byName("kvm1-1").userData, inputs[1]!.userData);
  });

  it("ipv6Prefix problems name the field and the fix", () => {
    const make = (args: Record<string, unknown>) => () =>
      new pool.EgressProxyPool("spread-bad", {
        squid: { allowedClientCidrs: ["10.0.0.0/8", "fd00::/8"] },
        ...args,
      } as never);
    assert.throws(
      make({ backends: [KVM("kvm1")], ipv6Prefix: { prefix: "2001:db8:7::/56", mode: "random" } }),
      /ipv6Prefix needs IPv6 on the backend kvm1's proxies .*set ipFamilies: \["ipv4", "ipv6"\]/,
    );
    assert.throws(
      make({
        backends: [KVM("kvm1"), KVM("kvm2")],
        ipFamilies: ["ipv4", "ipv6"],
        ipv6Prefix: { prefix: "2001:db8:7::/56", mode: "random" },
      }),
      /ipv6Prefix on the pool would be shared by the VM backends kvm1, kvm2.*set ipv6Prefix on each backend/,
    );
    assert.throws(
      make({
        backends: [
          KVM("kvm1", { count: 2, ipv6Prefix: { prefix: "2001:db8:7:1::/64", mode: "random" } }),
        ],
        ipFamilies: ["ipv4", "ipv6"],
      }),
      /backends\[0\]\.ipv6Prefix\.prefix 2001:db8:7:1::\/64 serves 1 proxy .* count 2: give a \/56/,
    );
    assert.throws(
      make({
        backends: [KVM("kvm1", { ipv6Prefix: { prefix: "2001:db8:7:1::1/64", mode: "fast" } })],
        ipFamilies: ["ipv4", "ipv6"],
      }),
      /backends\[0\]\.ipv6Prefix\.prefix .*has host bits set.*backends\[0\]\.ipv6Prefix\.mode must be one of/,
    );
    assert.throws(
      make({
        backends: [
          STATIC("s", ["http://192.0.2.1:3128"], {
            ipv6Prefix: { prefix: "2001:db8:7::/56", mode: "random" },
          }),
        ],
      }),
      /backends\[0\]\.ipv6Prefix: only a VM backend/,
    );
    // A weighted share that outgrows a /64 fails at declaration, naming the backend.
    assert.throws(
      make({
        backends: [KVM("kvm1", { ipv6Prefix: { prefix: "2001:db8:7:1::/64", mode: "random" } })],
        count: 2,
        ipFamilies: ["ipv4", "ipv6"],
      }),
      /backends kvm1: ipv6Prefix\.prefix 2001:db8:7:1::\/64 serves one proxy, but member 1 needs one too/,
    );
  });

  it("dual stack needs an IPv6 client range in squid, and names the fix", () => {
    assert.throws(
      () =>
        new pool.EgressProxyPool("dual-closed", {
          backends: [KVM("kvm1")],
          ipFamilies: ["ipv4", "ipv6"],
        } as never),
      /squid\.allowedClientCidrs lists no IPv6 range.*allowedClientCidrs: \["10\.0\.0\.0\/8", "fd00::\/8"\]/,
    );
    assert.throws(
      () =>
        new pool.EgressProxyPool("dual-bad", {
          backends: [KVM("kvm1")],
          ipFamilies: ["ipv4", "ipv4"],
        } as never),
      /ipFamilies names a family twice/,
    );
  });

  it("an IPv4-only pool declares what it did before: no IPv6 slice, no family policy, no IPv6 details", async () => {
    const instance = new pool.EgressProxyPool("plain4", {
      backends: [KVM("kvm1")],
      count: 1,
      kubernetes: { namespace: "crawlers", name: "egress" },
    });
    const proxies = await valueOf(instance.proxies);
    await settle();
    assert.ok(!("ipv6Address" in proxies[0]!) && !("endpointIpv6" in proxies[0]!));
    assert.equal(
      registered.filter((r) => r.type === "kubernetes:discovery.k8s.io/v1:EndpointSlice").length,
      1,
    );
    const service = plain(
      registered.find((r) => r.type === "kubernetes:core/v1:Service")!.inputs,
    ) as { spec: Record<string, unknown> };
    assert.ok(!("ipFamilyPolicy" in service.spec));
    const kvm = plain(registered.find((r) => r.type.includes("KvmProxy"))!.inputs) as object;
    assert.ok(!("ipFamilies" in kvm));
  });

  it("egress check: each proxy checks through squid with the pool's auth; egress groups them by address", async () => {
    const instance = new pool.EgressProxyPool("egress", {
      backends: [KVM("home"), PROXMOX("office")],
      count: 3,
      squid: { basicAuth: { user: "crawler", password: "s3cret horse" } },
      egressCheck: { url: "http://echo.lab/json", field: "ip" },
      kubernetes: { namespace: "crawlers", name: "egress" },
    });
    const groups = await valueOf(instance.egress);
    const proxies = await valueOf(instance.proxies);
    await settle();
    const child = proxiesOf()[0];
    assert.ok(
      isSecretValue(child.inputs.egressCheck),
      "the egress check (with the password) is secret",
    );
    assert.deepEqual(plain(child.inputs.egressCheck), {
      url: "http://echo.lab/json",
      field: "ip",
      proxyAuth: { user: "crawler", password: "s3cret horse" },
    });
    assert.deepEqual(
      proxies.map((proxy) => [proxy.name, proxy.egressIp]),
      [
        ["home-0", "203.0.113.1"],
        ["home-1", "203.0.113.1"],
        ["office-0", proxies[2].egressIp],
      ],
    );
    assert.deepEqual(groups[0], { address: "203.0.113.1", proxies: ["home-0", "home-1"] });
    assert.equal(groups.length, 2);
    const secret = plain(
      registered.find((r) => r.type === "kubernetes:core/v1:Secret")!.inputs,
    ) as { stringData: Record<string, string> };
    assert.deepEqual(
      (JSON.parse(secret.stringData["proxies.json"]) as Array<{ egressIp: string }>).map(
        (entry) => entry.egressIp,
      ),
      proxies.map((proxy) => proxy.egressIp),
    );
  });

  it("requireDistinctEgress: a shared egress address fails the pool before anything is published", async () => {
    const instance = new pool.EgressProxyPool("distinct", {
      backends: [KVM("home")],
      count: 2,
      egressCheck: { url: "http://echo.lab/" },
      requireDistinctEgress: true,
      kubernetes: { namespace: "crawlers", name: "egress" },
    });
    const failure = await (instance.egress as unknown as { promise(): Promise<unknown> })
      .promise()
      .then(
        () => undefined,
        (error: Error) => error,
      );
    await settle();
    assert.match(
      String(failure?.message),
      /2 proxies leave from 1 distinct egress address; shared: 203\.0\.113\.1 \(home-0, home-1\).*requireDistinctEgress is true, so nothing is published/,
    );
    // The collision is the pool's finding (only it sees every member): it names the exact change.
    assert.match(
      String(failure?.message),
      /replace the later members with rotate: \{ "home-1": "\d{4}-\d\d-\d\dT\d\d:\d\dZ" \}/,
    );
    assert.equal(
      registered.filter((r) => r.type.startsWith("kubernetes:")).length,
      0,
      "no Kubernetes object was declared",
    );
  });

  it('onCollision "rotate": a shared exit address publishes, names the younger member for the next up --refresh, and gives each member its budget and map', async () => {
    const warnings: string[] = [];
    const original = pulumi.log.warn;
    pulumi.log.warn = async (message: string) => void warnings.push(message);
    try {
      const instance = new pool.EgressProxyPool("healing", {
        backends: [KVM("home")],
        count: 2,
        egressCheck: { url: "http://echo.lab/" },
        requireDistinctEgress: true,
        onCollision: "rotate",
        kubernetes: { namespace: "crawlers", name: "egress" },
      });
      const groups = await valueOf(instance.egress);
      await settle();
      assert.deepEqual(groups, [{ address: "203.0.113.1", proxies: ["home-0", "home-1"] }]);
      assert.ok(
        warnings.some((line) =>
          /onCollision is "rotate": the next `pulumi up --refresh` replaces home-1 \(the younger of each pair, within maxUnavailable\)/.test(
            line,
          ),
        ),
        warnings.join("\n"),
      );
      assert.ok(
        registered.some((r) => r.type === "kubernetes:core/v1:Secret"),
        "published",
      );
      const kvm = registered
        .filter((r) => r.type.includes("KvmProxy"))
        .map(
          (r) =>
            plain(r.inputs) as {
              disruptionBudget: { onCollision?: string };
              rotateEgress?: object;
            },
        );
      for (const member of kvm) {
        assert.equal(member.disruptionBudget.onCollision, "rotate");
        assert.deepEqual(
          member.rotateEgress,
          {},
          "the map is given, so its output shows what a VM was made with",
        );
      }
    } finally {
      pulumi.log.warn = original;
    }
  });

  it('onCollision "rotate" that cannot help (the younger was made for that address and still leaves from it): refused as before, saying why', async () => {
    // An address entry for the shared address: each member's map (its state, under these mocks) holds it.
    const instance = new pool.EgressProxyPool("natted", {
      backends: [KVM("home")],
      count: 2,
      egressCheck: { url: "http://echo.lab/" },
      requireDistinctEgress: true,
      onCollision: "rotate",
      rotate: { "203.0.113.1": "shared with home-0" },
    });
    const failure = await (instance.egress as unknown as { promise(): Promise<unknown> })
      .promise()
      .then(
        () => undefined,
        (error: Error) => error,
      );
    assert.match(
      String(failure?.message),
      /onCollision is "rotate", but home-1 was made anew for that and still leaves from the same address: the network gives its VMs one exit address, and rotation cannot separate them/,
    );
    assert.throws(
      () =>
        new pool.EgressProxyPool("odd", {
          backends: [KVM("home")],
          count: 1,
          onCollision: "heal",
        } as never),
      /onCollision must be "fail" \(the default\) or "rotate"/,
    );
  });

  it("publishes the check exporter: check --serve on the Secret's proxies.json, a Service Prometheus scrapes", async () => {
    const instance = new pool.EgressProxyPool("watched", {
      backends: [KVM("kvm1")],
      count: 1,
      kubernetes: {
        namespace: "crawlers",
        name: "egress",
        exporter: {
          target: "http://example.com/",
          connect: "example.com:443",
          intervalSeconds: 30,
        },
      },
    });
    await valueOf(instance.endpoints);
    await settle();
    const byType = (type: string) =>
      plain(
        registered.find((r) => r.type === type && r.name.startsWith("watched"))!.inputs,
      ) as never;
    const deployment = byType("kubernetes:apps/v1:Deployment") as {
      metadata: { name: string; namespace: string; labels: Record<string, string> };
      spec: {
        selector: { matchLabels: Record<string, string> };
        template: {
          metadata: { labels: Record<string, string> };
          spec: {
            securityContext: { runAsNonRoot: boolean; fsGroup: number };
            containers: Array<{
              image: string;
              command: string[];
              ports: Array<{ containerPort: number; name: string }>;
              livenessProbe: { httpGet: { path: string } };
              securityContext: { readOnlyRootFilesystem: boolean };
              volumeMounts: Array<{ name: string; mountPath: string; subPath?: string }>;
            }>;
            volumes: Array<{ name: string; secret?: { secretName: string } }>;
          };
        };
      };
    };
    const services = registered
      .filter((r) => r.type === "kubernetes:core/v1:Service" && r.name.startsWith("watched"))
      .map((r) => plain(r.inputs)) as Array<{
      metadata: { name: string; annotations: Record<string, string> };
      spec: { selector?: Record<string, string>; ports: Array<{ port: number }> };
    }>;
    const metrics = services.find((service) => service.metadata.name === "egress-check")!;
    const container = deployment.spec.template.spec.containers[0]!;
    assert.deepEqual(container.command, [
      "npx",
      "--yes",
      "egress-proxies@0.1.0",
      "check",
      "--serve",
      ":9464",
      "--interval",
      "30",
      "--timeout",
      "10",
      "--from",
      "/proxies/proxies.json",
      "--target",
      "http://example.com/",
      "--connect",
      "example.com:443",
      "--endpointslices",
      "crawlers/egress",
    ]);
    // Its own account: it reads the pool's Secret and Service and writes the pool's slices, nothing else.
    assert.equal(
      (deployment.spec.template.spec as unknown as { serviceAccountName: string })
        .serviceAccountName,
      "egress-check",
    );
    const role = byType("kubernetes:rbac.authorization.k8s.io/v1:Role") as {
      rules: Array<{
        apiGroups: string[];
        resources: string[];
        resourceNames: string[];
        verbs: string[];
      }>;
    };
    assert.deepEqual(role.rules, [
      {
        apiGroups: ["discovery.k8s.io"],
        resources: ["endpointslices"],
        resourceNames: ["egress-checked", "egress-checked-ipv6"],
        verbs: ["get", "patch"],
      },
      // RBAC cannot narrow create by name.
      { apiGroups: ["discovery.k8s.io"], resources: ["endpointslices"], verbs: ["create"] },
      {
        apiGroups: [""],
        resources: ["secrets", "services"],
        resourceNames: ["egress"],
        verbs: ["get"],
      },
    ]);
    const binding = byType("kubernetes:rbac.authorization.k8s.io/v1:RoleBinding") as {
      roleRef: { name: string };
      subjects: Array<{ kind: string; name: string; namespace: string }>;
    };
    assert.equal(binding.roleRef.name, "egress-check");
    assert.deepEqual(binding.subjects, [
      { kind: "ServiceAccount", name: "egress-check", namespace: "crawlers" },
    ]);
    // One writer per slice: the exporter's; Pulumi declares none.
    assert.equal(
      registered.filter(
        (r) =>
          r.type === "kubernetes:discovery.k8s.io/v1:EndpointSlice" && r.name.startsWith("watched"),
      ).length,
      0,
    );
    assert.equal(container.image, "node:26-slim");
    assert.equal(container.livenessProbe.httpGet.path, "/healthz");
    assert.equal(container.securityContext.readOnlyRootFilesystem, true);
    assert.equal(deployment.spec.template.spec.securityContext.runAsNonRoot, true);
    // The list is a directory mount of the pool's Secret (a subPath would never see its updates).
    const listMount = container.volumeMounts.find((mount) => mount.mountPath === "/proxies")!;
    assert.equal(listMount.subPath, undefined);
    const listVolume = deployment.spec.template.spec.volumes.find(
      (v) => v.name === listMount.name,
    )!;
    assert.equal(listVolume.secret?.secretName, "egress");
    // The Service selects exactly the Deployment's pods and carries the scrape annotations.
    assert.deepEqual(metrics.spec.selector, deployment.spec.selector.matchLabels);
    for (const [key, value] of Object.entries(deployment.spec.selector.matchLabels))
      assert.equal(deployment.spec.template.metadata.labels[key], value);
    assert.deepEqual(
      [
        metrics.metadata.annotations["prometheus.io/scrape"],
        metrics.metadata.annotations["prometheus.io/port"],
        metrics.metadata.annotations["prometheus.io/path"],
      ],
      ["true", "9464", "/metrics"],
    );
    assert.equal(metrics.spec.ports[0]!.port, 9464);
    // The proxies' Service still has no selector.
    assert.equal(services.find((s) => s.metadata.name === "egress")!.spec.selector, undefined);
  });

  it("with keepSliceReadiness false the exporter gets no API token and no account", async () => {
    const instance = new pool.EgressProxyPool("tokenless", {
      backends: [KVM("kvm1")],
      count: 1,
      kubernetes: {
        namespace: "crawlers",
        name: "quiet",
        exporter: { target: "http://example.com/", keepSliceReadiness: false },
      },
    });
    await valueOf(instance.endpoints);
    await settle();
    const deployment = plain(
      registered.find(
        (r) => r.type === "kubernetes:apps/v1:Deployment" && r.name.startsWith("tokenless"),
      )!.inputs,
    ) as {
      spec: {
        template: {
          spec: { automountServiceAccountToken: boolean; containers: Array<{ command: string[] }> };
        };
      };
    };
    assert.equal(deployment.spec.template.spec.automountServiceAccountToken, false);
    assert.ok(!deployment.spec.template.spec.containers[0]!.command.includes("--endpointslices"));
    // Pulumi writes the slice then, as without an exporter.
    assert.equal(
      registered.filter(
        (r) =>
          r.type === "kubernetes:discovery.k8s.io/v1:EndpointSlice" &&
          r.name.startsWith("tokenless"),
      ).length,
      1,
    );
    assert.equal(
      registered.filter((r) => r.name.startsWith("tokenless") && /rbac|ServiceAccount/.test(r.type))
        .length,
      0,
    );
  });

  it("refuses bad exporter arguments with the field and the fix", () => {
    assert.throws(
      () =>
        new pool.EgressProxyPool("badwatch", {
          backends: [KVM("kvm1")],
          count: 1,
          kubernetes: {
            namespace: "crawlers",
            name: "egress",
            exporter: { target: "https://example.com/", intervalSeconds: 0, port: 80 },
          },
        }),
      (error: Error) =>
        error instanceof pool.PoolArgsError &&
        /kubernetes\.exporter\.target must be an http:\/\/ URL/.test(error.message) &&
        /kubernetes\.exporter\.intervalSeconds must be a whole number from 1 to 86400/.test(
          error.message,
        ) &&
        /kubernetes\.exporter\.port must be a whole number from 1024 to 65535/.test(error.message),
    );
  });

  it("members get squid's files to deliver in place: a change of squid.conf alone keeps the identity, a prefix changes it", async () => {
    const publish = async (
      name: string,
      squid: Record<string, unknown>,
      extra: Record<string, unknown> = {},
    ) => {
      registered = [];
      const instance = new pool.EgressProxyPool(name, {
        backends: [KVM("kvm1"), PROXMOX("pve1")],
        count: 2,
        squid: { allowedClientCidrs: ["10.0.0.0/8", "fd00::/8"], ...squid },
        ...extra,
      } as never);
      await valueOf(instance.endpoints);
      await settle();
      return registered
        .filter((r) => r.type.includes("KvmProxy") || r.type.includes("ProxmoxProxy"))
        .map((r) => ({
          userData: plain(r.inputs.userData) as string,
          guestFiles: plain(r.inputs.guestFiles) as {
            files: { path: string; content: string; permissions: string }[];
            commands: string[][];
            listensOn: number;
            userDataIdentity: string;
          },
          secret: isSecretValue(r.inputs.guestFiles),
        }));
    };
    const before = await publish("files-a", {
      basicAuth: { user: "crawler", password: "correct horse battery" },
    });
    assert.equal(before.length, 2, "both VM kinds get them");
    for (const member of before) {
      assert.equal(member.secret, true, "the password file rides in it");
      assert.deepEqual(
        member.guestFiles.files.map((file) => [file.path, file.permissions]),
        [
          ["/etc/squid/squid.conf", "0644"],
          ["/etc/squid/egress-proxies.htpasswd", "0640"],
        ],
      );
      assert.deepEqual(member.guestFiles.commands.at(-1), [
        "systemctl",
        "reload-or-restart",
        "squid",
      ]);
      assert.equal(member.guestFiles.listensOn, 3128);
      // What cloud-init writes at first boot is what is delivered after.
      for (const file of member.guestFiles.files)
        for (const line of file.content.trimEnd().split("\n"))
          assert.ok(member.userData.includes(line), `${file.path}: ${line}`);
    }
    const after = await publish("files-b", {
      basicAuth: { user: "crawler", password: "correct horse battery" },
      extraConfigLines: ["acl blocked dstdomain .example.com", "http_access deny blocked"],
    });
    assert.notEqual(after[0]!.userData, before[0]!.userData);
    assert.notEqual(
      after[0]!.guestFiles.files[0]!.content,
      before[0]!.guestFiles.files[0]!.content,
    );
    assert.equal(after[0]!.guestFiles.userDataIdentity, before[0]!.guestFiles.userDataIdentity);
    const spread = await publish(
      "files-c",
      { basicAuth: { user: "crawler", password: "correct horse battery" } },
      {
        ipFamilies: ["ipv4", "ipv6"],
        backends: [KVM("kvm1", { ipv6Prefix: { prefix: "2001:db8:7:100::/64", mode: "random" } })],
        count: 1,
      },
    );
    assert.notEqual(spread[0]!.guestFiles.userDataIdentity, before[0]!.guestFiles.userDataIdentity);
    assert.ok(spread[0]!.guestFiles.files.some((file) => file.path.endsWith("prefix-dialer.py")));
  });

  it("one writer: with the exporter, a refresh that finds a member silent changes nothing Pulumi writes", async () => {
    // The same pool after two refreshes: all answering, then "silent" (the mocks' re-check finding).
    const publish = async (pool_: string, second: string, exporter: boolean) => {
      registered = [];
      const instance = new pool.EgressProxyPool(pool_, {
        backends: [KVM("steady"), KVM(second)],
        count: 2,
        kubernetes: {
          namespace: "crawlers",
          name: "egress",
          ...(exporter ? { exporter: { target: "http://example.com/" } } : {}),
        },
      });
      const proxies = await valueOf(instance.proxies);
      await settle();
      const written = registered
        .filter((r) => r.type.startsWith("kubernetes:") && r.name.startsWith(pool_))
        .map((r) => [r.type, plain(r.inputs)] as [string, { stringData?: unknown }]);
      return {
        ready: proxies.map((proxy) => proxy.ready),
        secret: written.find(([type]) => type === "kubernetes:core/v1:Secret")![1].stringData,
        slices: written
          .filter(([type]) => type.endsWith("EndpointSlice"))
          .map(([, inputs]) => inputs),
      };
    };
    const healthy = await publish("resync-a", "other", true);
    const broken = await publish("resync-b", "silent", true);
    assert.deepEqual(
      [healthy.ready, broken.ready],
      [
        [true, true],
        [true, false],
      ],
    );
    assert.deepEqual(broken.secret, healthy.secret, "the Secret's inputs do not carry readiness");
    assert.deepEqual([healthy.slices, broken.slices], [[], []], "no slice is Pulumi's");
    // Control: without the exporter Pulumi is readiness's one writer, and the same refresh changes its inputs.
    const alone = [
      await publish("resync-c", "other", false),
      await publish("resync-d", "silent", false),
    ];
    assert.notDeepEqual(alone[1]!.secret, alone[0]!.secret);
    assert.notDeepEqual(alone[1]!.slices, alone[0]!.slices);
  });

  it("publishes a member that refresh found stopped as not ready, its running sibling as ready", async () => {
    const instance = new pool.EgressProxyPool("halted", {
      backends: [KVM("up"), KVM("stopped")],
      count: 2,
      kubernetes: { namespace: "crawlers", name: "egress" },
    });
    const proxies = await valueOf(instance.proxies);
    await settle();
    assert.deepEqual(
      proxies.map((proxy) => [proxy.backend, proxy.state, proxy.ready]),
      [
        ["up", "running", true],
        ["stopped", "stopped", false],
      ],
    );
    const byType = (type: string) =>
      plain(
        registered.find((r) => r.type === type && r.name.startsWith("halted"))!.inputs,
      ) as never;
    const slice = byType("kubernetes:discovery.k8s.io/v1:EndpointSlice") as {
      endpoints: Array<{ conditions: { ready?: boolean } }>;
    };
    assert.deepEqual(
      slice.endpoints.map((endpoint) => endpoint.conditions),
      [{ ready: true }, { ready: false }],
    );
    const secret = byType("kubernetes:core/v1:Secret") as { stringData: Record<string, string> };
    assert.deepEqual(
      (JSON.parse(secret.stringData["proxies.json"]!) as Array<{ ready: boolean }>).map(
        (entry) => entry.ready,
      ),
      [true, false],
    );
  });

  it("egress re-check: on for every member by default, a silent member published not ready; rotateAfterDays passed on", async () => {
    const instance = new pool.EgressProxyPool("recheck", {
      backends: [KVM("up"), KVM("silent"), STATIC("shop", ["http://203.0.113.7:3128"])],
      count: 3,
      rotateAfterDays: 30,
      kubernetes: { namespace: "crawlers", name: "egress" },
    });
    const proxies = await valueOf(instance.proxies);
    await settle();
    assert.deepEqual(
      proxies.map((proxy) => [proxy.backend, proxy.ready, proxy.egressProblem, proxy.rotateAfter]),
      [
        ["up", true, null, "2026-12-01T00:00:00.000Z"],
        ["silent", false, "connect ECONNREFUSED 198.51.100.12:3128", "2026-12-01T00:00:00.000Z"],
        ["shop", true, null, null],
      ],
    );
    const children = registered.filter(
      (r) => r.name.startsWith("recheck-") && /Proxy$/.test(r.type),
    );
    assert.deepEqual(
      Object.fromEntries(
        children.map((r) => {
          const inputs = plain(r.inputs) as { egressRecheck?: boolean; rotateAfterDays?: number };
          return [r.name, [inputs.egressRecheck, inputs.rotateAfterDays ?? null]];
        }),
      ),
      {
        "recheck-up-0": [true, 30],
        "recheck-silent-0": [true, 30],
        "recheck-shop-0": [true, null],
      },
    );
    const slice = plain(
      registered.find(
        (r) =>
          r.type === "kubernetes:discovery.k8s.io/v1:EndpointSlice" && r.name.startsWith("recheck"),
      )!.inputs,
    ) as { endpoints: Array<{ conditions: { ready?: boolean } }> };
    assert.deepEqual(
      slice.endpoints.map((endpoint) => endpoint.conditions),
      [{ ready: true }, { ready: false }, { ready: true }],
    );

    registered = [];
    new pool.EgressProxyPool("norecheck", {
      backends: [KVM("kvm1")],
      count: 1,
      recheckEgress: false,
    });
    await settle();
    assert.equal(
      (
        plain(registered.find((r) => r.name === "norecheck-kvm1-0")!.inputs) as {
          egressRecheck: boolean;
        }
      ).egressRecheck,
      false,
    );
    assert.throws(
      () =>
        new pool.EgressProxyPool("badage", {
          backends: [KVM("kvm1")],
          count: 1,
          rotateAfterDays: 0,
        }),
      /rotateAfterDays must be a number of days above 0/,
    );
  });

  it("rotate: the named member gets a rotation input (it is replaced), the others none (no diff)", async () => {
    const instance = new pool.EgressProxyPool("rot", {
      backends: [KVM("kvm1"), PROXMOX("pve1")],
      count: 4,
      rotate: { "kvm1-1": "2026-12-02", "pve1-0": "burned 203.0.113.7" },
    });
    await valueOf(instance.endpoints);
    await settle();
    const rotations = Object.fromEntries(
      registered
        .filter((r) => r.name.startsWith("rot-") && /(Kvm|Proxmox)Proxy/.test(r.type))
        .map((r) => [r.name, (plain(r.inputs) as { rotation?: string }).rotation ?? null]),
    );
    assert.deepEqual(rotations, {
      "rot-kvm1-0": null,
      "rot-kvm1-1": "2026-12-02",
      "rot-pve1-0": "burned 203.0.113.7",
      "rot-pve1-1": null,
    });
  });

  it("rotate by exit address: every VM member gets the address entries (canonical keys), static members none, nothing called unused", async () => {
    const args = {
      backends: [KVM("kvm1"), PROXMOX("pve1")],
      count: 3,
      rotate: {
        "kvm1-0": "2026-12-02",
        "203.0.113.9": "burned-2026-12-04",
        "2001:DB8:0:0::7": "burned",
      },
    };
    assert.deepEqual(pool.unusedRotateEntries(args), []);
    const instance = new pool.EgressProxyPool("byaddr", args);
    await valueOf(instance.endpoints);
    await settle();
    const members = registered.filter(
      (r) => r.name.startsWith("byaddr-") && /(Kvm|Proxmox)Proxy/.test(r.type),
    );
    assert.equal(members.length, 3);
    for (const member of members)
      assert.deepEqual(
        (plain(member.inputs) as { rotateEgress?: unknown }).rotateEgress,
        { "203.0.113.9": "burned-2026-12-04", "2001:db8::7": "burned" },
        member.name,
      );
    // Without address entries the input is absent: members made before it plan no change.
    const plainPool = new pool.EgressProxyPool("noaddr", {
      backends: [KVM("kvm1")],
      count: 1,
      rotate: { "kvm1-0": "x" },
    });
    await valueOf(plainPool.endpoints);
    await settle();
    const lone = registered.find((r) => r.name === "noaddr-kvm1-0")!;
    assert.equal("rotateEgress" in (plain(lone.inputs) as object), false);
    assert.throws(
      () =>
        new pool.EgressProxyPool("badaddr", {
          backends: [KVM("kvm1")],
          count: 1,
          rotate: { "203.0.113.9": "" },
        }),
      (error: Error) =>
        error instanceof pool.PoolArgsError &&
        /rotate\.203\.0\.113\.9 must be a text of 1 to 200 characters/.test(error.message),
    );
  });

  it("maxUnavailable and drainSeconds: every VM member gets the pool's disruption budget (default a quarter, at least one; a 30 s drain), static members none", async () => {
    const budgetsOf = async (name: string, args: Record<string, unknown>) => {
      const instance = new pool.EgressProxyPool(name, {
        backends: [KVM("kvm1"), PROXMOX("pve1"), STATIC("shop", ["http://203.0.113.7:3128"])],
        ...args,
      });
      await valueOf(instance.endpoints);
      await settle();
      return registered
        .filter((r) => r.name.startsWith(`${name}-`) && /Proxy$/.test(r.type))
        .map((r): [string, unknown] => [
          r.name,
          (plain(r.inputs) as { disruptionBudget?: unknown }).disruptionBudget,
        ]);
    };
    const byDefault = await budgetsOf("budget-default", { count: 9 });
    assert.equal(byDefault.length, 9);
    for (const [name, budget] of byDefault)
      assert.deepEqual(
        budget,
        String(name).startsWith("budget-default-shop")
          ? undefined
          : { group: "budget-default", maxUnavailable: 2, drainSeconds: 30 },
        String(name),
      );
    // Few members: never below one, or nothing could ever be rotated or healed.
    assert.deepEqual(
      new Map(await budgetsOf("budget-few", { count: 3 })).get("budget-few-kvm1-0"),
      {
        group: "budget-few",
        maxUnavailable: 1,
        drainSeconds: 30,
      },
    );
    assert.deepEqual(
      new Map(
        await budgetsOf("budget-count", { count: 3, maxUnavailable: 3, drainSeconds: 0 }),
      ).get("budget-count-kvm1-0"),
      {
        group: "budget-count",
        maxUnavailable: 3,
        drainSeconds: 0,
      },
    );
    assert.deepEqual(
      new Map(await budgetsOf("budget-share", { count: 6, maxUnavailable: "50%" })).get(
        "budget-share-kvm1-0",
      ),
      {
        group: "budget-share",
        maxUnavailable: 3,
        drainSeconds: 30,
      },
    );
    for (const [value, message] of [
      [
        0,
        /maxUnavailable must be a whole number of members of at least 1 \(e\.g\. 2\) or a share of them \(e\.g\. "25%"\), not 0/,
      ],
      [1.5, /maxUnavailable must be a whole number .*not 1\.5/],
      ["0%", /maxUnavailable must be a share from "1%" to "100%", not "0%"/],
      ["all", /maxUnavailable must be a whole number .*not "all"/],
    ] as const)
      assert.throws(
        () =>
          new pool.EgressProxyPool(`budget-bad-${String(value)}`, {
            backends: [KVM("kvm1")],
            count: 1,
            maxUnavailable: value,
          }),
        (error: Error) => error instanceof pool.PoolArgsError && message.test(error.message),
        String(value),
      );
    for (const value of [-1, 2.5, 3601, "30"])
      assert.throws(
        () =>
          new pool.EgressProxyPool(`drain-bad-${String(value)}`, {
            backends: [KVM("kvm1")],
            count: 1,
            drainSeconds: value as number,
          }),
        (error: Error) =>
          error instanceof pool.PoolArgsError &&
          /drainSeconds must be a whole number of seconds from 0 \(no drain\) to 3600, e\.g\. 30/.test(
            error.message,
          ),
        String(value),
      );
  });

  it("rotate refuses an empty text; an entry for a member the pool does not have (scaled down) is ignored and named", async () => {
    assert.throws(
      () =>
        new pool.EgressProxyPool("badrot", {
          backends: [KVM("kvm1")],
          count: 2,
          rotate: { "kvm1-5": "x", "kvm1-0": "" },
        }),
      (error: Error) =>
        error instanceof pool.PoolArgsError &&
        /rotate\.kvm1-0 must be a text of 1 to 200 characters/.test(error.message) &&
        !error.message.includes("kvm1-5"),
    );
    // Scaled down from 3 to 2: the entry for the member that went stays in the program, as the docs say.
    const scaledDown = {
      backends: [KVM("kvm1")],
      count: 2,
      rotate: { "kvm1-2": "2026-12-01", "kvm1-1": "2026-12-02" },
    };
    assert.deepEqual(pool.unusedRotateEntries(scaledDown), [
      "rotate.kvm1-2: the pool has no member kvm1-2 (scaled down, or a typo?), so the entry rotates nothing; its members are kvm1-0, kvm1-1",
    ]);
    const instance = new pool.EgressProxyPool("scaled", scaledDown);
    await valueOf(instance.endpoints);
    await settle();
    const rotations = Object.fromEntries(
      registered
        .filter((r) => r.name.startsWith("scaled-") && /KvmProxy/.test(r.type))
        .map((r) => [r.name, (plain(r.inputs) as { rotation?: string }).rotation ?? null]),
    );
    assert.deepEqual(rotations, { "scaled-kvm1-0": null, "scaled-kvm1-1": "2026-12-02" });
  });

  it("gateway: squid in Kubernetes routing to the members that serve, by their labels; only password hashes of its users; the Secret secret", async () => {
    const instance = new pool.EgressProxyPool("gw", {
      backends: [
        KVM("kvm1", { count: 2 }),
        KVM("stopped", { count: 1 }),
        PROXMOX("pve1", { count: 1 }),
      ],
      squid: { basicAuth: { user: "member", password: "member password:1" } },
      gateway: {
        users: [{ name: "crawler", password: pulumi.secret("crawler-password-1") }],
        backendLabels: { pve1: ["country-de"] },
        kubernetes: { namespace: "crawlers" },
      },
    });
    const [url, proxies] = await Promise.all([
      valueOf(instance.gateway!.url),
      valueOf(instance.proxies),
    ]);
    await settle();
    const gatewayObject = (type: string) =>
      registered.find((r) => r.type === type && r.name.startsWith("gw-gateway"))!;
    const secret = gatewayObject("kubernetes:core/v1:Secret");
    assert.ok(isSecretValue(secret.inputs.stringData), "the gateway's files are a secret");
    const files = plain(secret.inputs.stringData) as Record<string, string>;
    const config = files["squid.conf"]!;
    const peers = [
      ...config.matchAll(/^cache_peer (\S+) parent 3128 0 round-robin name=(\S+)/gm),
    ].map((match) => `${match[2]} ${match[1]}`);
    const serving = proxies.filter((proxy) => proxy.state === "running");
    assert.equal(serving.length, 3, "the member named stopped- was found stopped");
    assert.deepEqual(
      peers.sort(),
      serving.map((proxy) => `${proxy.name} ${proxy.ip}`).sort(),
      "every serving member, and only those",
    );
    assert.match(config, /^acl gateway_pin_country_de proxy_auth_regex \[-\]host\[-\]country-de/m);
    assert.match(config, /^cache_peer_access pve1-0 allow gateway_pinned gateway_pin_country_de$/m);
    assert.doesNotMatch(
      config,
      /^cache_peer_access kvm1-0 allow gateway_pinned gateway_pin_country_de$/m,
    );
    // The members' own credentials, escaped for login=; the users' passwords only as hashes.
    assert.match(config, /login=member:member%20password%3A1$/m);
    assert.match(files.users!, /^crawler:\$6\$/);
    assert.doesNotMatch(JSON.stringify(files), /crawler-password-1/);
    assert.equal(url, "http://gw-gateway.crawlers.svc:3128");
    assert.deepEqual(instance.gateway!.users, ["crawler"]);
    for (const type of [
      "kubernetes:apps/v1:Deployment",
      "kubernetes:policy/v1:PodDisruptionBudget",
      "kubernetes:core/v1:Service",
    ])
      assert.ok(gatewayObject(type), `${type} declared`);
  });

  it("gateway VM: made on a KVM backend like a member, its files from the members; members changing leave its document's identity as it is", async () => {
    const gatewayOf = async (count: number) => {
      registered = [];
      const instance = new pool.EgressProxyPool(`gwvm${count}`, {
        backends: [KVM("kvm1", { count })],
        squid: { basicAuth: { user: "member", password: "member-password-1" } },
        egressCheck: { url: "http://203.0.113.5/ip" },
        gateway: {
          users: [{ name: "crawler", password: "crawler-password-1" }],
          vm: { backend: "kvm1" },
        },
      });
      const url = await valueOf(instance.gateway!.url);
      await settle();
      const vm = registered.find((r) => r.name === `gwvm${count}-gateway`)!;
      return {
        instance,
        url,
        inputs: plain(vm.inputs) as Record<string, unknown>,
        secret: vm.inputs,
      };
    };
    const two = await gatewayOf(2);
    const three = await gatewayOf(3);
    const filesOf = (inputs: Record<string, unknown>) =>
      (inputs.guestFiles as { files: Array<{ path: string; content: string }> }).files;
    const identityOf = (inputs: Record<string, unknown>) =>
      (inputs.guestFiles as { userDataIdentity: string }).userDataIdentity;
    const peersOf = (inputs: Record<string, unknown>) =>
      [
        ...filesOf(inputs)[0]!.content.matchAll(
          /^cache_peer \S+ parent 3128 0 round-robin name=(\S+)/gm,
        ),
      ].map((match) => match[1]);
    assert.deepEqual(peersOf(two.inputs), ["kvm1-0", "kvm1-1"]);
    assert.deepEqual(peersOf(three.inputs), ["kvm1-0", "kvm1-1", "kvm1-2"]);
    assert.equal(filesOf(two.inputs)[0]!.path, "/etc/squid/squid.conf");
    assert.equal(
      identityOf(two.inputs),
      identityOf(three.inputs),
      "a member more is delivered, not a new VM",
    );
    assert.match(
      String(two.inputs.userData),
      /^#cloud-config\n# egress-proxies: the pool's gateway/,
    );
    assert.ok(isSecretValue(two.secret.userData) && isSecretValue(two.secret.guestFiles));
    // Not a member: no egress check or re-check, no budget, no basic auth of its own.
    assert.equal(two.inputs.egressCheck, undefined);
    assert.equal(two.inputs.disruptionBudget, undefined);
    assert.equal(two.inputs.egressRecheck, false);
    // Ready only once its own squid.conf serves (the package's squid listens on the port first).
    assert.deepEqual(two.inputs.readiness, { mode: "port", port: 3128, authRequired: true });
    assert.match(two.url, /^http:\/\/198\.51\.100\.\d+:3128$/);
    assert.equal(
      two.url,
      `http://${String((await valueOf(two.instance.gateway!.addresses))[0])}:3128`,
    );
    assert.equal(
      (await valueOf(two.instance.proxies)).length,
      2,
      "the gateway is not one of the proxies",
    );
  });

  it("gateway: refused without a place to run, with a label that is not one, or a user named with a suffix word", () => {
    const problems = pool.poolArgsProblems({
      backends: [KVM("kvm1")],
      gateway: {
        users: [{ name: "crawler-session", password: "x" }],
        backendLabels: { kvm1: ["Country DE"], nowhere: ["a"] },
      },
    });
    assert.deepEqual(
      problems.filter((problem) => problem.startsWith("gateway")),
      [
        'gateway.users[0].name "crawler-session" contains the word "session" or "host", which open a session or a pin in a client\'s user name; choose a name without them, e.g. "crawler-sessions"',
        'gateway.backendLabels.kvm1[0] must be lower-case letters and digits in words joined by single hyphens (at most 63), e.g. "kvm1" or "country-de"',
        "gateway.backendLabels.nowhere names no backend of the pool (backends: kvm1)",
        "gateway needs exactly one place to run: gateway.kubernetes: { namespace } (a Deployment of squid) or gateway.vm: { backend } (a VM on one of the pool's KVM or Proxmox backends)",
      ],
    );
  });

  it("refuses bad arguments with every problem named, before declaring anything", () => {
    assert.throws(
      () =>
        new pool.EgressProxyPool("bad", {
          backends: [KVM("kvm1"), { name: "both", kvm: {}, proxmox: {} } as never],
          squid: { port: 0 },
        }),
      (error: Error) =>
        error instanceof pool.PoolArgsError &&
        /count is required/.test(error.message) &&
        /backends\[1\] must have exactly one of kvm(, [a-z]+)* or [a-z]+ \(found kvm and proxmox\)/.test(
          error.message,
        ) &&
        /squid\.port must be/.test(error.message),
    );
  });

  describe("in preview, without credentials", () => {
    before(() => useMocks(true));
    after(() => useMocks(false));

    it("declares the same children and leaves endpoints unknown instead of failing", async () => {
      const instance = new pool.EgressProxyPool("preview", {
        backends: [
          { name: "kvm1", kvm: { connection: pulumi.output(pulumi.unknown) as never } },
          PROXMOX("pve1", { count: 1 }),
        ],
        count: 3,
        squid: { basicAuth: { user: "crawler", password: pulumi.output(pulumi.unknown) as never } },
        kubernetes: { namespace: "crawlers", name: "egress" },
      });
      await settle();
      await new Promise((resolve) => setTimeout(resolve, 200));
      assert.deepEqual(
        proxiesOf().map((r) => r.name),
        ["preview-kvm1-0", "preview-kvm1-1", "preview-pve1-0"],
      );
      assert.equal(await isKnown(instance.endpoints), false);
      assert.equal(await isKnown(instance.endpointsWithCredentials), false);
      assert.equal(await isSecret(instance.endpointsWithCredentials), true);
      assert.equal(await valueOf(instance.count), 3);
    });
  });
});

describe("the exporter's egressUrlIpv6 (components/kubernetes-exporter.ts)", () => {
  it("is refused without egressUrl or when its host is no IPv6 literal, naming the field", async () => {
    const { checkExporterArgsProblems } = await import("../../../components/kubernetes-exporter");
    const base = { target: "http://example.com/", egressUrl: "http://192.0.2.7/ip" };
    assert.deepEqual(
      checkExporterArgsProblems({ ...base, egressUrlIpv6: "http://[2001:db8::7]/ip" }),
      [],
    );
    assert.match(
      checkExporterArgsProblems({
        target: base.target,
        egressUrlIpv6: "http://[2001:db8::7]/ip",
      }).join(),
      /kubernetes\.exporter\.egressUrlIpv6 needs kubernetes\.exporter\.egressUrl/,
    );
    assert.match(
      checkExporterArgsProblems({ ...base, egressUrlIpv6: "http://echo.example/ip" }).join(),
      /kubernetes\.exporter\.egressUrlIpv6 must be an http:\/\/ URL whose host is an IPv6 literal/,
    );
  });
});
