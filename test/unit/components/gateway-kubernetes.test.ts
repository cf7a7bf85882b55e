/**
 * The gateway's Kubernetes objects (components/gateway-kubernetes.ts) under
 * pulumi.runtime.setMocks: what is declared and with which fields, the
 * members' passwords staying secret, a member change reaching the Secret and
 * never the pod template (squid reloads in place, the pods do not roll), and
 * the argument checks. The module is loaded after setMocks, as the SDK
 * requires; it declares only @pulumi/kubernetes objects, so the in-repo copy
 * serves (no dynamic provider to serialize).
 */
import assert from "node:assert/strict";
import * as pulumi from "@pulumi/pulumi";
import type * as gatewayModule from "../../../components/gateway-kubernetes";
import { EXPORTER_DEFAULTS } from "../../../components/kubernetes-exporter";
import {
  GATEWAY_POD_CONFIG_DIR,
  GATEWAY_POD_METRICS_UDP,
  gatewayEntrypointScript,
  gatewayPodFiles,
} from "../../../workloads/gateway/pod";
import {
  gatewayFiles,
  type GatewayFiles,
  type GatewayMember,
} from "../../../workloads/gateway/squid-gateway";

interface Registered {
  type: string;
  name: string;
  inputs: Record<string, unknown>;
}

let registered: Registered[] = [];
let previewMode = false;
/** What the mock cluster gives a Service: one address per family. */
const CLUSTER_IPS = ["10.96.12.34", "fd00:10:96::1234"];

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

async function useMocks(preview: boolean): Promise<void> {
  previewMode = preview;
  await pulumi.runtime.setMocks(
    {
      newResource(args) {
        registered.push({ type: args.type, name: args.name, inputs: args.inputs });
        const state = plain(args.inputs) as Record<string, unknown>;
        // As the Kubernetes provider does in preview: the inputs back, nothing the cluster assigns.
        if (previewMode) return { id: undefined as unknown as string, state };
        if (args.type === "kubernetes:core/v1:Service")
          state.spec = { ...(state.spec as object), clusterIPs: CLUSTER_IPS };
        return { id: `${args.name}-id`, state };
      },
      call: (args) => args.inputs,
    },
    "gateway-test",
    "unit",
    preview,
  );
}

const valueOf = <T>(output: pulumi.Output<T>): Promise<T> =>
  new Promise((resolve) => output.apply((value) => resolve(value)));
/** Lets the SDK finish registering everything declared so far. */
const settle = () => new Promise((resolve) => setTimeout(resolve, 50));

const MEMBER_PASSWORD = "member-pass-7f3k";
const member = (name: string, address: string): GatewayMember => ({
  name,
  address,
  port: 3128,
  labels: [name.split("-")[0]!],
  login: { user: "member", password: MEMBER_PASSWORD },
});
const filesFor = (members: GatewayMember[]): GatewayFiles =>
  gatewayPodFiles({
    port: 3128,
    allowedClientCidrs: ["10.0.0.0/8"],
    users: [{ name: "crawler", password: "correct horse battery" }],
    members,
  });

/** A parent of its own type per call: two declarations of one pool do not share URNs. */
let parents = 0;
const newParent = () =>
  new pulumi.ComponentResource(`test:index:Pool${++parents}`, `pool-${parents}`);

interface PodSpec {
  automountServiceAccountToken: boolean;
  terminationGracePeriodSeconds: number;
  affinity: {
    podAntiAffinity: {
      preferredDuringSchedulingIgnoredDuringExecution: Array<{
        weight: number;
        podAffinityTerm: {
          labelSelector: { matchLabels: Record<string, string> };
          topologyKey: string;
        };
      }>;
    };
  };
  containers: Array<{
    name: string;
    image: string;
    command: string[];
    env?: Array<{ name: string; value: string }>;
    ports: Array<{ name: string; containerPort: number; protocol: string }>;
    readinessProbe?: { tcpSocket: { port: string } };
    livenessProbe: { tcpSocket?: { port: string }; httpGet?: { path: string; port: string } };
    securityContext: Record<string, unknown>;
    volumeMounts: Array<{ name: string; mountPath: string; readOnly?: boolean; subPath?: string }>;
  }>;
  volumes: Array<{
    name: string;
    secret?: { secretName: string; defaultMode: number };
    emptyDir?: { sizeLimit: string };
  }>;
}
interface Deployment {
  metadata: { name: string; namespace: string; labels: Record<string, string> };
  spec: {
    replicas: number;
    selector: { matchLabels: Record<string, string> };
    strategy: { type: string; rollingUpdate: { maxUnavailable: number; maxSurge: number } };
    template: {
      metadata: { labels: Record<string, string>; annotations?: Record<string, string> };
      spec: PodSpec;
    };
  };
}
interface Service {
  metadata: { name: string; namespace: string; labels: Record<string, string> };
  spec: {
    type: string;
    ipFamilyPolicy: string;
    externalTrafficPolicy?: string;
    selector: Record<string, string>;
    ports: Array<{ name: string; port: number; targetPort: string; protocol: string }>;
  };
}
interface Budget {
  metadata: { name: string };
  spec: {
    maxUnavailable?: number;
    minAvailable?: number;
    selector: { matchLabels: Record<string, string> };
  };
}
interface Secret {
  metadata: { name: string; namespace: string; labels: Record<string, string> };
  type: string;
  stringData: Record<string, string>;
}

const byType = <T>(type: string, from: Registered[] = registered): T => {
  const found = from.filter((r) => r.type === type);
  assert.equal(found.length, 1, `one ${type} declared`);
  return plain(found[0]!.inputs) as T;
};
const DEPLOYMENT = "kubernetes:apps/v1:Deployment";
const SECRET = "kubernetes:core/v1:Secret";
const SERVICE = "kubernetes:core/v1:Service";
const BUDGET = "kubernetes:policy/v1:PodDisruptionBudget";
const POD_LABELS = {
  "app.kubernetes.io/name": "egress-proxies-gateway",
  "app.kubernetes.io/instance": "edge-gateway",
};

describe("the gateway in Kubernetes (components/gateway-kubernetes.ts, under Pulumi mocks)", function () {
  this.timeout(30_000);
  let gateway: typeof gatewayModule;

  before(async () => {
    await useMocks(false);
    gateway = await import("../../../components/gateway-kubernetes");
  });
  beforeEach(() => (registered = []));
  after(() => useMocks(false));

  /** Declares the gateway of pool "edge" and waits until every object is registered. */
  async function declare(
    args: Partial<gatewayModule.GatewayKubernetesArgs> = {},
    files: pulumi.Input<GatewayFiles> = filesFor([member("kvm1-0", "198.51.100.10")]),
  ) {
    const placed = gateway.publishGatewayToKubernetes(
      "edge",
      { namespace: "crawlers", ...args },
      { files, port: 3128 },
      newParent(),
    );
    const [url, clusterIps] = await Promise.all([valueOf(placed.url), valueOf(placed.clusterIps)]);
    await settle();
    return { placed, url, clusterIps };
  }

  it("declares the Secret, Deployment, PodDisruptionBudget and Service, named <pool>-gateway, under the parent", async () => {
    const { placed } = await declare();
    assert.deepEqual(
      registered
        .map((r) => r.type)
        .filter((type) => type.startsWith("kubernetes:"))
        .sort(),
      [DEPLOYMENT, SECRET, SERVICE, BUDGET].sort(),
    );
    for (const type of [DEPLOYMENT, SECRET, SERVICE, BUDGET]) {
      const { metadata } = byType<{ metadata: Deployment["metadata"] }>(type);
      assert.equal(metadata.name, "edge-gateway", type);
      assert.equal(metadata.namespace, "crawlers", type);
      assert.equal(metadata.labels["app.kubernetes.io/part-of"], "egress-proxies", type);
      assert.equal(metadata.labels["app.kubernetes.io/instance"], "edge-gateway", type);
    }
    const urn = await valueOf(placed.objects.deployment.urn);
    assert.match(urn, /::test:index:Pool\d+\$kubernetes:apps\/v1:Deployment::edge-gateway$/);
  });

  it("runs squid from the pod's entrypoint, the Secret mounted as a read-only directory, probes on the proxy port", async () => {
    await declare();
    const deployment = byType<Deployment>(DEPLOYMENT);
    assert.equal(deployment.spec.replicas, gateway.DEFAULT_GATEWAY_REPLICAS);
    assert.equal(gateway.DEFAULT_GATEWAY_REPLICAS, 2);
    assert.deepEqual(deployment.spec.selector.matchLabels, POD_LABELS);
    for (const [key, value] of Object.entries(POD_LABELS))
      assert.equal(deployment.spec.template.metadata.labels[key], value);
    assert.deepEqual(deployment.spec.strategy, {
      type: "RollingUpdate",
      rollingUpdate: { maxUnavailable: 0, maxSurge: 1 },
    });
    const pod = deployment.spec.template.spec;
    assert.equal(pod.containers.length, 1);
    const [squid] = pod.containers;
    assert.equal(squid!.name, "squid");
    assert.equal(squid!.image, gateway.DEFAULT_GATEWAY_IMAGE);
    assert.equal(gateway.DEFAULT_GATEWAY_IMAGE, "ubuntu/squid:6.6-24.04_beta");
    assert.deepEqual(squid!.command, ["sh", "-c", gatewayEntrypointScript()]);
    assert.deepEqual(squid!.ports, [{ name: "proxy", containerPort: 3128, protocol: "TCP" }]);
    assert.deepEqual(squid!.readinessProbe!.tcpSocket, { port: "proxy" });
    assert.deepEqual(squid!.livenessProbe.tcpSocket, { port: "proxy" });
    assert.deepEqual(squid!.volumeMounts, [
      { name: "config", mountPath: GATEWAY_POD_CONFIG_DIR, readOnly: true },
    ]);
    assert.deepEqual(pod.volumes, [
      { name: "config", secret: { secretName: "edge-gateway", defaultMode: 0o444 } },
    ]);
    assert.ok(pod.terminationGracePeriodSeconds >= 5 && pod.terminationGracePeriodSeconds <= 15);
    assert.equal(pod.automountServiceAccountToken, false);
    const [spread] = pod.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution;
    assert.equal(spread!.podAffinityTerm.topologyKey, "kubernetes.io/hostname");
    assert.deepEqual(spread!.podAffinityTerm.labelSelector.matchLabels, POD_LABELS);
  });

  it("keeps the files in an Opaque Secret whose data is a Pulumi secret", async () => {
    const files = filesFor([member("kvm1-0", "198.51.100.10")]);
    await declare({}, files);
    const secret = byType<Secret>(SECRET);
    assert.equal(secret.type, "Opaque");
    assert.deepEqual(secret.stringData, {
      "squid.conf": files.config.content,
      users: files.users.content,
      "auth-helper.sh": files.authHelper.content,
    });
    assert.match(secret.stringData["squid.conf"]!, /login=member:member-pass-7f3k/);
    const registeredSecret = registered.find((r) => r.type === SECRET)!;
    assert.ok(
      isSecretValue(registeredSecret.inputs.stringData),
      "stringData is registered as a secret",
    );
    for (const resource of registered.filter((r) => r.type !== SECRET))
      assert.ok(
        !JSON.stringify(resource.inputs).includes(MEMBER_PASSWORD),
        `${resource.type} carries a member's password`,
      );
  });

  it("wraps the files in pulumi.secret itself, not counting on @pulumi/kubernetes to", async () => {
    // @pulumi/kubernetes marks stringData secret too, which would hide a missing wrap from the check above.
    const secretModule = (await import("@pulumi/kubernetes/core/v1/secret")) as unknown as {
      Secret: new (name: string, args: { stringData?: unknown }, opts?: object) => object;
    };
    const Original = secretModule.Secret;
    let given: unknown;
    secretModule.Secret = class extends Original {
      constructor(name: string, args: { stringData?: unknown }, opts?: object) {
        given = args.stringData;
        super(name, args, opts);
      }
    };
    try {
      await declare();
    } finally {
      secretModule.Secret = Original;
    }
    assert.ok(pulumi.Output.isInstance(given), "stringData is given as an output");
    assert.equal(await (given as unknown as { isSecret: Promise<boolean> }).isSecret, true);
  });

  it("a member change changes the Secret only: the Deployment is byte-identical, so the pods reload squid rather than roll", async () => {
    await declare({}, filesFor([member("kvm1-0", "198.51.100.10")]));
    const before = registered;
    registered = [];
    await declare(
      {},
      filesFor([member("kvm1-0", "198.51.100.10"), member("kvm2-0", "198.51.100.11")]),
    );
    const after = registered;
    const secretBefore = byType<Secret>(SECRET, before);
    const secretAfter = byType<Secret>(SECRET, after);
    assert.notEqual(secretBefore.stringData["squid.conf"], secretAfter.stringData["squid.conf"]);
    assert.match(secretAfter.stringData["squid.conf"]!, /name=kvm2-0/);
    const deploymentBefore = byType<Deployment>(DEPLOYMENT, before);
    const deploymentAfter = byType<Deployment>(DEPLOYMENT, after);
    assert.equal(JSON.stringify(deploymentAfter.spec), JSON.stringify(deploymentBefore.spec));
    assert.equal(JSON.stringify(deploymentAfter), JSON.stringify(deploymentBefore));
    assert.equal(deploymentAfter.spec.template.metadata.annotations, undefined);
    // The whole template is free of the files, not only of an annotation.
    assert.ok(!JSON.stringify(deploymentAfter).includes("kvm1-0"));
  });

  it("a PodDisruptionBudget lets one pod go at a time, with one replica as with many", async () => {
    for (const replicas of [1, 3]) {
      registered = [];
      await declare({ replicas });
      const budget = byType<Budget>(BUDGET);
      assert.equal(budget.metadata.name, "edge-gateway");
      assert.equal(budget.spec.maxUnavailable, 1, `replicas ${replicas}`);
      assert.equal(budget.spec.minAvailable, undefined);
      assert.deepEqual(budget.spec.selector.matchLabels, POD_LABELS);
      assert.equal(byType<Deployment>(DEPLOYMENT).spec.replicas, replicas);
    }
  });

  it("a dual-stack Service on the proxy port, selecting the pods; the url and its cluster addresses", async () => {
    const { url, clusterIps } = await declare();
    const service = byType<Service>(SERVICE);
    assert.equal(service.spec.type, "ClusterIP");
    assert.equal(service.spec.ipFamilyPolicy, "PreferDualStack");
    assert.deepEqual(service.spec.selector, POD_LABELS);
    assert.deepEqual(service.spec.ports, [
      { name: "proxy", port: 3128, targetPort: "proxy", protocol: "TCP" },
    ]);
    assert.equal(service.spec.externalTrafficPolicy, undefined);
    assert.equal(url, "http://edge-gateway.crawlers.svc:3128");
    assert.deepEqual(clusterIps, CLUSTER_IPS);
  });

  it("a LoadBalancer keeps clients' own addresses (squid's client ACL sees them); NodePort as asked", async () => {
    await declare({ serviceType: "LoadBalancer" });
    const balancer = byType<Service>(SERVICE);
    assert.equal(balancer.spec.type, "LoadBalancer");
    assert.equal(balancer.spec.externalTrafficPolicy, "Local");
    assert.equal(balancer.spec.ipFamilyPolicy, "PreferDualStack");
    registered = [];
    await declare({ serviceType: "NodePort" });
    assert.equal(byType<Service>(SERVICE).spec.type, "NodePort");
  });

  it("takes the name, replicas, image, labels and a namespace that is an output", async () => {
    const { url } = await declare({
      name: "crawl-gw",
      namespace: pulumi.output("proxies"),
      replicas: 4,
      image: "registry.example/squid:6.10",
      labels: { team: "data", "app.kubernetes.io/name": "overridden?" },
    });
    assert.equal(url, "http://crawl-gw.proxies.svc:3128");
    const deployment = byType<Deployment>(DEPLOYMENT);
    assert.equal(deployment.metadata.name, "crawl-gw");
    assert.equal(deployment.metadata.namespace, "proxies");
    assert.equal(deployment.spec.replicas, 4);
    assert.equal(deployment.spec.template.spec.containers[0]!.image, "registry.example/squid:6.10");
    assert.equal(deployment.spec.template.spec.volumes[0]!.secret!.secretName, "crawl-gw");
    for (const type of [DEPLOYMENT, SECRET, SERVICE, BUDGET]) {
      const { metadata } = byType<{ metadata: Deployment["metadata"] }>(type);
      assert.equal(metadata.name, "crawl-gw", type);
      assert.equal(metadata.labels.team, "data", type);
      // The selector's labels are the module's own: a user label cannot detach the pods.
      assert.equal(metadata.labels["app.kubernetes.io/name"], "egress-proxies-gateway", type);
    }
    assert.equal(deployment.spec.template.metadata.labels.team, "data");
  });

  it("without metrics: squid alone, no scrape annotations, no metrics port", async () => {
    await declare();
    const deployment = byType<Deployment>(DEPLOYMENT);
    assert.deepEqual(
      deployment.spec.template.spec.containers.map((container) => container.name),
      ["squid"],
    );
    assert.equal(deployment.spec.template.metadata.annotations, undefined);
    assert.deepEqual(
      byType<Service>(SERVICE).spec.ports.map((port) => port.name),
      ["proxy"],
    );
  });

  it("with metrics: a sidecar running gateway-metrics through npx as the check exporter runs, scraped by annotations", async () => {
    await declare();
    const without = byType<Deployment>(DEPLOYMENT);
    registered = [];
    await declare({ metrics: {} });
    const deployment = byType<Deployment>(DEPLOYMENT);
    const pod = deployment.spec.template.spec;
    assert.deepEqual(
      pod.containers.map((container) => container.name),
      ["squid", "metrics"],
    );
    // squid's own container is the one it was.
    assert.deepEqual(pod.containers[0], without.spec.template.spec.containers[0]);
    const sidecar = pod.containers[1]!;
    assert.equal(sidecar.image, "node:26-slim");
    assert.equal(sidecar.image, EXPORTER_DEFAULTS.image);
    assert.deepEqual(sidecar.command, [
      "npx",
      "--yes",
      EXPORTER_DEFAULTS.packageSpec,
      "gateway-metrics",
      "--udp",
      "127.0.0.1:5140",
      "--listen",
      "0.0.0.0:9102",
    ]);
    assert.match(EXPORTER_DEFAULTS.packageSpec, /^egress-proxies@\d+\.\d+\.\d+/);
    assert.equal(GATEWAY_POD_METRICS_UDP, "127.0.0.1:5140");
    assert.deepEqual(sidecar.ports, [{ name: "metrics", containerPort: 9102, protocol: "TCP" }]);
    assert.deepEqual(sidecar.env, [
      { name: "HOME", value: "/tmp" },
      { name: "npm_config_cache", value: "/tmp/.npm" },
      { name: "npm_config_update_notifier", value: "false" },
    ]);
    assert.deepEqual(sidecar.livenessProbe.httpGet, { path: "/healthz", port: "metrics" });
    // The pod's readiness stays squid's: a sidecar still downloading must not unlist the proxy.
    assert.equal(sidecar.readinessProbe, undefined);
    assert.deepEqual(
      [
        sidecar.securityContext.runAsNonRoot,
        sidecar.securityContext.runAsUser,
        sidecar.securityContext.readOnlyRootFilesystem,
        sidecar.securityContext.allowPrivilegeEscalation,
      ],
      [true, 1000, true, false],
    );
    assert.deepEqual(sidecar.volumeMounts, [{ name: "metrics-tmp", mountPath: "/tmp" }]);
    assert.deepEqual(pod.volumes.at(-1), { name: "metrics-tmp", emptyDir: { sizeLimit: "512Mi" } });
    assert.deepEqual(deployment.spec.template.metadata.annotations, {
      "prometheus.io/scrape": "true",
      "prometheus.io/port": "9102",
      "prometheus.io/path": "/metrics",
    });
    assert.deepEqual(byType<Service>(SERVICE).spec.ports, [
      { name: "proxy", port: 3128, targetPort: "proxy", protocol: "TCP" },
      { name: "metrics", port: 9102, targetPort: "metrics", protocol: "TCP" },
    ]);
  });

  it("with metrics, a member change still changes the Secret only: the pod template carries nothing of the files", async () => {
    const metricsFiles = (members: GatewayMember[]) =>
      gatewayPodFiles(
        {
          port: 3128,
          allowedClientCidrs: ["10.0.0.0/8"],
          users: [{ name: "crawler", password: "correct horse battery" }],
          members,
        },
        { metricsUdp: GATEWAY_POD_METRICS_UDP },
      );
    await declare({ metrics: {} }, metricsFiles([member("kvm1-0", "198.51.100.10")]));
    const before = registered;
    registered = [];
    await declare(
      { metrics: {} },
      metricsFiles([member("kvm1-0", "198.51.100.10"), member("kvm2-0", "198.51.100.11")]),
    );
    const deploymentBefore = byType<Deployment>(DEPLOYMENT, before);
    const deploymentAfter = byType<Deployment>(DEPLOYMENT);
    assert.equal(JSON.stringify(deploymentAfter), JSON.stringify(deploymentBefore));
    assert.ok(!JSON.stringify(deploymentAfter).includes("kvm1-0"));
    assert.notEqual(
      byType<Secret>(SECRET, before).stringData["squid.conf"],
      byType<Secret>(SECRET).stringData["squid.conf"],
    );
    assert.match(
      byType<Secret>(SECRET).stringData["squid.conf"]!,
      /^access_log udp:\/\/127\.0\.0\.1:5140 egress_gateway$/m,
    );
  });

  it("takes the sidecar's port, image and package; a LoadBalancer publishes no metrics port", async () => {
    await declare({
      serviceType: "LoadBalancer",
      metrics: {
        port: 9300,
        image: "registry.example/node:22",
        packageSpec: "egress-proxies@0.1.0",
      },
    });
    const deployment = byType<Deployment>(DEPLOYMENT);
    const sidecar = deployment.spec.template.spec.containers[1]!;
    assert.equal(sidecar.image, "registry.example/node:22");
    assert.deepEqual(sidecar.command.slice(2), [
      "egress-proxies@0.1.0",
      "gateway-metrics",
      "--udp",
      "127.0.0.1:5140",
      "--listen",
      "0.0.0.0:9300",
    ]);
    assert.equal(sidecar.ports[0]!.containerPort, 9300);
    assert.equal(deployment.spec.template.metadata.annotations!["prometheus.io/port"], "9300");
    // Per-user counts stay inside the cluster: Prometheus scrapes the pods by their annotations.
    assert.deepEqual(
      byType<Service>(SERVICE).spec.ports.map((port) => port.name),
      ["proxy"],
    );
  });

  it("the pool's gateway sends squid's log lines to the sidecar exactly when there is one", async () => {
    const { declareGateway } = await import("../../../components/gateway");
    const squidConf = async (kubernetes: gatewayModule.GatewayKubernetesArgs) => {
      registered = [];
      declareGateway(
        "edge",
        {
          users: [{ name: "crawler", password: "correct horse battery" }],
          kubernetes,
        },
        { proxies: pulumi.output([]), port: 3128 },
        newParent(),
        () => assert.fail("no VM for a gateway in Kubernetes"),
      );
      await settle();
      return byType<Secret>(SECRET).stringData["squid.conf"]!;
    };
    const udpLine = /^access_log udp:\/\/127\.0\.0\.1:5140 egress_gateway$/m;
    assert.doesNotMatch(await squidConf({ namespace: "crawlers" }), udpLine);
    assert.match(await squidConf({ namespace: "crawlers", metrics: {} }), udpLine);
  });

  it("refuses files written for another directory than the pod's mount", async () => {
    const vmFiles = gatewayFiles({
      port: 3128,
      allowedClientCidrs: ["10.0.0.0/8"],
      users: [{ name: "crawler", password: "correct horse battery" }],
      members: [member("kvm1-0", "198.51.100.10")],
      paths: { configDir: "/etc/squid/gateway" },
    });
    const refused = new Promise<unknown>((resolve) => {
      const output = pulumi.output(vmFiles);
      const placed = gateway.publishGatewayToKubernetes(
        "edge",
        { namespace: "crawlers" },
        { files: output, port: 3128 },
        newParent(),
      );
      const stringData = (
        placed.objects.secret as unknown as { stringData: pulumi.Output<unknown> }
      ).stringData;
      (stringData as unknown as { promise: () => Promise<unknown> })
        .promise()
        .then(() => resolve(undefined), resolve);
    });
    const error = (await refused) as Error | undefined;
    assert.ok(error instanceof Error, "the Secret's data is refused");
    assert.match(
      error.message,
      /\/etc\/squid\/gateway\/squid\.conf, not \/etc\/egress-gateway\/squid\.conf: produce the pod's files with gatewayPodFiles/,
    );
  });
});

describe("the gateway in Kubernetes in preview", function () {
  this.timeout(30_000);
  before(() => useMocks(true));
  beforeEach(() => (registered = []));
  after(() => useMocks(false));

  it("has no cluster addresses yet: an empty list, and the url already", async () => {
    const { publishGatewayToKubernetes } = await import("../../../components/gateway-kubernetes");
    const placed = publishGatewayToKubernetes(
      "edge",
      { namespace: "crawlers" },
      { files: filesFor([member("kvm1-0", "198.51.100.10")]), port: 8080 },
      newParent(),
    );
    assert.deepEqual(await valueOf(placed.clusterIps), []);
    assert.equal(await valueOf(placed.url), "http://edge-gateway.crawlers.svc:8080");
  });
});

describe("gatewayKubernetesArgsProblems", () => {
  let problemsOf: typeof gatewayModule.gatewayKubernetesArgsProblems;
  before(async () => {
    problemsOf = (await import("../../../components/gateway-kubernetes"))
      .gatewayKubernetesArgsProblems;
  });
  const fine = { namespace: "crawlers" };

  it("finds nothing wrong with good arguments, or with none", () => {
    assert.deepEqual(problemsOf(undefined), []);
    assert.deepEqual(problemsOf(fine), []);
    assert.deepEqual(
      problemsOf({
        namespace: pulumi.output("crawlers"),
        name: "egress-gateway",
        replicas: 50,
        image: "ubuntu/squid:6.6-24.04_beta",
        serviceType: "NodePort",
        labels: { team: "data" },
      }),
      [],
    );
    assert.deepEqual(problemsOf({ ...fine, replicas: 1, serviceType: "LoadBalancer" }), []);
  });

  const expectOne = (args: unknown, pattern: RegExp) => {
    const problems = problemsOf(args as gatewayModule.GatewayKubernetesArgs);
    assert.equal(problems.length, 1, problems.join("\n"));
    assert.match(problems[0]!, pattern);
  };

  it("name: a DNS label", () => {
    for (const name of ["Egress", "egress_gateway", "-egress", "egress-", "", "a".repeat(64)])
      expectOne(
        { ...fine, name },
        /^gateway\.kubernetes\.name .* must be a DNS label: at most 63 lower-case letters, digits and '-'.*e\.g\. "egress-gateway"$/,
      );
    assert.deepEqual(problemsOf({ ...fine, name: "a".repeat(63) }), []);
  });

  it("replicas: a whole number from 1 to 50", () => {
    for (const replicas of [0, 51, 1.5, -1, Number.NaN, "2"])
      expectOne(
        { ...fine, replicas },
        /^gateway\.kubernetes\.replicas must be a whole number from 1 to 50, e\.g\. 2$/,
      );
  });

  it("image: a reference without spaces", () => {
    for (const image of ["", "ubuntu/squid latest", " ubuntu/squid", 42])
      expectOne(
        { ...fine, image },
        /^gateway\.kubernetes\.image must be an image reference without spaces, e\.g\. "ubuntu\/squid:6\.6-24\.04_beta"$/,
      );
  });

  it("serviceType: one of the three", () => {
    for (const serviceType of ["ExternalName", "clusterip", ""])
      expectOne(
        { ...fine, serviceType },
        /^gateway\.kubernetes\.serviceType must be one of "ClusterIP", "LoadBalancer", "NodePort" \(not ".*"\)$/,
      );
  });

  it("namespace: given, and a DNS label when plain", () => {
    expectOne(
      {},
      /^gateway\.kubernetes\.namespace must name an existing namespace, e\.g\. "crawlers"$/,
    );
    expectOne({ namespace: "" }, /^gateway\.kubernetes\.namespace must name an existing namespace/);
    expectOne(
      { namespace: "Crawlers" },
      /^gateway\.kubernetes\.namespace "Crawlers" must be a DNS label/,
    );
  });

  it("metrics: an object; a port from 1024, an image and a package without spaces", () => {
    assert.deepEqual(problemsOf({ ...fine, metrics: {} }), []);
    assert.deepEqual(
      problemsOf({ ...fine, metrics: { port: 1024, image: "node:22", packageSpec: "x@1" } }),
      [],
    );
    expectOne(
      { ...fine, metrics: "on" },
      /^gateway\.kubernetes\.metrics must be an object, e\.g\. \{\} for the defaults/,
    );
    for (const port of [80, 70_000, 9102.5, "9102"])
      expectOne(
        { ...fine, metrics: { port } },
        /^gateway\.kubernetes\.metrics\.port must be a whole number from 1024 to 65535 \(the sidecar runs unprivileged\), e\.g\. 9102$/,
      );
    expectOne(
      { ...fine, metrics: { image: "node 22" } },
      /^gateway\.kubernetes\.metrics\.image must be an image reference without spaces, e\.g\. "node:26-slim"$/,
    );
    expectOne(
      { ...fine, metrics: { packageSpec: "" } },
      /^gateway\.kubernetes\.metrics\.packageSpec must be what npx runs without spaces, e\.g\. "egress-proxies@/,
    );
  });

  it("every problem at once, under the field the caller names", () => {
    const problems = problemsOf(
      { namespace: "crawlers", name: "Bad", replicas: 0, image: "", serviceType: "x" } as never,
      "pools[0].gateway.kubernetes",
    );
    assert.deepEqual(
      problems.map((problem) => problem.split(" ")[0]),
      [
        "pools[0].gateway.kubernetes.name",
        "pools[0].gateway.kubernetes.replicas",
        "pools[0].gateway.kubernetes.image",
        "pools[0].gateway.kubernetes.serviceType",
      ],
    );
  });
});

describe("publishGatewayToKubernetes refuses bad arguments before declaring anything", function () {
  before(() => useMocks(false));
  beforeEach(() => (registered = []));

  it("throws every problem, and a default name that is no DNS label with the fix", async () => {
    const { publishGatewayToKubernetes } = await import("../../../components/gateway-kubernetes");
    const files = filesFor([member("kvm1-0", "198.51.100.10")]);
    assert.throws(
      () =>
        publishGatewayToKubernetes(
          "edge",
          { namespace: "crawlers", replicas: 0, serviceType: "Headless" as never },
          { files, port: 3128 },
          newParent(),
        ),
      /^Error: EgressProxyPool edge: gateway\.kubernetes\.replicas must be .*; gateway\.kubernetes\.serviceType must be one of/,
    );
    assert.throws(
      () =>
        publishGatewayToKubernetes(
          "Edge_Pool",
          { namespace: "crawlers" },
          { files, port: 3128 },
          newParent(),
        ),
      /gateway\.kubernetes\.name defaults to "Edge_Pool-gateway", which is not a DNS label.*: set gateway\.kubernetes\.name$/,
    );
    assert.throws(
      () =>
        publishGatewayToKubernetes(
          "edge",
          { namespace: "crawlers", metrics: { port: 3128 } },
          { files, port: 3128 },
          newParent(),
        ),
      /gateway\.kubernetes\.metrics\.port 3128 is the gateway's proxy port: choose another, e\.g\. 9102$/,
    );
    await settle();
    assert.deepEqual(
      registered.filter((r) => r.type.startsWith("kubernetes:")),
      [],
    );
    // The same pool with a name of its own is fine.
    publishGatewayToKubernetes(
      "Edge_Pool",
      { namespace: "crawlers", name: "edge-gateway" },
      { files, port: 3128 },
      newParent(),
    );
    await settle();
    assert.equal(registered.filter((r) => r.type.startsWith("kubernetes:")).length, 4);
  });
});
