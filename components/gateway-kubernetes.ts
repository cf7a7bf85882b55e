/**
 * The pool's gateway in Kubernetes: squid (workloads/gateway/) as a
 * Deployment, its three files in a Secret mounted as a directory, a
 * PodDisruptionBudget and a Service clients reach at
 * `http://<name>.<namespace>.svc:<port>`.
 *
 * Members come and go far more often than the gateway itself changes, so a
 * member change must touch the Secret only: the pod template names the Secret
 * by its fixed name and carries nothing derived from the files (no checksum
 * annotation), and the container's loop (workloads/gateway/pod.ts) reloads
 * squid in place once the kubelet has synced the new files. The Deployment
 * waits for the Secret through `dependsOn` alone, never through one of its
 * properties: a replaced Secret then never drags the Deployment along.
 *
 * Without `enableSecretMutable: true` on the Kubernetes provider, the
 * provider replaces a Secret whose data changes (deletes it, then creates it
 * under the same name): running pods keep the files they have until the new
 * Secret arrives, and a pod starting in that gap waits for it. With the
 * option the Secret is updated in place.
 *
 * `@pulumi/kubernetes` is loaded on first use and no exported type names it,
 * as in kubernetes.ts.
 */
import * as pulumi from "@pulumi/pulumi";
import {
  GATEWAY_POD_CONFIG_DIR,
  GATEWAY_POD_METRICS_UDP,
  gatewayEntrypointScript,
} from "../workloads/gateway/pod";
import type { GatewayFiles } from "../workloads/gateway/squid-gateway";
import { KubernetesPackageMissingError } from "./kubernetes";
import { EXPORTER_DEFAULTS } from "./kubernetes-exporter";

/** Canonical's maintained squid image (Ubuntu's squid, basic_ncsa_auth where the config expects it). */
export const DEFAULT_GATEWAY_IMAGE = "ubuntu/squid:6.6-24.04_beta";
export const DEFAULT_GATEWAY_REPLICAS = 2;
const MAX_GATEWAY_REPLICAS = 50;
const SERVICE_TYPES = ["ClusterIP", "LoadBalancer", "NodePort"] as const;
export const DEFAULT_GATEWAY_METRICS_PORT = 9102;

/**
 * `egress-proxies gateway-metrics` beside squid in each pod, run as the check
 * exporter is (kubernetes-exporter.ts): npx in a stock Node image, unprivileged.
 */
export interface GatewayMetricsArgs {
  /** The port of /metrics and /healthz on the pod (and on a ClusterIP Service). Default 9102. */
  port?: number;
  /** A Node.js 22+ image with npm. Default `node:26-slim`, the check exporter's. */
  image?: string;
  /** What npx runs. Default `egress-proxies@<this package's version>`. */
  packageSpec?: string;
}

export interface GatewayKubernetesArgs {
  /** Namespace of the gateway's objects; it must exist. */
  namespace: pulumi.Input<string>;
  /** Name of the Deployment, Service, Secret and PodDisruptionBudget (a DNS label). Default `<pool name>-gateway`. */
  name?: string;
  /** Pods running squid. Default 2; 1 to 50. */
  replicas?: number;
  /** A squid 5+ image with sh and basic_ncsa_auth at /usr/lib/squid. Default DEFAULT_GATEWAY_IMAGE. */
  image?: string;
  /**
   * The cluster: a `k8s.Provider`; default: Pulumi's default Kubernetes
   * provider. Set `enableSecretMutable: true` on it to update the Secret in
   * place rather than replace it when members change.
   */
  provider?: pulumi.ProviderResource;
  /** Extra labels on every object and on the pods (the app.kubernetes.io/* ones are always set). */
  labels?: Record<string, string>;
  /** Service type: "ClusterIP" (default) or "LoadBalancer" or "NodePort". */
  serviceType?: "ClusterIP" | "LoadBalancer" | "NodePort";
  /** Per-member and per-user metrics from a sidecar in each pod; off unless given (`{}` for the defaults). */
  metrics?: GatewayMetricsArgs;
}

/**
 * `k8s.core.v1.Secret`, `k8s.apps.v1.Deployment`,
 * `k8s.policy.v1.PodDisruptionBudget` and `k8s.core.v1.Service`, typed as
 * Pulumi's base class so the package's types do not require
 * `@pulumi/kubernetes`.
 */
export interface GatewayKubernetesObjects {
  secret: pulumi.CustomResource;
  deployment: pulumi.CustomResource;
  podDisruptionBudget: pulumi.CustomResource;
  service: pulumi.CustomResource;
}

const DNS_LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
const DNS_LABEL_HINT =
  "a DNS label: at most 63 lower-case letters, digits and '-', starting and ending with a letter or digit";

/** Every problem, each naming its field (e.g. `gateway.kubernetes.replicas`) and the fix; empty when fine. */
export function gatewayKubernetesArgsProblems(
  args: GatewayKubernetesArgs | undefined,
  field = "gateway.kubernetes",
): string[] {
  if (args === undefined) return [];
  const problems: string[] = [];
  // An output is checked by the cluster; only a plain value can be checked here.
  if (args.namespace === undefined || args.namespace === null || args.namespace === "")
    problems.push(`${field}.namespace must name an existing namespace, e.g. "crawlers"`);
  else if (typeof args.namespace === "string" && !DNS_LABEL.test(args.namespace))
    problems.push(
      `${field}.namespace ${JSON.stringify(args.namespace)} must be ${DNS_LABEL_HINT}, e.g. "crawlers"`,
    );
  if (args.name !== undefined && (typeof args.name !== "string" || !DNS_LABEL.test(args.name)))
    problems.push(
      `${field}.name ${JSON.stringify(args.name)} must be ${DNS_LABEL_HINT}, e.g. "egress-gateway"`,
    );
  const replicas = args.replicas;
  if (
    replicas !== undefined &&
    (!Number.isInteger(replicas) || replicas < 1 || replicas > MAX_GATEWAY_REPLICAS)
  )
    problems.push(
      `${field}.replicas must be a whole number from 1 to ${MAX_GATEWAY_REPLICAS}, e.g. ${DEFAULT_GATEWAY_REPLICAS}`,
    );
  if (args.image !== undefined && (typeof args.image !== "string" || !/^\S+$/.test(args.image)))
    problems.push(
      `${field}.image must be an image reference without spaces, e.g. "${DEFAULT_GATEWAY_IMAGE}"`,
    );
  if (
    args.serviceType !== undefined &&
    !(SERVICE_TYPES as readonly unknown[]).includes(args.serviceType)
  )
    problems.push(
      `${field}.serviceType must be one of ${SERVICE_TYPES.map((type) => `"${type}"`).join(", ")} (not ${JSON.stringify(args.serviceType)})`,
    );
  problems.push(...metricsArgsProblems(args.metrics, `${field}.metrics`));
  return problems;
}

function metricsArgsProblems(metrics: GatewayMetricsArgs | undefined, field: string): string[] {
  if (metrics === undefined) return [];
  if (typeof metrics !== "object" || metrics === null)
    return [`${field} must be an object, e.g. {} for the defaults or { port: 9102 }`];
  const problems: string[] = [];
  const port = metrics.port;
  if (port !== undefined && (!Number.isInteger(port) || port < 1024 || port > 65_535))
    problems.push(
      `${field}.port must be a whole number from 1024 to 65535 (the sidecar runs unprivileged), e.g. ${DEFAULT_GATEWAY_METRICS_PORT}`,
    );
  for (const key of ["image", "packageSpec"] as const)
    if (metrics[key] !== undefined && !/^\S+$/.test(metrics[key] as string))
      problems.push(
        `${field}.${key} must be ${key === "image" ? "an image reference" : "what npx runs"} without spaces, e.g. "${EXPORTER_DEFAULTS[key]}"`,
      );
  return problems;
}

type KubernetesModule = typeof import("@pulumi/kubernetes");

/** `require`d at call time, as in kubernetes.ts: a stack without a gateway need not install it. */
function loadKubernetes(owner: string): KubernetesModule {
  try {
    // eslint-disable-next-line @typescript-eslint/no-require-imports -- optional peer, loaded only for a gateway
    return require("@pulumi/kubernetes") as KubernetesModule;
  } catch (error) {
    const { code, message } = error as { code?: string; message?: string };
    if (code === "MODULE_NOT_FOUND" && message?.includes("'@pulumi/kubernetes'"))
      throw new KubernetesPackageMissingError(
        `${owner}: gateway.kubernetes runs the gateway with @pulumi/kubernetes, but that package is ` +
          "not installed in this stack. Run `npm install @pulumi/kubernetes` (an optional peer " +
          "dependency of egress-proxies), or remove gateway from the pool's arguments.",
        { cause: error },
      );
    throw error;
  }
}

/** The Secret's keys, each the file's name in GATEWAY_POD_CONFIG_DIR, where squid.conf expects it. */
const SECRET_KEYS = {
  config: "squid.conf",
  users: "users",
  authHelper: "auth-helper.sh",
} as const satisfies Record<keyof GatewayFiles, string>;

/**
 * The Secret's stringData. Files written for another directory (a VM's)
 * would name paths the pod does not have: squid would start without its
 * helper, so they are refused here rather than in a crash-looping pod.
 */
function secretStringData(files: GatewayFiles): Record<string, string> {
  return Object.fromEntries(
    (Object.keys(SECRET_KEYS) as Array<keyof GatewayFiles>).map((file) => {
      const expected = `${GATEWAY_POD_CONFIG_DIR}/${SECRET_KEYS[file]}`;
      if (files[file].path !== expected)
        throw new Error(
          `the gateway's ${file} file is written for ${files[file].path}, not ${expected}: produce the pod's files with gatewayPodFiles`,
        );
      return [SECRET_KEYS[file], files[file].content];
    }),
  );
}

export function publishGatewayToKubernetes(
  poolName: string,
  args: GatewayKubernetesArgs,
  gateway: { files: pulumi.Input<GatewayFiles>; port: number },
  parent: pulumi.Resource,
): {
  objects: GatewayKubernetesObjects;
  url: pulumi.Output<string>;
  clusterIps: pulumi.Output<string[]>;
} {
  const owner = `EgressProxyPool ${poolName}`;
  const name = args.name ?? `${poolName}-gateway`;
  const problems = gatewayKubernetesArgsProblems(args);
  if (args.name === undefined && !DNS_LABEL.test(name))
    problems.push(
      `gateway.kubernetes.name defaults to "${name}", which is not ${DNS_LABEL_HINT}: set gateway.kubernetes.name`,
    );
  const metrics = resolveMetrics(args.metrics);
  if (metrics?.port === gateway.port)
    problems.push(
      `gateway.kubernetes.metrics.port ${metrics.port} is the gateway's proxy port: choose another, e.g. ${DEFAULT_GATEWAY_METRICS_PORT}`,
    );
  if (problems.length > 0) throw new Error(`${owner}: ${problems.join("; ")}`);
  const k8s = loadKubernetes(owner);
  const options: pulumi.CustomResourceOptions = { parent, provider: args.provider };
  const selector = {
    "app.kubernetes.io/name": "egress-proxies-gateway",
    "app.kubernetes.io/instance": name,
  };
  const labels = {
    ...args.labels,
    ...selector,
    "app.kubernetes.io/component": "gateway",
    "app.kubernetes.io/part-of": "egress-proxies",
    "app.kubernetes.io/managed-by": "pulumi",
  };
  const metadata = {
    name,
    namespace: args.namespace,
    labels,
    annotations: { "egress-proxies.dev/pool": poolName },
  };

  const secret = new k8s.core.v1.Secret(
    `${poolName}-gateway-files`,
    {
      metadata,
      type: "Opaque",
      // It holds the members' passwords (in squid.conf's login=) and the users' hashes.
      stringData: pulumi.secret(pulumi.output(gateway.files).apply(secretStringData)),
    },
    options,
  );
  const deployment = new k8s.apps.v1.Deployment(
    `${poolName}-gateway`,
    {
      metadata,
      spec: gatewayDeploymentSpec({
        replicas: args.replicas ?? DEFAULT_GATEWAY_REPLICAS,
        image: args.image ?? DEFAULT_GATEWAY_IMAGE,
        port: gateway.port,
        secretName: name,
        selector,
        podLabels: labels,
        metrics,
      }),
    },
    // Pods need the Secret to start; a dependsOn edge, not a property, so its replacement leaves them be.
    { ...options, dependsOn: [secret] },
  );
  const podDisruptionBudget = new k8s.policy.v1.PodDisruptionBudget(
    `${poolName}-gateway-budget`,
    {
      metadata,
      spec: {
        // One pod at a time, whatever the replicas. With one replica this still lets a drain evict it
        // (a short outage one replica accepts anyway); minAvailable 1 would block every drain for good,
        // and minAvailable 0 would allow evicting all pods at once with more replicas.
        maxUnavailable: 1,
        selector: { matchLabels: selector },
        // A pod that is not ready serves nobody: evicting it must not wait for the budget.
        unhealthyPodEvictionPolicy: "AlwaysAllow",
      },
    },
    options,
  );
  const service = declareService(k8s, `${poolName}-gateway-service`, {
    metadata,
    selector,
    port: gateway.port,
    metricsPort: metrics?.port,
    type: args.serviceType ?? "ClusterIP",
    options,
  });
  return {
    objects: { secret, deployment, podDisruptionBudget, service },
    url: pulumi.interpolate`http://${name}.${args.namespace}.svc:${gateway.port}`,
    // The provider's preview has no addresses yet: an empty list rather than a missing one.
    clusterIps: service.spec.apply((spec) => spec?.clusterIPs ?? []),
  };
}

type ResolvedMetrics = Required<GatewayMetricsArgs>;

const resolveMetrics = (metrics: GatewayMetricsArgs | undefined): ResolvedMetrics | undefined =>
  metrics === undefined
    ? undefined
    : {
        port: metrics.port ?? DEFAULT_GATEWAY_METRICS_PORT,
        image: metrics.image ?? EXPORTER_DEFAULTS.image,
        packageSpec: metrics.packageSpec ?? EXPORTER_DEFAULTS.packageSpec,
      };

const scrapeAnnotations = (port: number) => ({
  "prometheus.io/scrape": "true",
  "prometheus.io/port": String(port),
  "prometheus.io/path": "/metrics",
});

/** The Deployment's spec: nothing in it depends on the files, so a member change never rolls the pods. */
function gatewayDeploymentSpec(deployment: {
  replicas: number;
  image: string;
  port: number;
  secretName: string;
  selector: Record<string, string>;
  podLabels: Record<string, string>;
  metrics: ResolvedMetrics | undefined;
}) {
  const { metrics } = deployment;
  return {
    replicas: deployment.replicas,
    selector: { matchLabels: deployment.selector },
    // A new pod is ready before an old one goes: the gateway never runs below its replicas.
    strategy: { type: "RollingUpdate", rollingUpdate: { maxUnavailable: 0, maxSurge: 1 } },
    template: {
      metadata: {
        labels: deployment.podLabels,
        // Scraped per pod, each squid counting what it routed; constant for a given port.
        ...(metrics === undefined ? {} : { annotations: scrapeAnnotations(metrics.port) }),
      },
      spec: gatewayPodSpec(deployment),
    },
  };
}

function gatewayPodSpec(pod: {
  image: string;
  port: number;
  secretName: string;
  selector: Record<string, string>;
  metrics: ResolvedMetrics | undefined;
}) {
  const tcp = { tcpSocket: { port: "proxy" } };
  return {
    // squid needs no API access, nor the Services' addresses in its environment.
    automountServiceAccountToken: false,
    enableServiceLinks: false,
    // squid stops within its shutdown_lifetime (1 s) after the preStop pause.
    terminationGracePeriodSeconds: 10,
    securityContext: { seccompProfile: { type: "RuntimeDefault" } },
    affinity: {
      // Replicas on different nodes where the cluster can: one node's loss leaves the gateway up.
      podAntiAffinity: {
        preferredDuringSchedulingIgnoredDuringExecution: [
          {
            weight: 100,
            podAffinityTerm: {
              labelSelector: { matchLabels: pod.selector },
              topologyKey: "kubernetes.io/hostname",
            },
          },
        ],
      },
    },
    containers: [
      {
        name: "squid",
        image: pod.image,
        // squid starts as root to drop to its `proxy` user and signal itself on reload: no runAsNonRoot.
        command: ["sh", "-c", gatewayEntrypointScript()],
        ports: [{ name: "proxy", containerPort: pod.port, protocol: "TCP" }],
        // A reload reopens the listening port: two misses in a row, not one, mark the pod unready.
        readinessProbe: { ...tcp, periodSeconds: 5, timeoutSeconds: 2, failureThreshold: 2 },
        livenessProbe: {
          ...tcp,
          initialDelaySeconds: 15,
          periodSeconds: 20,
          timeoutSeconds: 5,
          failureThreshold: 3,
        },
        // kube-proxy takes a moment to drop a terminating pod: it keeps serving meanwhile.
        lifecycle: { preStop: { exec: { command: ["sleep", "3"] } } },
        // No memory limit: reaching it would kill squid with every tunnel it carries.
        resources: { requests: { cpu: "50m", memory: "64Mi" } },
        securityContext: { allowPrivilegeEscalation: false },
        volumeMounts: [{ name: "config", mountPath: GATEWAY_POD_CONFIG_DIR, readOnly: true }],
      },
      ...(pod.metrics === undefined ? [] : [metricsContainer(pod.metrics)]),
    ],
    volumes: [
      {
        name: "config",
        // A directory mount, never subPath: only a directory mount follows the Secret's updates.
        // World-readable: squid's helpers read the password file as the unprivileged `proxy` user.
        secret: { secretName: pod.secretName, defaultMode: 0o444 },
      },
      ...(pod.metrics === undefined ? [] : [METRICS_TMP]),
    ],
  };
}

const NODE_IMAGE_USER = 1000; // the node image's unprivileged user, as in kubernetes-exporter.ts
/** The sidecar's only writable place: npx's cache and HOME. */
const METRICS_TMP = { name: "metrics-tmp", emptyDir: { sizeLimit: "512Mi" } };

/** The metrics sidecar: `gateway-metrics` on squid's loopback UDP log, through npx. */
function metricsContainer(metrics: ResolvedMetrics) {
  return {
    name: "metrics",
    image: metrics.image,
    command: [
      "npx",
      "--yes",
      metrics.packageSpec,
      "gateway-metrics",
      "--udp",
      GATEWAY_POD_METRICS_UDP,
      "--listen",
      `0.0.0.0:${metrics.port}`,
    ],
    // npx installs into its cache: HOME and the cache on the writable emptyDir.
    env: [
      { name: "HOME", value: "/tmp" },
      { name: "npm_config_cache", value: "/tmp/.npm" },
      { name: "npm_config_update_notifier", value: "false" },
    ],
    ports: [{ name: "metrics", containerPort: metrics.port, protocol: "TCP" }],
    // No readiness probe: the pod's readiness stays squid's, and a sidecar still downloading the
    // package must not take the proxy out of the Service. Liveness waits for that download.
    livenessProbe: {
      httpGet: { path: "/healthz", port: "metrics" },
      initialDelaySeconds: 300,
      periodSeconds: 30,
      timeoutSeconds: 5,
      failureThreshold: 3,
    },
    resources: { requests: { cpu: "10m", memory: "64Mi" }, limits: { memory: "256Mi" } },
    // The pod runs squid as root (it drops to `proxy` itself): the sidecar drops everything here.
    securityContext: {
      runAsNonRoot: true,
      runAsUser: NODE_IMAGE_USER,
      runAsGroup: NODE_IMAGE_USER,
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ["ALL"] },
    },
    volumeMounts: [{ name: METRICS_TMP.name, mountPath: "/tmp" }],
  };
}

/** The Service: both families where the cluster has them. */
function declareService(
  k8s: KubernetesModule,
  resourceName: string,
  service: {
    metadata: Record<string, unknown>;
    selector: Record<string, string>;
    port: number;
    metricsPort: number | undefined;
    type: NonNullable<GatewayKubernetesArgs["serviceType"]>;
    options: pulumi.CustomResourceOptions;
  },
) {
  // Inside the cluster only: a LoadBalancer or NodePort would publish the per-user counts beyond
  // it (Prometheus scrapes the pods through their annotations either way).
  const metrics =
    service.metricsPort !== undefined && service.type === "ClusterIP"
      ? [{ name: "metrics", port: service.metricsPort, targetPort: "metrics", protocol: "TCP" }]
      : [];
  return new k8s.core.v1.Service(
    resourceName,
    {
      metadata: service.metadata,
      spec: {
        type: service.type,
        ipFamilyPolicy: "PreferDualStack",
        selector: service.selector,
        ports: [
          { name: "proxy", port: service.port, targetPort: "proxy", protocol: "TCP" },
          ...metrics,
        ],
        // Through a load balancer, Cluster would SNAT clients to a node's (private) address, which
        // squid's allowedClientCidrs would then let in: Local keeps the client's own address.
        ...(service.type === "LoadBalancer" ? { externalTrafficPolicy: "Local" } : {}),
      },
    },
    service.options,
  );
}
